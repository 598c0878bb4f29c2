/* gepard-cuda-codec.cu: NanoCodec's causal decoder on the GPU, the same number of frames (1, 2, 4
 * or 8) for each of a batch of streams per pass (nanocodec.md §2, streaming per §6.1).
 *
 * Layout. Within a pass every stream adds the same number of columns at each layer (F frames'
 * worth), so a layer's activations for the whole batch are one matrix [channels][columns × streams]
 * with the stream index fastest: column t of stream s is at t·B + s. A causal convolution then
 * reads, for tap m, the input shifted by m·dilation columns — a contiguous shift of B·m·dilation in
 * that matrix — and the whole convolution is one implicit GEMM y[o][t·B + s] = b[o] + Σ_m Σ_c
 * W[o][c][m] · act(x)[c][(t + m·d)·B + s] over the virtual input [history | new columns]. The
 * history ((k − 1)·d columns per channel) of every stream lives in a state pool on the device,
 * element (c, h) of stream slot p at state[(c·hist + h)·slot_stride + p], so that a batch of
 * consecutive slots reads it coalesced. Before a convolution a gather builds its virtual input for
 * the batch — each stream's history, kept activated, then the activation of the new columns — and
 * after it the last columns of that input become the histories. Where a layer's output alone would
 * give the GPU few blocks (few streams), the reduction is split over blocks and summed in split
 * order by a second kernel.
 *
 * The module's own kernel runs that implicit GEMM on tensor cores (WMMA, TF32 inputs, fp32
 * accumulation). Because a tap's input is a shift of one matrix, the convolution is also `kernel`
 * plain GEMMs summed into one output, y = Σ_m W_m · X[:, m·d·B :], W_m the tap's [c_out][c_in]
 * weights and X the virtual input read at a column offset: with GEPARD_CUDA_CODEC_GEMM=cublas,
 * cuBLAS runs those (TF32, fp32 accumulation) into a scratch plane and one elementwise kernel adds
 * the bias, the residual and the branch mean (the own kernel serves where cuBLAS cannot be
 * opened). By default (GEPARD_CUDA_CODEC_GEMM=fp16; `own` names the TF32 kernel) a second own
 * kernel runs it with fp16 operands (mma.sync m16n8k16, fp32 accumulation): fp16 keeps TF32's
 * 10-bit mantissa at twice its rate and half its bytes, the gather writes the virtual input in fp16
 * and the weights are uploaded so (a codec with a weight beyond fp16's range runs in TF32).
 * GEPARD_CUDA_CODEC_PEDANTIC=1 sums in plain fp32 with the own kernel (the reference for the error
 * the tensor cores add). Either way the summation order differs from the CPU's, so
 * results agree with gepard-codec.c within a tolerance, not bit for bit. */
#include "gepard-cuda.h"
#include "gepard-cuda-private.h"

#include <cuda_fp16.h>
#include <cuda_profiler_api.h>
#include <mma.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#define GEPARD_CUDA_EXPORT extern "C" __attribute__ ((visibility ("default")))

namespace
{

using Message = GepardCudaMessage;

/* ---- kernels ---- */

/* the GEMM tile: output channels × columns × reduction */
constexpr int TILE_M = 64;
constexpr int TILE_N = 64;
constexpr int TILE_K = 32;
constexpr int CONV_THREADS = 128;
/* a pass covers a multiple of 8 streams, so that every row of a layer's batch matrix starts on
 * 16 bytes (in fp16 as in fp32) and the tiles move in 16-byte copies */
constexpr int PASS_ALIGN = 8;
/* a pass decodes 2^i frames of each stream, i < PASS_FRAME_SIZES: 1, 2, 4 or 8 (a graph each) */
constexpr int PASS_FRAME_SIZES = 4;

struct ActArgs
{
  int enabled;
  int n_snake; /* channels [0, n_snake) Snake, the rest LeakyReLU (0.01) */
  const float *alpha;
  const float *inv_alpha;
};

struct ConvArgs
{
  const float *w;      /* [c_out][k_total]: [kernel][c_in], then zeros */
  const __half *w16;   /* the same for the fp16 kernel */
  const float *bias;   /* [c_out] */
  const int *k_offset; /* [k_total]: c·(hist + n) + m·dilation, in columns of one stream; 0 in
                          the padding */
  int c_in, c_out;
  int k_total;           /* kernel · c_in rounded up to TILE_K */
  int n_cols;            /* n · batch: the output columns */
  int batch;             /* streams */
  int k_split;           /* reduction elements per split (a multiple of TILE_K) */
  const float *xv;       /* the virtual input [c_in][(hist + n) · batch], activated */
  const __half *xv16;    /* the same for the fp16 kernel */
  const float *residual; /* [c_out][n · batch] or NULL: y = residual + conv */
  const float *mean[3];  /* y = (mean[0] + … + y) / (n_mean + 1) */
  int n_mean;
  int output;     /* 0 none, 1 clamp(−1, 1), 2 tanh */
  float *out;     /* [c_out][n · batch] */
  float *partial; /* [splits][c_out][n · batch] where the reduction is split */
};

__device__ __forceinline__ float
activate (const ActArgs &a, int c, float x)
{
  if (c < a.n_snake)
    {
      float s = sinf (a.alpha[c] * x);
      return x + a.inv_alpha[c] * (s * s);
    }
  return x > 0.0f ? x : 0.01f * x;
}

__device__ __forceinline__ void
conv_store (const ConvArgs &a, int o, int j, float acc)
{
  size_t at = (size_t)o * a.n_cols + j;
  float y = acc + a.bias[o];
  if (a.residual != NULL)
    y = a.residual[at] + y;
  if (a.n_mean > 0)
    {
      float sum = a.mean[0][at];
      if (a.n_mean > 1)
        sum += a.mean[1][at];
      if (a.n_mean > 2)
        sum += a.mean[2][at];
      y = (sum + y) / (float)(a.n_mean + 1);
    }
  if (a.output == 1)
    y = fminf (fmaxf (y, -1.0f), 1.0f);
  else if (a.output == 2)
    y = tanhf (y);
  a.out[at] = y;
}

/* Shared-memory rows are padded by 4 floats so that the fragments' column reads fall in
 * different banks. */
constexpr int AS_LD = TILE_K + 4;
constexpr int BS_LD = TILE_N + 4;
constexpr int A_PER_THREAD = TILE_M * TILE_K / CONV_THREADS;
constexpr int B_PER_THREAD = TILE_K * TILE_N / CONV_THREADS;

/* a 16-byte asynchronous copy into shared memory; zeros where `valid` is false */
__device__ __forceinline__ void
copy_async (void *dst, const void *src, bool valid)
{
  unsigned to = (unsigned)__cvta_generic_to_shared (dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src),
               "r"(valid ? 16 : 0));
}

/* The tiles of the reduction chunk at k0 into `as` and `bs`, as one group of asynchronous
 * copies of 4 floats. Weight rows are padded with zeros to a multiple of TILE_K (and their
 * k_offset to a valid column), so only rows past c_out and columns past n_cols are left out; the
 * batch being a multiple of PASS_ALIGN keeps every copy on 16 bytes. */
__device__ __forceinline__ void
fetch_tiles (const ConvArgs &a, int o0, int j0, int k0, float *as, float *bs)
{
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < A_PER_THREAD / 4; i++)
    {
      int idx = tid + i * CONV_THREADS;
      int r = idx / (TILE_K / 4), q = idx % (TILE_K / 4) * 4;
      int o = o0 + r;
      bool valid = o < a.c_out;
      copy_async (as + r * AS_LD + q, valid ? a.w + (size_t)o * a.k_total + k0 + q : a.w, valid);
    }
#pragma unroll
  for (int i = 0; i < B_PER_THREAD / 4; i++)
    {
      int idx = tid + i * CONV_THREADS;
      int q = idx / (TILE_N / 4), col = idx % (TILE_N / 4) * 4;
      int j = j0 + col;
      bool valid = j < a.n_cols;
      copy_async (bs + q * BS_LD + col,
                  valid ? a.xv + (size_t)a.k_offset[k0 + q] * a.batch + j : a.xv, valid);
    }
  asm volatile("cp.async.commit_group;\n" ::);
}

/* One TILE_M × TILE_N tile of a causal convolution over the reduction range of split
 * blockIdx.z. With tensor cores, four warps each own a 32 × 32 quarter as 2 × 2 TF32 fragments;
 * without, each thread sums 8 × 4 outputs in fp32. Element (kk, j) of the right-hand matrix is
 * xv[k_offset[kk]·batch + j]: the tap's shift of the virtual input. Two stages of shared memory:
 * the next chunk is copied in while the current one is multiplied. */
