/* gepard-voice.c: speaker prefixes, their files, and cloning a voice from a reference clip. */
#include "gepard-voice.h"

#include "gepard-bf16.h"
#include "gepard-error.h"

#include <math.h>
#include <string.h>

struct _GepardVoice
{
  gatomicrefcount ref_count;
  char *id;
  float *prefix;
  int n_rows;
  int hidden;
};

GepardVoice *
gepard_voice_new (const char *id, const float *prefix, int n_rows, int hidden)
{
  GepardVoice *voice = g_new0 (GepardVoice, 1);
  g_atomic_ref_count_init (&voice->ref_count);
  voice->id = g_strdup (id);
  voice->n_rows = prefix != NULL ? n_rows : 0;
  voice->hidden = hidden;
  if (voice->n_rows > 0)
    voice->prefix = g_memdup2 (prefix, sizeof (float) * n_rows * hidden);
  return voice;
}

GepardVoice *
gepard_voice_ref (GepardVoice *voice)
{
  g_atomic_ref_count_inc (&voice->ref_count);
  return voice;
}

void
gepard_voice_unref (GepardVoice *voice)
{
  if (voice == NULL || !g_atomic_ref_count_dec (&voice->ref_count))
    return;
  g_free (voice->id);
  g_free (voice->prefix);
  g_free (voice);
}

const char *
gepard_voice_get_id (const GepardVoice *voice)
{
  return voice->id;
}

const float *
gepard_voice_get_prefix (const GepardVoice *voice, int *n_rows)
{
  *n_rows = voice->n_rows;
  return voice->prefix;
}

/* ---- prefix files (gepard-model.md §3.7) ---- */

gsize
gepard_voice_get_prefix_file_size (const GepardModelConfig *config)
{
  if (!config->voice_cloning || config->compressor_queries <= 0 || config->hidden_size <= 0)
    return 0;
  return (gsize)config->compressor_queries * config->hidden_size * sizeof (float);
}

/* Reads [rows][H] little-endian fp32 from `data`. `what` names the source in messages. */
static GepardVoice *
voice_from_prefix_data (const char *what, const char *id, const guint8 *data, gsize size,
                        const GepardModelConfig *config, GError **error)
{
  gsize expected = gepard_voice_get_prefix_file_size (config);
  if (expected == 0)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "%s: this model has no voice-cloning compressor, so it takes no speaker prefix",
                   what);
      return NULL;
    }
  int rows = config->compressor_queries, hidden = config->hidden_size;
  if (size != expected)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "%s has %" G_GSIZE_FORMAT " bytes, but a speaker prefix for this model is "
                   "%d × %d little-endian fp32 values (%" G_GSIZE_FORMAT " bytes)",
                   what, size, rows, hidden, expected);
      return NULL;
    }

  gsize n = (gsize)rows * hidden;
  g_autofree float *prefix = g_new (float, n);
  for (gsize i = 0; i < n; i++)
    {
      guint32 bits;
      memcpy (&bits, data + 4 * i, 4);
      bits = GUINT32_FROM_LE (bits);
      float value;
      memcpy (&value, &bits, 4);
      /* §3.7: the prefix is cast to bf16 (round to nearest even) before it meets the text
       * embeddings; a voice holds the values the model will see. A prefix written from a bf16
       * compressor output is already exact. Rounding can overflow the largest floats, so the
       * check for finite values comes after it. */
      value = gepard_bf16_round (value);
      if (!isfinite (value))
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT,
                       "%s holds a value that is not finite in bf16 at row %d, column %d; a "
                       "speaker prefix is a compressor output and never is",
                       what, (int)(i / hidden), (int)(i % hidden));
          return NULL;
        }
      prefix[i] = value;
    }
  return gepard_voice_new (id, prefix, rows, hidden);
}

GepardVoice *
gepard_voice_new_from_prefix_bytes (const char *id, GBytes *bytes, const GepardModelConfig *config,
                                    GError **error)
{
  g_return_val_if_fail (bytes != NULL && config != NULL, NULL);
  gsize size = 0;
  const guint8 *data = g_bytes_get_data (bytes, &size);
  g_autofree char *what = g_strdup_printf ("The speaker prefix of voice “%s”", id);
  return voice_from_prefix_data (what, id, data, size, config, error);
}

GepardVoice *
gepard_voice_load_prefix_file (const char *path, const GepardModelConfig *config, GError **error)
{
  g_return_val_if_fail (path != NULL && config != NULL, NULL);
  g_autoptr (GError) local = NULL;
  /* mapped, not read: a wrong file of any size costs nothing before the size check */
  g_autoptr (GMappedFile) file = g_mapped_file_new (path, FALSE, &local);
  if (file == NULL)
    {
      gboolean missing = g_error_matches (local, G_FILE_ERROR, G_FILE_ERROR_NOENT);
      g_set_error (error, GEPARD_FORMAT_ERROR,
                   missing ? GEPARD_FORMAT_ERROR_MISSING : GEPARD_FORMAT_ERROR_IO,
                   "Cannot read the speaker prefix file: %s", local->message);
      return NULL;
    }
  g_autofree char *what = g_strdup_printf ("The speaker prefix file %s", path);
  return voice_from_prefix_data (what, path, (const guint8 *)g_mapped_file_get_contents (file),
                                 g_mapped_file_get_length (file), config, error);
}

