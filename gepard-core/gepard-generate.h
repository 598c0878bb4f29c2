/* gepard-generate.h: GEPARD generation for one utterance on the CPU model, the reference loop
 * (gepard-model.md §3): text layout, prefill, first frame from the SOS position, then decode, stop
 * check and per-head sampling until stop or max_frames. */
#pragma once

#include "gepard-model.h"

G_BEGIN_DECLS

typedef struct
{
  float temperature;        /* §3.4; 0 or less: greedy argmax */
  int top_k;                /* 0: off; ties with the k-th value are kept */
  float repetition_penalty; /* 1: off; window of the last 32 frames */
  int max_frames;           /* 2000 in the reference runner */
  float cfg_scale;          /* §3.4 text CFG: 1 is off (production); else a second branch */
  guint64 seed;
  gboolean ignore_stop;     /* benchmarks: run to max_frames whatever the stop head says */
} GepardSampling;

/* temperature 0.4 (the production operating point), top-k off, no penalty, 2000 frames, CFG off,
 * seed 0 */
void gepard_sampling_init_default (GepardSampling *sampling);

/* §3.1: the repetition count R for n text tokens */
int gepard_text_repeats (const GepardModelConfig *config, int n_tokens);
/* §3.1: [SOT t… EOT] × (R−1) ++ [SOT t… EOT SOS] as a GArray of gint32 */
GArray *gepard_text_layout (const GepardModelConfig *config, const gint32 *ids, int n_ids);

/* §3.4: bf16(sigmoid(logit)) > 0.5, i.e. logit > 2⁻⁷ */
gboolean gepard_stop_decision (float stop_logit);

/* Per-utterance sampling state: the seeded RNG and the recent frames for the repetition penalty. */
typedef struct _GepardSampler GepardSampler;

GepardSampler *gepard_sampler_new (const GepardModel *model, const GepardSampling *sampling);
void gepard_sampler_free (GepardSampler *sampler);
/* §3.4: samples the next frame's 32 codes from the heads' logits (modified in place). */
void gepard_sampler_next (GepardSampler *sampler, float *logits, gint32 *codes);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardSampler, gepard_sampler_free)

/* Called with each frame (32 codes) as soon as it is sampled; return FALSE to stop generating. */
typedef gboolean (*GepardFrameFunc) (const gint32 *codes, int index, gpointer user_data);

/* Generates frames for `layout_ids` (already laid out) after an optional speaker prefix
 * [n_prefix, H]. Returns the number of frames, or -1 with `error` set. */
int gepard_generate (const GepardModel *model, const float *prefix, int n_prefix,
                     const gint32 *layout_ids, int n_ids, const GepardSampling *sampling,
                     GepardFrameFunc on_frame, gpointer user_data, GError **error);

G_END_DECLS