template <bool TENSOR_CORES>
__global__ void
__launch_bounds__ (CONV_THREADS) conv_kernel (const __grid_constant__ ConvArgs a)
{
  constexpr int STAGE = TILE_M * AS_LD + TILE_K * BS_LD;
  __shared__ __align__ (32) float smem[2 * STAGE];
  const int o0 = blockIdx.y * TILE_M, j0 = blockIdx.x * TILE_N;
  const int k_begin = blockIdx.z * a.k_split;
  const int k_end = min (a.k_total, k_begin + a.k_split);
  const int tid = threadIdx.x;

  using namespace nvcuda;
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc_tc[2][2];
  float acc[8][4];
  const int warp = tid / 32, wm = warp / 2, wn = warp % 2;
  const int tr = tid / 16, tc = tid % 16;
  if (TENSOR_CORES)
    {
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int k = 0; k < 2; k++)
          wmma::fill_fragment (acc_tc[i][k], 0.0f);
    }
  else
    {
#pragma unroll
      for (int i = 0; i < 8; i++)
#pragma unroll
        for (int k = 0; k < 4; k++)
          acc[i][k] = 0.0f;
    }

  fetch_tiles (a, o0, j0, k_begin, smem, smem + TILE_M * AS_LD);
  for (int k0 = k_begin, stage = 0; k0 < k_end; k0 += TILE_K, stage ^= 1)
    {
      const float *as = smem + stage * STAGE;
      const float *bs = as + TILE_M * AS_LD;
      if (k0 + TILE_K < k_end)
        {
          float *next = smem + (stage ^ 1) * STAGE;
          fetch_tiles (a, o0, j0, k0 + TILE_K, next, next + TILE_M * AS_LD);
          asm volatile("cp.async.wait_group 1;\n" ::);
        }
      else
        asm volatile("cp.async.wait_group 0;\n" ::);
      __syncthreads ();
      if (TENSOR_CORES)
        {
#pragma unroll
          for (int kq = 0; kq < TILE_K; kq += 8)
            {
              wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major>
                  fa[2];
              wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major>
                  fb[2];
#pragma unroll
              for (int i = 0; i < 2; i++)
                {
                  wmma::load_matrix_sync (fa[i], as + (wm * 32 + i * 16) * AS_LD + kq, AS_LD);
#pragma unroll
                  for (int e = 0; e < fa[i].num_elements; e++)
                    fa[i].x[e] = wmma::__float_to_tf32 (fa[i].x[e]);
                  wmma::load_matrix_sync (fb[i], bs + kq * BS_LD + wn * 32 + i * 16, BS_LD);
#pragma unroll
                  for (int e = 0; e < fb[i].num_elements; e++)
                    fb[i].x[e] = wmma::__float_to_tf32 (fb[i].x[e]);
                }
#pragma unroll
              for (int i = 0; i < 2; i++)
#pragma unroll
                for (int k = 0; k < 2; k++)
                  wmma::mma_sync (acc_tc[i][k], fa[i], fb[k], acc_tc[i][k]);
            }
        }
      else
        {
#pragma unroll
          for (int q = 0; q < TILE_K; q++)
            {
              float bv[4];
#pragma unroll
              for (int k = 0; k < 4; k++)
                bv[k] = bs[q * BS_LD + tc * 4 + k];
#pragma unroll
              for (int i = 0; i < 8; i++)
                {
                  float av = as[(tr * 8 + i) * AS_LD + q];
#pragma unroll
                  for (int k = 0; k < 4; k++)
                    acc[i][k] = fmaf (av, bv[k], acc[i][k]);
                }
            }
        }
      __syncthreads ();
    }

  /* one split: the finished value; several: this split's partial sum */
  float *partial = gridDim.z > 1 ? a.partial + (size_t)blockIdx.z * a.c_out * a.n_cols : NULL;
  if (TENSOR_CORES)
    {
      float *cs = smem; /* [TILE_M][BS_LD], within both input tiles */
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int k = 0; k < 2; k++)
          wmma::store_matrix_sync (cs + (wm * 32 + i * 16) * BS_LD + wn * 32 + k * 16, acc_tc[i][k],
                                   BS_LD, wmma::mem_row_major);
      __syncthreads ();
      for (int idx = tid; idx < TILE_M * TILE_N; idx += CONV_THREADS)
        {
          int r = idx / TILE_N, col = idx % TILE_N;
          int o = o0 + r, j = j0 + col;
          if (o < a.c_out && j < a.n_cols)
            {
              float v = cs[r * BS_LD + col];
              if (partial != NULL)
                partial[(size_t)o * a.n_cols + j] = v;
              else
                conv_store (a, o, j, v);
            }
        }
    }
  else
    {
#pragma unroll
      for (int i = 0; i < 8; i++)
#pragma unroll
        for (int k = 0; k < 4; k++)
          {
            int o = o0 + tr * 8 + i, j = j0 + tc * 4 + k;
            if (o < a.c_out && j < a.n_cols)
              {
                if (partial != NULL)
                  partial[(size_t)o * a.n_cols + j] = acc[i][k];
                else
                  conv_store (a, o, j, acc[i][k]);
              }
          }
    }
}

/* ---- the fp16 implicit GEMM ---- */

/* Tiles of BM output channels × H_BN columns × H_BK reduction elements, eight warps, H_STAGES
 * stages of asynchronous copies in flight. Shared rows are padded by 8 halves (16 bytes) so that
 * the 8 rows an ldmatrix reads fall in 8 different bank groups. */
constexpr int H_BN = 128;
constexpr int H_BK = TILE_K;
constexpr int H_STAGES = 3;
constexpr int H_THREADS = 256;
constexpr int H_A_LD = H_BK + 8;
constexpr int H_B_LD = H_BN + 8;

template <int BM>
__host__ __device__ constexpr int
h_stage_halves ()
{
  return BM * H_A_LD + H_BK * H_B_LD;
}

template <int BM>
constexpr size_t
h_smem_bytes ()
{
  return (size_t)H_STAGES * h_stage_halves<BM> () * sizeof (__half);
}

__device__ __forceinline__ unsigned
shared_address (const void *p)
{
  return (unsigned)__cvta_generic_to_shared (p);
}

/* four 8 × 8 matrices of halves; lane l gives the address of one row of matrix l / 8 */
__device__ __forceinline__ void
load_matrix_x4 (unsigned r[4], const __half *p)
{
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address (p)));
}

/* the same, each matrix transposed on the way */
__device__ __forceinline__ void
load_matrix_x4_trans (unsigned r[4], const __half *p)
{
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address (p)));
}

/* d (16 × 8, fp32) += a (16 × 16, fp16, row-major) · b (16 × 8, fp16, column-major) */
__device__ __forceinline__ void
mma_f16 (float d[4], const unsigned a[4], const unsigned b[2])
{
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* The chunk of the reduction at k0 into `as` [BM][H_A_LD] and `bs` [H_BK][H_B_LD], as 16-byte
 * asynchronous copies of 8 halves; rows past c_out and columns past n_cols read as zeros. */
template <int BM>
__device__ __forceinline__ void
fetch_tiles_f16 (const ConvArgs &a, int o0, int j0, int k0, __half *as, __half *bs)
{
  constexpr int A_CHUNKS = BM * H_BK / 8, B_CHUNKS = H_BK * H_BN / 8;
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < (A_CHUNKS + H_THREADS - 1) / H_THREADS; i++)
    {
      int idx = tid + i * H_THREADS;
      if (A_CHUNKS % H_THREADS != 0 && idx >= A_CHUNKS)
        break;
      int r = idx / (H_BK / 8), q = idx % (H_BK / 8) * 8;
      int o = o0 + r;
      bool valid = o < a.c_out;
      copy_async (as + r * H_A_LD + q, valid ? a.w16 + (size_t)o * a.k_total + k0 + q : a.w16,
                  valid);
    }
#pragma unroll
  for (int i = 0; i < B_CHUNKS / H_THREADS; i++)
    {
      int idx = tid + i * H_THREADS;
      int q = idx / (H_BN / 8), col = idx % (H_BN / 8) * 8;
      int j = j0 + col;
      bool valid = j < a.n_cols;
      copy_async (bs + q * H_B_LD + col,
                  valid ? a.xv16 + (size_t)a.k_offset[k0 + q] * a.batch + j : a.xv16, valid);
    }
}

