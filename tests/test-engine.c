/* The shared engine: continuous batching gives each utterance the frames the reference loop gives
 * it, cancellation ends one utterance at once, bad requests are refused. */
#include "gepard-engine.h"
#include "gepard-error.h"
#include "gepard-test-model.h"

#include <glib/gstdio.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

static char *work_dir;
static char *model_dir;

typedef struct
{
  GMutex lock;
  GCond cond;
  GArray *frames;
  int ended;
  GepardUtteranceEnd end;
  int n_frames;
  int cancel_after; /* cancel from the frame callback after this many frames; 0: never */
} Record;

static Record *
record_new (int cancel_after)
{
  Record *r = g_new0 (Record, 1);
  g_mutex_init (&r->lock);
  g_cond_init (&r->cond);
  r->frames = g_array_new (FALSE, FALSE, sizeof (gint32));
  r->cancel_after = cancel_after;
  return r;
}

static void
record_free (Record *r)
{
  g_mutex_clear (&r->lock);
  g_cond_clear (&r->cond);
  g_array_unref (r->frames);
  g_free (r);
}

static void
on_frame (GepardUtterance *u, const gint32 *codes, int index, gpointer user_data)
{
  Record *r = user_data;
  g_mutex_lock (&r->lock);
  g_assert_cmpint (index * 32, ==, r->frames->len);
  g_assert_cmpint (r->ended, ==, 0);
  g_array_append_vals (r->frames, codes, 32);
  g_mutex_unlock (&r->lock);
  if (r->cancel_after > 0 && index + 1 == r->cancel_after)
    gepard_utterance_cancel (u);
}

static void
on_done (GepardUtterance *u, GepardUtteranceEnd end, int n_frames, gpointer user_data)
{
  Record *r = user_data;
  g_mutex_lock (&r->lock);
  r->ended++;
  r->end = end;
  r->n_frames = n_frames;
  g_cond_broadcast (&r->cond);
  g_mutex_unlock (&r->lock);
}

static const GepardUtteranceCallbacks callbacks = {on_frame, on_done};

static void
record_wait (Record *r)
{
  gint64 deadline = g_get_monotonic_time () + 60 * G_TIME_SPAN_SECOND;
  g_mutex_lock (&r->lock);
  while (r->ended == 0)
    if (!g_cond_wait_until (&r->cond, &r->lock, deadline))
      g_error ("an utterance did not end within 60 s");
  g_mutex_unlock (&r->lock);
}

static gboolean
collect (const gint32 *codes, int index, gpointer user_data)
{
  g_array_append_vals (user_data, codes, 32);
  return TRUE;
}

/* the reference loop's frames for the same request */
static GArray *
reference_frames (GepardEngine *engine, const gint32 *text, int n, const GepardSampling *sampling)
{
  const GepardModelConfig *c = gepard_engine_get_config (engine);
  g_autoptr (GArray) layout = gepard_text_layout (c, text, n);
  GArray *frames = g_array_new (FALSE, FALSE, sizeof (gint32));
  int count
      = gepard_generate (gepard_engine_get_model (engine), NULL, 0, (const gint32 *)layout->data,
                         layout->len, sampling, collect, frames, NULL);
  g_assert_cmpint (count * 32, ==, frames->len);
  return frames;
}

static void
text_for (int i, gint32 *text, int *n)
{
  *n = 3 + i % 9;
  for (int k = 0; k < *n; k++)
    text[k] = 20 + (i * 31 + k * 7) % 200;
}

/* One utterance of text_for (`i`) alone in the engine: exactly the reference loop's frames, which
 * are returned. */
