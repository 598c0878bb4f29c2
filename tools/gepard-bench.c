/* gepard-bench: speed of Gepard's parts, measured outside the tests.
 *
 *   gepard-bench lm MODEL [--frames N] [--text-tokens N] [--runs N]
 *
 * lm: one utterance on the model's CPU path with a forced length (the stop head is ignored, so
 * every run decodes the same number of frames): prefill time, decode step time, real-time factor.
 */
#include "gepard-checkpoint.h"
#include "gepard-generate.h"
#include "gepard-model.h"

#include <stdlib.h>
#include <string.h>

static int
compare_double (const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int
bench_lm (const char *path, int n_frames, int n_text, int runs)
{
  g_autoptr (GError) error = NULL;
  gint64 t0 = g_get_monotonic_time ();
  g_autoptr (GepardCheckpoint) checkpoint = gepard_checkpoint_open (path, &error);
  if (checkpoint == NULL)
    {
      g_printerr ("gepard-bench: %s\n", error->message);
      return 1;
    }
  g_autoptr (GepardModel) model = gepard_model_new (checkpoint, GEPARD_ROPE_INV_FREQ_BF16, &error);
  if (model == NULL)
    {
      g_printerr ("gepard-bench: %s\n", error->message);
      return 1;
    }
  double load_s = (g_get_monotonic_time () - t0) / 1e6;
  const GepardModelConfig *c = gepard_model_get_config (model);
  int h = c->hidden_size;

  g_autofree gint32 *text = g_new (gint32, n_text);
  for (int i = 0; i < n_text; i++)
    text[i] = 100 + (i * 7919) % MAX (1, c->tokenizer_length - 200);
  g_autoptr (GArray) layout = gepard_text_layout (c, text, n_text);
  int prefill = layout->len;
  g_autofree float *embeds = g_new (float, (gsize)prefill *h);
  g_autofree float *hidden = g_new (float, (gsize)prefill *h);
  g_autofree double *steps = g_new (double, (gsize)runs *n_frames);
  float logits[GEPARD_MAX_HEAD_LOGITS], stop;
  gint32 codes[GEPARD_MAX_AUDIO_HEADS];
  double prefill_total = 0, decode_total = 0;
  int n_steps = 0;

  for (int run = 0; run < runs; run++)
    {
      g_autoptr (GepardKvCache) cache = gepard_kv_cache_new (model);
      g_assert (
          gepard_model_embed_tokens (model, (const gint32 *)layout->data, prefill, embeds, NULL));
      gint64 start = g_get_monotonic_time ();
      gepard_model_forward (model, cache, embeds, prefill, hidden);
      prefill_total += (g_get_monotonic_time () - start) / 1e6;
      const float *state = hidden + (gsize)(prefill - 1) * h;

      gint64 decode_start = g_get_monotonic_time ();
      for (int f = 0; f < n_frames; f++)
        {
          gint64 step_start = g_get_monotonic_time ();
          gepard_model_heads (model, state, logits, &stop);
          int offset = 0;
          for (int i = 0; i < c->n_audio_heads; i++)
            {
              int best = 0;
              for (int k = 1; k < c->head_levels[i]; k++)
                if (logits[offset + k] > logits[offset + best])
                  best = k;
              codes[i] = best;
              offset += c->head_levels[i];
            }
          if (f + 1 < n_frames)
            {
              g_assert (gepard_model_embed_frame (model, codes, embeds, NULL));
              gepard_model_forward (model, cache, embeds, 1, hidden);
              state = hidden;
              steps[n_steps++] = (g_get_monotonic_time () - step_start) / 1e3;
            }
        }
      decode_total += (g_get_monotonic_time () - decode_start) / 1e6;
    }

  qsort (steps, n_steps, sizeof (double), compare_double);
  double audio = runs * n_frames / c->frame_rate_hz;
  g_print ("model            %s (%d layers, hidden %d)\n", path, c->n_layers, h);
  g_print ("threads          %u\n", g_get_num_processors ());
  g_print ("load             %.2f s\n", load_s);
  g_print ("prefill          %d positions in %.1f ms\n", prefill, 1e3 * prefill_total / runs);
  if (n_steps > 0)
    g_print ("decode step      mean %.2f ms, p50 %.2f ms, p90 %.2f ms (%d steps)\n",
             1e3 * decode_total / n_steps, steps[n_steps / 2], steps[n_steps * 9 / 10], n_steps);
  g_print ("frames           %d per run, %d runs: %.1f frames/s\n", n_frames, runs,
           runs * n_frames / (decode_total + prefill_total));
  g_print ("real-time factor %.3f (%.2f s of audio in %.2f s)\n",
           (decode_total + prefill_total) / audio, audio, decode_total + prefill_total);
  return 0;
}

int
main (int argc, char **argv)
{
  int frames = 200, text_tokens = 20, runs = 3;
  g_auto (GStrv) rest = NULL;
  GOptionEntry entries[] = {
      {"frames", 0, 0, G_OPTION_ARG_INT, &frames, "Frames per utterance (200)", "N"},
      {"text-tokens", 0, 0, G_OPTION_ARG_INT, &text_tokens, "Text tokens per utterance (20)", "N"},
      {"runs", 0, 0, G_OPTION_ARG_INT, &runs, "Utterances (3)", "N"},
      {G_OPTION_REMAINING, 0, 0, G_OPTION_ARG_STRING_ARRAY, &rest, NULL, "lm MODEL"},
      {NULL},
  };
  g_autoptr (GOptionContext) context = g_option_context_new ("lm MODEL — speed of Gepard's parts");
  g_option_context_add_main_entries (context, entries, NULL);
  g_autoptr (GError) error = NULL;
  if (!g_option_context_parse (context, &argc, &argv, &error))
    {
      g_printerr ("gepard-bench: %s\n", error->message);
      return 2;
    }
  if (rest == NULL || g_strv_length (rest) != 2 || strcmp (rest[0], "lm") != 0 || frames < 1
      || text_tokens < 1 || runs < 1)
    {
      g_printerr ("gepard-bench: usage: gepard-bench lm MODEL [--frames N] [--text-tokens N] "
                  "[--runs N]\n");
      return 2;
    }
  return bench_lm (rest[1], frames, text_tokens, runs);
}