/* One BM × H_BN tile of a causal convolution over the reduction range of split blockIdx.z, with
 * fp16 operands and fp32 sums: each warp owns a WM × WN piece as (WM / 16) × (WN / 8) m16n8k16
 * products per 16 reduction elements, fragments loaded with ldmatrix (the input tile, stored
 * reduction-major, transposed on the way). Element (kk, j) of the right-hand matrix is
 * xv16[k_offset[kk]·batch + j], as in conv_kernel. */
template <int BM, int WM, int WN>
__global__ void
__launch_bounds__ (H_THREADS) conv_f16_kernel (const __grid_constant__ ConvArgs a)
{
  constexpr int WARPS_N = H_BN / WN, MI = WM / 16, NI = WN / 8;
  constexpr int STAGE = h_stage_halves<BM> ();
  static_assert ((BM / WM) * WARPS_N * 32 == H_THREADS, "eight warps cover the tile");
  static_assert (NI % 2 == 0, "the input fragments come in pairs");
  extern __shared__ __align__ (16) unsigned char smem_bytes[];
  __half *smem = reinterpret_cast<__half *> (smem_bytes);
  const int o0 = blockIdx.y * BM, j0 = blockIdx.x * H_BN;
  const int k_begin = blockIdx.z * a.k_split;
  const int n_chunks = (min (a.k_total, k_begin + a.k_split) - k_begin) / H_BK;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;

  float acc[MI][NI][4] = {};

  /* chunk c lives in stage c % H_STAGES; every iteration commits one group (empty past the end),
   * so waiting for all but the last H_STAGES − 2 groups means chunk c has arrived */
#pragma unroll
  for (int s = 0; s < H_STAGES - 1; s++)
    {
      if (s < n_chunks)
        fetch_tiles_f16<BM> (a, o0, j0, k_begin + s * H_BK, smem + s * STAGE,
                             smem + s * STAGE + BM * H_A_LD);
      asm volatile("cp.async.commit_group;\n" ::);
    }
  for (int c = 0; c < n_chunks; c++)
    {
      asm volatile("cp.async.wait_group %0;\n" ::"n"(H_STAGES - 2));
      /* chunk c is visible to all, and all are done with chunk c − 1, whose stage is refilled */
      __syncthreads ();
      int next = c + H_STAGES - 1;
      if (next < n_chunks)
        {
          __half *st = smem + (next % H_STAGES) * STAGE;
          fetch_tiles_f16<BM> (a, o0, j0, k_begin + next * H_BK, st, st + BM * H_A_LD);
        }
      asm volatile("cp.async.commit_group;\n" ::);

      const __half *as = smem + (c % H_STAGES) * STAGE;
      const __half *bs = as + BM * H_A_LD;
#pragma unroll
      for (int ks = 0; ks < H_BK; ks += 16)
        {
          unsigned af[MI][4], bf[NI][2];
          /* A: lanes 0–15 rows 0–15 at reduction ks, lanes 16–31 the same rows at ks + 8 */
#pragma unroll
          for (int mi = 0; mi < MI; mi++)
            {
              load_matrix_x4 (af[mi],
                              as + (wm * WM + mi * 16 + lane % 16) * H_A_LD + ks + lane / 16 * 8);
            }
            /* B: lanes 0–15 reduction rows ks … ks + 15 at columns 0–7 of the pair, lanes 16–31 at
             * columns 8–15 */
#pragma unroll
          for (int np = 0; np < NI / 2; np++)
            {
              unsigned r[4];
              load_matrix_x4_trans (r, bs + (ks + lane % 16) * H_B_LD + wn * WN + np * 16
                                           + lane / 16 * 8);
              bf[2 * np][0] = r[0];
              bf[2 * np][1] = r[1];
              bf[2 * np + 1][0] = r[2];
              bf[2 * np + 1][1] = r[3];
            }
#pragma unroll
          for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
              mma_f16 (acc[mi][ni], af[mi], bf[ni]);
        }
    }
  asm volatile("cp.async.wait_group 0;\n" ::);

  /* thread (g, t) = (lane / 4, lane % 4) holds rows g and g + 8, columns 2t and 2t + 1 of each
   * product */
  float *partial = gridDim.z > 1 ? a.partial + (size_t)blockIdx.z * a.c_out * a.n_cols : NULL;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int ni = 0; ni < NI; ni++)
#pragma unroll
      for (int h = 0; h < 2; h++)
        {
          int o = o0 + wm * WM + mi * 16 + g + h * 8;
          int j = j0 + wn * WN + ni * 8 + 2 * t;
          /* n_cols is a multiple of 8: both columns are in range or neither */
          if (o >= a.c_out || j >= a.n_cols)
            continue;
#pragma unroll
          for (int e = 0; e < 2; e++)
            {
              float v = acc[mi][ni][2 * h + e];
              if (partial != NULL)
                partial[(size_t)o * a.n_cols + j + e] = v;
              else
                conv_store (a, o, j + e, v);
            }
        }
}

/* idx = (hi · n_mid + mid) · n_lo + lo. The elementwise kernels index in 32 bits (64-bit
 * division is slow on the GPU); codec_init keeps every buffer below 2^31 elements. */
__device__ __forceinline__ void
split_index (unsigned idx, unsigned n_lo, unsigned n_mid, unsigned &lo, unsigned &mid, unsigned &hi)
{
  unsigned rest = idx / n_lo;
  lo = idx - rest * n_lo;
  hi = rest / n_mid;
  mid = rest - hi * n_mid;
}

/* the partial sums of the splits, in split order, then what conv_store adds */
__global__ void
conv_reduce_kernel (const __grid_constant__ ConvArgs a, int splits)
{
  unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned plane = (unsigned)a.c_out * a.n_cols;
  if (idx >= plane)
    return;
  float sum = a.partial[idx];
  for (int z = 1; z < splits; z++)
    sum += a.partial[(size_t)z * plane + idx];
  unsigned o = idx / a.n_cols;
  conv_store (a, (int)o, (int)(idx - o * a.n_cols), sum);
}

/* A convolution's virtual input [c][(hist + n) · batch]: each stream's history (kept activated)
 * then the activation of its n new columns. */
__device__ __forceinline__ void
put (float *p, float x)
{
  *p = x;
}

__device__ __forceinline__ void
put (__half *p, float x)
{
  *p = __float2half_rn (x);
}

__device__ __forceinline__ float
get (const float *p)
{
  return *p;
}

__device__ __forceinline__ float
get (const __half *p)
{
  return __half2float (*p);
}

/* T: float, or __half for the fp16 kernel */
template <typename T>
__global__ void
gather_input_kernel (const float *in, const float *state, int channels, int hist, int n, int batch,
                     int max_streams, const int *slots, ActArgs act, T *xv)
{
  unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
  int length = hist + n;
  if (idx >= (unsigned)channels * length * batch)
    return;
  unsigned s, tv, c;
  split_index (idx, batch, length, s, tv, c);
  float x;
  if ((int)tv < hist)
    x = state[((size_t)c * hist + tv) * max_streams + slots[s]];
  else
    {
      x = in[((size_t)c * n + tv - hist) * batch + s];
      if (act.enabled)
        x = activate (act, c, x);
    }
  put (xv + idx, x);
}

/* after the convolution: each stream's history becomes the last `hist` columns of its virtual
 * input */
template <typename T>
__global__ void
keep_history_kernel (const T *xv, int channels, int hist, int n, int batch, float *state,
                     int max_streams, const int *slots)
{
  unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (unsigned)channels * hist * batch)
    return;
  unsigned s, h, c;
  split_index (idx, batch, hist, s, h, c);
  state[((size_t)c * hist + h) * max_streams + slots[s]]
      = get (xv + ((size_t)c * (hist + n) + n + h) * batch + s);
}

/* §2.3 grouped transposed convolution (groups = out channels, kernel 2·rate, stride rate): output
 * column i·rate + r of channel ch gets frame i's tap r and frame i − 1's tap r + rate from input
 * channels 2ch and 2ch + 1, the older frame first, the bias last. Frame −1 is the stream's last
 * input column of the previous pass, kept in `carry` (pre-activation). */
