/* gepard-cuda-kernels.cu: the device side of the LM step (gepard-model.md §1, §3.4, §3.5).
 *
 * Every kernel rounds to bf16 exactly where the CPU reference (gepard-core/gepard-model.c) does,
 * with the same fp32 (and, for norm statistics, fp64) arithmetic, so the two differ only where
 * reductions sum in another order and where CUDA's expf/erff differ from glibc's by an ulp.
 * The residual stream stays in fp32 arrays holding bf16 values, as on the CPU, so that prefix
 * rows enter the first layer unrounded there too. */
#include "gepard-cuda-private.h"

#include <math.h>

#define WARP 32

__device__ __forceinline__ float
bf16r (float x)
{
  return __bfloat162float (__float2bfloat16_rn (x));
}

__device__ __forceinline__ float
ld (const gbf16 *p)
{
  return __bfloat162float (*p);
}

template <typename T>
__device__ __forceinline__ T
warp_sum (T v)
{
  for (int o = WARP / 2; o > 0; o /= 2)
    v += __shfl_xor_sync (0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float
warp_max (float v)
{
  for (int o = WARP / 2; o > 0; o /= 2)
    v = fmaxf (v, __shfl_xor_sync (0xffffffffu, v, o));
  return v;
}

/* sum over the block; every thread gets the result. `scratch` holds 32 values. */
template <typename T>
__device__ T
block_sum (T v, T *scratch)
{
  int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP,
      n_warps = (blockDim.x + WARP - 1) / WARP;
  v = warp_sum (v);
  __syncthreads ();
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads ();
  T total = 0;
  for (int w = 0; w < n_warps; w++)
    total += scratch[w];
  return total;
}

__device__ float
block_max (float v, float *scratch)
{
  int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP,
      n_warps = (blockDim.x + WARP - 1) / WARP;
  v = warp_max (v);
  __syncthreads ();
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads ();
  float m = -INFINITY;
  for (int w = 0; w < n_warps; w++)
    m = fmaxf (m, scratch[w]);
  return m;
}

/* gepard-model.c inverse_rms: fp64 sum of squares, fp32 rsqrt */
__device__ __forceinline__ float
inverse_rms (double sum, int n, float eps)
{
  return 1.0f / sqrtf ((float)(sum / n) + eps);
}

/* ---- embeddings ---- */

__global__ void
embed_rows_kernel (const GepardStepRow *rows, const gbf16 *table, const float *prefix, int hidden,
                   float *x)
{
  GepardStepRow row = rows[blockIdx.x];
  float *out = x + (size_t)blockIdx.x * hidden;
  if (row.kind == GEPARD_ROW_TEXT)
    {
      const gbf16 *src = table + (size_t)row.value * hidden;
      for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        out[i] = ld (src + i);
    }
  else if (row.kind == GEPARD_ROW_PREFIX)
    {
      /* copied as given, like the CPU backend's memcpy of the prefix into its embeddings */
      const float *src = prefix + (size_t)row.value * hidden;
      for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        out[i] = src[i];
    }
}

cudaError_t
gepard_launch_embed_rows (cudaStream_t stream, const GepardStepRow *rows, int n_rows,
                          const gbf16 *table, const float *prefix, int hidden, float *x)
{
  return launch (embed_rows_kernel, n_rows, 256, 0, stream, rows, table, prefix, hidden, x);
}

/* §3.5: concat_i audio_embeddings[i][c_i] */
__global__ void
frame_gather_kernel (const int32_t *codes, int n_heads, const int *head_offsets,
                     const gbf16 *audio_table, int embed_dim, gbf16 *out)
{
  int f = blockIdx.x;
  int width = n_heads * embed_dim;
  for (int i = threadIdx.x; i < width; i += blockDim.x)
    {
      int head = i / embed_dim, e = i % embed_dim;
      int row = head_offsets[head] + codes[(size_t)f * n_heads + head];
      out[(size_t)f * width + i] = audio_table[(size_t)row * embed_dim + e];
    }
}

cudaError_t
gepard_launch_frame_gather (cudaStream_t stream, const int32_t *codes, int n_frames, int n_heads,
                            const int *head_offsets, const gbf16 *audio_table, int embed_dim,
                            gbf16 *out)
{
  return launch (frame_gather_kernel, n_frames, 256, 0, stream, codes, n_heads, head_offsets,
                 audio_table, embed_dim, out);
}

/* Linear+bias rounded once, then exact GELU rounded (§3.5) */
__global__ void
bias_gelu_kernel (const float *acc, const float *bias, int n, gbf16 *out)
{
  size_t base = (size_t)blockIdx.x * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    {
      float a = bf16r (acc[base + i] + bias[i]);
      out[base + i] = __float2bfloat16_rn (a * 0.5f * (1.0f + erff (a * (float)M_SQRT1_2)));
    }
}

cudaError_t
gepard_launch_bias_gelu (cudaStream_t stream, const float *acc, const float *bias, int n_rows,
                         int n, gbf16 *out)
{
  return launch (bias_gelu_kernel, n_rows, 256, 0, stream, acc, bias, n, out);
}

/* Linear+bias, LayerNorm without affine (eps 1e-5, fp64 statistics as the CPU), × scale; the
 * result becomes the frame's row of the residual stream */
__global__ void
bias_layer_norm_kernel (const float *acc, const float *bias, float scale, const int *frame_rows,
                        int n, float *x)
{
  __shared__ double scratch[WARP];
  extern __shared__ float b[];
  size_t base = (size_t)blockIdx.x * n;
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    {
      b[i] = bf16r (acc[base + i] + bias[i]);
      s += b[i];
    }
  double mean = block_sum (s, scratch) / n;
  double v = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    v += (b[i] - mean) * (b[i] - mean);
  double var = block_sum (v, scratch);
  float rstd = 1.0f / sqrtf ((float)(var / n) + 1e-5f);
  float *out = x + (size_t)frame_rows[blockIdx.x] * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    {
      float normed = bf16r ((b[i] - (float)mean) * rstd);
      out[i] = bf16r (normed * scale);
    }
}

cudaError_t
gepard_launch_bias_layer_norm (cudaStream_t stream, const float *acc, const float *bias,
                               float scale, const int *frame_rows, int n_frames, int n, float *x)
{
  return launch (bias_layer_norm_kernel, n_frames, 256, n * sizeof (float), stream, acc, bias,
                 scale, frame_rows, n, x);
}

/* ---- norms ---- */

/* §1.2 on one row of the residual stream by the whole block, after adding `residual` (bf16,
 * rounded sum; NULL: none, and the row is only read) */
__device__ void
rms_norm_row (float *row, const gbf16 *residual, const float *scale, int n, float eps,
              double *scratch, gbf16 *out)
{
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    {
      float v = row[i];
      if (residual != NULL)
        row[i] = v = bf16r (v + ld (residual + i));
      s += (double)v * v;
    }
  float r = inverse_rms (block_sum (s, scratch), n, eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    out[i] = __float2bfloat16_rn ((row[i] * r) * scale[i]);
}

/* §1.2 on the residual stream, a block per row */
__global__ void
rms_norm_kernel (float *x, const gbf16 *residual, const float *scale, int n, float eps, gbf16 *out)
{
  __shared__ double scratch[WARP];
  size_t at = (size_t)blockIdx.x * n;
  rms_norm_row (x + at, residual != NULL ? residual + at : NULL, scale, n, eps, scratch, out + at);
}

cudaError_t
gepard_launch_rms_norm (cudaStream_t stream, float *x, const gbf16 *residual, const float *scale,
                        int n_rows, int n, float eps, gbf16 *out)
{
  return launch (rms_norm_kernel, n_rows, 256, 0, stream, x, residual, scale, n, eps, out);
}

/* the last residual add and the final norm, for each sequence's last row only */
__global__ void
final_norm_kernel (const float *x, const gbf16 *residual, const GepardStepSeq *seqs,
                   const float *scale, int n, float eps, gbf16 *out)
{
  __shared__ double scratch[WARP];
  extern __shared__ float h[];
  size_t row = (size_t)seqs[blockIdx.x].last_row;
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    {
      float v = h[i] = residual != NULL ? bf16r (x[row * n + i] + ld (residual + row * n + i))
                                        : x[row * n + i];
      s += (double)v * v;
    }
  float r = inverse_rms (block_sum (s, scratch), n, eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    out[(size_t)blockIdx.x * n + i] = __float2bfloat16_rn ((h[i] * r) * scale[i]);
}

cudaError_t
gepard_launch_final_norm (cudaStream_t stream, float *x, const gbf16 *residual,
                          const GepardStepSeq *seqs, int n_seqs, const float *scale, int n,
                          float eps, gbf16 *out)
{
  return launch (final_norm_kernel, n_seqs, 256, n * sizeof (float), stream, x, residual, seqs,
                 scale, n, eps, out);
}

/* ---- attention ---- */

__device__ __forceinline__ gbf16 *
kv_at (const GepardKvView &kv, int seq, int layer, int kv_head, int which, int pos, int head_dim)
{
  int block = kv.block_tables[(size_t)seq * kv.max_blocks + pos / GEPARD_KV_BLOCK];
  return kv.pool + (size_t)block * kv.block_elems + (size_t)layer * kv.layer_elems
         + ((size_t)(2 * kv_head + which) * GEPARD_KV_BLOCK + pos % GEPARD_KV_BLOCK) * head_dim;
}

/* §1.4 steps 2–5: per-head zero-centred norm of q and k, RoPE at the row's position (§1.5),
 * k and v into the cache. One block per (row, unit): units are the q heads, then the kv heads'
 * keys, then their values. */
__global__ void
qk_norm_rope_kernel (gbf16 *qkv, const GepardStepRow *rows, GepardDims d, const float *q_scale,
                     const float *k_scale, const float *rope_table, GepardKvView kv, int layer)
{
  __shared__ double scratch[WARP];
  __shared__ float y[256];
  int hd = d.head_dim, nq = d.n_q_heads, nkv = d.n_kv_heads;
  int unit = blockIdx.y;
  GepardStepRow row = rows[blockIdx.x];
  gbf16 *base = qkv + (size_t)blockIdx.x * (nq * 2 + nkv * 2) * hd;

  if (unit >= nq + nkv)
    {
      int j = unit - nq - nkv;
      const gbf16 *src = base + (size_t)(nq * 2 + nkv + j) * hd;
      gbf16 *dst = kv_at (kv, row.seq, layer, j, 1, row.pos, hd);
      for (int i = threadIdx.x; i < hd; i += blockDim.x)
        dst[i] = src[i];
      return;
    }

  gbf16 *src = unit < nq ? base + (size_t)unit * 2 * hd : base + (size_t)(nq * 2 + unit - nq) * hd;
  const float *scale = unit < nq ? q_scale : k_scale;
  double s = 0;
  for (int i = threadIdx.x; i < hd; i += blockDim.x)
    {
      float v = ld (src + i);
      y[i] = v;
      s += (double)v * v;
    }
  float r = inverse_rms (block_sum (s, scratch), hd, d.eps);
  for (int i = threadIdx.x; i < hd; i += blockDim.x)
    y[i] = bf16r ((y[i] * r) * scale[i]);
  __syncthreads ();

  /* half-split RoPE, every product and the sum rounded; dims past rotary_dim pass through */
  int half = d.rotary_dim / 2;
  const float *cs = rope_table + (size_t)row.pos * 2 * half;
  for (int i = threadIdx.x; i < half; i += blockDim.x)
    {
      float c = cs[i], sn = cs[half + i];
      float a = y[i], b = y[i + half];
      y[i] = bf16r (bf16r (a * c) + bf16r (-b * sn));
      y[i + half] = bf16r (bf16r (b * c) + bf16r (a * sn));
    }
  __syncthreads ();

  gbf16 *dst = unit < nq ? src : kv_at (kv, row.seq, layer, unit - nq, 0, row.pos, hd);
  for (int i = threadIdx.x; i < hd; i += blockDim.x)
    dst[i] = __float2bfloat16_rn (y[i]);
}

cudaError_t
gepard_launch_qk_norm_rope (cudaStream_t stream, gbf16 *qkv, const GepardStepRow *rows, int n_rows,
                            const GepardDims *dims, const float *q_scale, const float *k_scale,
                            const float *rope_table, GepardKvView kv, int layer)
{
  dim3 grid (n_rows, dims->n_q_heads + 2 * dims->n_kv_heads);
  int threads = dims->head_dim >= 128 ? 128 : 64;
  return launch (qk_norm_rope_kernel, grid, threads, 0, stream, qkv, rows, *dims, q_scale, k_scale,
                 rope_table, kv, layer);
}

#define ATTN_THREADS 256
#define ATTN_WARPS (ATTN_THREADS / WARP)

/* Eager attention (§1.4 step 6 and the output gate, step 8) for one row and G query heads of
 * one kv head (all `group` of them, or fewer to spread a small batch over more blocks): scores
 * bf16(bf16(q·k) / √hd), fp32 softmax rounded to bf16 after the normalisation, P·V in fp32 rounded
 * to bf16, × bf16(sigmoid(gate)), rounded. The probabilities are rounded after dividing by the full
 * sum, so the scores of all visible keys are kept in shared memory and the pass is two-phase (no
 * online softmax). Each warp takes every ATTN_WARPS-th key; a lane holds HD/32 dims of the G
 * queries. */
template <int HD, int G>
__global__ void
__launch_bounds__ (ATTN_THREADS)
    attention_kernel (const gbf16 *qkv, const GepardStepRow *rows, GepardKvView kv, int layer,
                      int nq, int nkv, int group, float scaling, gbf16 *out)
{
  constexpr int EPL = HD >= WARP ? HD / WARP : 1;
  extern __shared__ float smem[];
  __shared__ float scratch[WARP];
  int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
  int h0 = blockIdx.y * G, j = h0 / group;
  GepardStepRow row = rows[blockIdx.x];
  int visible = row.pos + 1;
  int dim0 = lane * EPL;
  bool active = dim0 < HD;
  const gbf16 *qrow = qkv + (size_t)blockIdx.x * (nq * 2 + nkv * 2) * HD;

  float q[G][EPL];
  for (int g = 0; g < G; g++)
    for (int e = 0; e < EPL; e++)
      q[g][e] = active ? ld (qrow + (size_t)(h0 + g) * 2 * HD + dim0 + e) : 0.0f;

  float *scores = smem; /* [G][visible] */
#pragma unroll 4
  for (int s = warp; s < visible; s += ATTN_WARPS)
    {
      const gbf16 *k = kv_at (kv, row.seq, layer, j, 0, s, HD);
      float kf[EPL];
      if constexpr (EPL == 8)
        {
          uint4 raw = active ? *(const uint4 *)(k + dim0) : make_uint4 (0, 0, 0, 0);
          const gbf16 *kb = (const gbf16 *)&raw;
          for (int e = 0; e < EPL; e++)
            kf[e] = __bfloat162float (kb[e]);
        }
      else
        for (int e = 0; e < EPL; e++)
          kf[e] = active ? ld (k + dim0 + e) : 0.0f;
      for (int g = 0; g < G; g++)
        {
          float dot = 0;
          for (int e = 0; e < EPL; e++)
            dot += q[g][e] * kf[e];
          dot = warp_sum (dot);
          if (lane == 0)
            scores[g * visible + s] = bf16r (bf16r (dot) * scaling);
        }
    }
  __syncthreads ();

  for (int g = 0; g < G; g++)
    {
      float *sg = scores + g * visible;
      float m = -INFINITY;
      for (int s = threadIdx.x; s < visible; s += ATTN_THREADS)
        m = fmaxf (m, sg[s]);
      m = block_max (m, scratch);
      float sum = 0;
      for (int s = threadIdx.x; s < visible; s += ATTN_THREADS)
        sum += sg[s] = expf (sg[s] - m);
      sum = block_sum (sum, scratch);
      for (int s = threadIdx.x; s < visible; s += ATTN_THREADS)
        sg[s] = bf16r (sg[s] / sum);
    }
  __syncthreads ();

  float acc[G][EPL];
  for (int g = 0; g < G; g++)
    for (int e = 0; e < EPL; e++)
      acc[g][e] = 0;
#pragma unroll 4
  for (int s = warp; s < visible; s += ATTN_WARPS)
    {
      const gbf16 *v = kv_at (kv, row.seq, layer, j, 1, s, HD);
      float vf[EPL];
      if constexpr (EPL == 8)
        {
          uint4 raw = active ? *(const uint4 *)(v + dim0) : make_uint4 (0, 0, 0, 0);
          const gbf16 *vb = (const gbf16 *)&raw;
          for (int e = 0; e < EPL; e++)
            vf[e] = __bfloat162float (vb[e]);
        }
      else
        for (int e = 0; e < EPL; e++)
          vf[e] = active ? ld (v + dim0 + e) : 0.0f;
      for (int g = 0; g < G; g++)
        {
          float p = scores[g * visible + s];
          for (int e = 0; e < EPL; e++)
            acc[g][e] += p * vf[e];
        }
    }
  __syncthreads ();

  /* the scores are spent: the same shared memory sums the warps' partial outputs */
  float *partial = smem; /* [ATTN_WARPS][G][HD] */
  if (active)
    for (int g = 0; g < G; g++)
      for (int e = 0; e < EPL; e++)
        partial[((size_t)warp * G + g) * HD + dim0 + e] = acc[g][e];
  __syncthreads ();
  for (int i = threadIdx.x; i < G * HD; i += ATTN_THREADS)
    {
      float o = 0;
      for (int w = 0; w < ATTN_WARPS; w++)
        o += partial[(size_t)w * G * HD + i];
      int g = i / HD, dd = i % HD, h = h0 + g;
      float gate = ld (qrow + (size_t)h * 2 * HD + HD + dd);
      float sig = bf16r (1.0f / (1.0f + expf (-gate)));
      out[(size_t)blockIdx.x * nq * HD + (size_t)h * HD + dd]
          = __float2bfloat16_rn (bf16r (o) * sig);
    }
}

typedef void (*AttentionKernel) (const gbf16 *, const GepardStepRow *, GepardKvView, int, int, int,
                                 int, float, gbf16 *);

static AttentionKernel
attention_kernel_for (int head_dim, int group)
{
#define CASE(hd, g)                                                                                \
  if (head_dim == hd && group == g)                                                                \
    return attention_kernel<hd, g>;
#define CASES(hd) CASE (hd, 1) CASE (hd, 2) CASE (hd, 4) CASE (hd, 8)
  CASES (16)
  CASES (64)
  CASES (128)
  CASES (256)
#undef CASES
#undef CASE
  return NULL;
}

int
gepard_attention_supported (const GepardDims *dims)
{
  return dims->n_kv_heads > 0 && dims->n_q_heads % dims->n_kv_heads == 0
         && attention_kernel_for (dims->head_dim, dims->n_q_heads / dims->n_kv_heads) != NULL
         && attention_kernel_for (dims->head_dim, 1) != NULL;
}

/* Query heads per block: the whole GQA group, so a block reads its keys and values once, unless
 * that leaves most of the GPU idle (few rows, as in a small batch's decode step): then one head
 * per block, the group's blocks sharing their keys through L2. */
static int
heads_per_block (const GepardDims *dims, int n_rows)
{
  static int n_sms;
  if (n_sms == 0)
    {
      int device = 0;
      cudaGetDevice (&device);
      cudaDeviceGetAttribute (&n_sms, cudaDevAttrMultiProcessorCount, device);
      n_sms = n_sms > 0 ? n_sms : 1;
    }
  int group = dims->n_q_heads / dims->n_kv_heads;
  return n_rows * dims->n_kv_heads < n_sms ? 1 : group;
}

static size_t
attention_smem (const GepardDims *dims, int heads, int max_visible)
{
  size_t scores = (size_t)heads * max_visible * sizeof (float);
  size_t partial = (size_t)ATTN_WARPS * heads * dims->head_dim * sizeof (float);
  return scores > partial ? scores : partial;
}

size_t
gepard_attention_smem (const GepardDims *dims, int max_visible)
{
  return attention_smem (dims, dims->n_q_heads / dims->n_kv_heads, max_visible);
}

cudaError_t
gepard_attention_prepare (const GepardDims *dims, size_t max_smem)
{
  int group = dims->n_q_heads / dims->n_kv_heads;
  AttentionKernel kernels[]
      = {attention_kernel_for (dims->head_dim, group), attention_kernel_for (dims->head_dim, 1)};
  for (AttentionKernel kernel : kernels)
    {
      cudaError_t status = cudaFuncSetAttribute (
          (const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)max_smem);
      if (status != cudaSuccess)
        return status;
    }
  return cudaSuccess;
}

cudaError_t
gepard_launch_attention (cudaStream_t stream, const gbf16 *qkv, const GepardStepRow *rows,
                         int n_rows, const GepardDims *dims, GepardKvView kv, int layer,
                         int max_visible, gbf16 *out)
{
  int group = dims->n_q_heads / dims->n_kv_heads;
  int heads = heads_per_block (dims, n_rows);
  AttentionKernel kernel = attention_kernel_for (dims->head_dim, heads);
  /* head_dim^-0.5 as torch's Python float, exact for 1/16 */
  float scaling = (float)pow ((double)dims->head_dim, -0.5);
  dim3 grid (n_rows, dims->n_q_heads / heads);
  return launch (kernel, grid, ATTN_THREADS, attention_smem (dims, heads, max_visible), stream, qkv,
                 rows, kv, layer, dims->n_q_heads, dims->n_kv_heads, group, scaling, out);
}

/* §1.6: bf16(bf16(silu(gate)) · up); gate_up holds [gate | up] per row. One thread per
 * element, so that a single row still spreads over the GPU. */
__global__ void
silu_mul_kernel (const gbf16 *gate_up, size_t n, int intermediate, gbf16 *out)
{
  size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= n)
    return;
  size_t row = idx / intermediate, i = idx % intermediate;
  const gbf16 *gu = gate_up + row * 2 * intermediate;
  float g = ld (gu + i), u = ld (gu + intermediate + i);
  float s = bf16r (g / (1.0f + expf (-g)));
  out[idx] = __float2bfloat16_rn (s * u);
}

cudaError_t
gepard_launch_silu_mul (cudaStream_t stream, const gbf16 *gate_up, int n_rows, int intermediate,
                        gbf16 *out)
{
  size_t n = (size_t)n_rows * intermediate;
  return launch (silu_mul_kernel, (unsigned)((n + 255) / 256), 256, 0, stream, gate_up, n,
                 intermediate, out);
}

/* ---- products of a few rows (decode steps of up to GEPARD_GEMV_MAX_ROWS sequences) ---- */

/* the 8 bf16 of a 16-byte word as floats */
__device__ __forceinline__ void
unpack8 (uint4 v, float *f)
{
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; i++)
    {
      f[2 * i] = __uint_as_float (words[i] << 16);
      f[2 * i + 1] = __uint_as_float (words[i] & 0xffff0000u);
    }
}

/* a weight word: read once per step, so kept out of L1 */
__device__ __forceinline__ uint4
load_weights (const uint4 *p)
{
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

/* acc[r] += w_row · x[r] over `in` columns (a multiple of 8), this lane's share: 16-byte words
 * lane, lane + 32, …; x in shared memory (SHARED) or global */
template <bool SHARED>
__device__ __forceinline__ void
dot_rows (const gbf16 *w_row, const gbf16 *x, int rows, int in, float *acc)
{
  const int lane = threadIdx.x % WARP, words = in / 8;
  const uint4 *wv = reinterpret_cast<const uint4 *> (w_row);
#pragma unroll 4
  for (int k = lane; k < words; k += WARP)
    {
      float wf[8];
      unpack8 (load_weights (wv + k), wf);
#pragma unroll
      for (int r = 0; r < GEPARD_GEMV_MAX_ROWS; r++)
        if (r < rows)
          {
            const uint4 *xv = reinterpret_cast<const uint4 *> (x + (size_t)r * in) + k;
            float xf[8];
            unpack8 (SHARED ? *xv : __ldg (xv), xf);
#pragma unroll
            for (int i = 0; i < 8; i++)
              acc[r] = fmaf (wf[i], xf[i], acc[r]);
          }
    }
#pragma unroll
  for (int r = 0; r < GEPARD_GEMV_MAX_ROWS; r++)
    if (r < rows)
      acc[r] = warp_sum (acc[r]);
}

struct GemvArgs
{
  const gbf16 *w; /* [out][in] */
  const gbf16 *x; /* [rows][in], or NULL where the kernel normalizes norm_x itself */
  /* with NORM: x = RMSNorm(norm_x [rows][in]) · norm_scale (rms_norm_row, no residual: only
   * read) */
  float *norm_x;
  const float *norm_scale;
  float eps;
  int rows, out, in;
  void *y;
  float *x_res;
};

constexpr int GEMV_WARPS = 8;
constexpr int GEMV_THREADS = GEMV_WARPS * WARP;

/* y[r][o] = Σ_i x[r][i] · w[o][i] for rows ≤ GEPARD_GEMV_MAX_ROWS, one warp per output o, summed
 * in fp32 (the GEMM's products, for the few rows of a decode step, without cuBLAS's tiles), then
 * by `MODE`: GEPARD_GEMV_BF16 y in bf16 (as the GEMM would store it); GEPARD_GEMV_F32 y in fp32;
 * GEPARD_GEMV_RESIDUAL the bf16 product added to the residual stream x_res (fp32) and rounded
 * there, as rms_norm_kernel adds its residual; GEPARD_GEMV_SWIGLU outputs o < out/2 only, the gate
 * row o and the up row out/2 + o each rounded to bf16, then silu_mul_kernel's arithmetic.
 * With NORM, each block first normalizes the rows of norm_x into shared memory exactly as
 * rms_norm_kernel would (the same 256 threads and order of sums, so the same bits), in place of
 * a norm kernel before it. */
template <int MODE, bool NORM>
__global__ void
__launch_bounds__ (GEMV_THREADS) gemv_kernel (const __grid_constant__ GemvArgs a)
{
  extern __shared__ __align__ (16) unsigned char gemv_shared[];
  const gbf16 *x = a.x;
  if (NORM)
    {
      __shared__ double scratch[WARP];
      gbf16 *normed = reinterpret_cast<gbf16 *> (gemv_shared);
      for (int r = 0; r < a.rows; r++)
        rms_norm_row (a.norm_x + (size_t)r * a.in, NULL, a.norm_scale, a.in, a.eps, scratch,
                      normed + (size_t)r * a.in);
      __syncthreads ();
      x = normed;
    }
  const int o = blockIdx.x * GEMV_WARPS + threadIdx.x / WARP;
  const int n_outputs = MODE == GEPARD_GEMV_SWIGLU ? a.out / 2 : a.out;
  if (o >= n_outputs)
    return;
  float acc[GEPARD_GEMV_MAX_ROWS] = {};
  dot_rows<NORM> (a.w + (size_t)o * a.in, x, a.rows, a.in, acc);
  float up[GEPARD_GEMV_MAX_ROWS] = {};
  if (MODE == GEPARD_GEMV_SWIGLU)
    dot_rows<NORM> (a.w + (size_t)(n_outputs + o) * a.in, x, a.rows, a.in, up);
  if (threadIdx.x % WARP != 0)
    return;
#pragma unroll
  for (int r = 0; r < GEPARD_GEMV_MAX_ROWS; r++)
    if (r < a.rows)
      {
        size_t at = (size_t)r * n_outputs + o;
        if (MODE == GEPARD_GEMV_F32)
          ((float *)a.y)[at] = acc[r];
        else if (MODE == GEPARD_GEMV_BF16)
          ((gbf16 *)a.y)[at] = __float2bfloat16_rn (acc[r]);
        else if (MODE == GEPARD_GEMV_RESIDUAL)
          a.x_res[at] = bf16r (a.x_res[at] + bf16r (acc[r]));
        else
          {
            float g = bf16r (acc[r]), u = bf16r (up[r]);
            float s = bf16r (g / (1.0f + expf (-g)));
            ((gbf16 *)a.y)[at] = __float2bfloat16_rn (s * u);
          }
      }
}

template <bool NORM>
cudaError_t
launch_gemv (cudaStream_t stream, GepardGemvMode mode, const GemvArgs &a)
{
  const int n_outputs = mode == GEPARD_GEMV_SWIGLU ? a.out / 2 : a.out;
  unsigned blocks = (unsigned)((n_outputs + GEMV_WARPS - 1) / GEMV_WARPS);
  size_t shared = NORM ? (size_t)a.rows * a.in * sizeof (gbf16) : 0;
  switch (mode)
    {
    case GEPARD_GEMV_BF16:
      return launch (gemv_kernel<GEPARD_GEMV_BF16, NORM>, blocks, GEMV_THREADS, shared, stream, a);
    case GEPARD_GEMV_F32:
      return launch (gemv_kernel<GEPARD_GEMV_F32, NORM>, blocks, GEMV_THREADS, shared, stream, a);
    case GEPARD_GEMV_RESIDUAL:
      return launch (gemv_kernel<GEPARD_GEMV_RESIDUAL, NORM>, blocks, GEMV_THREADS, shared, stream,
                     a);
    case GEPARD_GEMV_SWIGLU:
      return launch (gemv_kernel<GEPARD_GEMV_SWIGLU, NORM>, blocks, GEMV_THREADS, shared, stream,
                     a);
    }
  return cudaErrorInvalidValue;
}

cudaError_t
gepard_launch_gemv (cudaStream_t stream, GepardGemvMode mode, const gbf16 *w, const gbf16 *x,
                    int rows, int out, int in, void *y, float *x_res)
{
  GemvArgs a = {w, x, NULL, NULL, 0.0f, rows, out, in, y, x_res};
  return launch_gemv<false> (stream, mode, a);
}

cudaError_t
gepard_launch_gemv_norm (cudaStream_t stream, GepardGemvMode mode, const gbf16 *w, float *x,
                         const float *scale, float eps, int rows, int out, int in, void *y,
                         float *x_res)
{
  GemvArgs a = {w, NULL, x, scale, eps, rows, out, in, y, x_res};
  return launch_gemv<true> (stream, mode, a);
}

/* ---- sampling (§3.4), the arithmetic of gepard-generate.c ---- */

__device__ __forceinline__ uint64_t
rotl (uint64_t x, int k)
{
  return (x << k) | (x >> (64 - k));
}

/* xoshiro256** */
__device__ uint64_t
rng_next (uint64_t *s)
{
  uint64_t result = rotl (s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl (s[3], 45);
  return result;
}

__device__ int
argmax (const float *x, int n)
{
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best])
      best = i; /* first of equal maxima, as torch.argmax */
  return best;
}

/* `draw` is the head's number from the sequence's RNG stream (used only when sampling) */
__device__ int
sample_head (float *logits, int n, const GepardSamplerState *st, const int32_t *history,
             int history_stride, int n_recent, uint64_t draw)
{
  if (st->penalty != 1.0f)
    for (int i = 0; i < n; i++)
      {
        bool seen = false;
        for (int r = 0; r < n_recent && !seen; r++)
          seen = history[(size_t)r * history_stride] == i;
        if (seen)
          logits[i] = logits[i] > 0 ? logits[i] / st->penalty : logits[i] * st->penalty;
      }
  if (st->temperature <= 0)
    return argmax (logits, n);
  if (st->temperature != 1.0f)
    for (int i = 0; i < n; i++)
      logits[i] /= st->temperature;
  if (st->top_k > 0 && st->top_k < n)
    {
      /* the k-th largest value, ties kept: the value with fewer than k larger ones and at
       * least k at or above it (what sorting and taking index k−1 gives) */
      float kth = -INFINITY;
      for (int i = 0; i < n; i++)
        {
          int above = 0, at_or_above = 0;
          for (int m = 0; m < n; m++)
            {
              above += logits[m] > logits[i];
              at_or_above += logits[m] >= logits[i];
            }
          if (above < st->top_k && at_or_above >= st->top_k)
            kth = logits[i];
        }
      for (int i = 0; i < n; i++)
        if (logits[i] < kth)
          logits[i] = -INFINITY;
    }
  float max = logits[argmax (logits, n)], sum = 0;
  for (int i = 0; i < n; i++)
    sum += logits[i] = expf (logits[i] - max);
  double u = (draw >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0;
  for (int i = 0; i < n; i++)
    {
      acc += logits[i];
      if (u < acc && logits[i] > 0)
        return i;
    }
  return argmax (logits, n);
}

/* One warp per sequence: the heads' logits bf16(acc + bias) and the stop logit, then the heads
 * sampled a lane each. The CPU sampler takes one number from the sequence's RNG stream per head,
 * in head order, whenever it samples; every lane steps the stream through all the heads' numbers
 * and keeps its own heads', so each head gets the same number as on the CPU. */
__global__ void
sample_kernel (const float *acc, int acc_stride, const float *bias, const GepardStepSeq *seqs,
               int n_seqs, int n_heads, const int *head_offsets, int n_logits,
               GepardSamplerState *states, int32_t *history, int32_t *codes, float *stop_logits,
               float *logits, float *work)
{
  int b = (blockIdx.x * blockDim.x + threadIdx.x) / WARP, lane = threadIdx.x % WARP;
  if (b >= n_seqs)
    return;
  const float *a = acc + (size_t)b * acc_stride;
  float *l = logits + (size_t)b * n_logits, *w = work + (size_t)b * n_logits;
  GepardStepSeq seq = seqs[b];
  /* text-CFG: u + w·(c − u) over the next sequence's logits, rounded op by op as on the CPU */
  const float *u = seq.guided && b + 1 < n_seqs ? acc + (size_t)(b + 1) * acc_stride : NULL;
  for (int i = lane; i < n_logits; i += WARP)
    {
      float c = bf16r (a[i] + bias[i]);
      l[i] = c;
      if (u != NULL)
        {
          float ui = bf16r (u[i] + bias[i]);
          c = __fadd_rn (ui, __fmul_rn (seq.cfg_scale, __fsub_rn (c, ui)));
        }
      w[i] = c;
    }
  if (lane == 0)
    stop_logits[b] = bf16r (a[n_logits] + bias[n_logits]);
  __syncwarp ();

  GepardSamplerState st = seq.init ? seq.state : states[seq.slot];
  int32_t *hist = history + (size_t)seq.slot * GEPARD_PENALTY_WINDOW * n_heads;
  int n_recent = min (st.n_frames, GEPARD_PENALTY_WINDOW);
  int32_t *out = codes + (size_t)b * n_heads;
  uint64_t draws[GEPARD_CUDA_MAX_HEADS / WARP] = {0};
  if (st.temperature > 0)
    for (int i = 0; i < n_heads; i++)
      {
        uint64_t x = rng_next (st.rng);
        if (i % WARP == lane)
          draws[i / WARP] = x;
      }
  int32_t *ring = hist + (size_t)(st.n_frames % GEPARD_PENALTY_WINDOW) * n_heads;
  for (int i = lane; i < n_heads; i += WARP)
    {
      int code = sample_head (w + head_offsets[i], head_offsets[i + 1] - head_offsets[i], &st,
                              hist + i, n_heads, n_recent, draws[i / WARP]);
      out[i] = code;
      /* a lane reads and writes only its own heads' column of the window */
      ring[i] = code;
    }
  if (lane == 0)
    {
      st.n_frames++;
      states[seq.slot] = st;
    }
}

cudaError_t
gepard_launch_sample (cudaStream_t stream, const float *acc, int acc_stride, const float *bias,
                      const GepardStepSeq *seqs, int n_seqs, int n_heads, const int *head_offsets,
                      int n_logits, GepardSamplerState *states, int32_t *history, int32_t *codes,
                      float *stop_logits, float *logits, float *work)
{
  int threads = 128, per_block = threads / WARP;
  return launch (sample_kernel, (n_seqs + per_block - 1) / per_block, threads, 0, stream, acc,
                 acc_stride, bias, seqs, n_seqs, n_heads, head_offsets, n_logits, states, history,
                 codes, stop_logits, logits, work);
}
