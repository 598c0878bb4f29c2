/* The CPU model and the reference generation loop on a tiny test model: layout, stop rule,
 * cache consistency, determinism, input validation. Parity with transformers is in
 * tests/python/test_lm_parity.py. */
#include "gepard-error.h"
#include "gepard-generate.h"
#include "gepard-test-model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static char *work_dir;
static GepardCheckpoint *checkpoint;
static GepardModel *model;

static void
test_repeats_table (void)
{
  /* gepard-model.md §3.1 */
  static const int expected[] = {1, 8, 8, 6, 4, 4, 3, 3, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1};
  const GepardModelConfig *c = gepard_model_get_config (model);
  for (int n = 0; n < (int)G_N_ELEMENTS (expected); n++)
    g_assert_cmpint (gepard_text_repeats (c, n), ==, expected[n]);

  GepardModelConfig off = *c;
  off.repetition_enabled = FALSE;
  g_assert_cmpint (gepard_text_repeats (&off, 3), ==, 1);
}

static void
test_layout (void)
{
  const GepardModelConfig *c = gepard_model_get_config (model);
  gint32 ids[3] = {10, 11, 12};
  g_autoptr (GArray) layout = gepard_text_layout (c, ids, 3);
  /* R = 6: [SOT t EOT] × 5 ++ [SOT t EOT SOS] */
  g_assert_cmpuint (layout->len, ==, 6 * 5 + 1);
  for (int r = 0; r < 6; r++)
    {
      const gint32 *block = (const gint32 *)layout->data + r * 5;
      g_assert_cmpint (block[0], ==, c->start_of_text);
      g_assert_cmpmem (block + 1, 3 * sizeof (gint32), ids, 3 * sizeof (gint32));
      g_assert_cmpint (block[4], ==, c->end_of_text);
    }
  g_assert_cmpint (g_array_index (layout, gint32, 30), ==, c->start_of_speech);
}

static void
test_stop_rule (void)
{
  /* §3.4: stop ⇔ bf16(sigmoid(bf16 logit)) > 0.5 ⇔ logit > 2⁻⁷ */
  g_assert_false (gepard_stop_decision (0.0f));
  g_assert_false (gepard_stop_decision (0.004f));
  g_assert_false (gepard_stop_decision (0.0078125f));
  g_assert_true (gepard_stop_decision (0.0078125f * (1.0f + 1.0f / 128)));
  g_assert_true (gepard_stop_decision (0.016f));
  g_assert_false (gepard_stop_decision (-3.0f));
  g_assert_true (gepard_stop_decision (3.0f));
}

static float
max_relative_error (const float *a, const float *b, gsize n)
{
  float max_diff = 0, max_ref = 0;
  for (gsize i = 0; i < n; i++)
    {
      max_diff = MAX (max_diff, fabsf (a[i] - b[i]));
      max_ref = MAX (max_ref, fabsf (b[i]));
    }
  return max_diff / max_ref;
}

/* One prefill of n tokens equals n single-token steps through the cache, up to GEMM order. */
static void
test_cache_matches_prefill (void)
{
  const GepardModelConfig *c = gepard_model_get_config (model);
  int h = c->hidden_size, n = 12;
  gint32 ids[12];
  for (int i = 0; i < n; i++)
    ids[i] = (i * 37 + 5) % c->tokenizer_length;
  g_autofree float *embeds = g_new (float, n *h);
  g_autofree float *all = g_new (float, n *h);
  g_autofree float *stepped = g_new (float, n *h);
  g_assert_true (gepard_model_embed_tokens (model, ids, n, embeds, NULL));

  g_autoptr (GepardKvCache) cache = gepard_kv_cache_new (model);
  gepard_model_forward (model, cache, embeds, n, all);
  g_assert_cmpint (gepard_kv_cache_get_length (cache), ==, n);

  gepard_kv_cache_reset (cache);
  for (int t = 0; t < n; t++)
    gepard_model_forward (model, cache, embeds + t * h, 1, stepped + t * h);
  float error = max_relative_error (stepped, all, (gsize)n * h);
  g_test_message ("prefill vs stepped: max relative error %.3g", error);
  g_assert_cmpfloat (error, <, 0.05f);

  /* and the hidden states are not trivially equal across positions */
  g_assert_cmpfloat (max_relative_error (all, all + h, h), >, 0.1f);
}

