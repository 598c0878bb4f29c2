/* gepard-cuda-lm.cu: the GEPARD LM on the GPU — weights as bf16, a paged KV cache, and one batched
 * step over any mix of prefills and single-frame decodes (gepard-model.md §1, §3.3–§3.5).
 *
 * A step uploads one block of metadata (rows, sequences, block tables, prefix rows, fed-back
 * frames), runs every projection as one cuBLAS bf16 GEMM with fp32 accumulation over all rows of
 * all sequences, attention per row over its own sequence's cache, the heads for each sequence's
 * last row, and samples on the device; only the codes, the stop logits (and on request the head
 * logits) come back. cuBLAS is opened with dlopen when a model is created, so the module still
 * loads, probes and describes GPUs where only the driver is installed. */
#include "gepard-cuda.h"
#include "gepard-cuda-private.h"

#include <cublas_v2.h>
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#define GEPARD_CUDA_EXPORT extern "C" __attribute__ ((visibility ("default")))

/* ---- cuBLAS, opened at run time ---- */

const GepardCudaBlas *
gepard_cuda_blas (GepardCudaMessage &msg)
{
  static std::once_flag once;
  static GepardCudaBlas blas;
  static bool ok;
  static char error[256];

  std::call_once (once, [] () {
#define STR2(x) #x
#define STR(x) STR2 (x)
    const char *names[] = {"libcublas.so." STR (CUBLAS_VER_MAJOR),
                           "/usr/local/cuda/lib64/libcublas.so." STR (CUBLAS_VER_MAJOR)};
#undef STR
#undef STR2
    void *lib = NULL;
    for (const char *name : names)
      if ((lib = dlopen (name, RTLD_NOW | RTLD_LOCAL)) != NULL)
        break;
    if (lib == NULL)
      {
        snprintf (error, sizeof error, "cuBLAS %d cannot be opened: %s", CUBLAS_VER_MAJOR,
                  dlerror ());
        return;
      }
    blas.create = (decltype (blas.create))dlsym (lib, "cublasCreate_v2");
    blas.destroy = (decltype (blas.destroy))dlsym (lib, "cublasDestroy_v2");
    blas.set_stream = (decltype (blas.set_stream))dlsym (lib, "cublasSetStream_v2");
    blas.set_math_mode = (decltype (blas.set_math_mode))dlsym (lib, "cublasSetMathMode");
    blas.set_workspace = (decltype (blas.set_workspace))dlsym (lib, "cublasSetWorkspace_v2");
    blas.gemm_ex = (decltype (blas.gemm_ex))dlsym (lib, "cublasGemmEx");
    blas.status_string = (decltype (blas.status_string))dlsym (lib, "cublasGetStatusString");
    ok = blas.create && blas.destroy && blas.set_stream && blas.set_math_mode && blas.set_workspace
         && blas.gemm_ex && blas.status_string;
    if (!ok)
      snprintf (error, sizeof error, "cuBLAS lacks the functions Gepard needs");
  });
  if (!ok)
    {
      msg.fail ("%s", error);
      return NULL;
    }
  return &blas;
}

