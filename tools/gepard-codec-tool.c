/* gepard-codec-tool: NanoCodec decode / encode / speed from the command line.
 *
 *   gepard-codec-tool decode CODEC CODES.safetensors OUT.safetensors [--chunk N]
 *       CODES: "codes" I32 [T, 32] → OUT: "samples" F32 [T·1024]; --chunk N streams N frames per
 *       call through one GepardCodecStream instead of a one-shot decode
 *   gepard-codec-tool encode CODEC AUDIO.safetensors OUT.safetensors
 *       AUDIO: "samples" F32 [N] at 22050 Hz → OUT: "codes" I32 [T, 32] and "latent" F32 [T, 32]
 *       (the encoder's output before FSQ)
 *   gepard-codec-tool bench CODEC [--frames N] [--chunk N] [--threads N]
 *       decode speed on random codes: frames/s, real-time factor, ms per frame
 *
 * CODEC is a .nemo archive or its safetensors export. */
#include "gepard-codec.h"
#include "gepard-error.h"
#include "gepard-fsq.h"
#include "gepard-safetensors.h"

#include <locale.h>
#include <stdlib.h>
#include <string.h>

static int chunk = 0;
static int n_frames = 64;
static int n_threads = 0;
static gint64 seed = 1;

static GOptionEntry entries[] = {
    {"chunk", 0, 0, G_OPTION_ARG_INT, &chunk,
     "decode: stream N frames per call; bench: frames per streaming call (default 1)", "N"},
    {"frames", 0, 0, G_OPTION_ARG_INT, &n_frames, "bench: frames to decode (default 64)", "N"},
    {"threads", 0, 0, G_OPTION_ARG_INT, &n_threads,
     "Worker threads (default: $GEPARD_CODEC_THREADS or all processors)", "N"},
    {"seed", 0, 0, G_OPTION_ARG_INT64, &seed, "bench: seed of the random codes", "N"},
    G_OPTION_ENTRY_NULL,
};

static gboolean fail (GError **error, const char *format, ...) G_GNUC_PRINTF (2, 3);

static gboolean
fail (GError **error, const char *format, ...)
{
  g_autofree char *message = NULL;
  va_list args;

  va_start (args, format);
  message = g_strdup_vprintf (format, args);
  va_end (args);
  g_set_error_literal (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE, message);
  return FALSE;
}

static GepardCodec *
open_codec (const char *path, GError **error)
{
  GepardCodec *codec = gepard_codec_new (path, error);

  if (codec != NULL && n_threads > 0)
    gepard_codec_set_n_threads (codec, n_threads);
  return codec;
}

static gboolean
run_decode (const char *codec_path, const char *codes_path, const char *out_path, GError **error)
{
  g_autoptr (GepardCodec) codec = NULL;
  g_autoptr (GepardSafetensors) file = NULL;
  g_autoptr (GepardSafetensorsWriter) writer = NULL;
  g_autofree gint32 *codes = NULL;
  g_autofree float *samples = NULL;
  const GepardCodecConfig *config;
  const GepardTensor *tensor;
  gint64 n, width, shape[1];
  gsize spf;

  codec = open_codec (codec_path, error);
  if (codec == NULL)
    return FALSE;
  config = gepard_codec_get_config (codec);
  spf = config->samples_per_frame;

  file = gepard_safetensors_open (codes_path, error);
  if (file == NULL)
    return FALSE;
  tensor = gepard_safetensors_lookup (file, "codes");
  if (tensor == NULL)
    return fail (error, "%s has no tensor “codes”", codes_path);
  width = config->latent_dim;
  if (tensor->n_dims != 2 || tensor->shape[1] != width
      || (tensor->dtype != GEPARD_DTYPE_I32 && tensor->dtype != GEPARD_DTYPE_I64))
    return fail (error, "“codes” must be I32 [T, %" G_GINT64_FORMAT "]", width);
  n = tensor->shape[0];
  if (n > G_MAXINT / (gint64)spf)
    return fail (error, "%" G_GINT64_FORMAT " frames are too many", n);

  codes = g_new (gint32, MAX (n * width, 1));
  for (gint64 i = 0; i < n * width; i++)
    {
      gint64 value;

      if (tensor->dtype == GEPARD_DTYPE_I32)
        {
          gint32 v32;

          memcpy (&v32, tensor->data + i * 4, 4);
          value = v32;
        }
      else
        memcpy (&value, tensor->data + i * 8, 8);
      /* out-of-range values reach the codec, which reports them */
      codes[i] = (gint32)CLAMP (value, G_MININT32, G_MAXINT32);
    }

  samples = g_new (float, MAX (n * (gint64)spf, 1));
  if (chunk > 0)
    {
      g_autoptr (GepardCodecStream) stream = gepard_codec_stream_new (codec);

      for (gint64 done = 0; done < n; done += chunk)
        {
          int count = (int)MIN ((gint64)chunk, n - done);

          if (!gepard_codec_stream_decode (stream, codes + done * width, count,
                                           samples + done * spf, error))
            return FALSE;
        }
    }
  else if (!gepard_codec_decode (codec, codes, (int)n, samples, error))
    return FALSE;

  writer = gepard_safetensors_writer_new ();
  shape[0] = n * (gint64)spf;
  gepard_safetensors_writer_add_data (writer, "samples", GEPARD_DTYPE_F32, 1, shape, samples);
  return gepard_safetensors_writer_write (writer, out_path, error);
}