/* A batch of sequences at different positions equals running them one by one. */
static void
test_batch_matches_single (void)
{
  const GepardModelConfig *c = gepard_model_get_config (model);
  int h = c->hidden_size;
  int lengths[3] = {7, 1, 4};
  int total = 12;
  g_autofree float *embeds = g_new (float, total *h);
  g_autofree float *batched = g_new (float, total *h);
  g_autofree float *single = g_new (float, total *h);
  g_autofree float *warmup = g_new (float, 5 * h);
  gint32 ids[12], warm_ids[5] = {1, 2, 3, 4, 5};
  for (int i = 0; i < total; i++)
    ids[i] = (i * 53 + 11) % c->tokenizer_length;
  g_assert_true (gepard_model_embed_tokens (model, ids, total, embeds, NULL));
  g_assert_true (gepard_model_embed_tokens (model, warm_ids, 5, warmup, NULL));

  GepardKvCache *a[3], *b[3];
  for (int s = 0; s < 3; s++)
    {
      a[s] = gepard_kv_cache_new (model);
      b[s] = gepard_kv_cache_new (model);
    }
  /* the second sequence is already 5 tokens in: its one token is a decode step */
  g_autofree float *scratch = g_new (float, 5 * h);
  gepard_model_forward (model, a[1], warmup, 5, scratch);
  gepard_model_forward (model, b[1], warmup, 5, scratch);

  GepardBatchSegment segments[3] = {{a[0], 7}, {a[1], 1}, {a[2], 4}};
  gepard_model_forward_batch (model, segments, 3, embeds, batched);
  int row = 0;
  for (int s = 0; s < 3; s++)
    {
      gepard_model_forward (model, b[s], embeds + row * h, lengths[s], single + row * h);
      g_assert_cmpint (gepard_kv_cache_get_length (a[s]), ==, gepard_kv_cache_get_length (b[s]));
      row += lengths[s];
    }
  float error = max_relative_error (batched, single, (gsize)total * h);
  g_test_message ("batched vs single: max relative error %.3g", error);
  g_assert_cmpfloat (error, <, 0.05f);
  for (int s = 0; s < 3; s++)
    {
      gepard_kv_cache_free (a[s]);
      gepard_kv_cache_free (b[s]);
    }
}

typedef struct
{
  GArray *frames;
  int stop_after;
} Collector;

static gboolean
collect (const gint32 *codes, int index, gpointer user_data)
{
  Collector *collector = user_data;
  g_array_append_vals (collector->frames, codes, 32);
  return collector->stop_after <= 0 || index + 1 < collector->stop_after;
}

static GArray *
generate (float temperature, int top_k, guint64 seed, int max_frames, const float *prefix)
{
  const GepardModelConfig *c = gepard_model_get_config (model);
  gint32 text[5] = {40, 41, 42, 43, 44};
  g_autoptr (GArray) layout = gepard_text_layout (c, text, 5);
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.temperature = temperature;
  sampling.top_k = top_k;
  sampling.seed = seed;
  sampling.max_frames = max_frames;
  Collector collector = {g_array_new (FALSE, FALSE, sizeof (gint32)), 0};
  g_autoptr (GError) error = NULL;
  int n = gepard_generate (model, prefix, prefix ? c->compressor_queries : 0,
                           (const gint32 *)layout->data, layout->len, &sampling, collect,
                           &collector, &error);
  g_assert_no_error (error);
  g_assert_cmpint (n * 32, ==, collector.frames->len);
  g_assert_cmpint (n, >=, 1);
  g_assert_cmpint (n, <=, max_frames);
  for (guint i = 0; i < collector.frames->len; i++)
    g_assert_cmpint (g_array_index (collector.frames, gint32, i), <, c->head_levels[i % 32]);
  return collector.frames;
}

