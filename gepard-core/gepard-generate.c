/* gepard-generate.c: the reference generation loop (gepard-model.md §3). */
#include "gepard-generate.h"

#include "gepard-bf16.h"
#include "gepard-error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PENALTY_WINDOW 32

void
gepard_sampling_init_default (GepardSampling *sampling)
{
  sampling->temperature = 0.4f;
  sampling->top_k = 0;
  sampling->repetition_penalty = 1.0f;
  sampling->max_frames = 2000;
  sampling->cfg_scale = 1.0f;
  sampling->seed = 0;
  sampling->ignore_stop = FALSE;
}

int
gepard_text_repeats (const GepardModelConfig *config, int n)
{
  if (!config->repetition_enabled || n <= 0 || n >= config->repetition_apply_below
      || n >= config->repetition_target_tokens)
    return 1;
  int r = (config->repetition_target_tokens + n - 1) / n;
  return CLAMP (r, 1, config->repetition_max_repeats);
}

GArray *
gepard_text_layout (const GepardModelConfig *config, const gint32 *ids, int n_ids)
{
  int repeats = gepard_text_repeats (config, n_ids);
  GArray *layout = g_array_sized_new (FALSE, FALSE, sizeof (gint32), repeats * (n_ids + 2) + 1);
  gint32 sot = config->start_of_text, eot = config->end_of_text, sos = config->start_of_speech;
  for (int r = 0; r < repeats; r++)
    {
      g_array_append_val (layout, sot);
      g_array_append_vals (layout, ids, n_ids);
      g_array_append_val (layout, eot);
    }
  g_array_append_val (layout, sos);
  return layout;
}

gboolean
gepard_stop_decision (float stop_logit)
{
  float p = gepard_bf16_round (1.0f / (1.0f + expf (-gepard_bf16_round (stop_logit))));
  return p > 0.5f;
}

/* xoshiro256** seeded through splitmix64: small, fast, and the same on every platform */
typedef struct
{
  guint64 s[4];
} Rng;

static guint64
splitmix64 (guint64 *x)
{
  guint64 z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void
rng_seed (Rng *rng, guint64 seed)
{
  for (int i = 0; i < 4; i++)
    rng->s[i] = splitmix64 (&seed);
}

static guint64
rotl (guint64 x, int k)
{
  return (x << k) | (x >> (64 - k));
}

static guint64
rng_next (Rng *rng)
{
  guint64 *s = rng->s;
  guint64 result = rotl (s[1] * 5, 7) * 9;
  guint64 t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl (s[3], 45);
  return result;
}

static double
rng_uniform (Rng *rng)
{
  return (rng_next (rng) >> 11) * (1.0 / 9007199254740992.0);
}

static int
argmax (const float *x, int n)
{
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best])
      best = i; /* first of equal maxima, as torch.argmax */
  return best;
}

static int
compare_desc (const void *a, const void *b)
{
  float x = *(const float *)a, y = *(const float *)b;
  return (x < y) - (x > y);
}

/* §3.4 steps 1–4 for one head of `n` logits */
static int
sample_head (float *logits, int n, const GepardSampling *sampling, const int *recent, int n_recent,
             Rng *rng)
{
  if (sampling->repetition_penalty != 1.0f)
    {
      /* once per distinct id seen in the window */
      gboolean seen[GEPARD_MAX_HEAD_LOGITS] = {FALSE};
      for (int r = 0; r < n_recent; r++)
        seen[recent[r]] = TRUE;
      for (int i = 0; i < n; i++)
        if (seen[i])
          logits[i] = logits[i] > 0 ? logits[i] / sampling->repetition_penalty
                                    : logits[i] * sampling->repetition_penalty;
    }
  if (sampling->temperature <= 0)
    return argmax (logits, n);
  if (sampling->temperature != 1.0f)
    for (int i = 0; i < n; i++)
      logits[i] /= sampling->temperature;
  if (sampling->top_k > 0 && sampling->top_k < n)
    {
      float sorted[GEPARD_MAX_HEAD_LOGITS];
      memcpy (sorted, logits, sizeof (float) * n);
      qsort (sorted, n, sizeof (float), compare_desc);
      float kth = sorted[sampling->top_k - 1];
      for (int i = 0; i < n; i++)
        if (logits[i] < kth)
          logits[i] = -INFINITY;
    }
  float max = logits[argmax (logits, n)], sum = 0;
  for (int i = 0; i < n; i++)
    sum += logits[i] = expf (logits[i] - max);
  double u = rng_uniform (rng) * sum, acc = 0;
  for (int i = 0; i < n; i++)
    {
      acc += logits[i];
      if (u < acc && logits[i] > 0)
        return i;
    }
  return argmax (logits, n);
}

struct _GepardSampler
{
  const GepardModelConfig *config;
  GepardSampling sampling;
  Rng rng;
  int n_frames;
  gint32 *history; /* the last PENALTY_WINDOW frames, a ring */
};

GepardSampler *
gepard_sampler_new (const GepardModel *model, const GepardSampling *sampling)
{
  GepardSampler *sampler = g_new0 (GepardSampler, 1);
  sampler->config = gepard_model_get_config (model);
  sampler->sampling = *sampling;
  rng_seed (&sampler->rng, sampling->seed);
  sampler->history = g_new0 (gint32, (gsize)PENALTY_WINDOW * sampler->config->n_audio_heads);
  return sampler;
}