static gboolean
run_encode (const char *codec_path, const char *audio_path, const char *out_path, GError **error)
{
  g_autoptr (GepardCodec) codec = NULL;
  g_autoptr (GepardSafetensors) file = NULL;
  g_autoptr (GepardSafetensorsWriter) writer = NULL;
  g_autoptr (GArray) latent = NULL;
  g_autoptr (GArray) codes = NULL;
  g_autofree float *samples = NULL;
  const GepardTensor *tensor;
  gint64 shape[2];
  int latent_dim;

  codec = open_codec (codec_path, error);
  if (codec == NULL)
    return FALSE;
  latent_dim = gepard_codec_get_config (codec)->latent_dim;

  file = gepard_safetensors_open (audio_path, error);
  if (file == NULL)
    return FALSE;
  tensor = gepard_safetensors_lookup (file, "samples");
  if (tensor == NULL)
    return fail (error, "%s has no tensor “samples”", audio_path);
  if (tensor->n_dims != 1
      || (tensor->dtype != GEPARD_DTYPE_F32 && tensor->dtype != GEPARD_DTYPE_BF16
          && tensor->dtype != GEPARD_DTYPE_F16))
    return fail (error, "“samples” must be F32 [N]");
  samples = g_new (float, MAX (tensor->n_elements, 1));
  gepard_tensor_to_f32 (tensor, samples);

  /* one pass for the latent, FSQ on it: the same codes as gepard_codec_encode (§4) */
  latent = gepard_codec_encode_latent (codec, samples, tensor->n_elements, error);
  if (latent == NULL)
    return FALSE;
  codes = g_array_sized_new (FALSE, FALSE, sizeof (gint32), latent->len);
  g_array_set_size (codes, latent->len);
  gepard_fsq_encode (gepard_codec_get_config (codec), (const float *)latent->data,
                     latent->len / latent_dim, (gint32 *)codes->data);

  writer = gepard_safetensors_writer_new ();
  shape[0] = latent->len / latent_dim;
  shape[1] = latent_dim;
  gepard_safetensors_writer_add_data (writer, "codes", GEPARD_DTYPE_I32, 2, shape, codes->data);
  gepard_safetensors_writer_add_data (writer, "latent", GEPARD_DTYPE_F32, 2, shape, latent->data);
  return gepard_safetensors_writer_write (writer, out_path, error);
}