GBytes *
gepard_voice_to_prefix_bytes (const GepardVoice *voice, GError **error)
{
  g_return_val_if_fail (voice != NULL, NULL);
  if (voice->n_rows == 0)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "Voice “%s” has no speaker prefix (it is the model's own voice), so there is "
                   "nothing to write",
                   voice->id);
      return NULL;
    }
  gsize n = (gsize)voice->n_rows * voice->hidden;
  guint32 *data = g_new (guint32, n);
  for (gsize i = 0; i < n; i++)
    {
      guint32 bits;
      memcpy (&bits, &voice->prefix[i], 4);
      data[i] = GUINT32_TO_LE (bits);
    }
  return g_bytes_new_take (data, n * sizeof (guint32));
}

gboolean
gepard_voice_save_prefix_file (const GepardVoice *voice, const char *path, GError **error)
{
  g_return_val_if_fail (voice != NULL && path != NULL, FALSE);
  g_autoptr (GBytes) bytes = gepard_voice_to_prefix_bytes (voice, error);
  if (bytes == NULL)
    return FALSE;
  gsize size = 0;
  const char *data = g_bytes_get_data (bytes, &size);
  g_autoptr (GError) local = NULL;
  /* CONSISTENT writes a temporary file beside `path` and renames it over, so a reader sees the
   * old prefix or the new one, never a torn file; DURABLE syncs it first, so a crash does not
   * leave an empty file behind the new name either. */
  if (!g_file_set_contents_full (path, data, (gssize)size,
                                 G_FILE_SET_CONTENTS_CONSISTENT | G_FILE_SET_CONTENTS_DURABLE, 0644,
                                 &local))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO,
                   "Cannot write the speaker prefix file: %s", local->message);
      return FALSE;
    }
  return TRUE;
}

/* ---- cloning (gepard-model.md §3.2, §3.6; nanocodec.md §3.2) ---- */

GepardVoice *
gepard_voice_new_from_audio (GepardEngine *engine, const char *id, const float *samples,
                             gsize n_samples, GError **error)
{
  g_return_val_if_fail (engine != NULL, NULL);
  g_return_val_if_fail (samples != NULL || n_samples == 0, NULL);

  const GepardModelConfig *config = gepard_engine_get_config (engine);
  GepardCodec *codec = gepard_engine_get_codec (engine);
  if (codec == NULL)
    {
      g_set_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_UNSUPPORTED,
                   "Cloning a voice needs the codec's encoder, and this model has no codec; put "
                   "codec.nemo beside the model");
      return NULL;
    }
  if (gepard_voice_get_prefix_file_size (config) == 0)
    {
      g_set_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_UNSUPPORTED,
                   "This model has no voice-cloning compressor, so it cannot clone a voice");
      return NULL;
    }
  const GepardCodecConfig *codec_config = gepard_codec_get_config (codec);
  if (codec_config->latent_dim != config->n_audio_heads)
    {
      g_set_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_UNSUPPORTED,
                   "The codec gives %d channels per frame but the model reads %d; the codec "
                   "beside the model does not belong to it",
                   codec_config->latent_dim, config->n_audio_heads);
      return NULL;
    }
  /* The encoder would pad a shorter clip to one frame of mostly silence: nothing of the speaker
   * to compress. How long a useful reference is (seconds, not milliseconds) is for the caller to
   * decide. */
  if (n_samples < (gsize)codec_config->samples_per_frame)
    {
      g_set_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT,
                   "A reference clip of %" G_GSIZE_FORMAT " samples is shorter than one codec "
                   "frame (%d samples at %d Hz); give at least a few seconds of speech",
                   n_samples, codec_config->samples_per_frame, codec_config->sample_rate);
      return NULL;
    }

  /* nanocodec.md §3.2: 22050 Hz mono in, zero-padded to whole frames, no normalization */
  g_autoptr (GArray) codes = gepard_codec_encode (codec, samples, n_samples, error);
  if (codes == NULL)
    return NULL;
  int n_frames = (int)(codes->len / codec_config->latent_dim);

  /* gepard-model.md §3.6: the compressor turns the unfolded codes into [queries, H] */
  gsize n = (gsize)config->compressor_queries * config->hidden_size;
  g_autofree float *prefix = g_new (float, n);
  if (!gepard_model_compress (gepard_engine_get_model (engine), (const gint32 *)codes->data,
                              n_frames, prefix, error))
    return NULL;
  return gepard_voice_new (id, prefix, config->compressor_queries, config->hidden_size);
}