__global__ void
up_sample_kernel (const float *in, int n_in, int batch, const float *w, const float *bias,
                  int channels, int rate, ActArgs act, const float *carry, int max_streams,
                  const int *slots, float *out)
{
  unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
  int n_out = n_in * rate;
  if (idx >= (unsigned)channels * n_out * batch)
    return;
  unsigned s, u, ch;
  split_index (idx, batch, n_out, s, u, ch);
  int i = (int)u / rate, r = (int)u - i * rate;
  float older = 0.0f, newer = 0.0f;
  for (int p = 0; p < 2; p++)
    {
      int c = 2 * ch + p;
      const float *x = in + (size_t)c * n_in * batch + s;
      float cur = activate (act, c, x[(size_t)i * batch]);
      float prev = i > 0 ? x[(size_t)(i - 1) * batch] : carry[(size_t)c * max_streams + slots[s]];
      prev = activate (act, c, prev);
      const float *wc = w + (size_t)c * 2 * rate;
      older += prev * wc[r + rate];
      newer += cur * wc[r];
    }
  out[idx] = (older + newer) + bias[ch];
}

__global__ void
keep_carry_kernel (const float *in, int channels, int n_in, int batch, float *carry,
                   int max_streams, const int *slots)
{
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= channels * batch)
    return;
  int c = idx / batch, s = idx - c * batch;
  carry[(size_t)c * max_streams + slots[s]] = in[((size_t)c * n_in + n_in - 1) * batch + s];
}

/* zero the whole state of the listed slots */
__global__ void
zero_state_kernel (float *state, size_t per_stream, int max_streams, const int *slots)
{
  size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e < per_stream)
    state[e * max_streams + slots[blockIdx.y]] = 0.0f;
}

/* [n][batch] (stream fastest) → [batch][n] */
__global__ void
unbatch_kernel (const float *in, int n, int batch, float *out)
{
  unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (unsigned)n * batch)
    return;
  unsigned s = idx / n, t = idx - s * n;
  out[idx] = in[(size_t)t * batch + s];
}

/* returns a failed launch's status from the enclosing function */
#define RETURN_IF_FAILED(expr)                                                                     \
  do                                                                                               \
    {                                                                                              \
      cudaError_t status_ = (expr);                                                                \
      if (status_ != cudaSuccess)                                                                  \
        return status_;                                                                            \
    }                                                                                              \
  while (0)

/* blocks of 256 threads for `total` threads */
inline unsigned
blocks_for (size_t total)
{
  return (unsigned)((total + 255) / 256);
}

/* ---- the decoder's layers ---- */

struct Act
{
  int channels = 0;
  int n_snake = 0;
  float *alpha = NULL;
  float *inv_alpha = NULL;
};

struct Conv
{
  int c_in = 0, c_out = 0, kernel = 0, dilation = 1, hist = 0;
  int n = 0;     /* new columns per stream and frame */
  int k_pad = 0; /* kernel · c_in rounded up to TILE_K */
  float *w = NULL;
  __half *w16 = NULL; /* w in fp16, for the fp16 kernel instead */
  /* for cuBLAS instead of w: [kernel][c_out][c_in_pad], each tap's matrix on its own, rows of
   * c_in_pad (c_in rounded up to 4) floats so that every tap and row starts on 16 bytes */
  float *w_taps = NULL;
  int c_in_pad = 0;
  float *bias = NULL;
  /* for passes of 1, 2, 4 and 8 frames: each reduction element's input column (ConvArgs) */
  int *k_offset[PASS_FRAME_SIZES] = {};
  size_t state = 0; /* offset of its history piece, in floats per stream */
};

struct Block
{
  Act act_in, act_skip;
  Conv conv_in, conv_skip;
};

struct Stage
{
  int c_in = 0, channels = 0, rate = 0;
  int n_in = 0; /* columns per frame entering the stage */
  Act act;
  float *up_w = NULL;
  float *up_b = NULL;
  size_t carry = 0;
  Block blocks[4][4];
};

} // namespace

struct _GepardCudaCodec
{
  int device = 0;
  cudaStream_t stream = NULL;
  bool tensor_cores = true;
  bool f16 = false;       /* the convolutions' GEMMs in the own fp16 kernel */
  bool f16_unfit = false; /* a weight that fp16 cannot hold stopped the loading */
  /* the convolutions' GEMMs through cuBLAS (else the own kernel); blas_status: its last failure */
  const GepardCudaBlas *blas = NULL;
  cublasHandle_t blas_handle = NULL;
  cublasStatus_t blas_status = CUBLAS_STATUS_SUCCESS;
  float *gemm_out = NULL; /* [c_out][n · batch] of the largest convolution */
  GepardCudaCodecConfig config;
  Conv pre_conv, post_conv;
  Act post_act;
  Stage stages[8];
  std::vector<void *> allocations;
  size_t weight_bytes = 0;

  size_t state_floats = 0; /* per stream */
  /* slots in the state pool: max_streams, then one where the streams that pad a pass to a
   * multiple of PASS_ALIGN write what nobody reads */
  int slot_stride = 0;
  int max_batch = 0; /* max_streams rounded up to PASS_ALIGN */
  float *state = NULL;
  size_t buffer_floats = 0; /* per buffer */
  float *buffers[8] = {};
  int n_buffers = 0;
  size_t input_floats = 0; /* a convolution's virtual input, per stream */
  float *input = NULL;
  size_t partial_floats = 0;
  float *partial = NULL;
  int target_blocks = 0;
  float *d_latent = NULL;
  int *d_slots = NULL;
  float *d_out = NULL;
  float *h_latent = NULL;
  int *h_slots = NULL;
  float *h_out = NULL;

  bool use_graphs = true;
  int profile_batch = 0;
  std::map<int, cudaGraphExec_t> graphs; /* a captured pass per batch size and frame count */

  std::mutex lock;
  std::vector<int> free_streams;
  std::vector<char> fresh; /* the slot's state must be zeroed before its next frame */
};