static void
test_sampling_determinism (void)
{
  g_autoptr (GArray) a = generate (1.0f, 0, 11, 40, NULL);
  g_autoptr (GArray) b = generate (1.0f, 0, 11, 40, NULL);
  g_autoptr (GArray) other = generate (1.0f, 0, 12, 40, NULL);
  g_assert_cmpmem (a->data, a->len * 4, b->data, b->len * 4);
  gsize common = MIN (a->len, other->len);
  g_assert_true (a->len != other->len || memcmp (a->data, other->data, common * 4) != 0);

  /* greedy ignores the seed (top-k 1 is not quite greedy: it keeps bf16 ties, §3.4) */
  g_autoptr (GArray) g1 = generate (0.0f, 0, 1, 40, NULL);
  g_autoptr (GArray) g2 = generate (0.0f, 0, 2, 40, NULL);
  g_assert_cmpmem (g1->data, g1->len * 4, g2->data, g2->len * 4);
}

static void
test_max_frames_and_cancel (void)
{
  g_autoptr (GArray) one = generate (0.4f, 0, 5, 1, NULL);
  g_assert_cmpuint (one->len, ==, 32);

  const GepardModelConfig *c = gepard_model_get_config (model);
  gint32 text[2] = {40, 41};
  g_autoptr (GArray) layout = gepard_text_layout (c, text, 2);
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.max_frames = 500;
  Collector collector = {g_array_new (FALSE, FALSE, sizeof (gint32)), 3};
  int n = gepard_generate (model, NULL, 0, (const gint32 *)layout->data, layout->len, &sampling,
                           collect, &collector, NULL);
  g_assert_cmpint (n, <=, 3);
  g_array_unref (collector.frames);
}

static void
test_prefix_changes_output (void)
{
  const GepardModelConfig *c = gepard_model_get_config (model);
  int n_ref = 20;
  g_autofree gint32 *codes = g_new (gint32, n_ref * 32);
  for (int i = 0; i < n_ref * 32; i++)
    codes[i] = (i * 7 + 3) % c->head_levels[i % 32];
  g_autofree float *prefix = g_new (float, c->compressor_queries * c->hidden_size);
  g_autoptr (GError) error = NULL;
  g_assert_true (gepard_model_compress (model, codes, n_ref, prefix, &error));
  g_assert_no_error (error);
  for (int i = 0; i < c->compressor_queries * c->hidden_size; i++)
    g_assert_true (isfinite (prefix[i]));

  g_autoptr (GArray) plain = generate (0.0f, 0, 1, 30, NULL);
  g_autoptr (GArray) cloned = generate (0.0f, 0, 1, 30, prefix);
  g_assert_true (plain->len != cloned->len
                 || memcmp (plain->data, cloned->data, plain->len * 4) != 0);

  /* a different reference gives a different prefix */
  codes[0] = (codes[0] + 1) % 8;
  g_autofree float *other = g_new (float, c->compressor_queries * c->hidden_size);
  g_assert_true (gepard_model_compress (model, codes, n_ref, other, NULL));
  g_assert_true (memcmp (prefix, other, sizeof (float) * c->hidden_size) != 0);
}

/* §3.4 text CFG: with scale 0 the logits are the unconditional branch's, whose input is
 * [SOT EOT SOS]; greedy frames then follow that branch until the conditional stop ends them */