static gboolean
run_bench (const char *codec_path, GError **error)
{
  g_autoptr (GepardCodec) codec = NULL;
  g_autoptr (GepardCodecStream) stream = NULL;
  g_autoptr (GRand) rand = NULL;
  g_autofree gint32 *codes = NULL;
  g_autofree float *samples = NULL;
  const GepardCodecConfig *config;
  int step = chunk > 0 ? chunk : 1;
  double audio_seconds, start, stream_seconds, oneshot_seconds;
  gsize spf, n_samples;

  if (n_frames < 1)
    return fail (error, "--frames must be at least 1");
  start = g_get_monotonic_time () / 1e6;
  codec = open_codec (codec_path, error);
  if (codec == NULL)
    return FALSE;
  config = gepard_codec_get_config (codec);
  spf = config->samples_per_frame;
  g_print ("codec: %s (decoder base %d channels, %d threads), loaded in %.2f s\n", codec_path,
           config->decoder.base_channels, gepard_codec_get_n_threads (codec),
           g_get_monotonic_time () / 1e6 - start);

  rand = g_rand_new_with_seed ((guint32)seed);
  codes = g_new (gint32, (gsize)n_frames * config->latent_dim);
  for (gsize i = 0; i < (gsize)n_frames * config->latent_dim; i++)
    codes[i] = g_rand_int_range (rand, 0, config->fsq_levels[i % config->fsq_n_dims]);
  n_samples = (gsize)n_frames * spf;
  samples = g_new (float, n_samples);
  audio_seconds = (double)n_frames * spf / config->sample_rate;

  /* warm-up: page in the weights */
  if (!gepard_codec_decode (codec, codes, MIN (n_frames, 2), samples, error))
    return FALSE;

  stream = gepard_codec_stream_new (codec);
  start = g_get_monotonic_time () / 1e6;
  for (int done = 0; done < n_frames; done += step)
    if (!gepard_codec_stream_decode (stream, codes + (gsize)done * config->latent_dim,
                                     MIN (step, n_frames - done), samples + (gsize)done * spf,
                                     error))
      return FALSE;
  stream_seconds = g_get_monotonic_time () / 1e6 - start;

  start = g_get_monotonic_time () / 1e6;
  if (!gepard_codec_decode (codec, codes, n_frames, samples, error))
    return FALSE;
  oneshot_seconds = g_get_monotonic_time () / 1e6 - start;

  g_print ("%d frames = %.2f s of audio; stream state %" G_GSIZE_FORMAT " bytes\n", n_frames,
           audio_seconds, gepard_codec_stream_state_bytes (stream));
  g_print ("streaming, %d frame(s) per call: %.2f frames/s, RTF %.3f, %.2f ms per frame\n", step,
           n_frames / stream_seconds, stream_seconds / audio_seconds,
           1e3 * stream_seconds / n_frames);
  g_print ("one-shot: %.2f frames/s, RTF %.3f, %.2f ms per frame\n", n_frames / oneshot_seconds,
           oneshot_seconds / audio_seconds, 1e3 * oneshot_seconds / n_frames);
  return TRUE;
}

int
main (int argc, char **argv)
{
  g_autoptr (GOptionContext) context = NULL;
  g_autoptr (GError) error = NULL;
  const char *command;
  gboolean ok;

  setlocale (LC_ALL, "");
  context = g_option_context_new ("decode CODEC CODES OUT | encode CODEC AUDIO OUT | bench CODEC");
  g_option_context_set_summary (context, "NanoCodec decode, encode and decode speed on the CPU.");
  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, &argc, &argv, &error))
    {
      g_printerr ("gepard-codec-tool: %s\n", error->message);
      return 2;
    }
  if (argc < 2)
    {
      g_printerr ("%s", g_option_context_get_help (context, TRUE, NULL));
      return 2;
    }

  command = argv[1];
  if (g_strcmp0 (command, "decode") == 0 && argc == 5)
    ok = run_decode (argv[2], argv[3], argv[4], &error);
  else if (g_strcmp0 (command, "encode") == 0 && argc == 5)
    ok = run_encode (argv[2], argv[3], argv[4], &error);
  else if (g_strcmp0 (command, "bench") == 0 && argc == 3)
    ok = run_bench (argv[2], &error);
  else
    {
      g_printerr ("%s", g_option_context_get_help (context, TRUE, NULL));
      return 2;
    }

  if (!ok)
    {
      g_printerr ("gepard-codec-tool: %s\n", error->message);
      return 1;
    }
  return 0;
}