namespace
{

template <typename T>
cudaError_t
codec_alloc (GepardCudaCodec *codec, T **ptr, size_t count)
{
  void *p = NULL;
  cudaError_t status = cudaMalloc (&p, std::max<size_t> (count * sizeof (T), 1));
  if (status == cudaSuccess)
    codec->allocations.push_back (p);
  *ptr = (T *)p;
  return status;
}

template <typename T>
int
upload (GepardCudaCodec *codec, T **dst, const std::vector<T> &v, Message &msg)
{
  CUDA_TRY (codec_alloc (codec, dst, v.size ()), "Allocating the codec's weights");
  CUDA_TRY (cudaMemcpy (*dst, v.data (), v.size () * sizeof (T), cudaMemcpyHostToDevice),
            "Uploading the codec's weights");
  codec->weight_bytes += v.size () * sizeof (T);
  return 0;
}

/* a named fp32 tensor with exactly n elements */
int
fetch (GepardCudaTensorLookup lookup, void *user_data, const std::string &name, size_t n,
       std::vector<float> &out, Message &msg)
{
  GepardCudaTensor t;
  if (lookup (user_data, name.c_str (), &t) != 0)
    return msg.fail ("The codec has no tensor %s", name.c_str ());
  size_t count = 1;
  for (int d = 0; d < t.n_dims; d++)
    count *= (size_t)t.shape[d];
  if (t.dtype != GEPARD_CUDA_DTYPE_F32 || count != n)
    return msg.fail ("The codec's tensor %s has %zu elements where %zu were expected",
                     name.c_str (), count, n);
  const float *data = (const float *)t.data;
  out.assign (data, data + n);
  return 0;
}

int
load_act (GepardCudaCodec *codec, Act &act, int channels, GepardCudaTensorLookup lookup,
          void *user_data, const std::string &name, Message &msg)
{
  act.channels = channels;
  act.n_snake = codec->config.half_snake ? channels / 2 : 0;
  if (act.n_snake == 0)
    return 0;
  std::vector<float> alpha;
  if (fetch (lookup, user_data, name + ".activation.snake_act.alpha", act.n_snake, alpha, msg) != 0)
    return -1;
  /* NeMo's reciprocal (alpha + 1e-9) in fp32 */
  std::vector<float> inv (alpha.size ());
  for (size_t i = 0; i < alpha.size (); i++)
    inv[i] = 1.0f / (alpha[i] + 1e-9f);
  if (upload (codec, &act.alpha, alpha, msg) != 0 || upload (codec, &act.inv_alpha, inv, msg) != 0)
    return -1;
  return 0;
}

/* W [c_out][c_in][k] in the layout of the GEMM that runs the convolutions: for the own kernels
 * [c_out][k][c_in], their reduction order (in fp16 for the fp16 kernel), with the input column of
 * each reduction element; for cuBLAS [k][c_out][c_in_pad], each tap's matrix on its own. */
int
load_conv (GepardCudaCodec *codec, Conv &conv, int c_in, int c_out, int kernel, int dilation, int n,
           GepardCudaTensorLookup lookup, void *user_data, const std::string &name, Message &msg)
{
  conv.c_in = c_in;
  conv.c_out = c_out;
  conv.kernel = kernel;
  conv.dilation = dilation;
  conv.hist = (kernel - 1) * dilation;
  conv.n = n;
  conv.state = codec->state_floats;
  codec->state_floats += (size_t)c_in * conv.hist;
  codec->input_floats = std::max (codec->input_floats, (size_t)c_in * (conv.hist + n));
  conv.k_pad = (kernel * c_in + TILE_K - 1) / TILE_K * TILE_K;
  std::vector<float> w, bias;
  if (fetch (lookup, user_data, name + ".conv.weight", (size_t)c_out * c_in * kernel, w, msg) != 0
      || fetch (lookup, user_data, name + ".conv.bias", c_out, bias, msg) != 0
      || upload (codec, &conv.bias, bias, msg) != 0)
    return -1;
  if (codec->blas != NULL)
    {
      conv.c_in_pad = (c_in + 3) / 4 * 4;
      std::vector<float> taps ((size_t)kernel * c_out * conv.c_in_pad, 0.0f);
      for (int m = 0; m < kernel; m++)
        for (int o = 0; o < c_out; o++)
          for (int c = 0; c < c_in; c++)
            taps[((size_t)m * c_out + o) * conv.c_in_pad + c]
                = w[((size_t)o * c_in + c) * kernel + m];
      return upload (codec, &conv.w_taps, taps, msg);
    }
  for (int i = 0; i < PASS_FRAME_SIZES; i++)
    {
      int columns = n << i; /* new columns per stream in a pass of 2^i frames */
      std::vector<int> offsets (conv.k_pad, 0);
      for (int m = 0; m < kernel; m++)
        for (int c = 0; c < c_in; c++)
          offsets[(size_t)m * c_in + c] = c * (conv.hist + columns) + m * dilation;
      CUDA_TRY (codec_alloc (codec, &conv.k_offset[i], offsets.size ()),
                "Allocating the codec's weights");
      CUDA_TRY (cudaMemcpy (conv.k_offset[i], offsets.data (), offsets.size () * sizeof (int),
                            cudaMemcpyHostToDevice),
                "Uploading the codec's weights");
    }
  std::vector<float> packed ((size_t)c_out * conv.k_pad, 0.0f);
  for (int o = 0; o < c_out; o++)
    for (int c = 0; c < c_in; c++)
      for (int m = 0; m < kernel; m++)
        packed[(size_t)o * conv.k_pad + (size_t)m * c_in + c]
            = w[((size_t)o * c_in + c) * kernel + m];
  if (!codec->f16)
    return upload (codec, &conv.w, packed, msg);
  std::vector<__half> halves (packed.size ());
  for (size_t i = 0; i < packed.size (); i++)
    {
      if (!(fabsf (packed[i]) <= 65504.0f))
        {
          codec->f16_unfit = true;
          return msg.fail ("The codec's tensor %s.conv.weight has a value (%g) that fp16 cannot "
                           "hold; GEPARD_CUDA_CODEC_GEMM=own runs the codec in TF32",
                           name.c_str (), packed[i]);
        }
      halves[i] = __float2half_rn (packed[i]);
    }
  return upload (codec, &conv.w16, halves, msg);
}

int
load_weights (GepardCudaCodec *codec, GepardCudaTensorLookup lookup, void *user_data, Message &msg)
{
  const GepardCudaCodecConfig &c = codec->config;
  const std::string dec = "audio_decoder.";
  if (load_conv (codec, codec->pre_conv, c.latent_dim, c.base_channels, c.in_kernel_size, 1, 1,
                 lookup, user_data, dec + "pre_conv", msg)
      != 0)
    return -1;
  int channels = c.base_channels, n_in = 1;
  for (int i = 0; i < c.n_stages; i++)
    {
      Stage &st = codec->stages[i];
      std::string si = std::to_string (i);
      st.c_in = channels;
      st.channels = channels / 2;
      st.rate = c.up_sample_rates[i];
      st.n_in = n_in;
      if (load_act (codec, st.act, st.c_in, lookup, user_data, dec + "activations." + si, msg) != 0)
        return -1;
      std::vector<float> w, b;
      if (fetch (lookup, user_data, dec + "up_sample_conv_layers." + si + ".conv.weight",
                 (size_t)st.c_in * 2 * st.rate, w, msg)
              != 0
          || fetch (lookup, user_data, dec + "up_sample_conv_layers." + si + ".conv.bias",
                    st.channels, b, msg)
                 != 0
          || upload (codec, &st.up_w, w, msg) != 0 || upload (codec, &st.up_b, b, msg) != 0)
        return -1;
      st.carry = codec->state_floats;
      codec->state_floats += st.c_in;
      for (int j = 0; j < c.n_kernels; j++)
        for (int m = 0; m < c.n_dilations; m++)
          {
            Block &bl = st.blocks[j][m];
            std::string name = dec + "res_layers." + si + ".res_blocks." + std::to_string (j)
                               + ".res_blocks." + std::to_string (m) + ".";
            if (load_act (codec, bl.act_in, st.channels, lookup, user_data,
                          name + "input_activation", msg)
                    != 0
                || load_act (codec, bl.act_skip, st.channels, lookup, user_data,
                             name + "skip_activation", msg)
                       != 0
                || load_conv (codec, bl.conv_in, st.channels, st.channels, c.kernels[j],
                              c.dilations[m], n_in * st.rate, lookup, user_data,
                              name + "input_conv", msg)
                       != 0
                || load_conv (codec, bl.conv_skip, st.channels, st.channels, c.kernels[j], 1,
                              n_in * st.rate, lookup, user_data, name + "skip_conv", msg)
                       != 0)
              return -1;
          }
      channels = st.channels;
      n_in *= st.rate;
    }
  if (load_act (codec, codec->post_act, channels, lookup, user_data, dec + "post_activation", msg)
          != 0
      || load_conv (codec, codec->post_conv, channels, 1, c.out_kernel_size, 1, n_in, lookup,
                    user_data, dec + "post_conv", msg)
             != 0)
    return -1;
  if (n_in != c.samples_per_frame)
    return msg.fail ("The codec's up-sampling rates give %d samples per frame, not %d", n_in,
                     c.samples_per_frame);
  return 0;
}

ActArgs
act_args (const Act *act)
{
  ActArgs a = {};
  if (act != NULL)
    {
      a.enabled = 1;
      a.n_snake = act->n_snake;
      a.alpha = act->alpha;
      a.inv_alpha = act->inv_alpha;
    }
  return a;
}

/* The fp16 kernel's rows per tile for c_out output channels: the widest tile whose padding
 * costs at most a tenth more rows than the next narrower one's. */
int
f16_tile_rows (int c_out)
{
  auto padded = [c_out] (int rows) { return (c_out + rows - 1) / rows * rows; };
  if (padded (128) * 10 <= padded (64) * 11)
    return 128;
  if (padded (64) * 10 <= padded (32) * 11)
    return 64;
  return 32;
}

/* the fp16 kernels may take more shared memory than the 48 KiB a launch gets by default */
cudaError_t
allow_f16_shared_memory ()
{
  RETURN_IF_FAILED (cudaFuncSetAttribute (conv_f16_kernel<128, 64, 32>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int)h_smem_bytes<128> ()));
  RETURN_IF_FAILED (cudaFuncSetAttribute (conv_f16_kernel<64, 32, 32>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int)h_smem_bytes<64> ()));
  return cudaFuncSetAttribute (conv_f16_kernel<32, 32, 16>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)h_smem_bytes<32> ());
}

/* The convolution's GEMM with one of the module's own kernels, its reduction split over several
 * blocks where the output alone would leave the GPU mostly idle. */
