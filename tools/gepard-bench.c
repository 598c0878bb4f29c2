/* gepard-bench: speed of Gepard's parts, measured outside the tests.
 *
 *   gepard-bench lm MODEL [--frames N] [--text-tokens N] [--runs N]
 *   gepard-bench codec CODEC [--steps N] [--streams B] [--threads N]
 *
 * lm: one utterance on the model's CPU path with a forced length (the stop head is ignored, so
 * every run decodes the same number of frames): prefill time, decode step time, real-time factor.
 *
 * codec: B streams each decoding one frame per step, as a server's streams do: one
 * gepard_codec_stream_decode per stream against one gepard_codec_decode_batch per step, in ms per
 * step, for B = 1, 8, 32 and 64 unless --streams is given. Both start from the same histories and
 * decode the same codes, so their samples must be the same bits.
 */
#include "gepard-checkpoint.h"
#include "gepard-codec.h"
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

/* One step: a frame for each of n streams, from codes [n][latent_dim] into samples
 * [n][samples_per_frame], one call per stream or one batch; returns the milliseconds it took. */
static double
codec_step (GepardCodec *codec, GepardCodecStream **streams, int n, const gint32 *codes,
            float *samples, gboolean batched)
{
  const GepardCodecConfig *config = gepard_codec_get_config (codec);
  gsize frame = config->latent_dim, spf = config->samples_per_frame;
  g_autofree const gint32 **step_codes = g_new (const gint32 *, n);
  g_autofree float **step_samples = g_new (float *, n);
  g_autofree int *ones = g_new (int, n);

  for (int i = 0; i < n; i++)
    {
      step_codes[i] = codes + (gsize)i * frame;
      step_samples[i] = samples + (gsize)i * spf;
      ones[i] = 1;
    }
  gint64 start = g_get_monotonic_time ();
  if (batched)
    g_assert (gepard_codec_decode_batch (streams, step_codes, ones, step_samples, n, NULL));
  else
    for (int i = 0; i < n; i++)
      g_assert (gepard_codec_stream_decode (streams[i], step_codes[i], 1, step_samples[i], NULL));
  return (g_get_monotonic_time () - start) / 1e3;
}

static int
bench_codec (const char *path, int steps, int only_streams, int threads)
{
  static const int default_streams[] = {1, 8, 32, 64};
  /* frames every stream decodes before timing, 1 to 4 of them, so that the streams carry
   * different histories and their buffers exist */
  const int warm_up = 4;
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardCodec) codec = gepard_codec_new (path, &error);
  if (codec == NULL)
    {
      g_printerr ("gepard-bench: %s\n", error->message);
      return 1;
    }
  if (threads > 0)
    gepard_codec_set_n_threads (codec, threads);
  const GepardCodecConfig *config = gepard_codec_get_config (codec);
  gsize frame = config->latent_dim, spf = config->samples_per_frame;
  const int *list = only_streams > 0 ? &only_streams : default_streams;
  int n_list = only_streams > 0 ? 1 : G_N_ELEMENTS (default_streams);
  gboolean all_same = TRUE;

  g_print ("codec            %s (decoder base %d channels, %d threads)\n", path,
           config->decoder.base_channels, gepard_codec_get_n_threads (codec));
  g_print ("steps            %d of one frame per stream, per-stream and batched in turn; "
           "median step\n",
           steps);
  g_print ("streams  per-stream ms/step  batched ms/step  speed-up  batched ms/frame  bits\n");
  for (int k = 0; k < n_list; k++)
    {
      int n = list[k];
      g_autoptr (GRand) rand = g_rand_new_with_seed (n);
      g_autofree gint32 *codes = g_new (gint32, (gsize)(steps + warm_up) * n * frame);
      g_autofree float *alone_samples = g_new (float, (gsize)MAX (n, warm_up) * spf);
      g_autofree float *batch_samples = g_new (float, (gsize)MAX (n, warm_up) * spf);
      g_autofree GepardCodecStream **alone = g_new (GepardCodecStream *, n);
      g_autofree GepardCodecStream **batched = g_new (GepardCodecStream *, n);
      g_autofree double *alone_ms = g_new (double, steps);
      g_autofree double *batch_ms = g_new (double, steps);
      gboolean same = TRUE;

      for (gsize i = 0; i < (gsize)(steps + warm_up) * n * frame; i++)
        codes[i] = g_rand_int_range (rand, 0, config->fsq_levels[i % config->fsq_n_dims]);
      for (int i = 0; i < n; i++)
        {
          const gint32 *history = codes + (gsize)(steps * n + i) * frame;
          int n_history = 1 + i % warm_up;
          alone[i] = gepard_codec_stream_new (codec);
          batched[i] = gepard_codec_stream_new (codec);
          g_assert (gepard_codec_stream_decode (alone[i], history, n_history, alone_samples, NULL));
          g_assert (
              gepard_codec_stream_decode (batched[i], history, n_history, batch_samples, NULL));
        }

      /* in turn, so that whatever else the machine does weighs on both alike */
      for (int t = 0; t < steps; t++)
        {
          const gint32 *step_codes = codes + (gsize)t * n * frame;
          alone_ms[t] = codec_step (codec, alone, n, step_codes, alone_samples, FALSE);
          batch_ms[t] = codec_step (codec, batched, n, step_codes, batch_samples, TRUE);
          same
              = same && memcmp (alone_samples, batch_samples, (gsize)n * spf * sizeof (float)) == 0;
        }
      /* the median step, which a busy machine disturbs least */
      qsort (alone_ms, steps, sizeof (double), compare_double);
      qsort (batch_ms, steps, sizeof (double), compare_double);
      double alone_median = alone_ms[steps / 2], batch_median = batch_ms[steps / 2];
      all_same = all_same && same;
      g_print ("%7d  %18.2f  %15.2f  %7.2fx  %16.2f  %s\n", n, alone_median, batch_median,
               alone_median / batch_median, batch_median / n, same ? "same" : "DIFFERENT");

      for (int i = 0; i < n; i++)
        {
          gepard_codec_stream_free (alone[i]);
          gepard_codec_stream_free (batched[i]);
        }
    }
  return all_same ? 0 : 1;
}