static GArray *
alone_equals_reference (GepardEngine *engine, int i, const GepardSampling *sampling)
{
  g_autoptr (GError) error = NULL;
  gint32 text[16];
  int n;
  text_for (i, text, &n);

  Record *r = record_new (0);
  g_autoptr (GepardUtterance) u
      = gepard_engine_submit (engine, text, n, NULL, 0, sampling, &callbacks, r, NULL, &error);
  g_assert_no_error (error);
  record_wait (r);
  GArray *expected = reference_frames (engine, text, n, sampling);
  g_assert_cmpint (r->ended, ==, 1);
  g_assert_cmpint (r->n_frames * 32, ==, r->frames->len);
  g_assert_cmpmem (r->frames->data, r->frames->len * 4, expected->data, expected->len * 4);
  g_assert_true (r->end == GEPARD_UTTERANCE_STOPPED || r->end == GEPARD_UTTERANCE_MAX_FRAMES);
  record_free (r);
  return expected;
}

static void
test_single_equals_reference (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardEngine) engine = gepard_engine_new (model_dir, "cpu", NULL, &error);
  g_assert_no_error (error);
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.seed = 99;
  sampling.max_frames = 300;
  g_autoptr (GArray) frames = alone_equals_reference (engine, 1, &sampling);
}

/* The heads' logits of the reference loop over `ids` at frame `k` after forcing `frames` [k, 32].
 */
static void
forced_logits (const GepardModel *model, const gint32 *ids, int n_ids, const gint32 *frames, int k,
               float *logits)
{
  int h = gepard_model_get_config (model)->hidden_size;
  g_autofree float *embeds = g_new (float, n_ids *h);
  g_autofree float *hidden = g_new (float, n_ids *h);
  g_autoptr (GepardKvCache) cache = gepard_kv_cache_new (model);
  float stop;
  g_assert_true (gepard_model_embed_tokens (model, ids, n_ids, embeds, NULL));
  gepard_model_forward (model, cache, embeds, n_ids, hidden);
  const float *state = hidden + (n_ids - 1) * h;
  for (int j = 0; j < k; j++)
    {
      g_assert_true (gepard_model_embed_frame (model, frames + j * 32, embeds, NULL));
      gepard_model_forward (model, cache, embeds, 1, hidden);
      state = hidden;
    }
  gepard_model_heads (model, state, logits, &stop);
}

/* The reference's logits at frame `k` after forcing `frames` [k, 32], with text-CFG's
 * u + w·(c − u) where cfg_scale ≠ 1 (§3.4). */
static void
reference_logits_at (GepardEngine *engine, const gint32 *text, int n, const gint32 *frames, int k,
                     float cfg_scale, float *logits)
{
  const GepardModel *model = gepard_engine_get_model (engine);
  const GepardModelConfig *c = gepard_engine_get_config (engine);
  g_autoptr (GArray) layout = gepard_text_layout (c, text, n);
  forced_logits (model, (const gint32 *)layout->data, layout->len, frames, k, logits);
  if (cfg_scale == 1.0f)
    return;
  const gint32 empty[3] = {c->start_of_text, c->end_of_text, c->start_of_speech};
  float u[GEPARD_MAX_HEAD_LOGITS];
  forced_logits (model, empty, 3, frames, k, u);
  for (int i = 0; i < gepard_model_get_n_head_logits (model); i++)
    logits[i] = u[i] + cfg_scale * (logits[i] - u[i]);
}

/* Whether greedy frames `got` from a batched engine are the reference loop's for the same request;
 * where they first differ, the reference must have had a near tie (BLAS may sum a batch in another
 * order than one row: gepard-model.h), else the test fails. */
static gboolean
matches_reference (GepardEngine *engine, const gint32 *text, int n, const GepardSampling *sampling,
                   const GArray *got, int utterance)
{
  const GepardModelConfig *c = gepard_engine_get_config (engine);
  g_autoptr (GArray) expected = reference_frames (engine, text, n, sampling);
  guint common = MIN (got->len, expected->len), k = 0;
  while (k < common && g_array_index (got, gint32, k) == g_array_index (expected, gint32, k))
    k++;
  if (k == common)
    {
      g_assert_cmpuint (got->len, ==, expected->len);
      return TRUE;
    }
  int frame = k / 32, head = k % 32, offset = 0;
  float logits[GEPARD_MAX_HEAD_LOGITS];
  reference_logits_at (engine, text, n, (const gint32 *)got->data, frame, sampling->cfg_scale,
                       logits);
  for (int j = 0; j < head; j++)
    offset += c->head_levels[j];
  float a = logits[offset + g_array_index (got, gint32, k)];
  float b = logits[offset + g_array_index (expected, gint32, k)];
  g_test_message ("utterance %d: near tie at frame %d head %d: %g vs %g", utterance, frame, head, a,
                  b);
  g_assert_cmpfloat (fabsf (a - b), <=, 0.02f * MAX (1.0f, fabsf (b)));
  return FALSE;
}