cudaError_t
run_own_gemm (GepardCudaCodec *codec, ConvArgs a, size_t plane)
{
  const int tile_m = codec->f16 ? f16_tile_rows (a.c_out) : TILE_M;
  const int tile_n = codec->f16 ? H_BN : TILE_N;
  dim3 grid ((a.n_cols + tile_n - 1) / tile_n, (a.c_out + tile_m - 1) / tile_m, 1);
  int chunks = (a.k_total + TILE_K - 1) / TILE_K;
  int splits = std::max (1, codec->target_blocks / (int)(grid.x * grid.y));
  splits = std::min ({splits, chunks, (int)std::max<size_t> (1, codec->partial_floats / plane)});
  a.k_split = (chunks + splits - 1) / splits * TILE_K;
  grid.z = (a.k_total + a.k_split - 1) / a.k_split;
  cudaStream_t stream = codec->stream;
  if (codec->f16 && tile_m == 128)
    RETURN_IF_FAILED (
        launch (conv_f16_kernel<128, 64, 32>, grid, H_THREADS, h_smem_bytes<128> (), stream, a));
  else if (codec->f16 && tile_m == 64)
    RETURN_IF_FAILED (
        launch (conv_f16_kernel<64, 32, 32>, grid, H_THREADS, h_smem_bytes<64> (), stream, a));
  else if (codec->f16)
    RETURN_IF_FAILED (
        launch (conv_f16_kernel<32, 32, 16>, grid, H_THREADS, h_smem_bytes<32> (), stream, a));
  else if (codec->tensor_cores)
    RETURN_IF_FAILED (launch (conv_kernel<true>, grid, CONV_THREADS, 0, stream, a));
  else
    RETURN_IF_FAILED (launch (conv_kernel<false>, grid, CONV_THREADS, 0, stream, a));
  if (grid.z > 1)
    RETURN_IF_FAILED (launch (conv_reduce_kernel, blocks_for (plane), 256, 0, stream, a, grid.z));
  return cudaSuccess;
}

/* One causal convolution over the batch, 2^frames_log2 frames of each stream: its virtual input
 * (histories, then the activated new columns), the GEMM, and the histories kept for the next
 * pass. */
cudaError_t
run_conv (GepardCudaCodec *codec, const Conv &conv, const Act *act, const float *in, int batch,
          int frames_log2, const float *residual, const float *const *mean, int n_mean, int output,
          float *out)
{
  const int max_streams = codec->slot_stride;
  float *state = codec->state + conv.state * max_streams;
  int n = conv.n << frames_log2;
  int length = conv.hist + n;
  size_t total = (size_t)conv.c_in * length * batch;
  __half *input16 = reinterpret_cast<__half *> (codec->input);
  if (codec->f16)
    RETURN_IF_FAILED (launch (gather_input_kernel<__half>, blocks_for (total), 256, 0,
                              codec->stream, in, state, conv.c_in, conv.hist, n, batch, max_streams,
                              codec->d_slots, act_args (act), input16));
  else
    RETURN_IF_FAILED (launch (gather_input_kernel<float>, blocks_for (total), 256, 0, codec->stream,
                              in, state, conv.c_in, conv.hist, n, batch, max_streams,
                              codec->d_slots, act_args (act), codec->input));

  ConvArgs a = {};
  a.w = conv.w;
  a.w16 = conv.w16;
  a.bias = conv.bias;
  a.k_offset = conv.k_offset[frames_log2];
  a.c_in = conv.c_in;
  a.c_out = conv.c_out;
  a.k_total = conv.k_pad;
  a.n_cols = n * batch;
  a.batch = batch;
  a.xv = codec->input;
  a.xv16 = input16;
  a.residual = residual;
  for (int i = 0; i < n_mean; i++)
    a.mean[i] = mean[i];
  a.n_mean = n_mean;
  a.output = output;
  a.out = out;
  a.partial = codec->partial;
  size_t plane = (size_t)conv.c_out * a.n_cols;
  if (codec->blas != NULL)
    {
      /* tap m: gemm_out [c_out][n_cols] += W_m [c_out][c_in] · X [c_in][n_cols] read at column
       * m·d·batch of the virtual input; column-major for cuBLAS, that is
       * out^T (n_cols × c_out) = X^T (n_cols × c_in) · W_m^T (c_in × c_out) */
      const float one = 1.0f, zero = 0.0f;
      for (int m = 0; m < conv.kernel; m++)
        {
          cublasStatus_t bs = codec->blas->gemm_ex (
              codec->blas_handle, CUBLAS_OP_N, CUBLAS_OP_N, a.n_cols, conv.c_out, conv.c_in, &one,
              codec->input + (size_t)m * conv.dilation * batch, CUDA_R_32F, length * batch,
              conv.w_taps + (size_t)m * conv.c_out * conv.c_in_pad, CUDA_R_32F, conv.c_in_pad,
              m == 0 ? &zero : &one, codec->gemm_out, CUDA_R_32F, a.n_cols,
              CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
          if (bs != CUBLAS_STATUS_SUCCESS)
            {
              codec->blas_status = bs;
              return cudaErrorUnknown;
            }
        }
      a.partial = codec->gemm_out;
      RETURN_IF_FAILED (
          launch (conv_reduce_kernel, blocks_for (plane), 256, 0, codec->stream, a, 1));
    }
  else
    RETURN_IF_FAILED (run_own_gemm (codec, a, plane));

  if (conv.hist > 0)
    {
      size_t kept = (size_t)conv.c_in * conv.hist * batch;
      if (codec->f16)
        RETURN_IF_FAILED (launch (keep_history_kernel<__half>, blocks_for (kept), 256, 0,
                                  codec->stream, input16, conv.c_in, conv.hist, n, batch, state,
                                  max_streams, codec->d_slots));
      else
        RETURN_IF_FAILED (launch (keep_history_kernel<float>, blocks_for (kept), 256, 0,
                                  codec->stream, codec->input, conv.c_in, conv.hist, n, batch,
                                  state, max_streams, codec->d_slots));
    }
  return cudaGetLastError ();
}

/* §2.2 one stage: activation, transposed convolution, then the residual layer — kernels in
 * parallel branches of dilated blocks, averaged. `x` holds the stage's input and receives its
 * output. */
cudaError_t
run_stage (GepardCudaCodec *codec, const Stage &st, float *x, int batch, int frames_log2)
{
  const GepardCudaCodecConfig &c = codec->config;
  float *y = codec->buffers[1], *t = codec->buffers[2], **branch = codec->buffers + 3;
  int n_in = st.n_in << frames_log2;
  int n = n_in * st.rate;
  ActArgs act = act_args (&st.act);
  size_t total = (size_t)st.channels * n * batch;
  RETURN_IF_FAILED (launch (up_sample_kernel, blocks_for (total), 256, 0, codec->stream, x, n_in,
                            batch, st.up_w, st.up_b, st.channels, st.rate, act,
                            codec->state + st.carry * codec->slot_stride, codec->slot_stride,
                            codec->d_slots, y));
  int threads = st.c_in * batch;
  RETURN_IF_FAILED (launch (keep_carry_kernel, blocks_for (threads), 256, 0, codec->stream, x,
                            st.c_in, n_in, batch, codec->state + st.carry * codec->slot_stride,
                            codec->slot_stride, codec->d_slots));
  for (int j = 0; j < c.n_kernels; j++)
    for (int m = 0; m < c.n_dilations; m++)
      {
        const Block &bl = st.blocks[j][m];
        const float *h = m == 0 ? y : branch[j];
        bool last = j == c.n_kernels - 1 && m == c.n_dilations - 1;
        cudaError_t status
            = run_conv (codec, bl.conv_in, &bl.act_in, h, batch, frames_log2, NULL, NULL, 0, 0, t);
        if (status == cudaSuccess)
          status = run_conv (codec, bl.conv_skip, &bl.act_skip, t, batch, frames_log2, h, branch,
                             last ? j : 0, 0, last ? x : branch[j]);
        if (status != cudaSuccess)
          return status;
      }
  return cudaSuccess;
}

/* every kernel of a pass of 2^frames_log2 frames over n streams, from the latent
 * ([latent_dim][frames][n]) to the samples in d_out ([n][frames · samples_per_frame]) */
cudaError_t
run_pass (GepardCudaCodec *codec, int n, int frames_log2)
{
  const GepardCudaCodecConfig &c = codec->config;
  float *x = codec->buffers[0];
  cudaError_t status = run_conv (codec, codec->pre_conv, NULL, codec->d_latent, n, frames_log2,
                                 NULL, NULL, 0, 0, x);
  for (int i = 0; i < c.n_stages && status == cudaSuccess; i++)
    status = run_stage (codec, codec->stages[i], x, n, frames_log2);
  if (status != cudaSuccess)
    return status;
  float *pcm = codec->buffers[1];
  status = run_conv (codec, codec->post_conv, &codec->post_act, x, n, frames_log2, NULL, NULL, 0,
                     c.output_tanh ? 2 : 1, pcm);
  if (status != cudaSuccess)
    return status;
  int columns = c.samples_per_frame << frames_log2;
  size_t total = (size_t)columns * n;
  RETURN_IF_FAILED (launch (unbatch_kernel, blocks_for (total), 256, 0, codec->stream, pcm, columns,
                            n, codec->d_out));
  return cudaGetLastError ();
}

void
drop_graphs (GepardCudaCodec *codec)
{
  for (auto &g : codec->graphs)
    cudaGraphExecDestroy (g.second);
  codec->graphs.clear ();
}

/* The streams a pass over n streams runs: a multiple of PASS_ALIGN and, where passes are captured,
 * one of the bucketed sizes (gepard_batch_bucket), so that a few dozen graphs serve every n. */
int
pass_streams (int n, bool bucketed)
{
  int size = bucketed ? gepard_batch_bucket (n) : n;
  return (size + PASS_ALIGN - 1) / PASS_ALIGN * PASS_ALIGN;
}

/* A pass as one graph launch: its kernels depend only on the number of streams and frames (inputs
 * are read from the same device buffers every time), so one capture per batch size and frame
 * count serves every later pass of that shape. Where capture fails, passes run uncaptured from
 * then on. */
cudaError_t
run_pass_graph (GepardCudaCodec *codec, int n, int frames_log2)
{
  int key = n * PASS_FRAME_SIZES + frames_log2;
  auto it = codec->graphs.find (key);
  if (it == codec->graphs.end ())
    {
      cudaGraph_t captured = NULL;
      cudaGraphExec_t exec = NULL;
      cudaError_t status = cudaStreamBeginCapture (codec->stream, cudaStreamCaptureModeThreadLocal);
      if (status != cudaSuccess)
        return status;
      cudaError_t result = run_pass (codec, n, frames_log2);
      status = cudaStreamEndCapture (codec->stream, &captured);
      if (result == cudaSuccess && status == cudaSuccess)
        status = cudaGraphInstantiate (&exec, captured, 0);
      if (captured != NULL)
        cudaGraphDestroy (captured);
      if (result != cudaSuccess || status != cudaSuccess)
        {
          cudaGetLastError ();
          codec->use_graphs = false;
          return run_pass (codec, n, frames_log2);
        }
      /* batch sizes wander as streams come and go: bound what is kept */
      if (codec->graphs.size () >= 256)
        drop_graphs (codec);
      it = codec->graphs.emplace (key, exec).first;
    }
  return cudaGraphLaunch (it->second, codec->stream);
}

} // namespace

