/* gepard-cuda-private.h: what the LM and codec host code (gepard-cuda-lm.cu,
 * gepard-cuda-codec.cu) and the device kernels (gepard-cuda-kernels.cu) share inside the module. */
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

/* a failure's reason, written into the caller's buffer */
struct GepardCudaMessage
{
  char *text;
  size_t len;

  __attribute__ ((format (printf, 2, 3))) int
  fail (const char *format, ...)
  {
    if (text != NULL && len > 0)
      {
        va_list args;
        va_start (args, format);
        vsnprintf (text, len, format, args);
        va_end (args);
      }
    return -1;
  }
};

static inline int
cuda_fail (GepardCudaMessage &msg, cudaError_t status, const char *what)
{
  return msg.fail ("%s: %s (%s)", what, cudaGetErrorString (status), cudaGetErrorName (status));
}

/* returns -1 from the enclosing function, with the reason in `msg`, when expr fails */
#define CUDA_TRY(expr, what)                                                                       \
  do                                                                                               \
    {                                                                                              \
      cudaError_t status_ = (expr);                                                                \
      if (status_ != cudaSuccess)                                                                  \
        return cuda_fail (msg, status_, what);                                                     \
    }                                                                                              \
  while (0)

typedef __nv_bfloat16 gbf16;

/* The cuBLAS functions the module calls. The module does not link cuBLAS: gepard_cuda_blas opens
 * it with dlopen the first time a model or codec needs it (gepard-cuda-lm.cu), so the module loads
 * and probes where only the driver is installed. NULL, with the reason in msg, where it cannot. */
struct GepardCudaBlas
{
  decltype (&cublasCreate_v2) create;
  decltype (&cublasDestroy_v2) destroy;
  decltype (&cublasSetStream_v2) set_stream;
  decltype (&cublasSetMathMode) set_math_mode;
  decltype (&cublasSetWorkspace_v2) set_workspace;
  /* the C symbol; C++ also sees an overload taking the compute type as a cudaDataType_t */
  cublasStatus_t (*gemm_ex) (cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                             const void *, const void *, cudaDataType_t, int, const void *,
                             cudaDataType_t, int, const void *, void *, cudaDataType_t, int,
                             cublasComputeType_t, cublasGemmAlgo_t);
  decltype (&cublasGetStatusString) status_string;
};

const GepardCudaBlas *gepard_cuda_blas (GepardCudaMessage &msg);

/* Every launch goes through here rather than the triple-chevron syntax, which clang-format does
 * not read; the arguments are converted to the kernel's parameter types. */