/* Many greedy utterances at once, joining while others run: each gets the reference loop's frames
 * up to a near tie (matches_reference). */
static void
test_batched_equals_reference (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardEngine) engine = gepard_engine_new (model_dir, "cpu", NULL, &error);
  g_assert_no_error (error);
  enum
  {
    N = 12
  };
  Record *records[N];
  GepardUtterance *utterances[N];
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.temperature = 0;
  for (int i = 0; i < N; i++)
    {
      gint32 text[16];
      int n;
      text_for (i, text, &n);
      sampling.max_frames = 40 + 10 * i;
      records[i] = record_new (0);
      utterances[i] = gepard_engine_submit (engine, text, n, NULL, 0, &sampling, &callbacks,
                                            records[i], NULL, &error);
      g_assert_no_error (error);
      if (i % 4 == 3)
        g_usleep (2000); /* later ones join a running batch */
    }
  int identical = 0;
  for (int i = 0; i < N; i++)
    {
      gint32 text[16];
      int n;
      text_for (i, text, &n);
      record_wait (records[i]);
      g_assert_cmpint (records[i]->ended, ==, 1);
      sampling.max_frames = 40 + 10 * i;
      identical += matches_reference (engine, text, n, &sampling, records[i]->frames, i);
      gepard_utterance_unref (utterances[i]);
      record_free (records[i]);
    }
  g_assert_cmpint (identical, >=, N / 2);
  GepardEngineStats stats;
  gepard_engine_get_stats (engine, &stats);
  g_test_message ("%" G_GUINT64_FORMAT " steps for %" G_GUINT64_FORMAT " frames", stats.steps,
                  stats.frames);
  /* batching: far fewer steps than frames */
  g_assert_cmpuint (stats.steps * 2, <, stats.frames);
  g_assert_cmpuint (stats.utterances, ==, N);
}

/* Text-CFG (§3.4) in the engine: each utterance runs its text's and the empty text's branch side
 * by side in the batch, beside utterances without CFG. Alone and sampled, an utterance gets exactly
 * the reference loop's frames; batched and greedy, each gets them up to a near tie of the
 * reference's guided logits (matches_reference). */
static void
test_cfg_equals_reference (void)
{
  g_autoptr (GError) error = NULL;
  GepardEngineOptions options;
  gepard_engine_options_init (&options);
  options.max_batch = 5; /* fewer sequences than the utterances ask for at once: they queue */
  g_autoptr (GepardEngine) engine = gepard_engine_new (model_dir, "cpu", &options, &error);
  g_assert_no_error (error);
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.seed = 7;
  sampling.max_frames = 120;
  sampling.cfg_scale = 1.5f;
  gint32 text[16];
  int n;
  text_for (2, text, &n);
  g_autoptr (GArray) expected = alone_equals_reference (engine, 2, &sampling);
  /* and CFG changed them */
  sampling.cfg_scale = 1.0f;
  g_autoptr (GArray) plain = reference_frames (engine, text, n, &sampling);
  g_assert_false (plain->len == expected->len
                  && memcmp (plain->data, expected->data, plain->len * 4) == 0);

  enum
  {
    N = 6
  };
  Record *records[N];
  GepardUtterance *utterances[N];
  float scales[N] = {2.0f, 1.0f, 0.5f, 3.0f, 1.0f, 1.5f};
  sampling.temperature = 0;
  for (int i = 0; i < N; i++)
    {
      text_for (i, text, &n);
      sampling.cfg_scale = scales[i];
      sampling.max_frames = 30 + 10 * i;
      records[i] = record_new (0);
      utterances[i] = gepard_engine_submit (engine, text, n, NULL, 0, &sampling, &callbacks,
                                            records[i], NULL, &error);
      g_assert_no_error (error);
    }
  int identical = 0;
  for (int i = 0; i < N; i++)
    {
      text_for (i, text, &n);
      record_wait (records[i]);
      g_assert_cmpint (records[i]->ended, ==, 1);
      sampling.cfg_scale = scales[i];
      sampling.max_frames = 30 + 10 * i;
      identical += matches_reference (engine, text, n, &sampling, records[i]->frames, i);
      gepard_utterance_unref (utterances[i]);
      record_free (records[i]);
    }
  g_assert_cmpint (identical, >=, N / 2);
}

