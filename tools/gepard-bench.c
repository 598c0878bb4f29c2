/* gepard-bench: speed of Gepard's parts, measured outside the tests.
 *
 *   gepard-bench lm MODEL [--frames N] [--text-tokens N] [--runs N]
 *   gepard-bench codec CODEC [--steps N] [--streams B] [--threads N]
 *   gepard-bench engine MODEL [--device D] [--concurrency 1,8,…] [--frames N] [--no-audio]
 *   gepard-bench server URL [--concurrency 1,32,…] [--frames N] [--sentences N] [--api-key K]
 *                [--voice ID] [--sample-rate R] [--encoding E]
 *
 * lm: one utterance on the model's CPU path with a forced length (the stop head is ignored, so
 * every run decodes the same number of frames): prefill time, decode step time, real-time factor.
 *
 * codec: B streams each decoding one frame per step, as a server's streams do: one
 * gepard_codec_stream_decode per stream against one gepard_codec_decode_batch per step, in ms per
 * step, for B = 1, 8, 32 and 64 unless --streams is given. Both start from the same histories and
 * decode the same codes, so their samples must be the same bits.
 *
 * engine: the whole engine as a server drives it: C utterances submitted at once, each of a
 * forced length (the stop head ignored, like vLLM's ignore_eos), each stream decoding its frames
 * through the engine's codec service as they arrive. Per stream: time to first audio (first
 * decoded PCM; first frame with --no-audio) and real-time factor (time to its last audio over
 * the audio's duration), as p50/p90/p99, and the aggregate: audio seconds per wall second.
 *
 * server: the same table for a running gepard-server at URL, through its WebSocket: C clients,
 * each on its own socket, each sending a turn of --sentences messages whose sentences are forced
 * to --frames frames each (Gepard's "gepard" request extension, server/README.md), then one JSON
 * line per level (gepard-bench-server.c).
 */
#include "gepard-bench-server.h"
#include "gepard-checkpoint.h"
#include "gepard-codec.h"
#include "gepard-engine.h"
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

/* ---- engine ---- */

typedef struct
{
  GMutex lock;
  GCond cond;
  GArray *codes; /* frames sampled, not yet decoded */
  gboolean ended;
  int n_frames;
  GepardAudioDecoder *decoder; /* NULL with --no-audio */
  gint64 start, first_audio, done;
} BenchStream;

static void
bench_on_frame (GepardUtterance *u, const gint32 *codes, int index, gpointer data)
{
  BenchStream *s = data;
  g_mutex_lock (&s->lock);
  if (s->decoder == NULL && s->first_audio == 0)
    s->first_audio = g_get_monotonic_time ();
  g_array_append_vals (s->codes, codes, GEPARD_MAX_AUDIO_HEADS);
  s->n_frames++;
  g_cond_signal (&s->cond);
  g_mutex_unlock (&s->lock);
}

static void
bench_on_done (GepardUtterance *u, GepardUtteranceEnd end, int n_frames, gpointer data)
{
  BenchStream *s = data;
  g_mutex_lock (&s->lock);
  s->ended = TRUE;
  if (s->decoder == NULL)
    s->done = g_get_monotonic_time ();
  g_cond_signal (&s->cond);
  g_mutex_unlock (&s->lock);
}

/* A stream's consumer, as gepardcodec is: decodes what has arrived, as soon as it arrives. */
static gpointer
bench_decode_thread (gpointer data)
{
  BenchStream *s = data;
  g_autoptr (GArray) taken = g_array_new (FALSE, FALSE, sizeof (gint32));
  g_autofree float *samples = NULL;
  gsize capacity = 0;
  int spf
      = gepard_codec_get_config (gepard_audio_decoder_get_codec (s->decoder))->samples_per_frame;

  for (;;)
    {
      g_mutex_lock (&s->lock);
      while (s->codes->len == 0 && !s->ended)
        g_cond_wait (&s->cond, &s->lock);
      GArray *swap = s->codes;
      s->codes = taken;
      taken = swap;
      gboolean ended = s->ended;
      g_mutex_unlock (&s->lock);

      int n = taken->len / GEPARD_MAX_AUDIO_HEADS;
      if (n > 0)
        {
          if ((gsize)n * spf > capacity)
            {
              capacity = (gsize)n * spf;
              samples = g_renew (float, samples, capacity);
            }
          g_assert (gepard_audio_decoder_decode (s->decoder, (const gint32 *)taken->data, n,
                                                 samples, NULL));
          if (s->first_audio == 0)
            s->first_audio = g_get_monotonic_time ();
          g_array_set_size (taken, 0);
        }
      else if (ended)
        break;
    }
  s->done = g_get_monotonic_time ();
  return NULL;
}

static double
percentile (double *values, int n, double p)
{
  qsort (values, n, sizeof (double), compare_double);
  return values[MIN (n - 1, (int)(p * n))];
}