GEPARD_CUDA_EXPORT void
gepard_cuda_codec_free (GepardCudaCodec *codec)
{
  if (codec == NULL)
    return;
  cudaSetDevice (codec->device);
  if (codec->stream != NULL)
    cudaStreamSynchronize (codec->stream);
  drop_graphs (codec);
  if (codec->blas_handle != NULL)
    codec->blas->destroy (codec->blas_handle);
  for (void *p : codec->allocations)
    cudaFree (p);
  cudaFreeHost (codec->h_latent);
  cudaFreeHost (codec->h_slots);
  cudaFreeHost (codec->h_out);
  if (codec->stream != NULL)
    cudaStreamDestroy (codec->stream);
  delete codec;
}

namespace
{

int
codec_init (GepardCudaCodec *codec, int device, const GepardCudaCodecConfig *c, const char *gemm,
            GepardCudaTensorLookup lookup, void *user_data, Message &msg)
{
  if (c->latent_dim < 1 || c->base_channels < 2 || c->n_stages < 1 || c->n_stages > 8
      || c->n_kernels < 1 || c->n_kernels > 4 || c->n_dilations < 1 || c->n_dilations > 4
      || c->max_streams < 1 || c->samples_per_frame < 1 || c->in_kernel_size < 1
      || c->out_kernel_size < 1)
    return msg.fail ("The GPU codec cannot run this codec shape");
  codec->device = device;
  codec->config = *c;
  const char *pedantic = getenv ("GEPARD_CUDA_CODEC_PEDANTIC");
  codec->tensor_cores = pedantic == NULL || strcmp (pedantic, "1") != 0;
  const char *graphs = getenv ("GEPARD_CUDA_GRAPHS");
  codec->use_graphs = graphs == NULL || strcmp (graphs, "0") != 0;
  const char *profile = getenv ("GEPARD_CUDA_CODEC_PROFILE");
  codec->profile_batch = profile != NULL ? atoi (profile) : 0;
  CUDA_TRY (cudaSetDevice (device), "Selecting the GPU");
  CUDA_TRY (cudaStreamCreateWithFlags (&codec->stream, cudaStreamNonBlocking), "Creating a stream");
  codec->f16 = codec->tensor_cores && strcmp (gemm, "fp16") == 0;
  if (codec->f16)
    CUDA_TRY (allow_f16_shared_memory (), "Preparing the codec's fp16 kernels");
  if (codec->tensor_cores && strcmp (gemm, "cublas") == 0)
    {
      /* where cuBLAS cannot be opened, the own kernel serves */
      Message quiet = {NULL, 0};
      codec->blas = gepard_cuda_blas (quiet);
      if (codec->blas != NULL && codec->blas->create (&codec->blas_handle) != CUBLAS_STATUS_SUCCESS)
        codec->blas = NULL;
    }
  if (codec->blas != NULL)
    {
      codec->blas->set_stream (codec->blas_handle, codec->stream);
      /* a workspace of its own, so that cuBLAS allocates nothing while a pass is being captured */
      const size_t workspace_bytes = (size_t)32 << 20;
      char *workspace = NULL;
      CUDA_TRY (codec_alloc (codec, &workspace, workspace_bytes),
                "Allocating the cuBLAS workspace");
      if (codec->blas->set_workspace (codec->blas_handle, workspace, workspace_bytes)
          != CUBLAS_STATUS_SUCCESS)
        return msg.fail ("cuBLAS refuses its workspace");
    }
  if (load_weights (codec, lookup, user_data, msg) != 0)
    return -1;

  /* the largest activation of one frame: [channels][columns] at any stage */
  size_t per_frame = c->base_channels;
  for (int i = 0; i < c->n_stages; i++)
    per_frame = std::max (per_frame, (size_t)codec->stages[i].channels * codec->stages[i].n_in
                                         * codec->stages[i].rate);
  per_frame = std::max (per_frame, (size_t)c->samples_per_frame);
  codec->slot_stride = c->max_streams + 1;
  codec->max_batch = pass_streams (c->max_streams, true);
  int streams = codec->max_batch;
  codec->buffer_floats = per_frame * streams;
  /* the elementwise kernels index in 32 bits */
  if (codec->buffer_floats >= (size_t)INT32_MAX
      || codec->input_floats * (size_t)streams >= (size_t)INT32_MAX)
    return msg.fail ("The GPU codec cannot decode %d streams at once: its batch buffers would pass "
                     "2^31 elements; lower GEPARD_GPU_MAX_SEQUENCES",
                     c->max_streams);
  codec->n_buffers = 3 + c->n_kernels;
  for (int i = 0; i < codec->n_buffers; i++)
    CUDA_TRY (codec_alloc (codec, &codec->buffers[i], codec->buffer_floats),
              "Allocating the codec's batch buffers");
  CUDA_TRY (codec_alloc (codec, &codec->input, codec->input_floats * streams),
            "Allocating the codec's batch buffers");
  if (codec->blas != NULL)
    CUDA_TRY (codec_alloc (codec, &codec->gemm_out, codec->buffer_floats),
              "Allocating the codec's batch buffers");
  /* split reductions: room for 8 splits of the largest output, at least 16 Mi floats */
  codec->partial_floats = std::max ((size_t)16 << 20, 8 * per_frame * std::min (streams, 64));
  CUDA_TRY (codec_alloc (codec, &codec->partial, codec->partial_floats),
            "Allocating the codec's batch buffers");
  int n_sms = 0;
  CUDA_TRY (cudaDeviceGetAttribute (&n_sms, cudaDevAttrMultiProcessorCount, device),
            "Querying the GPU");
  codec->target_blocks = 2 * n_sms;
  CUDA_TRY (codec_alloc (codec, &codec->state, codec->state_floats * codec->slot_stride),
            "Allocating the codec's stream states");
  CUDA_TRY (cudaMemset (codec->state, 0, codec->state_floats * codec->slot_stride * sizeof (float)),
            "Clearing the codec's stream states");
  CUDA_TRY (codec_alloc (codec, &codec->d_latent, (size_t)c->latent_dim * streams),
            "Allocating the codec's inputs");
  CUDA_TRY (codec_alloc (codec, &codec->d_slots, (size_t)2 * streams),
            "Allocating the codec's inputs");
  CUDA_TRY (codec_alloc (codec, &codec->d_out, (size_t)c->samples_per_frame * streams),
            "Allocating the codec's output");
  CUDA_TRY (cudaHostAlloc ((void **)&codec->h_latent, (size_t)c->latent_dim * streams * 4, 0),
            "Allocating host buffers");
  CUDA_TRY (cudaHostAlloc ((void **)&codec->h_slots, (size_t)2 * streams * sizeof (int), 0),
            "Allocating host buffers");
  CUDA_TRY (cudaHostAlloc ((void **)&codec->h_out, (size_t)c->samples_per_frame * streams * 4, 0),
            "Allocating host buffers");
  codec->fresh.assign (c->max_streams, 0);
  for (int s = c->max_streams - 1; s >= 0; s--)
    codec->free_streams.push_back (s);
  return 0;
}

} // namespace

