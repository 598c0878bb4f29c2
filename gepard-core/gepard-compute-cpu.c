/* gepard-compute-cpu.c: the CPU backend, the numerics of record (gepard-model.md, nanocodec.md).
 *
 * A step embeds every input (prefix rows and text ids for a prefill, the fed-back frame
 * otherwise), runs one batched forward over all of them (every projection over all rows at once,
 * attention per sequence), takes each sequence's last hidden state through the heads and samples
 * its next frame on the host. */
#include "gepard-compute.h"

#include "gepard-error.h"

#include <string.h>

typedef struct
{
  GepardCompute parent;
  const GepardModel *model;
  GepardCodec *codec;
} CpuCompute;

struct _GepardSequence
{
  GepardKvCache *cache;
  GepardSampler *sampler;
};

struct _GepardAudioStream
{
  GepardCodecStream *stream;
};

static void
cpu_free (GepardCompute *compute)
{
  g_free (compute);
}

static GepardSequence *
cpu_sequence_new (GepardCompute *compute, const GepardSampling *sampling, GError **error)
{
  CpuCompute *self = (CpuCompute *)compute;
  GepardSequence *sequence = g_new0 (GepardSequence, 1);

  sequence->cache = gepard_kv_cache_new (self->model);
  sequence->sampler = gepard_sampler_new (self->model, sampling);
  return sequence;
}

static void
cpu_sequence_free (GepardCompute *compute, GepardSequence *sequence)
{
  if (sequence == NULL)
    return;
  gepard_kv_cache_free (sequence->cache);
  gepard_sampler_free (sequence->sampler);
  g_free (sequence);
}

static int
input_rows (const GepardStepInput *input)
{
  return input->codes != NULL ? 1 : input->n_prefix + input->n_ids;
}

static gboolean
cpu_step (GepardCompute *compute, const GepardStepInput *inputs, int n, gint32 *codes,
          float *stop_logits, GError **error)
{
  CpuCompute *self = (CpuCompute *)compute;
  const GepardModelConfig *c = gepard_model_get_config (self->model);
  int h = c->hidden_size, n_logits = gepard_model_get_n_head_logits (self->model);
  int rows = 0;

  if (n <= 0)
    return TRUE;
  for (int k = 0; k < n; k++)
    {
      if (inputs[k].guided && !(k + 1 < n && inputs[k + 1].unconditional))
        {
          g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_INVALID,
                       "Step input %d is guided but has no unconditional branch after it", k);
          return FALSE;
        }
      rows += input_rows (&inputs[k]);
    }

  g_autofree GepardBatchSegment *segments = g_new (GepardBatchSegment, n);
  g_autofree float *embeds = g_new (float, (gsize)rows *h);
  g_autofree float *hidden = g_new (float, (gsize)rows *h);
  g_autofree float *last = g_new (float, (gsize)n *h);
  g_autofree float *logits = g_new (float, (gsize)n *n_logits);
  int row = 0;

  for (int k = 0; k < n; k++)
    {
      const GepardStepInput *in = &inputs[k];
      float *e = embeds + (gsize)row * h;

      if (in->codes != NULL)
        {
          if (!gepard_model_embed_frame (self->model, in->codes, e, error))
            return FALSE;
        }
      else
        {
          if (in->n_prefix > 0)
            memcpy (e, in->prefix, sizeof (float) * in->n_prefix * h);
          if (!gepard_model_embed_tokens (self->model, in->ids, in->n_ids,
                                          e + (gsize)in->n_prefix * h, error))
            return FALSE;
        }
      segments[k] = (GepardBatchSegment){in->sequence->cache, input_rows (in)};
      row += segments[k].n_tokens;
    }

  gepard_model_forward_batch (self->model, segments, n, embeds, hidden);
  row = 0;
  for (int k = 0; k < n; k++)
    {
      row += segments[k].n_tokens;
      memcpy (last + (gsize)k * h, hidden + (gsize)(row - 1) * h, sizeof (float) * h);
    }
  gepard_model_heads_batch (self->model, last, n, logits, stop_logits);
  for (int k = 0; k < n; k++)
    {
      float *mine = logits + (gsize)k * n_logits;
      if (inputs[k].unconditional)
        continue;
      if (inputs[k].guided)
        {
          const float *u = mine + n_logits; /* inputs[k + 1]: checked above */
          for (int i = 0; i < n_logits; i++)
            mine[i] = u[i] + inputs[k].cfg_scale * (mine[i] - u[i]);
        }
      gepard_sampler_next (inputs[k].sequence->sampler, mine, codes + (gsize)k * c->n_audio_heads);
    }
  return TRUE;
}

static GepardAudioStream *
cpu_audio_stream_new (GepardCompute *compute, GError **error)
{
  CpuCompute *self = (CpuCompute *)compute;
  GepardAudioStream *stream;

  if (self->codec == NULL)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_MISSING,
                   "The model has no codec (codec.nemo or codec.safetensors beside it)");
      return NULL;
    }
  stream = g_new0 (GepardAudioStream, 1);
  stream->stream = gepard_codec_stream_new (self->codec);
  return stream;
}

static void
cpu_audio_stream_free (GepardCompute *compute, GepardAudioStream *stream)
{
  if (stream == NULL)
    return;
  gepard_codec_stream_free (stream->stream);
  g_free (stream);
}

static void
cpu_audio_stream_reset (GepardCompute *compute, GepardAudioStream *stream)
{
  gepard_codec_stream_reset (stream->stream);
}

static gboolean
cpu_decode_audio (GepardCompute *compute, GepardAudioStream *const *streams,
                  const gint32 *const *codes, const int *n_frames, float *const *samples, int n,
                  GError **error)
{
  g_autofree GepardCodecStream **codec_streams = g_new (GepardCodecStream *, MAX (n, 1));

  for (int i = 0; i < n; i++)
    codec_streams[i] = streams[i]->stream;
  return gepard_codec_decode_batch (codec_streams, codes, n_frames, samples, n, error);
}

static const GepardComputeFuncs cpu_funcs = {
    .kind = GEPARD_BACKEND_CPU,
    .free = cpu_free,
    .sequence_new = cpu_sequence_new,
    .sequence_free = cpu_sequence_free,
    .step = cpu_step,
    .audio_stream_new = cpu_audio_stream_new,
    .audio_stream_free = cpu_audio_stream_free,
    .audio_stream_reset = cpu_audio_stream_reset,
    .decode_audio = cpu_decode_audio,
};

GepardCompute *
gepard_compute_cpu_new (const GepardModel *model, GepardCodec *codec)
{
  CpuCompute *self = g_new0 (CpuCompute, 1);

  self->parent.funcs = &cpu_funcs;
  self->parent.max_batch = G_MAXINT;
  self->parent.text_cfg = TRUE;
  /* a step's time grows with its batch on the CPU: more streams per step only slow each down */
  self->parent.default_batch = 64;
  self->model = model;
  self->codec = codec;
  return &self->parent;
}