static int
bench_engine (const char *path, const char *device, const char *concurrency, int n_frames,
              int n_text, gboolean audio)
{
  g_autoptr (GError) error = NULL;
  g_auto (GStrv) levels = g_strsplit (concurrency, ",", -1);
  int max_c = 1;
  for (guint i = 0; levels[i] != NULL; i++)
    max_c = MAX (max_c, atoi (levels[i]));

  GepardEngineOptions options;
  gepard_engine_options_init (&options);
  options.max_batch = max_c;
  gint64 t0 = g_get_monotonic_time ();
  g_autoptr (GepardEngine) engine = gepard_engine_new (path, device, &options, &error);
  if (engine == NULL)
    {
      g_printerr ("gepard-bench: %s\n", error->message);
      return 1;
    }
  if (audio && gepard_engine_get_codec (engine) == NULL)
    {
      g_printerr ("gepard-bench: the model has no codec; use --no-audio\n");
      return 1;
    }
  const GepardModelConfig *c = gepard_engine_get_config (engine);
  g_print ("model %s (%d layers, hidden %d) on %s, loaded in %.1f s\n", path, c->n_layers,
           c->hidden_size, gepard_engine_get_device_description (engine),
           (g_get_monotonic_time () - t0) / 1e6);
  g_print ("%d frames per utterance (%.2f s of audio), %d text tokens, %s\n", n_frames,
           n_frames / c->frame_rate_hz, n_text,
           audio ? "through the codec service" : "frames only (--no-audio)");
  g_print ("%6s %10s %10s %10s %8s %8s %8s %12s %9s\n", "C", "TTFA p50", "p90", "p99", "RTF p50",
           "p90", "p99", "aggregate", "wall");

  g_autofree gint32 *text = g_new (gint32, n_text);
  for (int i = 0; i < n_text; i++)
    text[i] = 100 + (i * 7919) % MAX (1, c->tokenizer_length - 200);
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.max_frames = n_frames;
  sampling.ignore_stop = TRUE;
  /* the model's operating point: with text-CFG each utterance runs two sequences */
  sampling.cfg_scale = gepard_engine_get_cfg_scale (engine);
  const GepardUtteranceCallbacks callbacks = {bench_on_frame, bench_on_done};
  double audio_s = n_frames / c->frame_rate_hz;

  for (guint level = 0; levels[level] != NULL; level++)
    {
      int n = atoi (levels[level]);
      if (n < 1)
        continue;
      g_autofree BenchStream *streams = g_new0 (BenchStream, n);
      g_autofree GThread **threads = g_new0 (GThread *, n);
      g_autofree GepardUtterance **utterances = g_new0 (GepardUtterance *, n);
      for (int i = 0; i < n; i++)
        {
          g_mutex_init (&streams[i].lock);
          g_cond_init (&streams[i].cond);
          streams[i].codes = g_array_new (FALSE, FALSE, sizeof (gint32));
          if (audio)
            streams[i].decoder = gepard_engine_new_audio_decoder (engine, NULL);
        }
      gint64 start = g_get_monotonic_time ();
      for (int i = 0; i < n; i++)
        {
          streams[i].start = g_get_monotonic_time ();
          sampling.seed = i;
          utterances[i] = gepard_engine_submit (engine, text, n_text, NULL, 0, &sampling,
                                                &callbacks, &streams[i], NULL, &error);
          if (utterances[i] == NULL)
            {
              g_printerr ("gepard-bench: %s\n", error->message);
              return 1;
            }
          if (audio)
            threads[i] = g_thread_new ("bench-decode", bench_decode_thread, &streams[i]);
        }
      /* wait for every stream's last audio */
      for (int i = 0; i < n; i++)
        {
          if (audio)
            g_thread_join (threads[i]);
          else
            {
              g_mutex_lock (&streams[i].lock);
              while (!streams[i].ended)
                g_cond_wait (&streams[i].cond, &streams[i].lock);
              g_mutex_unlock (&streams[i].lock);
            }
        }
      gint64 end = start;
      g_autofree double *ttfa = g_new (double, n);
      g_autofree double *rtf = g_new (double, n);
      for (int i = 0; i < n; i++)
        {
          BenchStream *s = &streams[i];
          ttfa[i] = (s->first_audio - s->start) / 1e3;
          rtf[i] = (s->done - s->start) / 1e6 / audio_s;
          end = MAX (end, s->done);
          gepard_utterance_unref (utterances[i]);
          gepard_audio_decoder_free (s->decoder);
          g_array_unref (s->codes);
          g_mutex_clear (&s->lock);
          g_cond_clear (&s->cond);
        }
      double wall = (end - start) / 1e6;
      g_print ("%6d %8.1fms %8.1fms %8.1fms %8.4f %8.4f %8.4f %10.1fx %8.2fs\n", n,
               percentile (ttfa, n, 0.5), percentile (ttfa, n, 0.9), percentile (ttfa, n, 0.99),
               percentile (rtf, n, 0.5), percentile (rtf, n, 0.9), percentile (rtf, n, 0.99),
               n * audio_s / wall, wall);
    }
  GepardEngineStats stats;
  gepard_engine_get_stats (engine, &stats);
  if (audio)
    g_print ("%" G_GUINT64_FORMAT " codec passes for %" G_GUINT64_FORMAT " frames (at most %u "
             "streams in one), %" G_GUINT64_FORMAT " of them beside a step\n",
             stats.decode_batches, stats.decoded_frames, stats.largest_decode_batch,
             stats.decode_batches_alongside);
  return 0;
}