/* The scale a model asks for: its metadata gepard.cfg_scale, else 1; a model naming one that is no
 * scale does not load. */
static void
test_model_cfg_scale (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardEngine) plain = gepard_engine_new (model_dir, "cpu", NULL, &error);
  g_assert_no_error (error);
  g_assert_cmpfloat (gepard_engine_get_cfg_scale (plain), ==, 1.0f);

  g_autofree char *named = g_build_filename (work_dir, "tiny-cfg", NULL);
  gepard_test_make_model ("--preset tiny --seed 21 --codec none --cfg-scale 1.75", named);
  g_autoptr (GepardEngine) engine = gepard_engine_new (named, "cpu", NULL, &error);
  g_assert_no_error (error);
  g_assert_cmpfloat (gepard_engine_get_cfg_scale (engine), ==, 1.75f);

  g_autofree char *bad = g_build_filename (work_dir, "tiny-bad-cfg", NULL);
  gepard_test_make_model ("--preset tiny --seed 21 --codec none --cfg-scale lots", bad);
  g_assert_null (gepard_engine_new (bad, "cpu", NULL, &error));
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT);
  g_assert_nonnull (strstr (error->message, "\"lots\""));
}

static void
test_cancel (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardEngine) engine = gepard_engine_new (model_dir, "cpu", NULL, &error);
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.temperature = 0;
  sampling.max_frames = 100000;
  gint32 text[4] = {30, 31, 32, 33};

  /* cancelled from its own frame callback: no frame after the third */
  Record *r = record_new (3);
  g_autoptr (GepardUtterance) u
      = gepard_engine_submit (engine, text, 4, NULL, 0, &sampling, &callbacks, r, NULL, &error);
  g_assert_no_error (error);
  record_wait (r);
  if (r->end == GEPARD_UTTERANCE_CANCELLED)
    g_assert_cmpint (r->n_frames, ==, 3);
  else
    g_assert_cmpint (r->n_frames, <, 3); /* the model stopped first */

  /* cancelled at once (usually before it ever ran: this thread may lose the CPU for a few
   * steps between the two calls), and cancelling twice is harmless */
  Record *q = record_new (0);
  g_autoptr (GepardUtterance) v
      = gepard_engine_submit (engine, text, 4, NULL, 0, &sampling, &callbacks, q, NULL, &error);
  gepard_utterance_cancel (v);
  gepard_utterance_cancel (v);
  record_wait (q);
  g_assert_cmpint (q->ended, ==, 1);
  g_assert_cmpint (q->end, ==, GEPARD_UTTERANCE_CANCELLED);
  g_test_message ("%d frames before the cancel took", q->n_frames);
  record_free (r);
  record_free (q);
}

/* Utterances keep their engine: dropping every other reference lets them finish, and the engine
 * goes away with the last one (on its own scheduler thread). */