int
main (int argc, char **argv)
{
  int frames = 200, text_tokens = 20, runs = 3, steps = 5, streams = 0, threads = 0;
  g_auto (GStrv) rest = NULL;
  GOptionEntry entries[] = {
      {"frames", 0, 0, G_OPTION_ARG_INT, &frames, "lm: frames per utterance (200)", "N"},
      {"text-tokens", 0, 0, G_OPTION_ARG_INT, &text_tokens, "lm: text tokens per utterance (20)",
       "N"},
      {"runs", 0, 0, G_OPTION_ARG_INT, &runs, "lm: utterances (3)", "N"},
      {"steps", 0, 0, G_OPTION_ARG_INT, &steps, "codec: timed steps (5)", "N"},
      {"streams", 0, 0, G_OPTION_ARG_INT, &streams, "codec: only this many streams (1, 8, 32, 64)",
       "B"},
      {"threads", 0, 0, G_OPTION_ARG_INT, &threads,
       "codec: worker threads (default: $GEPARD_CODEC_THREADS or all processors)", "N"},
      {G_OPTION_REMAINING, 0, 0, G_OPTION_ARG_STRING_ARRAY, &rest, NULL, "lm MODEL | codec CODEC"},
      {NULL},
  };
  g_autoptr (GOptionContext) context
      = g_option_context_new ("lm MODEL | codec CODEC — speed of Gepard's parts");
  g_option_context_add_main_entries (context, entries, NULL);
  g_autoptr (GError) error = NULL;
  if (!g_option_context_parse (context, &argc, &argv, &error))
    {
      g_printerr ("gepard-bench: %s\n", error->message);
      return 2;
    }
  if (rest != NULL && g_strv_length (rest) == 2 && strcmp (rest[0], "codec") == 0 && steps >= 1
      && streams >= 0 && threads >= 0)
    return bench_codec (rest[1], steps, streams, threads);
  if (rest == NULL || g_strv_length (rest) != 2 || strcmp (rest[0], "lm") != 0 || frames < 1
      || text_tokens < 1 || runs < 1)
    {
      g_printerr ("gepard-bench: usage: gepard-bench lm MODEL [--frames N] [--text-tokens N] "
                  "[--runs N]\n"
                  "       gepard-bench codec CODEC [--steps N] [--streams B] [--threads N]\n");
      return 2;
    }
  return bench_lm (rest[1], frames, text_tokens, runs);
}