int
main (int argc, char **argv)
{
  int frames = 200, text_tokens = 20, runs = 3, steps = 5, streams = 0, threads = 0;
  int sentences = 3, sample_rate = 24000;
  gboolean no_audio = FALSE;
  g_autofree char *device = NULL, *concurrency = NULL;
  g_autofree char *api_key = NULL, *voice = NULL, *encoding = NULL;
  g_auto (GStrv) rest = NULL;
  GOptionEntry entries[] = {
      {"frames", 0, 0, G_OPTION_ARG_INT, &frames,
       "lm, engine: frames per utterance; server: per sentence (200)", "N"},
      {"text-tokens", 0, 0, G_OPTION_ARG_INT, &text_tokens, "lm: text tokens per utterance (20)",
       "N"},
      {"runs", 0, 0, G_OPTION_ARG_INT, &runs, "lm: utterances (3)", "N"},
      {"steps", 0, 0, G_OPTION_ARG_INT, &steps, "codec: timed steps (5)", "N"},
      {"streams", 0, 0, G_OPTION_ARG_INT, &streams, "codec: only this many streams (1, 8, 32, 64)",
       "B"},
      {"threads", 0, 0, G_OPTION_ARG_INT, &threads,
       "codec: worker threads (default: $GEPARD_CODEC_THREADS or all processors)", "N"},
      {"device", 0, 0, G_OPTION_ARG_STRING, &device, "engine: auto, cpu, cuda or cuda:N (auto)",
       "D"},
      {"concurrency", 0, 0, G_OPTION_ARG_STRING, &concurrency,
       "engine, server: concurrent streams, comma-separated (1,8,32; server 1,32,128,256,512,1024)",
       "C,…"},
      {"no-audio", 0, 0, G_OPTION_ARG_NONE, &no_audio, "engine: frames only, no codec", NULL},
      {"sentences", 0, 0, G_OPTION_ARG_INT, &sentences, "server: sentences (messages) per turn (3)",
       "N"},
      {"api-key", 0, 0, G_OPTION_ARG_STRING, &api_key, "server: the server's API key", "K"},
      {"voice", 0, 0, G_OPTION_ARG_STRING, &voice, "server: voice id (default)", "ID"},
      {"sample-rate", 0, 0, G_OPTION_ARG_INT, &sample_rate, "server: output sample rate (24000)",
       "R"},
      {"encoding", 0, 0, G_OPTION_ARG_STRING, &encoding,
       "server: pcm_f32le or pcm_s16le (pcm_f32le)", "E"},
      {G_OPTION_REMAINING, 0, 0, G_OPTION_ARG_STRING_ARRAY, &rest, NULL,
       "lm MODEL | codec CODEC | engine MODEL | server URL"},
      {NULL},
  };
  g_autoptr (GOptionContext) context
      = g_option_context_new ("lm MODEL | codec CODEC | engine MODEL | server URL — speed of "
                              "Gepard's parts");
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
  if (rest != NULL && g_strv_length (rest) == 2 && strcmp (rest[0], "engine") == 0 && frames >= 1
      && text_tokens >= 1)
    return bench_engine (rest[1], device ? device : "auto", concurrency ? concurrency : "1,8,32",
                         frames, text_tokens, !no_audio);
  if (rest != NULL && g_strv_length (rest) == 2 && strcmp (rest[0], "server") == 0 && frames >= 1
      && sentences >= 1 && sample_rate >= 8000 && sample_rate <= 192000)
    {
      GepardBenchServerOptions options = {
          .url = rest[1],
          .concurrency = concurrency ? concurrency : "1,32,128,256,512,1024",
          .frames = frames,
          .sentences = sentences,
          .api_key = api_key,
          .voice = voice ? voice : "default",
          .encoding = encoding ? encoding : "pcm_f32le",
          .sample_rate = sample_rate,
      };
      return gepard_bench_server (&options);
    }
  if (rest == NULL || g_strv_length (rest) != 2 || strcmp (rest[0], "lm") != 0 || frames < 1
      || text_tokens < 1 || runs < 1)
    {
      g_printerr ("gepard-bench: usage: gepard-bench lm MODEL [--frames N] [--text-tokens N] "
                  "[--runs N]\n"
                  "       gepard-bench codec CODEC [--steps N] [--streams B] [--threads N]\n"
                  "       gepard-bench engine MODEL [--device D] [--concurrency C,…] [--frames N] "
                  "[--no-audio]\n"
                  "       gepard-bench server URL [--concurrency C,…] [--frames N] "
                  "[--sentences N] [--api-key K] [--voice ID] [--sample-rate R] [--encoding E]\n");
      return 2;
    }
  return bench_lm (rest[1], frames, text_tokens, runs);
}