static void
test_utterances_keep_engine (void)
{
  g_autoptr (GError) error = NULL;
  GepardEngine *engine = gepard_engine_new (model_dir, "cpu", NULL, &error);
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.max_frames = 30;
  gint32 text[2] = {40, 41};
  Record *records[4];
  for (int i = 0; i < 4; i++)
    {
      records[i] = record_new (0);
      GepardUtterance *u = gepard_engine_submit (engine, text, 2, NULL, 0, &sampling, &callbacks,
                                                 records[i], NULL, &error);
      g_assert_no_error (error);
      gepard_utterance_unref (u);
    }
  gepard_engine_unref (engine);
  for (int i = 0; i < 4; i++)
    {
      record_wait (records[i]);
      g_assert_cmpint (records[i]->ended, ==, 1);
      g_assert_cmpint (records[i]->end, !=, GEPARD_UTTERANCE_CANCELLED);
    }
  /* the scheduler drops its last utterance (and so the engine) right after `done` */
  g_usleep (100000);
  for (int i = 0; i < 4; i++)
    record_free (records[i]);
}

static void
test_bad_requests (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardEngine) engine = gepard_engine_new (model_dir, "cpu", NULL, &error);
  const GepardModelConfig *c = gepard_engine_get_config (engine);
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  gint32 bad[2] = {5, c->vocab_size};

  g_assert_null (
      gepard_engine_submit (engine, bad, 2, NULL, 0, &sampling, &callbacks, NULL, NULL, &error));
  g_assert_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT);
  g_clear_error (&error);
  g_assert_null (
      gepard_engine_submit (engine, bad, 0, NULL, 0, &sampling, &callbacks, NULL, NULL, &error));
  g_assert_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT);
  g_clear_error (&error);
  sampling.cfg_scale = NAN;
  g_assert_null (
      gepard_engine_submit (engine, bad, 1, NULL, 0, &sampling, &callbacks, NULL, NULL, &error));
  g_assert_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT);
  g_clear_error (&error);
  sampling.cfg_scale = 1.0f;
  sampling.max_frames = 0;
  g_assert_null (
      gepard_engine_submit (engine, bad, 1, NULL, 0, &sampling, &callbacks, NULL, NULL, &error));
  g_assert_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT);
  g_clear_error (&error);

  g_assert_null (gepard_engine_new (model_dir, "tpu", NULL, &error));
  g_assert_nonnull (error);
  g_clear_error (&error);
  g_assert_null (gepard_engine_new ("/no/such/model", "cpu", NULL, &error));
  g_assert_nonnull (error);
}

static void
test_shared (void)
{
  g_autoptr (GError) error = NULL;
  GepardEngine *a = gepard_engine_get_shared (model_dir, "cpu", &error);
  g_assert_no_error (error);
  GepardEngine *b = gepard_engine_get_shared (model_dir, "cpu", &error);
  g_assert_true (a == b);
  g_assert_true (gepard_engine_is_test_model (a));
  g_assert_nonnull (gepard_engine_get_codec (a));
  gepard_engine_unref (a);
  gepard_engine_unref (b);
  GepardEngine *c = gepard_engine_get_shared (model_dir, "cpu", &error);
  g_assert_no_error (error);
  gepard_engine_unref (c);
}

/* A relative path, a path with "." in it and the absolute path are one engine. */
static void
test_shared_by_location (void)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *dotted = g_build_filename (work_dir, ".", "tiny", NULL);
  g_autofree char *cwd = g_get_current_dir ();
  g_assert_true (g_chdir (work_dir) == 0);
  GepardEngine *a = gepard_engine_get_shared (model_dir, "cpu", &error);
  g_assert_no_error (error);
  GepardEngine *b = gepard_engine_get_shared (dotted, "cpu", &error);
  g_assert_no_error (error);
  GepardEngine *c = gepard_engine_get_shared ("tiny", "cpu", &error);
  g_assert_no_error (error);
  g_assert_true (a == b && b == c);
  g_assert_cmpuint (gepard_engine_count_shared (), ==, 1);
  g_assert_true (g_chdir (cwd) == 0);
  gepard_engine_unref (a);
  gepard_engine_unref (b);
  gepard_engine_unref (c);
  g_assert_cmpuint (gepard_engine_count_shared (), ==, 0);
}

