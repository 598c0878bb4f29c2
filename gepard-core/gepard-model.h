/* gepard-model.h: the GEPARD model on the CPU, the numerics of record (gepard-model.md).
 *
 * Values live in fp32 arrays but are rounded to bf16 at every point where the bf16 eager reference
 * rounds (§1.9), so the outputs agree with transformers' Qwen3_5TextModel plus GEPARD's overlay up
 * to the accumulation order of the GEMMs. Weights are held as bf16-rounded fp32 (what
 * `model.to(bf16)` gives); the text embedding stays in the mapped file and is converted row by row.
 */
#pragma once

#include "gepard-checkpoint.h"

G_BEGIN_DECLS

/* gepard-model.md §1.5: GEPARD's runner rounds RoPE's inverse frequencies to bf16; transformers'
 * from_pretrained, training and vLLM keep them in fp32. */
typedef enum
{
  GEPARD_ROPE_INV_FREQ_BF16,
  GEPARD_ROPE_INV_FREQ_F32,
} GepardRopeMode;

/* the sum of the 32 heads' level counts: 8+7+6+6 per codebook × 8 */
#define GEPARD_MAX_HEAD_LOGITS 1024

typedef struct _GepardModel GepardModel;
typedef struct _GepardKvCache GepardKvCache;

GepardModel *gepard_model_new (const GepardCheckpoint *checkpoint, GepardRopeMode rope_mode,
                               GError **error);
void gepard_model_free (GepardModel *model);
const GepardModelConfig *gepard_model_get_config (const GepardModel *model);
/* total logits over all heads (216 for GEPARD) */
int gepard_model_get_n_head_logits (const GepardModel *model);

/* KV cache of one sequence; grows as needed. */
GepardKvCache *gepard_kv_cache_new (const GepardModel *model);
void gepard_kv_cache_free (GepardKvCache *cache);
int gepard_kv_cache_get_length (const GepardKvCache *cache);
void gepard_kv_cache_reset (GepardKvCache *cache);

/* Text embeddings of `ids` into `out` [n, H]. Fails naming the id when one is outside the table. */
gboolean gepard_model_embed_tokens (const GepardModel *model, const gint32 *ids, int n, float *out,
                                    GError **error);
/* §3.5: embedding of one frame of 32 channel codes into `out` [H]. Fails on a code outside its
 * head's levels. */
gboolean gepard_model_embed_frame (const GepardModel *model, const gint32 *codes, float *out,
                                   GError **error);
/* Runs the backbone over `n` input embeddings [n, H] appended at the cache's end (positions
 * len … len+n−1) and writes the final-norm hidden states [n, H]. */
void gepard_model_forward (const GepardModel *model, GepardKvCache *cache, const float *embeds,
                           int n, float *hidden);

/* One sequence's part of a batch: its cache and how many new tokens it brings. */
typedef struct
{
  GepardKvCache *cache;
  int n_tokens;
} GepardBatchSegment;

/* One forward for many sequences (continuous batching): `embeds` holds the segments' tokens one
 * segment after the other; every projection runs over all rows at once, attention per sequence.
 * Each cache must appear once. The results equal separate forwards up to the GEMM's accumulation
 * order, which BLAS may choose by batch size: bf16 roundings can then differ in the last bit, so
 * a near tie between two codes may resolve differently in a batch than alone. */
void gepard_model_forward_batch (const GepardModel *model, const GepardBatchSegment *segments,
                                 int n_segments, const float *embeds, float *hidden);
/* §3.4: the 32 heads' logits (concatenated in head order) and the stop logit for one hidden state
 */
void gepard_model_heads (const GepardModel *model, const float *hidden, float *logits,
                         float *stop_logit);
/* the heads for `n` hidden states [n, H]: logits [n, n_head_logits], stop logits [n] */
void gepard_model_heads_batch (const GepardModel *model, const float *hidden, int n, float *logits,
                               float *stop_logits);
/* §3.6: the speaker prefix [queries, H] from reference codes [n_frames, 32] (unfolded channels). */
gboolean gepard_model_compress (const GepardModel *model, const gint32 *codes, int n_frames,
                                float *prefix, GError **error);
/* §3.7: the learned unconditional prefix [queries, H], or NULL without voice cloning */
const float *gepard_model_get_null_prefix (const GepardModel *model);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardModel, gepard_model_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardKvCache, gepard_kv_cache_free)

G_END_DECLS
