/* gepard-compute-cuda.h: what the CUDA backend offers beyond GepardComputeFuncs, for tools that
 * check it against the CPU backend. Not installed. */
#pragma once

#include "gepard-compute.h"

G_BEGIN_DECLS

/* The step of GepardComputeFuncs, also copying the heads' logits before sampling into `logits`
 * [n][n_head_logits] (bf16 values as fp32, concatenated in head order as gepard_model_heads
 * writes them). `compute` must be a CUDA backend. */
gboolean gepard_compute_cuda_step_with_logits (GepardCompute *compute,
                                               const GepardStepInput *inputs, int n, gint32 *codes,
                                               float *stop_logits, float *logits, GError **error);

/* "NVIDIA H200: weights 1.0 GiB, KV cache 120.3 GiB (68000 blocks of 64 positions), up to 1024
 * sequences of 8192 positions"; NULL for another backend */
char *gepard_compute_cuda_describe (GepardCompute *compute);

G_END_DECLS