GEPARD_CUDA_EXPORT int
gepard_cuda_codec_new (int device, const GepardCudaCodecConfig *config,
                       GepardCudaTensorLookup lookup, void *user_data, GepardCudaCodec **out,
                       char *message, size_t message_len)
{
  Message msg = {message, message_len};
  /* fp16 unless GEPARD_CUDA_CODEC_GEMM names another; a codec whose weights fp16 cannot hold
   * runs in the TF32 kernel instead, unless fp16 was asked for */
  const char *gemm = getenv ("GEPARD_CUDA_CODEC_GEMM");
  GepardCudaCodec *codec = new GepardCudaCodec ();
  int status
      = codec_init (codec, device, config, gemm != NULL ? gemm : "fp16", lookup, user_data, msg);
  if (status != 0 && codec->f16_unfit && gemm == NULL)
    {
      gepard_cuda_codec_free (codec);
      codec = new GepardCudaCodec ();
      status = codec_init (codec, device, config, "own", lookup, user_data, msg);
    }
  if (status != 0)
    {
      gepard_cuda_codec_free (codec);
      return -1;
    }
  *out = codec;
  return 0;
}

GEPARD_CUDA_EXPORT void
gepard_cuda_codec_info (GepardCudaCodec *codec, GepardCudaCodecInfo *info)
{
  info->weight_bytes = codec->weight_bytes;
  info->state_bytes = codec->state_floats * sizeof (float);
  info->work_bytes
      = (codec->state_floats * codec->slot_stride + codec->input_floats * codec->max_batch
         + codec->buffer_floats * (codec->n_buffers + (codec->gemm_out != NULL ? 1 : 0))
         + codec->partial_floats)
        * sizeof (float);
  info->max_streams = codec->config.max_streams;
  info->tensor_cores = !codec->tensor_cores ? 0 : codec->blas != NULL ? 2 : codec->f16 ? 3 : 1;
  info->graphs = codec->use_graphs ? 1 : 0;
}

GEPARD_CUDA_EXPORT int
gepard_cuda_codec_stream_new (GepardCudaCodec *codec, int *stream, char *message,
                              size_t message_len)
{
  Message msg = {message, message_len};
  std::lock_guard<std::mutex> hold (codec->lock);
  if (codec->free_streams.empty ())
    return msg.fail ("All %d audio streams of the GPU codec are in use (GEPARD_GPU_MAX_SEQUENCES "
                     "sets how many)",
                     codec->config.max_streams);
  *stream = codec->free_streams.back ();
  codec->free_streams.pop_back ();
  codec->fresh[*stream] = 1;
  return 0;
}

GEPARD_CUDA_EXPORT void
gepard_cuda_codec_stream_free (GepardCudaCodec *codec, int stream)
{
  std::lock_guard<std::mutex> hold (codec->lock);
  codec->free_streams.push_back (stream);
}

GEPARD_CUDA_EXPORT void
gepard_cuda_codec_stream_reset (GepardCudaCodec *codec, int stream)
{
  std::lock_guard<std::mutex> hold (codec->lock);
  codec->fresh[stream] = 1;
}

namespace
{

/* the frames (as log2) of the pass that decodes the next of `left` frames of n_pass streams: the
 * most of 1, 2, 4 and 8 that is no more than `left` and whose columns fit the batch buffers */
int
pass_frames_log2 (const GepardCudaCodec *codec, int n_pass, int left)
{
  int f = 0;
  while (f + 1 < PASS_FRAME_SIZES && (2 << f) <= left
         && (size_t)(2 << f) * n_pass <= (size_t)codec->max_batch)
    f++;
  return f;
}

} // namespace

GEPARD_CUDA_EXPORT int
gepard_cuda_codec_decode (GepardCudaCodec *codec, const int *streams, const float *latent, int n,
                          int frames, float *const *samples, char *message, size_t message_len)
{
  Message msg = {message, message_len};
  const GepardCudaCodecConfig &c = codec->config;
  if (n < 1 || frames < 1)
    return 0;
  if (n > c.max_streams)
    return msg.fail ("%d streams in one pass; the GPU codec takes at most %d", n, c.max_streams);
  CUDA_TRY (cudaSetDevice (codec->device), "Selecting the GPU");

  /* inputs: slots (padded with the spare slot to the pass's size), then the slots whose state
   * starts from zero */
  const int n_pass = pass_streams (n, codec->use_graphs);
  int n_fresh = 0;
  {
    std::lock_guard<std::mutex> hold (codec->lock);
    for (int s = 0; s < n_pass; s++)
      codec->h_slots[s] = s < n ? streams[s] : c.max_streams;
    for (int s = 0; s < n; s++)
      if (codec->fresh[streams[s]])
        {
          codec->h_slots[n_pass + n_fresh++] = streams[s];
          codec->fresh[streams[s]] = 0;
        }
  }
  cudaStream_t stream = codec->stream;
  CUDA_TRY (cudaMemcpyAsync (codec->d_slots, codec->h_slots,
                             (size_t)(n_pass + n_fresh) * sizeof (int), cudaMemcpyHostToDevice,
                             stream),
            "Uploading the codec's inputs");
  if (n_fresh > 0)
    {
      dim3 grid ((unsigned)((codec->state_floats + 255) / 256), n_fresh);
      CUDA_TRY (launch (zero_state_kernel, grid, 256, 0, stream, codec->state, codec->state_floats,
                        codec->slot_stride, codec->d_slots + n_pass),
                "Decoding audio");
    }

  const int spf = c.samples_per_frame;
  for (int done = 0; done < frames;)
    {
      /* latent as [latent_dim][frames of this pass][padded n] */
      const int frames_log2 = pass_frames_log2 (codec, n_pass, frames - done);
      const int pass_frames = 1 << frames_log2;
      for (int i = 0; i < c.latent_dim; i++)
        for (int f = 0; f < pass_frames; f++)
          for (int s = 0; s < n_pass; s++)
            codec->h_latent[((size_t)i * pass_frames + f) * n_pass + s]
                = s < n ? latent[((size_t)s * frames + done + f) * c.latent_dim + i] : 0.0f;
      CUDA_TRY (cudaMemcpyAsync (codec->d_latent, codec->h_latent,
                                 (size_t)c.latent_dim * pass_frames * n_pass * sizeof (float),
                                 cudaMemcpyHostToDevice, stream),
                "Uploading the codec's inputs");

      cudaError_t status;
      codec->blas_status = CUBLAS_STATUS_SUCCESS;
      if (n_pass == codec->profile_batch && frames_log2 == 0)
        {
          /* GEPARD_CUDA_CODEC_PROFILE=N: the first one-frame pass over N streams, uncaptured, is
           * the one a profiler started with --profile-from-start off sees */
          codec->profile_batch = 0;
          cudaProfilerStart ();
          status = run_pass (codec, n_pass, 0);
          cudaProfilerStop ();
        }
      else
        status = codec->use_graphs ? run_pass_graph (codec, n_pass, frames_log2)
                                   : run_pass (codec, n_pass, frames_log2);
      if (status != cudaSuccess && codec->blas_status != CUBLAS_STATUS_SUCCESS)
        return msg.fail ("Decoding audio: a cuBLAS GEMM failed: %s",
                         codec->blas->status_string (codec->blas_status));
      CUDA_TRY (status, "Decoding audio");
      const size_t per_stream = (size_t)spf * pass_frames;
      CUDA_TRY (cudaMemcpyAsync (codec->h_out, codec->d_out, per_stream * n * sizeof (float),
                                 cudaMemcpyDeviceToHost, stream),
                "Copying audio back");
      CUDA_TRY (cudaStreamSynchronize (stream), "Decoding audio");
      for (int s = 0; s < n; s++)
        memcpy (samples[s] + (size_t)done * spf, codec->h_out + (size_t)s * per_stream,
                per_stream * sizeof (float));
      done += pass_frames;
    }
  return 0;
}