/* Deterministic codes in range for the codec's levels. */
static gint32 *
some_codes (GepardCodec *codec, int n_frames, guint32 seed)
{
  const GepardCodecConfig *config = gepard_codec_get_config (codec);
  gint32 *codes = g_new (gint32, (gsize)n_frames * config->latent_dim);
  GRand *rand = g_rand_new_with_seed (seed);
  for (int i = 0; i < n_frames * config->latent_dim; i++)
    codes[i] = g_rand_int_range (rand, 0, config->fsq_levels[i % config->fsq_n_dims]);
  g_rand_free (rand);
  return codes;
}

/* Frames decoded through the codec service are the frames a stream of the codec decodes alone,
 * bit for bit, across calls and a reset. */
static void
test_audio_decoder_exact (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardEngine) engine = gepard_engine_new (model_dir, "cpu", NULL, &error);
  g_assert_no_error (error);
  GepardCodec *codec = gepard_engine_get_codec (engine);
  int spf = gepard_codec_get_config (codec)->samples_per_frame;
  g_autofree gint32 *codes = some_codes (codec, 12, 5);
  int latent = gepard_codec_get_config (codec)->latent_dim;

  g_autoptr (GepardAudioDecoder) decoder = gepard_engine_new_audio_decoder (engine, &error);
  g_assert_no_error (error);
  g_autoptr (GepardCodecStream) alone = gepard_codec_stream_new (codec);
  g_autofree float *got = g_new (float, 12 * spf);
  g_autofree float *want = g_new (float, 12 * spf);
  /* 1 + 4 frames, a reset, then 7: a new utterance starts from zero state */
  g_assert_true (gepard_audio_decoder_decode (decoder, codes, 1, got, &error));
  g_assert_true (gepard_audio_decoder_decode (decoder, codes + latent, 4, got + spf, &error));
  gepard_audio_decoder_reset (decoder);
  g_assert_true (
      gepard_audio_decoder_decode (decoder, codes + 5 * latent, 7, got + 5 * spf, &error));
  g_assert_no_error (error);
  g_assert_true (gepard_codec_stream_decode (alone, codes, 5, want, &error));
  gepard_codec_stream_reset (alone);
  g_assert_true (gepard_codec_stream_decode (alone, codes + 5 * latent, 7, want + 5 * spf, &error));
  g_assert_true (memcmp (got, want, sizeof (float) * 12 * spf) == 0);

  /* a code outside its level fails that call and leaves the stream as it was */
  codes[3] = 99;
  g_assert_false (gepard_audio_decoder_decode (decoder, codes, 1, got, &error));
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE);
  g_clear_error (&error);
  g_autofree gint32 *more = some_codes (codec, 2, 9);
  g_assert_true (gepard_audio_decoder_decode (decoder, more, 2, got, &error));
  g_assert_true (gepard_codec_stream_decode (alone, more, 2, want, &error));
  g_assert_true (memcmp (got, want, sizeof (float) * 2 * spf) == 0);

  GepardEngineStats stats;
  gepard_engine_get_stats (engine, &stats);
  g_assert_cmpuint (stats.decoded_frames, ==, 14);
}

typedef struct
{
  GepardEngine *engine;
  int index;
  gboolean exact;
} DecodeThread;

#define DECODE_FRAMES 24

/* One stream decoding frame by frame, as gepardcodec does; checked against a stream alone. */
static gpointer
decode_thread (gpointer data)
{
  DecodeThread *t = data;
  GepardCodec *codec = gepard_engine_get_codec (t->engine);
  int spf = gepard_codec_get_config (codec)->samples_per_frame;
  int latent = gepard_codec_get_config (codec)->latent_dim;
  g_autofree gint32 *codes = some_codes (codec, DECODE_FRAMES, 100 + t->index);
  g_autofree float *got = g_new (float, DECODE_FRAMES *spf);
  g_autofree float *want = g_new (float, DECODE_FRAMES *spf);
  g_autoptr (GepardAudioDecoder) decoder = gepard_engine_new_audio_decoder (t->engine, NULL);
  g_autoptr (GepardCodecStream) alone = gepard_codec_stream_new (codec);

  t->exact = TRUE;
  for (int f = 0; f < DECODE_FRAMES; f++)
    if (!gepard_audio_decoder_decode (decoder, codes + f * latent, 1, got + f * spf, NULL))
      t->exact = FALSE;
  gepard_codec_stream_decode (alone, codes, DECODE_FRAMES, want, NULL);
  t->exact = t->exact && memcmp (got, want, sizeof (float) * DECODE_FRAMES * spf) == 0;
  return NULL;
}