void
gepard_sampler_free (GepardSampler *sampler)
{
  if (sampler == NULL)
    return;
  g_free (sampler->history);
  g_free (sampler);
}

void
gepard_sampler_next (GepardSampler *sampler, float *logits, gint32 *codes)
{
  const GepardModelConfig *c = sampler->config;
  int n_heads = c->n_audio_heads;
  int n_recent = MIN (sampler->n_frames, PENALTY_WINDOW);
  int recent[PENALTY_WINDOW];
  int offset = 0;

  /* §3.4: the heads in order, each from the same RNG stream */
  for (int i = 0; i < n_heads; i++)
    {
      for (int r = 0; r < n_recent; r++)
        recent[r] = sampler->history[r * n_heads + i];
      codes[i] = sample_head (logits + offset, c->head_levels[i], &sampler->sampling, recent,
                              n_recent, &sampler->rng);
      offset += c->head_levels[i];
    }
  memcpy (sampler->history + (gsize)(sampler->n_frames % PENALTY_WINDOW) * n_heads, codes,
          sizeof (gint32) * n_heads);
  sampler->n_frames++;
}

int
gepard_generate (const GepardModel *model, const float *prefix, int n_prefix,
                 const gint32 *layout_ids, int n_ids, const GepardSampling *sampling,
                 GepardFrameFunc on_frame, gpointer user_data, GError **error)
{
  const GepardModelConfig *c = gepard_model_get_config (model);
  int h = c->hidden_size;
  int n_logits = gepard_model_get_n_head_logits (model);
  int prefill = n_prefix + n_ids;

  if (n_ids <= 0 || sampling->max_frames <= 0)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "Nothing to generate: %d text ids, at most %d frames", n_ids,
                   sampling->max_frames);
      return -1;
    }

  g_autofree float *embeds = g_new (float, (gsize)prefill *h);
  g_autofree float *hidden = g_new (float, (gsize)prefill *h);
  if (n_prefix > 0)
    memcpy (embeds, prefix, sizeof (float) * n_prefix * h);
  if (!gepard_model_embed_tokens (model, layout_ids, n_ids, embeds + (gsize)n_prefix * h, error))
    return -1;

  g_autoptr (GepardKvCache) cache = gepard_kv_cache_new (model);
  g_autoptr (GepardSampler) sampler = gepard_sampler_new (model, sampling);
  float logits[GEPARD_MAX_HEAD_LOGITS], stop;
  gint32 codes[GEPARD_MAX_AUDIO_HEADS];

  /* §3.3: the first frame comes from the last prefill position (SOS), with no stop check */
  gepard_model_forward (model, cache, embeds, prefill, hidden);
  const float *state = hidden + (gsize)(prefill - 1) * h;

  /* §3.4 text CFG: an unconditional branch over [prefix | SOT EOT SOS] fed the same frames */
  gboolean cfg = sampling->cfg_scale != 1.0f;
  g_autoptr (GepardKvCache) uncond_cache = NULL;
  g_autofree float *uncond_hidden = NULL;
  float uncond_logits[GEPARD_MAX_HEAD_LOGITS], uncond_stop;
  if (cfg)
    {
      const gint32 uncond_ids[3] = {c->start_of_text, c->end_of_text, c->start_of_speech};
      int uncond_prefill = n_prefix + 3;
      g_autofree float *uncond_embeds = g_new (float, (gsize)uncond_prefill *h);
      uncond_hidden = g_new (float, (gsize)uncond_prefill *h);
      if (n_prefix > 0)
        memcpy (uncond_embeds, prefix, sizeof (float) * n_prefix * h);
      if (!gepard_model_embed_tokens (model, uncond_ids, 3, uncond_embeds + (gsize)n_prefix * h,
                                      error))
        return -1;
      uncond_cache = gepard_kv_cache_new (model);
      gepard_model_forward (model, uncond_cache, uncond_embeds, uncond_prefill, uncond_hidden);
      memmove (uncond_hidden, uncond_hidden + (gsize)(uncond_prefill - 1) * h, sizeof (float) * h);
    }

  int n_frames = 0;
  for (;;)
    {
      /* the stop is decided on the conditional branch */
      gepard_model_heads (model, state, logits, &stop);
      if (n_frames > 0 && !sampling->ignore_stop && gepard_stop_decision (stop))
        break;
      if (cfg)
        {
          gepard_model_heads (model, uncond_hidden, uncond_logits, &uncond_stop);
          for (int i = 0; i < n_logits; i++)
            logits[i] = uncond_logits[i] + sampling->cfg_scale * (logits[i] - uncond_logits[i]);
        }

      gepard_sampler_next (sampler, logits, codes);
      if (on_frame != NULL && !on_frame (codes, n_frames, user_data))
        return n_frames + 1;
      n_frames++;
      if (n_frames >= sampling->max_frames)
        break;

      /* §3.4: embed the last frame, one decode step */
      if (!gepard_model_embed_frame (model, codes, embeds, error))
        return -1;
      gepard_model_forward (model, cache, embeds, 1, hidden);
      state = hidden;
      if (cfg)
        gepard_model_forward (model, uncond_cache, embeds, 1, uncond_hidden);
    }
  return n_frames;
}