template <typename... Params, typename... Args>
static inline cudaError_t
launch (void (*kernel) (Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
        Args... args)
{
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  return cudaLaunchKernelEx (&config, kernel, args...);
}

/* The batch sizes captured graphs are made for. A decode step or codec pass over n items runs as
 * one over gepard_batch_bucket (n) items, the extra ones doing throwaway work in a spare slot, so
 * batches that change size at every step as streams come and go reuse a few dozen graphs (32 up
 * to 1024) rather than capturing one per size. Padding costs at most 1/8 more work above 128. */
static inline int
gepard_batch_bucket (int n)
{
  if (n <= 16)
    {
      int b = 1;
      while (b < n)
        b *= 2;
      return b;
    }
  int step = n <= 128 ? 16 : n <= 512 ? 32 : 64;
  return (n + step - 1) / step * step;
}

/* positions per KV-cache block */
#define GEPARD_KV_BLOCK 64
/* the repetition penalty looks at the last 32 frames (gepard-generate.c) */
#define GEPARD_PENALTY_WINDOW 32
#define GEPARD_CUDA_MAX_HEADS 64

enum
{
  GEPARD_ROW_TEXT,   /* value: token id */
  GEPARD_ROW_PREFIX, /* value: row of the step's prefix rows */
  GEPARD_ROW_FRAME,  /* value: index of the step's frames */
};

/* one row (position) of a step */
typedef struct
{
  int seq; /* index into the step's sequences */
  int pos;
  int kind;
  int value;
} GepardStepRow;

/* the sampler of one sequence slot, kept on the device between steps; the same state and
 * arithmetic as gepard-generate.c's GepardSampler */
typedef struct
{
  uint64_t rng[4];
  int n_frames;
  float temperature;
  int top_k;
  float penalty;
} GepardSamplerState;

/* one sequence of a step */
typedef struct
{
  int slot;
  int last_row;
  int init;   /* the slot's sampler starts from `state` (a new sequence) */
  int guided; /* text-CFG: the next sequence of the step is this one's unconditional branch */
  float cfg_scale;
  int pad;
  GepardSamplerState state;
} GepardStepSeq;

/* where one layer's keys and values live in the paged pool: block b, layer l, kv head j, K or V
 * at pool + b·block_elems + l·layer_elems + (2j + which)·GEPARD_KV_BLOCK·head_dim */
typedef struct
{
  gbf16 *pool;
  size_t block_elems;
  size_t layer_elems;
  const int *block_tables; /* [n_seqs][max_blocks] */
  int max_blocks;
} GepardKvView;

typedef struct
{
  int hidden;
  int n_q_heads;
  int n_kv_heads;
  int head_dim;
  int rotary_dim;
  int max_context;
  float eps;
} GepardDims;

/* launchers; all run on `stream` and return the launch status */
cudaError_t gepard_launch_embed_rows (cudaStream_t stream, const GepardStepRow *rows, int n_rows,
                                      const gbf16 *table, const float *prefix, int hidden,
                                      float *x);
cudaError_t gepard_launch_frame_gather (cudaStream_t stream, const int32_t *codes, int n_frames,
                                        int n_heads, const int *head_offsets,
                                        const gbf16 *audio_table, int embed_dim, gbf16 *out);
cudaError_t gepard_launch_bias_gelu (cudaStream_t stream, const float *acc, const float *bias,
                                     int n_rows, int n, gbf16 *out);
cudaError_t gepard_launch_bias_layer_norm (cudaStream_t stream, const float *acc, const float *bias,
                                           float scale, const int *frame_rows, int n_frames, int n,
                                           float *x);
cudaError_t gepard_launch_rms_norm (cudaStream_t stream, float *x, const gbf16 *residual,
                                    const float *scale, int n_rows, int n, float eps, gbf16 *out);
/* residual may be NULL where the last product already joined x (GEPARD_GEMV_RESIDUAL) */
cudaError_t gepard_launch_final_norm (cudaStream_t stream, float *x, const gbf16 *residual,
                                      const GepardStepSeq *seqs, int n_seqs, const float *scale,
                                      int n, float eps, gbf16 *out);
cudaError_t gepard_launch_qk_norm_rope (cudaStream_t stream, gbf16 *qkv, const GepardStepRow *rows,
                                        int n_rows, const GepardDims *dims, const float *q_scale,
                                        const float *k_scale, const float *rope_table,
                                        GepardKvView kv, int layer);
/* dynamic shared memory the attention kernel needs for `max_visible` keys */
size_t gepard_attention_smem (const GepardDims *dims, int max_visible);
/* whether the head geometry has a compiled attention kernel */
int gepard_attention_supported (const GepardDims *dims);
cudaError_t gepard_attention_prepare (const GepardDims *dims, size_t max_smem);
cudaError_t gepard_launch_attention (cudaStream_t stream, const gbf16 *qkv,
                                     const GepardStepRow *rows, int n_rows, const GepardDims *dims,
                                     GepardKvView kv, int layer, int max_visible, gbf16 *out);
cudaError_t gepard_launch_silu_mul (cudaStream_t stream, const gbf16 *gate_up, int n_rows,
                                    int intermediate, gbf16 *out);
/* Products of at most GEPARD_GEMV_MAX_ROWS rows, y = x · wᵀ (w [out][in] bf16, x [rows][in]
 * bf16, row-major like the GEMMs they stand in for; `in` a multiple of 8 and both on 16 bytes),
 * one warp per output, with the step's next elementwise work folded in by `mode`. */
#define GEPARD_GEMV_MAX_ROWS 8
typedef enum
{
  GEPARD_GEMV_BF16,     /* y [rows][out] bf16 */
  GEPARD_GEMV_F32,      /* y [rows][out] fp32 */
  GEPARD_GEMV_RESIDUAL, /* x_res [rows][out] += the bf16 product, rounded to bf16 (no y) */
  GEPARD_GEMV_SWIGLU,   /* y [rows][out/2] = silu(gate) · up, w's rows gate then up */
} GepardGemvMode;
cudaError_t gepard_launch_gemv (cudaStream_t stream, GepardGemvMode mode, const gbf16 *w,
                                const gbf16 *x, int rows, int out, int in, void *y, float *x_res);
/* the same with x = RMSNorm(x [rows][in], fp32) · scale (rms_norm_kernel's bits; rows · in · 2
 * bytes of normalized rows must fit the 48 KiB of shared memory a launch gets: in ≤ 3072) in place
 * of a norm kernel before it */
cudaError_t gepard_launch_gemv_norm (cudaStream_t stream, GepardGemvMode mode, const gbf16 *w,
                                     float *x, const float *scale, float eps, int rows, int out,
                                     int in, void *y, float *x_res);
/* heads' bias and bf16 rounding, then §3.4 sampling for each sequence */
cudaError_t gepard_launch_sample (cudaStream_t stream, const float *acc, int acc_stride,
                                  const float *bias, const GepardStepSeq *seqs, int n_seqs,
                                  int n_heads, const int *head_offsets, int n_logits,
                                  GepardSamplerState *states, int32_t *history, int32_t *codes,
                                  float *stop_logits, float *logits, float *work);