/* n streams decoding at once, each checked against a stream alone */
static void
decode_in_threads (GepardEngine *engine, guint n)
{
  DecodeThread threads[8];
  GThread *handles[G_N_ELEMENTS (threads)];
  g_assert_cmpuint (n, <=, G_N_ELEMENTS (threads));
  for (guint i = 0; i < n; i++)
    {
      threads[i] = (DecodeThread){engine, (int)i, FALSE};
      handles[i] = g_thread_new ("decode", decode_thread, &threads[i]);
    }
  for (guint i = 0; i < n; i++)
    {
      g_thread_join (handles[i]);
      g_assert_true (threads[i].exact);
    }
}

/* Streams decoding at once share batched passes, and each still gets its own exact audio. */
static void
test_audio_decoders_batch (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardEngine) engine = gepard_engine_new (model_dir, "cpu", NULL, &error);
  g_assert_no_error (error);
  decode_in_threads (engine, 6);
  GepardEngineStats stats;
  gepard_engine_get_stats (engine, &stats);
  g_assert_cmpuint (stats.decoded_frames, ==, 6 * DECODE_FRAMES);
  /* 144 single-frame calls from six threads: while one pass runs the others queue up, so some
   * pass carries several streams */
  g_test_message ("%" G_GUINT64_FORMAT " passes for %" G_GUINT64_FORMAT
                  " frames, at most %u streams in one",
                  stats.decode_batches, stats.decoded_frames, stats.largest_decode_batch);
  g_assert_cmpuint (stats.largest_decode_batch, >, 1);
  g_assert_cmpuint (stats.decode_batches, <, stats.decoded_frames);
}

/* A CPU engine with its codec passes on the decode thread (a GPU's default), `lead` steps
 * running while one is in flight; lead 0: the default lead. */
static GepardEngine *
engine_decoding_alongside (int lead)
{
  g_autoptr (GError) error = NULL;
  GepardEngineOptions options;
  gepard_engine_options_init (&options);
  options.decode_alongside = 1;
  if (lead > 0)
    options.decode_lead = lead;
  GepardEngine *engine = gepard_engine_new (model_dir, "cpu", &options, &error);
  g_assert_no_error (error);
  return engine;
}

/* Decoding beside the steps, on the engine's decode thread (a GPU's default, forced here): an
 * utterance generating all along still gets the reference's frames, each decoder still gets
 * exact audio, and passes did run beside steps. */
static void
test_decode_alongside (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardEngine) engine = engine_decoding_alongside (0);
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.seed = 5;
  sampling.max_frames = 300;
  sampling.ignore_stop = TRUE;
  gint32 text[16];
  int n;
  text_for (2, text, &n);
  Record *r = record_new (0);
  g_autoptr (GepardUtterance) u
      = gepard_engine_submit (engine, text, n, NULL, 0, &sampling, &callbacks, r, NULL, &error);
  g_assert_no_error (error);
  /* the decoders start once it is generating: at least 299 more steps to run beside */
  for (;;)
    {
      g_mutex_lock (&r->lock);
      guint got = r->frames->len;
      g_mutex_unlock (&r->lock);
      if (got > 0)
        break;
      g_usleep (1000);
    }
  decode_in_threads (engine, 4);
  record_wait (r);
  g_autoptr (GArray) expected = reference_frames (engine, text, n, &sampling);
  g_assert_cmpint (r->end, ==, GEPARD_UTTERANCE_MAX_FRAMES);
  g_assert_cmpmem (r->frames->data, r->frames->len * 4, expected->data, expected->len * 4);
  record_free (r);

  GepardEngineStats stats;
  gepard_engine_get_stats (engine, &stats);
  g_test_message ("%" G_GUINT64_FORMAT " passes, %" G_GUINT64_FORMAT " beside a step",
                  stats.decode_batches, stats.decode_batches_alongside);
  g_assert_cmpuint (stats.decoded_frames, ==, 4 * DECODE_FRAMES);
  g_assert_cmpuint (stats.decode_batches_alongside, >, 0);
}