static void
test_cfg_zero_is_unconditional (void)
{
  const GepardModelConfig *c = gepard_model_get_config (model);
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.temperature = 0;
  sampling.max_frames = 25;

  gint32 text[4] = {50, 51, 52, 53};
  g_autoptr (GArray) layout = gepard_text_layout (c, text, 4);
  Collector guided = {g_array_new (FALSE, FALSE, sizeof (gint32)), 0};
  sampling.cfg_scale = 0.0f;
  int n = gepard_generate (model, NULL, 0, (const gint32 *)layout->data, layout->len, &sampling,
                           collect, &guided, NULL);
  g_assert_cmpint (n, >=, 1);

  const gint32 empty[3] = {c->start_of_text, c->end_of_text, c->start_of_speech};
  Collector plain = {g_array_new (FALSE, FALSE, sizeof (gint32)), 0};
  sampling.cfg_scale = 1.0f;
  int m = gepard_generate (model, NULL, 0, empty, 3, &sampling, collect, &plain, NULL);
  g_assert_cmpint (m, >=, 1);
  int common = MIN (n, m);
  g_assert_cmpmem (guided.frames->data, common * 32 * 4, plain.frames->data, common * 32 * 4);

  g_array_unref (guided.frames);
  g_array_unref (plain.frames);
}

static void
test_bad_inputs (void)
{
  const GepardModelConfig *c = gepard_model_get_config (model);
  g_autofree float *out = g_new (float, c->hidden_size * c->compressor_queries);
  g_autoptr (GError) error = NULL;

  gint32 bad_id = c->vocab_size;
  g_assert_false (gepard_model_embed_tokens (model, &bad_id, 1, out, &error));
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE);
  g_clear_error (&error);
  bad_id = -1;
  g_assert_false (gepard_model_embed_tokens (model, &bad_id, 1, out, &error));
  g_clear_error (&error);

  gint32 codes[32] = {0};
  codes[1] = 7; /* channel 1 has 7 levels */
  g_assert_false (gepard_model_embed_frame (model, codes, out, &error));
  g_assert_nonnull (strstr (error->message, "channel 1"));
  g_clear_error (&error);
  g_assert_false (gepard_model_compress (model, codes, 1, out, &error));
  g_clear_error (&error);
  g_assert_false (gepard_model_compress (model, codes, 0, out, &error));
  g_clear_error (&error);

  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  g_assert_cmpint (gepard_generate (model, NULL, 0, codes, 0, &sampling, NULL, NULL, &error), ==,
                   -1);
  g_assert_nonnull (error);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  work_dir = g_dir_make_tmp ("gepard-model-XXXXXX", NULL);
  g_autofree char *dir = g_build_filename (work_dir, "tiny", NULL);
  gepard_test_make_model ("--preset tiny --seed 5 --codec none", dir);
  checkpoint = gepard_checkpoint_open (dir, NULL);
  g_assert_nonnull (checkpoint);
  model = gepard_model_new (checkpoint, GEPARD_ROPE_INV_FREQ_BF16, NULL);
  g_assert_nonnull (model);

  g_test_add_func ("/model/repeats-table", test_repeats_table);
  g_test_add_func ("/model/layout", test_layout);
  g_test_add_func ("/model/stop-rule", test_stop_rule);
  g_test_add_func ("/model/cache-matches-prefill", test_cache_matches_prefill);
  g_test_add_func ("/model/batch-matches-single", test_batch_matches_single);
  g_test_add_func ("/model/sampling-determinism", test_sampling_determinism);
  g_test_add_func ("/model/max-frames-and-cancel", test_max_frames_and_cancel);
  g_test_add_func ("/model/prefix-changes-output", test_prefix_changes_output);
  g_test_add_func ("/model/cfg-zero-is-unconditional", test_cfg_zero_is_unconditional);
  g_test_add_func ("/model/bad-inputs", test_bad_inputs);
  int result = g_test_run ();

  gepard_model_free (model);
  gepard_checkpoint_free (checkpoint);
  g_autofree char *rm = g_strdup_printf ("rm -rf '%s'", work_dir);
  (void)!system (rm);
  g_free (work_dir);
  return result;
}