namespace
{

using Message = GepardCudaMessage;

/* ---- host-side dtype conversion ---- */

float
bf16_bits_to_f32 (uint16_t h)
{
  uint32_t bits = (uint32_t)h << 16;
  float x;
  memcpy (&x, &bits, 4);
  return x;
}

/* round to nearest even, NaN kept (gepard-bf16.h) */
uint16_t
f32_to_bf16_bits (float x)
{
  uint32_t bits;
  memcpy (&bits, &x, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)(bits >> 16);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

float
f16_bits_to_f32 (uint16_t h)
{
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f)
    bits = sign | 0x7f800000u | (mant << 13);
  else if (exp != 0)
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  else if (mant == 0)
    bits = sign;
  else
    {
      /* subnormal half: normalise */
      exp = 113;
      while (!(mant & 0x400u))
        {
          mant <<= 1;
          exp--;
        }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  float x;
  memcpy (&x, &bits, 4);
  return x;
}

float
tensor_value (const GepardCudaTensor &t, size_t i)
{
  switch (t.dtype)
    {
    case GEPARD_CUDA_DTYPE_F32:
      return ((const float *)t.data)[i];
    case GEPARD_CUDA_DTYPE_BF16:
      return bf16_bits_to_f32 (((const uint16_t *)t.data)[i]);
    case GEPARD_CUDA_DTYPE_F16:
      return f16_bits_to_f32 (((const uint16_t *)t.data)[i]);
    }
  return 0;
}

size_t
tensor_elements (const GepardCudaTensor &t)
{
  size_t n = 1;
  for (int d = 0; d < t.n_dims; d++)
    n *= (size_t)t.shape[d];
  return n;
}

struct Layer
{
  gbf16 *qkv;     /* [nq·2·hd + 2·nkv·hd, H]: q_proj, k_proj, v_proj stacked */
  gbf16 *o;       /* [H, nq·hd] */
  gbf16 *gate_up; /* [2·I, H]: gate_proj, up_proj stacked */
  gbf16 *down;    /* [H, I] */
  float *input_scale, *post_scale, *q_scale, *k_scale; /* 1 + w (§1.2) */
};

/* a captured decode step: every kernel and GEMM of a step of `n` single-frame inputs (a bucketed
 * size, gepard_batch_bucket) whose longest sequence fits `visible` positions */
struct Graph
{
  int n;
  int visible;
  cudaGraphExec_t exec;
  unsigned long long used; /* when it last ran, for evicting the longest unused */
};

/* captured steps kept at once: the (bucketed size, length bucket) pairs a busy server visits */
constexpr size_t MAX_GRAPHS = 256;

struct Sequence
{
  bool in_use;
  bool init;
  int length;
  unsigned stamp;
  std::vector<int> blocks;
  GepardSamplerState state;
};

uint64_t
splitmix64 (uint64_t *x)
{
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

size_t
align_up (size_t n, size_t a)
{
  return (n + a - 1) / a * a;
}

} // namespace

struct _GepardCudaModel
{
  int device;
  char device_name[256];
  GepardDims dims;
  int n_layers, intermediate, vocab_rows;
  int n_heads, embed_dim, n_logits, acc_stride;
  int max_sequences, max_context, max_blocks;
  std::vector<int> head_levels;
  const GepardCudaBlas *blas;
  cublasHandle_t handle;
  cudaStream_t stream;
  std::vector<void *> allocations;
  size_t weight_bytes;

  gbf16 *embed;
  std::vector<Layer> layers;
  float *final_scale;
  float *rope_table;
  gbf16 *audio_table;
  int *head_offsets;
  gbf16 *proj0, *proj2;
  float *proj0_bias, *proj2_bias;
  float audio_scale;
  gbf16 *heads;
  float *heads_bias;

  gbf16 *kv_pool;
  size_t kv_bytes, block_elems, layer_elems;
  int kv_blocks;

  std::mutex lock; /* slots and KV blocks: sequences come and go from any thread */
  std::vector<int> free_blocks;
  /* where the rows that pad a captured step to its bucketed size write their keys, values and
   * sampler state: a KV block and a sampler slot (max_sequences) no sequence owns */
  int spare_block;
  int max_step; /* sequences a step's buffers hold: max_sequences, bucketed */
  std::vector<Sequence> seqs;
  std::vector<int> free_slots;
  unsigned stamp;

  GepardSamplerState *states;
  int32_t *history;

  int cap_rows;
  float *x;
  gbf16 *u, *qkv, *attn, *y, *gate_up, *act;
  gbf16 *frame_in, *frame_mid;
  float *frame_acc;
  gbf16 *hidden_last;
  float *head_acc, *work;
  char *d_out, *h_out;
  size_t cap_meta;
  char *d_meta, *h_meta;
  void *blas_workspace;

  bool use_graphs;
  /* steps of up to gemv_rows rows (0: none) run their products in the few-row kernels (every
   * matrix's row length a multiple of 8, hidden ≤ 3072): by default steps of one row, where they
   * beat cuBLAS on an H100 (0.72 against 0.74 ms a step at context 64, 1.78 against 2.00 ms at
   * 1024; at 8 rows they took 1.43 against 0.81 ms); GEPARD_CUDA_GEMV_ROWS=N sets it, up to
   * GEPARD_GEMV_MAX_ROWS */
  int gemv_rows;
  std::vector<Graph> graphs;
  unsigned long long graph_clock;
  cublasComputeType_t compute_type;
};

namespace
{

template <typename T>
cudaError_t
device_alloc (GepardCudaModel *m, T **ptr, size_t count)
{
  void *p = NULL;
  cudaError_t status = cudaMalloc (&p, std::max<size_t> (count * sizeof (T), 1));
  if (status == cudaSuccess)
    m->allocations.push_back (p);
  *ptr = (T *)p;
  return status;
}

void
device_release (GepardCudaModel *m, void *p)
{
  if (p == NULL)
    return;
  auto it = std::find (m->allocations.begin (), m->allocations.end (), p);
  if (it != m->allocations.end ())
    m->allocations.erase (it);
  cudaFree (p);
}

/* a named tensor with exactly `n` elements (its shape was validated with the checkpoint) */
int
fetch (GepardCudaTensorLookup lookup, void *user_data, const char *name, size_t n,
       GepardCudaTensor *t, Message &msg)
{
  if (lookup (user_data, name, t) != 0)
    return msg.fail ("The checkpoint has no tensor %s", name);
  if (t->dtype != GEPARD_CUDA_DTYPE_F32 && t->dtype != GEPARD_CUDA_DTYPE_BF16
      && t->dtype != GEPARD_CUDA_DTYPE_F16)
    return msg.fail ("Tensor %s has a type the GPU backend does not read", name);
  if (tensor_elements (*t) != n)
    return msg.fail ("Tensor %s has %zu elements, not %zu", name, tensor_elements (*t), n);
  return 0;
}

/* copies a tensor as bf16 to `dst` (the runner casts the model to bf16, §2.3) */
int
upload_bf16 (gbf16 *dst, const GepardCudaTensor &t, Message &msg)
{
  size_t n = tensor_elements (t);
  if (t.dtype == GEPARD_CUDA_DTYPE_BF16)
    {
      CUDA_TRY (cudaMemcpy (dst, t.data, n * 2, cudaMemcpyHostToDevice), "Uploading weights");
      return 0;
    }
  const size_t chunk = (size_t)1 << 22;
  std::vector<uint16_t> staging (std::min (n, chunk));
  for (size_t start = 0; start < n; start += chunk)
    {
      size_t count = std::min (chunk, n - start);
      for (size_t i = 0; i < count; i++)
        staging[i] = f32_to_bf16_bits (tensor_value (t, start + i));
      CUDA_TRY (cudaMemcpy (dst + start, staging.data (), count * 2, cudaMemcpyHostToDevice),
                "Uploading weights");
    }
  return 0;
}

/* a tensor's values rounded to bf16 and held as fp32 on the host, as gepard-model.c loads them */
std::vector<float>
host_f32 (const GepardCudaTensor &t)
{
  size_t n = tensor_elements (t);
  std::vector<float> v (n);
  for (size_t i = 0; i < n; i++)
    v[i] = bf16_bits_to_f32 (f32_to_bf16_bits (tensor_value (t, i)));
  return v;
}

int
upload_f32 (GepardCudaModel *m, float **dst, const std::vector<float> &v, Message &msg)
{
  CUDA_TRY (device_alloc (m, dst, v.size ()), "Allocating weights");
  CUDA_TRY (cudaMemcpy (*dst, v.data (), v.size () * sizeof (float), cudaMemcpyHostToDevice),
            "Uploading weights");
  m->weight_bytes += v.size () * sizeof (float);
  return 0;
}

/* norm weight w → fp32 1 + bf16(w) (§1.2) */
int
load_norm (GepardCudaModel *m, GepardCudaTensorLookup lookup, void *user_data, const char *name,
           int n, float **dst, Message &msg)
{
  GepardCudaTensor t;
  if (fetch (lookup, user_data, name, n, &t, msg) != 0)
    return -1;
  std::vector<float> v = host_f32 (t);
  for (float &w : v)
    w = 1.0f + w;
  return upload_f32 (m, dst, v, msg);
}

/* Stacks tensors (all with `in` columns) into one [Σ rows, in] bf16 matrix. */
int
load_stacked (GepardCudaModel *m, GepardCudaTensorLookup lookup, void *user_data,
              const std::vector<const char *> &names, const std::vector<int> &rows, int in,
              int padded_rows, gbf16 **dst, Message &msg)
{
  CUDA_TRY (device_alloc (m, dst, (size_t)padded_rows * in), "Allocating weights");
  CUDA_TRY (cudaMemset (*dst, 0, (size_t)padded_rows * in * 2), "Clearing weights");
  m->weight_bytes += (size_t)padded_rows * in * 2;
  size_t offset = 0;
  for (size_t i = 0; i < names.size (); i++)
    {
      GepardCudaTensor t;
      if (fetch (lookup, user_data, names[i], (size_t)rows[i] * in, &t, msg) != 0
          || upload_bf16 (*dst + offset, t, msg) != 0)
        return -1;
      offset += (size_t)rows[i] * in;
    }
  return 0;
}

int
load_matrix (GepardCudaModel *m, GepardCudaTensorLookup lookup, void *user_data, const char *name,
             int rows, int in, gbf16 **dst, Message &msg)
{
  return load_stacked (m, lookup, user_data, {name}, {rows}, in, rows, dst, msg);
}

int
load_vector (GepardCudaModel *m, GepardCudaTensorLookup lookup, void *user_data, const char *name,
             int n, float **dst, Message &msg)
{
  GepardCudaTensor t;
  if (fetch (lookup, user_data, name, n, &t, msg) != 0)
    return -1;
  return upload_f32 (m, dst, host_f32 (t), msg);
}

int
load_weights (GepardCudaModel *m, const GepardCudaModelConfig *c, GepardCudaTensorLookup lookup,
              void *ud, Message &msg)
{
  int h = c->hidden_size, hd = c->head_dim, nq = c->n_q_heads, nkv = c->n_kv_heads;
  int inter = c->intermediate_size;
  char name[128];

  GepardCudaTensor embed;
  if (lookup (ud, "model.embed_tokens.weight", &embed) != 0 || embed.n_dims != 2
      || embed.shape[1] != h)
    return msg.fail ("The checkpoint has no embedding table of width %d", h);
  m->vocab_rows = (int)embed.shape[0];
  if (fetch (lookup, ud, "model.embed_tokens.weight", (size_t)m->vocab_rows * h, &embed, msg) != 0)
    return -1;
  CUDA_TRY (device_alloc (m, &m->embed, (size_t)m->vocab_rows * h), "Allocating the embedding");
  m->weight_bytes += (size_t)m->vocab_rows * h * 2;
  if (upload_bf16 (m->embed, embed, msg) != 0)
    return -1;

  m->layers.resize (c->n_layers);
  for (int l = 0; l < c->n_layers; l++)
    {
      Layer &L = m->layers[l];
      auto N = [l] (const char *suffix) {
        char buf[128];
        snprintf (buf, sizeof buf, "model.layers.%d.%s", l, suffix);
        return std::string (buf);
      };
      std::string q = N ("self_attn.q_proj.weight"), k = N ("self_attn.k_proj.weight"),
                  v = N ("self_attn.v_proj.weight"), o = N ("self_attn.o_proj.weight"),
                  gate = N ("mlp.gate_proj.weight"), up = N ("mlp.up_proj.weight"),
                  down = N ("mlp.down_proj.weight"), in_norm = N ("input_layernorm.weight"),
                  post_norm = N ("post_attention_layernorm.weight"),
                  q_norm = N ("self_attn.q_norm.weight"), k_norm = N ("self_attn.k_norm.weight");
      if (load_stacked (m, lookup, ud, {q.c_str (), k.c_str (), v.c_str ()},
                        {nq * 2 * hd, nkv * hd, nkv * hd}, h, nq * 2 * hd + 2 * nkv * hd, &L.qkv,
                        msg)
              != 0
          || load_matrix (m, lookup, ud, o.c_str (), h, nq * hd, &L.o, msg) != 0
          || load_stacked (m, lookup, ud, {gate.c_str (), up.c_str ()}, {inter, inter}, h,
                           2 * inter, &L.gate_up, msg)
                 != 0
          || load_matrix (m, lookup, ud, down.c_str (), h, inter, &L.down, msg) != 0
          || load_norm (m, lookup, ud, in_norm.c_str (), h, &L.input_scale, msg) != 0
          || load_norm (m, lookup, ud, post_norm.c_str (), h, &L.post_scale, msg) != 0
          || load_norm (m, lookup, ud, q_norm.c_str (), hd, &L.q_scale, msg) != 0
          || load_norm (m, lookup, ud, k_norm.c_str (), hd, &L.k_scale, msg) != 0)
        return -1;
    }
  if (load_norm (m, lookup, ud, "model.norm.weight", h, &m->final_scale, msg) != 0)
    return -1;

  /* §3.5: the 32 embedding tables stacked by rows, with each head's first row */
  int nh = m->n_heads, e = m->embed_dim;
  std::vector<int> offsets (nh + 1, 0);
  for (int i = 0; i < nh; i++)
    offsets[i + 1] = offsets[i] + m->head_levels[i];
  m->n_logits = offsets[nh];
  std::vector<std::string> table_names (nh), head_names (nh);
  std::vector<const char *> table_ptrs (nh), head_ptrs (nh);
  for (int i = 0; i < nh; i++)
    {
      snprintf (name, sizeof name, "audio_embeddings.%d.weight", i);
      table_names[i] = name;
      table_ptrs[i] = table_names[i].c_str ();
      snprintf (name, sizeof name, "codebook_heads.%d.weight", i);
      head_names[i] = name;
      head_ptrs[i] = head_names[i].c_str ();
    }
  if (load_stacked (m, lookup, ud, table_ptrs, m->head_levels, e, m->n_logits, &m->audio_table, msg)
      != 0)
    return -1;
  CUDA_TRY (device_alloc (m, &m->head_offsets, nh + 1), "Allocating head offsets");
  CUDA_TRY (cudaMemcpy (m->head_offsets, offsets.data (), (nh + 1) * sizeof (int),
                        cudaMemcpyHostToDevice),
            "Uploading head offsets");
  if (load_matrix (m, lookup, ud, "audio_embed_proj.0.weight", h, nh * e, &m->proj0, msg) != 0
      || load_vector (m, lookup, ud, "audio_embed_proj.0.bias", h, &m->proj0_bias, msg) != 0
      || load_matrix (m, lookup, ud, "audio_embed_proj.2.weight", h, h, &m->proj2, msg) != 0
      || load_vector (m, lookup, ud, "audio_embed_proj.2.bias", h, &m->proj2_bias, msg) != 0)
    return -1;
  GepardCudaTensor scale;
  if (fetch (lookup, ud, "audio_embed_scale", 1, &scale, msg) != 0)
    return -1;
  m->audio_scale = host_f32 (scale)[0];

  /* the 32 heads and the stop head as one [n_logits + 1, H] matrix (rows padded to a multiple
   * of 8 for the GEMM), biases likewise */
  std::vector<const char *> all_heads (head_ptrs);
  std::vector<int> all_rows (m->head_levels);
  all_heads.push_back ("stop_head.weight");
  all_rows.push_back (1);
  m->acc_stride = (int)align_up (m->n_logits + 1, 8);
  if (load_stacked (m, lookup, ud, all_heads, all_rows, h, m->acc_stride, &m->heads, msg) != 0)
    return -1;
  std::vector<float> bias;
  for (int i = 0; i <= nh; i++)
    {
      if (i < nh)
        snprintf (name, sizeof name, "codebook_heads.%d.bias", i);
      else
        snprintf (name, sizeof name, "stop_head.bias");
      GepardCudaTensor t;
      if (fetch (lookup, ud, name, all_rows[i], &t, msg) != 0)
        return -1;
      std::vector<float> b = host_f32 (t);
      bias.insert (bias.end (), b.begin (), b.end ());
    }
  return upload_f32 (m, &m->heads_bias, bias, msg);
}

/* the captured steps hold the work buffers' addresses: they go when a buffer moves */
void
drop_graphs (GepardCudaModel *m)
{
  for (Graph &g : m->graphs)
    cudaGraphExecDestroy (g.exec);
  m->graphs.clear ();
}

/* work buffers for `rows` rows of a step */
int
ensure_rows (GepardCudaModel *m, int rows, Message &msg)
{
  if (rows <= m->cap_rows)
    return 0;
  int cap = std::max (rows, m->cap_rows * 2);
  const GepardDims &d = m->dims;
  drop_graphs (m);
  size_t h = d.hidden, c = (size_t)(d.n_q_heads * 2 + d.n_kv_heads * 2) * d.head_dim;
  void *old[] = {m->x, m->u, m->qkv, m->attn, m->y, m->gate_up, m->act};
  for (void *p : old)
    device_release (m, p);
  m->cap_rows = 0;
  CUDA_TRY (device_alloc (m, &m->x, cap * h), "Allocating work buffers");
  CUDA_TRY (device_alloc (m, &m->u, cap * h), "Allocating work buffers");
  CUDA_TRY (device_alloc (m, &m->qkv, cap * c), "Allocating work buffers");
  CUDA_TRY (device_alloc (m, &m->attn, cap * (size_t)d.n_q_heads * d.head_dim),
            "Allocating work buffers");
  CUDA_TRY (device_alloc (m, &m->y, cap * h), "Allocating work buffers");
  CUDA_TRY (device_alloc (m, &m->gate_up, cap * 2 * (size_t)m->intermediate),
            "Allocating work buffers");
  CUDA_TRY (device_alloc (m, &m->act, cap * (size_t)m->intermediate), "Allocating work buffers");
  m->cap_rows = cap;
  return 0;
}

int
ensure_meta (GepardCudaModel *m, size_t bytes, Message &msg)
{
  if (bytes <= m->cap_meta)
    return 0;
  size_t cap = std::max (bytes, m->cap_meta * 2);
  drop_graphs (m);
  device_release (m, m->d_meta);
  m->d_meta = NULL;
  if (m->h_meta != NULL)
    cudaFreeHost (m->h_meta);
  m->h_meta = NULL;
  m->cap_meta = 0;
  CUDA_TRY (device_alloc (m, &m->d_meta, cap), "Allocating step buffers");
  CUDA_TRY (cudaHostAlloc ((void **)&m->h_meta, cap, cudaHostAllocDefault),
            "Allocating step buffers");
  m->cap_meta = cap;
  return 0;
}

cublasStatus_t
gemm (GepardCudaModel *m, const gbf16 *w, const gbf16 *x, void *y, cudaDataType_t y_type, int rows,
      int out, int in)
{
  /* y[rows, out] = x[rows, in] · w[out, in]ᵀ, row-major, as column-major yᵀ = wᵀᵀ · xᵀ */
  const float alpha = 1.0f, beta = 0.0f;
  return m->blas->gemm_ex (m->handle, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &alpha, w,
                           CUDA_R_16BF, in, x, CUDA_R_16BF, in, &beta, y, y_type, out,
                           m->compute_type, CUBLAS_GEMM_DEFAULT);
}

} // namespace

GEPARD_CUDA_EXPORT void
gepard_cuda_model_free (GepardCudaModel *m)
{
  if (m == NULL)
    return;
  cudaSetDevice (m->device);
  if (m->stream != NULL)
    cudaStreamSynchronize (m->stream);
  drop_graphs (m);
  if (m->handle != NULL)
    m->blas->destroy (m->handle);
  for (void *p : m->allocations)
    cudaFree (p);
  if (m->h_meta != NULL)
    cudaFreeHost (m->h_meta);
  if (m->h_out != NULL)
    cudaFreeHost (m->h_out);
  if (m->stream != NULL)
    cudaStreamDestroy (m->stream);
  delete m;
}

namespace
{

int
model_init (GepardCudaModel *m, int device, const GepardCudaModelConfig *c,
            GepardCudaTensorLookup lookup, void *user_data, Message &msg)
{
  if (c->n_layers < 1 || c->hidden_size < 1 || c->n_q_heads < 1 || c->n_kv_heads < 1
      || c->head_dim < 2 || c->head_dim > 256 || c->n_audio_heads < 1
      || c->n_audio_heads > GEPARD_CUDA_MAX_HEADS || c->rotary_dim < 0
      || c->rotary_dim > c->head_dim || c->rotary_dim % 2 != 0 || c->max_context < 1
      || c->max_sequences < 1 || c->rope_table == NULL)
    return msg.fail ("The GPU backend cannot run this model shape");

  m->device = device;
  CUDA_TRY (cudaSetDevice (device), "Selecting the GPU");
  cudaDeviceProp prop;
  CUDA_TRY (cudaGetDeviceProperties (&prop, device), "Querying the GPU");
  snprintf (m->device_name, sizeof m->device_name, "%s", prop.name);

  m->dims.hidden = c->hidden_size;
  m->dims.n_q_heads = c->n_q_heads;
  m->dims.n_kv_heads = c->n_kv_heads;
  m->dims.head_dim = c->head_dim;
  m->dims.rotary_dim = c->rotary_dim;
  m->dims.eps = c->rms_norm_eps;
  m->n_layers = c->n_layers;
  m->intermediate = c->intermediate_size;
  m->n_heads = c->n_audio_heads;
  m->embed_dim = c->audio_embed_dim;
  m->head_levels.assign (c->head_levels, c->head_levels + c->n_audio_heads);
  m->max_sequences = c->max_sequences;
  if (!gepard_attention_supported (&m->dims))
    return msg.fail ("The GPU backend has no attention kernel for head_dim %d with %d query "
                     "heads per kv head",
                     c->head_dim, c->n_q_heads / c->n_kv_heads);

  /* the attention kernel keeps a row's scores in shared memory, which bounds the context */
  size_t smem_limit = prop.sharedMemPerBlockOptin - 1024;
  m->max_context = c->max_context;
  while (m->max_context > GEPARD_KV_BLOCK
         && gepard_attention_smem (&m->dims, m->max_context) > smem_limit)
    m->max_context -= GEPARD_KV_BLOCK;
  m->dims.max_context = m->max_context;
  CUDA_TRY (gepard_attention_prepare (&m->dims, gepard_attention_smem (&m->dims, m->max_context)),
            "Preparing the attention kernel");
  m->max_blocks = (m->max_context + GEPARD_KV_BLOCK - 1) / GEPARD_KV_BLOCK;

  CUDA_TRY (cudaStreamCreateWithFlags (&m->stream, cudaStreamNonBlocking), "Creating a stream");
  if ((m->blas = gepard_cuda_blas (msg)) == NULL)
    return -1;
  cublasStatus_t bs = m->blas->create (&m->handle);
  if (bs != CUBLAS_STATUS_SUCCESS)
    return msg.fail ("cuBLAS cannot start: %s", m->blas->status_string (bs));
  m->blas->set_stream (m->handle, m->stream);
  /* split-K GEMMs would otherwise sum their partial results in bf16, the output type: one
   * rounding of the fp32 sum is what the reference does (§1.9) */
  m->blas->set_math_mode (
      m->handle,
      (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  /* a workspace of its own, so that cuBLAS allocates nothing while a step is being captured */
  const size_t blas_workspace = (size_t)32 << 20;
  CUDA_TRY (cudaMalloc (&m->blas_workspace, blas_workspace), "Allocating the cuBLAS workspace");
  m->allocations.push_back (m->blas_workspace);
  if (m->blas->set_workspace (m->handle, m->blas_workspace, blas_workspace)
      != CUBLAS_STATUS_SUCCESS)
    return msg.fail ("cuBLAS refuses its workspace");
  const char *graphs = getenv ("GEPARD_CUDA_GRAPHS");
  m->use_graphs = graphs == NULL || strcmp (graphs, "0") != 0;
  /* GEPARD_CUDA_GEMM_PEDANTIC=1 sums the GEMMs in plain fp32 without tensor cores (slow): a
   * check that what differs from the CPU comes from the tensor cores' summation */
  const char *pedantic = getenv ("GEPARD_CUDA_GEMM_PEDANTIC");
  m->compute_type = pedantic != NULL && strcmp (pedantic, "1") == 0 ? CUBLAS_COMPUTE_32F_PEDANTIC
                                                                    : CUBLAS_COMPUTE_32F;
  const char *gemv_rows = getenv ("GEPARD_CUDA_GEMV_ROWS");
  const bool gemv_fits = c->hidden_size % 8 == 0 && c->hidden_size <= 3072
                         && (c->n_q_heads * c->head_dim) % 8 == 0 && c->intermediate_size % 8 == 0
                         && (c->n_audio_heads * c->audio_embed_dim) % 8 == 0;
  m->gemv_rows = !gemv_fits          ? 0
                 : gemv_rows == NULL ? 1
                                     : std::clamp (atoi (gemv_rows), 0, GEPARD_GEMV_MAX_ROWS);

  if (load_weights (m, c, lookup, user_data, msg) != 0)
    return -1;
  std::vector<float> rope (c->rope_table, c->rope_table + (size_t)m->max_context * c->rotary_dim);
  if (upload_f32 (m, &m->rope_table, rope, msg) != 0)
    return -1;

  /* sampler state for every slot and the spare one; per-sequence buffers for a step of up to
   * max_sequences sequences padded to its bucketed size */
  m->max_step = gepard_batch_bucket (m->max_sequences);
  size_t ns = m->max_step, h = c->hidden_size, slots = (size_t)m->max_sequences + 1;
  CUDA_TRY (device_alloc (m, &m->states, slots), "Allocating sampler state");
  CUDA_TRY (device_alloc (m, &m->history, slots * GEPARD_PENALTY_WINDOW * m->n_heads),
            "Allocating sampler state");
  CUDA_TRY (device_alloc (m, &m->frame_in, ns * m->n_heads * m->embed_dim),
            "Allocating work buffers");
  CUDA_TRY (device_alloc (m, &m->frame_mid, ns * h), "Allocating work buffers");
  CUDA_TRY (device_alloc (m, &m->frame_acc, ns * h), "Allocating work buffers");
  CUDA_TRY (device_alloc (m, &m->hidden_last, ns * h), "Allocating work buffers");
  CUDA_TRY (device_alloc (m, &m->head_acc, ns * m->acc_stride), "Allocating work buffers");
  CUDA_TRY (device_alloc (m, &m->work, ns * m->n_logits), "Allocating work buffers");
  size_t out_bytes = ns * (m->n_heads + 1 + m->n_logits) * 4;
  CUDA_TRY (device_alloc (m, &m->d_out, out_bytes), "Allocating work buffers");
  CUDA_TRY (cudaHostAlloc ((void **)&m->h_out, out_bytes, cudaHostAllocDefault),
            "Allocating work buffers");
  if (ensure_rows (m, 2048, msg) != 0)
    return -1;

  /* the KV pool: what the budget leaves, in blocks of GEPARD_KV_BLOCK positions */
  m->layer_elems = (size_t)2 * c->n_kv_heads * GEPARD_KV_BLOCK * c->head_dim;
  m->block_elems = m->layer_elems * c->n_layers;
  size_t block_bytes = m->block_elems * 2;
  size_t budget = c->kv_cache_bytes;
  if (budget == 0)
    {
      size_t free_bytes, total;
      CUDA_TRY (cudaMemGetInfo (&free_bytes, &total), "Querying GPU memory");
      double fraction
          = c->memory_fraction > 0 && c->memory_fraction <= 1 ? c->memory_fraction : 0.9;
      /* room for cuBLAS's workspaces and for the work buffers to grow with long prefills */
      double reserve = 512.0 * 1024 * 1024;
      double left = fraction * total - (double)(total - free_bytes) - reserve;
      budget = left > 0 ? (size_t)left : 0;
    }
  size_t wanted = (size_t)m->max_sequences * m->max_blocks + 1;
  m->kv_blocks = (int)std::min (budget / block_bytes, wanted);
  if (m->kv_blocks < m->max_blocks + 1)
    return msg.fail ("The GPU has room for %d KV blocks of %d positions (%.1f MiB each) after the "
                     "weights; one sequence of %d positions needs %d",
                     m->kv_blocks, GEPARD_KV_BLOCK, block_bytes / 1048576.0, m->max_context,
                     m->max_blocks);
  m->kv_bytes = (size_t)m->kv_blocks * block_bytes;
  CUDA_TRY (device_alloc (m, &m->kv_pool, m->kv_bytes / 2), "Allocating the KV cache");
  m->free_blocks.reserve (m->kv_blocks);
  m->spare_block = m->kv_blocks - 1;
  for (int b = m->kv_blocks - 2; b >= 0; b--)
    m->free_blocks.push_back (b);
  m->seqs.resize (m->max_sequences);
  for (int s = m->max_sequences - 1; s >= 0; s--)
    m->free_slots.push_back (s);
  CUDA_TRY (cudaDeviceSynchronize (), "Loading the model");
  return 0;
}

} // namespace

GEPARD_CUDA_EXPORT int
gepard_cuda_model_new (int device, const GepardCudaModelConfig *config,
                       GepardCudaTensorLookup lookup, void *user_data, GepardCudaModel **model,
                       char *message, size_t message_len)
{
  Message msg = {message, message_len};
  GepardCudaModel *m = new GepardCudaModel ();
  if (model_init (m, device, config, lookup, user_data, msg) != 0)
    {
      gepard_cuda_model_free (m);
      *model = NULL;
      return -1;
    }
  *model = m;
  return 0;
}

GEPARD_CUDA_EXPORT void
gepard_cuda_model_info (GepardCudaModel *m, GepardCudaModelInfo *info)
{
  memset (info, 0, sizeof *info);
  info->weight_bytes = m->weight_bytes;
  info->kv_cache_bytes = m->kv_bytes;
  info->kv_block_tokens = GEPARD_KV_BLOCK;
  info->kv_blocks = m->kv_blocks - 1;
  info->max_context = m->max_context;
  info->max_sequences = m->max_sequences;
  snprintf (info->device, sizeof info->device, "%s", m->device_name);
}

GEPARD_CUDA_EXPORT int
gepard_cuda_sequence_new (GepardCudaModel *m, const GepardCudaSampling *sampling, int *sequence,
                          char *message, size_t message_len)
{
  Message msg = {message, message_len};
  std::lock_guard<std::mutex> guard (m->lock);
  if (m->free_slots.empty ())
    return msg.fail ("All %d sequence slots of the GPU backend are in use", m->max_sequences);
  int slot = m->free_slots.back ();
  m->free_slots.pop_back ();
  Sequence &s = m->seqs[slot];
  s.in_use = true;
  s.init = true;
  s.length = 0;
  s.blocks.clear ();
  /* the sampler's state is written on the device by the sequence's first step */
  uint64_t seed = sampling->seed;
  for (int i = 0; i < 4; i++)
    s.state.rng[i] = splitmix64 (&seed);
  s.state.n_frames = 0;
  s.state.temperature = sampling->temperature;
  s.state.top_k = sampling->top_k;
  s.state.penalty = sampling->repetition_penalty;
  *sequence = slot;
  return 0;
}

GEPARD_CUDA_EXPORT void
gepard_cuda_sequence_free (GepardCudaModel *m, int sequence)
{
  std::lock_guard<std::mutex> guard (m->lock);
  if (sequence < 0 || sequence >= m->max_sequences || !m->seqs[sequence].in_use)
    return;
  Sequence &s = m->seqs[sequence];
  m->free_blocks.insert (m->free_blocks.end (), s.blocks.begin (), s.blocks.end ());
  s.blocks.clear ();
  s.in_use = false;
  m->free_slots.push_back (sequence);
}

namespace
{

struct MetaLayout
{
  size_t seqs, rows, frame_codes, frame_rows, block_tables, prefix, total;
};

MetaLayout
meta_layout (const GepardCudaModel *m, int n, int rows, int frames, int prefix_rows)
{
  MetaLayout l;
  size_t at = 0;
  l.seqs = at;
  at = align_up (at + n * sizeof (GepardStepSeq), 256);
  l.rows = at;
  at = align_up (at + rows * sizeof (GepardStepRow), 256);
  l.frame_codes = at;
  at = align_up (at + (size_t)frames * m->n_heads * 4, 256);
  l.frame_rows = at;
  at = align_up (at + (size_t)frames * 4, 256);
  l.block_tables = at;
  at = align_up (at + (size_t)n * m->max_blocks * 4, 256);
  l.prefix = at;
  at = align_up (at + (size_t)prefix_rows * m->dims.hidden * 4, 256);
  l.total = at;
  return l;
}

int
check_cublas (GepardCudaModel *m, cublasStatus_t status, Message &msg)
{
  if (status != CUBLAS_STATUS_SUCCESS)
    return msg.fail ("cuBLAS GEMM failed: %s", m->blas->status_string (status));
  return 0;
}

#define BLAS_TRY(expr)                                                                             \
  do                                                                                               \
    {                                                                                              \
      if (check_cublas (m, (expr), msg) != 0)                                                      \
        return -1;                                                                                 \
    }                                                                                              \
  while (0)

/* the launches of one step, metadata already on the device */
int
run_step (GepardCudaModel *m, const MetaLayout &lay, int n, int rows, int frames, int max_visible,
          Message &msg)
{
  const GepardDims &d = m->dims;
  int h = d.hidden, hd = d.head_dim, nq = d.n_q_heads, nkv = d.n_kv_heads;
  int qkv_width = (nq * 2 + nkv * 2) * hd;
  cudaStream_t st = m->stream;
  const GepardStepSeq *seqs = (const GepardStepSeq *)(m->d_meta + lay.seqs);
  const GepardStepRow *row_meta = (const GepardStepRow *)(m->d_meta + lay.rows);
  GepardKvView kv = {m->kv_pool, m->block_elems, m->layer_elems,
                     (const int *)(m->d_meta + lay.block_tables), m->max_blocks};
  /* a step of a few rows (decodes of a few sequences) is bound by kernel latency: its products
   * run in the few-row kernels, which also run the RMSNorm before them, add the attention's and
   * the MLP's outputs to the residual stream and run SwiGLU: 6 launches a layer */
  const bool few = rows <= m->gemv_rows;

  CUDA_TRY (gepard_launch_embed_rows (st, row_meta, rows, m->embed,
                                      (const float *)(m->d_meta + lay.prefix), h, m->x),
            "Embedding");
  if (frames > 0)
    {
      /* §3.5: Linear → GELU → Linear → LayerNorm → × scale, over the fed-back frames */
      CUDA_TRY (gepard_launch_frame_gather (st, (const int32_t *)(m->d_meta + lay.frame_codes),
                                            frames, m->n_heads, m->head_offsets, m->audio_table,
                                            m->embed_dim, m->frame_in),
                "Embedding frames");
      if (few)
        CUDA_TRY (gepard_launch_gemv (st, GEPARD_GEMV_F32, m->proj0, m->frame_in, frames, h,
                                      m->n_heads * m->embed_dim, m->frame_acc, NULL),
                  "Embedding frames");
      else
        BLAS_TRY (gemm (m, m->proj0, m->frame_in, m->frame_acc, CUDA_R_32F, frames, h,
                        m->n_heads * m->embed_dim));
      CUDA_TRY (gepard_launch_bias_gelu (st, m->frame_acc, m->proj0_bias, frames, h, m->frame_mid),
                "Embedding frames");
      if (few)
        CUDA_TRY (gepard_launch_gemv (st, GEPARD_GEMV_F32, m->proj2, m->frame_mid, frames, h, h,
                                      m->frame_acc, NULL),
                  "Embedding frames");
      else
        BLAS_TRY (gemm (m, m->proj2, m->frame_mid, m->frame_acc, CUDA_R_32F, frames, h, h));
      CUDA_TRY (gepard_launch_bias_layer_norm (st, m->frame_acc, m->proj2_bias, m->audio_scale,
                                               (const int *)(m->d_meta + lay.frame_rows), frames, h,
                                               m->x),
                "Embedding frames");
    }

  for (int l = 0; l < m->n_layers; l++)
    {
      const Layer &L = m->layers[l];
      if (few)
        CUDA_TRY (gepard_launch_gemv_norm (st, GEPARD_GEMV_BF16, L.qkv, m->x, L.input_scale, d.eps,
                                           rows, qkv_width, h, m->qkv, NULL),
                  "RMSNorm and q/k/v products");
      else
        {
          /* the previous layer's MLP output joins the residual stream inside the norm */
          CUDA_TRY (gepard_launch_rms_norm (st, m->x, l == 0 ? NULL : m->y, L.input_scale, rows, h,
                                            d.eps, m->u),
                    "RMSNorm");
          BLAS_TRY (gemm (m, L.qkv, m->u, m->qkv, CUDA_R_16BF, rows, qkv_width, h));
        }
      CUDA_TRY (gepard_launch_qk_norm_rope (st, m->qkv, row_meta, rows, &d, L.q_scale, L.k_scale,
                                            m->rope_table, kv, l),
                "q/k norm and RoPE");
      CUDA_TRY (
          gepard_launch_attention (st, m->qkv, row_meta, rows, &d, kv, l, max_visible, m->attn),
          "Attention");
      if (few)
        {
          CUDA_TRY (gepard_launch_gemv (st, GEPARD_GEMV_RESIDUAL, L.o, m->attn, rows, h, nq * hd,
                                        NULL, m->x),
                    "Output product");
          CUDA_TRY (gepard_launch_gemv_norm (st, GEPARD_GEMV_SWIGLU, L.gate_up, m->x, L.post_scale,
                                             d.eps, rows, 2 * m->intermediate, h, m->act, NULL),
                    "RMSNorm, gate/up products and SwiGLU");
          CUDA_TRY (gepard_launch_gemv (st, GEPARD_GEMV_RESIDUAL, L.down, m->act, rows, h,
                                        m->intermediate, NULL, m->x),
                    "Down product");
        }
      else
        {
          BLAS_TRY (gemm (m, L.o, m->attn, m->y, CUDA_R_16BF, rows, h, nq * hd));
          CUDA_TRY (gepard_launch_rms_norm (st, m->x, m->y, L.post_scale, rows, h, d.eps, m->u),
                    "RMSNorm");
          BLAS_TRY (
              gemm (m, L.gate_up, m->u, m->gate_up, CUDA_R_16BF, rows, 2 * m->intermediate, h));
          CUDA_TRY (gepard_launch_silu_mul (st, m->gate_up, rows, m->intermediate, m->act),
                    "SwiGLU");
          BLAS_TRY (gemm (m, L.down, m->act, m->y, CUDA_R_16BF, rows, h, m->intermediate));
        }
    }
  CUDA_TRY (gepard_launch_final_norm (st, m->x, few ? NULL : m->y, seqs, n, m->final_scale, h,
                                      d.eps, m->hidden_last),
            "Final norm");
  if (few)
    CUDA_TRY (gepard_launch_gemv (st, GEPARD_GEMV_F32, m->heads, m->hidden_last, n, m->acc_stride,
                                  h, m->head_acc, NULL),
              "Heads");
  else
    BLAS_TRY (gemm (m, m->heads, m->hidden_last, m->head_acc, CUDA_R_32F, n, m->acc_stride, h));
  int32_t *codes = (int32_t *)m->d_out;
  float *stops = (float *)(codes + (size_t)n * m->n_heads);
  float *logits = stops + n;
  CUDA_TRY (gepard_launch_sample (st, m->head_acc, m->acc_stride, m->heads_bias, seqs, n,
                                  m->n_heads, m->head_offsets, m->n_logits, m->states, m->history,
                                  codes, stops, logits, m->work),
            "Sampling");
  return 0;
}

/* A decode step (one fed-back frame per sequence) as one graph launch: the kernels and GEMMs of
 * such steps depend only on the number of sequences and on the shared memory the attention
 * needs, so one capture per (n, 256-position bucket) serves every later step of that shape,
 * with the step's metadata read from the same device buffer. Where capture fails, steps run
 * uncaptured from then on. */
int
run_graph (GepardCudaModel *m, const MetaLayout &lay, int n, int max_visible, Message &msg)
{
  int visible = std::min ((int)align_up (max_visible, 256), m->max_context);
  Graph *graph = NULL;
  for (Graph &g : m->graphs)
    if (g.n == n && g.visible == visible)
      graph = &g;
  m->graph_clock++;
  if (graph == NULL)
    {
      cudaGraph_t captured = NULL;
      cudaGraphExec_t exec = NULL;
      CUDA_TRY (cudaStreamBeginCapture (m->stream, cudaStreamCaptureModeThreadLocal),
                "Capturing a step");
      int result = run_step (m, lay, n, n, n, visible, msg);
      cudaError_t status = cudaStreamEndCapture (m->stream, &captured);
      if (result == 0 && status == cudaSuccess)
        status = cudaGraphInstantiate (&exec, captured, 0);
      if (captured != NULL)
        cudaGraphDestroy (captured);
      if (result != 0 || status != cudaSuccess)
        {
          cudaGetLastError ();
          m->use_graphs = false;
          return run_step (m, lay, n, n, n, max_visible, msg);
        }
      /* lengths move on and batch buckets come and go: keep the most recently used */
      if (m->graphs.size () >= MAX_GRAPHS)
        {
          auto oldest
              = std::min_element (m->graphs.begin (), m->graphs.end (),
                                  [] (const Graph &a, const Graph &b) { return a.used < b.used; });
          cudaGraphExecDestroy (oldest->exec);
          m->graphs.erase (oldest);
        }
      m->graphs.push_back ({n, visible, exec, 0});
      graph = &m->graphs.back ();
    }
  graph->used = m->graph_clock;
  CUDA_TRY (cudaGraphLaunch (graph->exec, m->stream), "Launching a step");
  return 0;
}

} // namespace

GEPARD_CUDA_EXPORT int
gepard_cuda_step (GepardCudaModel *m, const GepardCudaStepInput *inputs, int n, int32_t *codes,
                  float *stop_logits, float *logits, char *message, size_t message_len)
{
  Message msg = {message, message_len};
  if (n <= 0)
    return 0;
  if (n > m->max_sequences)
    return msg.fail ("A step of %d sequences is more than the %d the GPU backend holds", n,
                     m->max_sequences);
  CUDA_TRY (cudaSetDevice (m->device), "Selecting the GPU");

  /* validate everything before anything moves */
  unsigned stamp = ++m->stamp;
  int rows = 0, frames = 0, prefix_rows = 0, max_visible = 0;
  size_t blocks_needed = 0;
  std::vector<int> n_rows (n);
  for (int i = 0; i < n; i++)
    {
      const GepardCudaStepInput &in = inputs[i];
      if (in.sequence < 0 || in.sequence >= m->max_sequences || !m->seqs[in.sequence].in_use)
        return msg.fail ("Step input %d names no live sequence", i);
      Sequence &s = m->seqs[in.sequence];
      if (s.stamp == stamp)
        return msg.fail ("Sequence %d appears twice in one step", in.sequence);
      s.stamp = stamp;
      if (in.codes != NULL)
        {
          for (int c = 0; c < m->n_heads; c++)
            if (in.codes[c] < 0 || in.codes[c] >= m->head_levels[c])
              return msg.fail ("Code %d of channel %d is outside its %d levels", in.codes[c], c,
                               m->head_levels[c]);
          n_rows[i] = 1;
          frames++;
        }
      else
        {
          if (in.n_prefix < 0 || in.n_ids < 0 || (in.n_prefix > 0 && in.prefix == NULL))
            return msg.fail ("Step input %d has a bad prefix or id count", i);
          for (int t = 0; t < in.n_ids; t++)
            if (in.ids[t] < 0 || in.ids[t] >= m->vocab_rows)
              return msg.fail ("Token id %d is outside the embedding table (%d rows)", in.ids[t],
                               m->vocab_rows);
          n_rows[i] = in.n_prefix + in.n_ids;
          prefix_rows += in.n_prefix;
        }
      if (n_rows[i] == 0)
        return msg.fail ("Step input %d brings no rows", i);
      if (in.guided && i + 1 >= n)
        return msg.fail ("Step input %d is guided but has no unconditional branch after it", i);
      int length = s.length + n_rows[i];
      if (length > m->max_context)
        return msg.fail ("A sequence would reach %d positions, more than the %d the GPU backend "
                         "holds",
                         length, m->max_context);
      rows += n_rows[i];
      max_visible = std::max (max_visible, length);
      blocks_needed += (length + GEPARD_KV_BLOCK - 1) / GEPARD_KV_BLOCK - s.blocks.size ();
    }

  /* a step of single frames runs as a captured graph, padded to its bucketed size */
  const bool captured = frames == n && m->use_graphs;
  const int n_step = captured ? gepard_batch_bucket (n) : n;
  if (ensure_rows (m, rows + n_step - n, msg) != 0)
    return -1;
  MetaLayout lay = meta_layout (m, n_step, rows + n_step - n, frames + n_step - n, prefix_rows);
  if (ensure_meta (m, lay.total, msg) != 0)
    return -1;

  std::vector<size_t> old_blocks (n);
  {
    std::lock_guard<std::mutex> guard (m->lock);
    if (blocks_needed > m->free_blocks.size ())
      return msg.fail ("The KV cache is full: the step needs %zu more blocks, %zu are free",
                       blocks_needed, m->free_blocks.size ());
    for (int i = 0; i < n; i++)
      {
        Sequence &s = m->seqs[inputs[i].sequence];
        old_blocks[i] = s.blocks.size ();
        size_t want = (s.length + n_rows[i] + GEPARD_KV_BLOCK - 1) / GEPARD_KV_BLOCK;
        while (s.blocks.size () < want)
          {
            s.blocks.push_back (m->free_blocks.back ());
            m->free_blocks.pop_back ();
          }
      }
  }

  /* the step's metadata, one upload */
  char *meta = m->h_meta;
  GepardStepSeq *seq_meta = (GepardStepSeq *)(meta + lay.seqs);
  GepardStepRow *row_meta = (GepardStepRow *)(meta + lay.rows);
  int32_t *frame_codes = (int32_t *)(meta + lay.frame_codes);
  int32_t *frame_rows = (int32_t *)(meta + lay.frame_rows);
  int32_t *tables = (int32_t *)(meta + lay.block_tables);
  float *prefix = (float *)(meta + lay.prefix);
  int row = 0, frame = 0, prefix_row = 0, h = m->dims.hidden;
  for (int i = 0; i < n; i++)
    {
      const GepardCudaStepInput &in = inputs[i];
      Sequence &s = m->seqs[in.sequence];
      for (int t = 0; t < n_rows[i]; t++, row++)
        {
          GepardStepRow &r = row_meta[row];
          r.seq = i;
          r.pos = s.length + t;
          if (in.codes != NULL)
            {
              r.kind = GEPARD_ROW_FRAME;
              r.value = frame;
              memcpy (frame_codes + (size_t)frame * m->n_heads, in.codes, m->n_heads * 4);
              frame_rows[frame++] = row;
            }
          else if (t < in.n_prefix)
            {
              r.kind = GEPARD_ROW_PREFIX;
              r.value = prefix_row;
              memcpy (prefix + (size_t)prefix_row++ * h, in.prefix + (size_t)t * h, h * 4);
            }
          else
            {
              r.kind = GEPARD_ROW_TEXT;
              r.value = in.ids[t - in.n_prefix];
            }
        }
      GepardStepSeq &q = seq_meta[i];
      memset (&q, 0, sizeof q);
      q.slot = in.sequence;
      q.last_row = row - 1;
      q.init = s.init;
      q.guided = in.guided;
      q.cfg_scale = in.cfg_scale;
      q.state = s.state;
      int32_t *table = tables + (size_t)i * m->max_blocks;
      for (int b = 0; b < m->max_blocks; b++)
        table[b] = b < (int)s.blocks.size () ? s.blocks[b] : 0;
    }
  /* the padding: a first frame of code 0 in the spare slot, sampled greedily, never read */
  for (int i = n; i < n_step; i++, row++)
    {
      GepardStepRow &r = row_meta[row];
      r.seq = i;
      r.pos = 0;
      r.kind = GEPARD_ROW_FRAME;
      r.value = frame;
      memset (frame_codes + (size_t)frame * m->n_heads, 0, m->n_heads * 4);
      frame_rows[frame++] = row;
      GepardStepSeq &q = seq_meta[i];
      memset (&q, 0, sizeof q);
      q.slot = m->max_sequences;
      q.last_row = row;
      q.init = 1;
      int32_t *table = tables + (size_t)i * m->max_blocks;
      for (int b = 0; b < m->max_blocks; b++)
        table[b] = m->spare_block;
    }

  size_t out_bytes = (size_t)n_step * (m->n_heads + 1 + (logits != NULL ? m->n_logits : 0)) * 4;
  cudaError_t status
      = cudaMemcpyAsync (m->d_meta, m->h_meta, lay.total, cudaMemcpyHostToDevice, m->stream);
  int result = status == cudaSuccess ? 0 : cuda_fail (msg, status, "Uploading the step");
  if (result == 0)
    result = captured ? run_graph (m, lay, n_step, max_visible, msg)
                      : run_step (m, lay, n, rows, frames, max_visible, msg);
  if (result == 0)
    {
      status = cudaMemcpyAsync (m->h_out, m->d_out, out_bytes, cudaMemcpyDeviceToHost, m->stream);
      if (status == cudaSuccess)
        status = cudaStreamSynchronize (m->stream);
      if (status != cudaSuccess)
        result = cuda_fail (msg, status, "Running the step");
    }
  if (result != 0)
    {
      std::lock_guard<std::mutex> guard (m->lock);
      for (int i = 0; i < n; i++)
        {
          Sequence &s = m->seqs[inputs[i].sequence];
          while (s.blocks.size () > old_blocks[i])
            {
              m->free_blocks.push_back (s.blocks.back ());
              s.blocks.pop_back ();
            }
        }
      return -1;
    }

  for (int i = 0; i < n; i++)
    {
      Sequence &s = m->seqs[inputs[i].sequence];
      s.length += n_rows[i];
      s.init = false;
    }
  const int32_t *out_codes = (const int32_t *)m->h_out;
  const float *out_stops = (const float *)(out_codes + (size_t)n_step * m->n_heads);
  memcpy (codes, out_codes, (size_t)n * m->n_heads * 4);
  memcpy (stop_logits, out_stops, (size_t)n * 4);
  if (logits != NULL)
    memcpy (logits, out_stops + n_step, (size_t)n * m->n_logits * 4);
  return 0;
}