static gpointer
decoders_thread (gpointer engine)
{
  decode_in_threads (engine, 4);
  return NULL;
}

/* Utterances that arrive while the decode thread is busy and the steps have run their lead
 * (GEPARD_DECODE_LEAD=1 here: each step waits for the pass beside it) are prefilled and generate
 * the reference's frames like any other (greedy, up to a near tie: matches_reference). */
static void
test_decode_alongside_admits (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardEngine) engine = engine_decoding_alongside (1);
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.temperature = 0; /* greedy: a batch's other summing order shows only at near ties */
  sampling.max_frames = 12;
  sampling.ignore_stop = TRUE;

  GThread *decoders = g_thread_new ("decoders", decoders_thread, engine);
  enum
  {
    N = 24
  };
  Record *records[N];
  GepardUtterance *utterances[N];
  gint32 texts[N][16];
  int lengths[N];
  for (int i = 0; i < N; i++)
    {
      text_for (i, texts[i], &lengths[i]);
      records[i] = record_new (0);
      utterances[i] = gepard_engine_submit (engine, texts[i], lengths[i], NULL, 0, &sampling,
                                            &callbacks, records[i], NULL, &error);
      g_assert_no_error (error);
      g_usleep (500);
    }
  g_thread_join (decoders);
  int identical = 0;
  for (int i = 0; i < N; i++)
    {
      record_wait (records[i]);
      g_assert_cmpint (records[i]->end, ==, GEPARD_UTTERANCE_MAX_FRAMES);
      identical
          += matches_reference (engine, texts[i], lengths[i], &sampling, records[i]->frames, i);
      gepard_utterance_unref (utterances[i]);
      record_free (records[i]);
    }
  g_assert_cmpint (identical, >=, N / 2);
  GepardEngineStats stats;
  gepard_engine_get_stats (engine, &stats);
  g_assert_cmpuint (stats.decode_batches_alongside, >, 0);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  work_dir = g_dir_make_tmp ("gepard-engine-XXXXXX", NULL);
  model_dir = g_build_filename (work_dir, "tiny", NULL);
  gepard_test_make_model ("--preset tiny --seed 21", model_dir);

  g_test_add_func ("/engine/single-equals-reference", test_single_equals_reference);
  g_test_add_func ("/engine/batched-equals-reference", test_batched_equals_reference);
  g_test_add_func ("/engine/cfg-equals-reference", test_cfg_equals_reference);
  g_test_add_func ("/engine/model-cfg-scale", test_model_cfg_scale);
  g_test_add_func ("/engine/cancel", test_cancel);
  g_test_add_func ("/engine/utterances-keep-engine", test_utterances_keep_engine);
  g_test_add_func ("/engine/bad-requests", test_bad_requests);
  g_test_add_func ("/engine/shared", test_shared);
  g_test_add_func ("/engine/shared-by-location", test_shared_by_location);
  g_test_add_func ("/engine/audio-decoder-exact", test_audio_decoder_exact);
  g_test_add_func ("/engine/audio-decoders-batch", test_audio_decoders_batch);
  g_test_add_func ("/engine/decode-alongside", test_decode_alongside);
  g_test_add_func ("/engine/decode-alongside-admits", test_decode_alongside_admits);
  int result = g_test_run ();

  g_autofree char *rm = g_strdup_printf ("rm -rf '%s'", work_dir);
  (void)!system (rm);
  g_free (model_dir);
  g_free (work_dir);
  return result;
}
