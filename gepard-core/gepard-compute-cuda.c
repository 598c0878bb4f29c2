/* gepard-compute-cuda.c: the CUDA backend's side in gepard-core: it loads the kernels module
 * (kernels/, through gepard-backend.c) and adapts its plain C entry points to GepardCompute.
 *
 * The LM runs on the GPU: weights, KV cache, sampler state and sampling stay on the device and a
 * step copies back only each sequence's codes and stop logit. The codec's decoder runs there too
 * (kernels/gepard-cuda-codec.cu): each stream's causal state stays on the device and a decode
 * takes one frame of every stream with new frames through the decoder in one batched pass.
 * GEPARD_CUDA_CODEC=0 decodes on the CPU instead, as does a codec the GPU decoder does not take.
 *
 * Sizes come from the environment: TTS_GPU_MEMORY_UTILIZATION (fraction of the GPU's memory the
 * backend may fill, default 0.9), GEPARD_KV_CACHE_MIB (a fixed KV cache size instead),
 * GEPARD_GPU_MAX_CONTEXT (positions per sequence, default 8192) and GEPARD_GPU_MAX_SEQUENCES
 * (sequences alive at once, default 1024). */
#include "gepard-compute-cuda.h"

#include "gepard-bf16.h"
#include "gepard-codec-weights.h"
#include "gepard-fsq.h"
#include "gepard-error.h"
#include "../kernels/gepard-cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct
{
  GepardCudaModelNewFunc model_new;
  GepardCudaModelFreeFunc model_free;
  GepardCudaModelInfoFunc model_info;
  GepardCudaSequenceNewFunc sequence_new;
  GepardCudaSequenceFreeFunc sequence_free;
  GepardCudaStepFunc step;
  GepardCudaCodecNewFunc codec_new;
  GepardCudaCodecFreeFunc codec_free;
  GepardCudaCodecInfoFunc codec_info;
  GepardCudaCodecStreamNewFunc codec_stream_new;
  GepardCudaCodecStreamFreeFunc codec_stream_free;
  GepardCudaCodecStreamResetFunc codec_stream_reset;
  GepardCudaCodecDecodeFunc codec_decode;
} CudaEntryPoints;

typedef struct
{
  GepardCompute parent;
  const GepardModel *model;
  GepardCodec *codec;
  /* the CPU backend, whose codec decodes where the GPU's cannot (GEPARD_CUDA_CODEC=0, or a codec
   * the GPU decoder does not take) */
  GepardCompute *host_audio;
  CudaEntryPoints fn;
  GepardCudaModel *gpu;
  GepardCudaCodec *codec_gpu; /* NULL: audio on the CPU */
} CudaCompute;

struct _GepardSequence
{
  int slot;
};

static void
cuda_free (GepardCompute *compute)
{
  CudaCompute *self = (CudaCompute *)compute;
  if (self->gpu != NULL)
    self->fn.model_free (self->gpu);
  if (self->codec_gpu != NULL)
    self->fn.codec_free (self->codec_gpu);
  gepard_compute_free (self->host_audio);
  g_free (self);
}

static GepardSequence *
cuda_sequence_new (GepardCompute *compute, const GepardSampling *sampling, GError **error)
{
  CudaCompute *self = (CudaCompute *)compute;
  GepardCudaSampling s
      = {sampling->temperature, sampling->top_k, sampling->repetition_penalty, sampling->seed};
  char message[256] = "";
  int slot;

  if (self->fn.sequence_new (self->gpu, &s, &slot, message, sizeof message) != 0)
    {
      g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE, "%s", message);
      return NULL;
    }
  GepardSequence *sequence = g_new (GepardSequence, 1);
  sequence->slot = slot;
  return sequence;
}

static void
cuda_sequence_free (GepardCompute *compute, GepardSequence *sequence)
{
  CudaCompute *self = (CudaCompute *)compute;
  if (sequence == NULL)
    return;
  self->fn.sequence_free (self->gpu, sequence->slot);
  g_free (sequence);
}

/* the CPU backend's checks, with its error domain and messages, before anything reaches the GPU
 */
static gboolean
check_inputs (CudaCompute *self, const GepardStepInput *inputs, int n, GError **error)
{
  const GepardModelConfig *c = gepard_model_get_config (self->model);
  for (int k = 0; k < n; k++)
    {
      const GepardStepInput *in = &inputs[k];
      if (in->codes != NULL)
        {
          for (int i = 0; i < c->n_audio_heads; i++)
            if (in->codes[i] < 0 || in->codes[i] >= c->head_levels[i])
              {
                g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                             "Code %d of channel %d is outside its %d levels", in->codes[i], i,
                             c->head_levels[i]);
                return FALSE;
              }
        }
      else
        for (int t = 0; t < in->n_ids; t++)
          if (in->ids[t] < 0 || in->ids[t] >= c->vocab_size)
            {
              g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                           "Token id %d is outside the embedding table (%d rows)", in->ids[t],
                           c->vocab_size);
              return FALSE;
            }
    }
  return TRUE;
}

static gboolean
cuda_step_full (GepardCompute *compute, const GepardStepInput *inputs, int n, gint32 *codes,
                float *stop_logits, float *logits, GError **error)
{
  CudaCompute *self = (CudaCompute *)compute;
  char message[512] = "";

  if (n <= 0)
    return TRUE;
  if (!check_inputs (self, inputs, n, error))
    return FALSE;
  g_autofree GepardCudaStepInput *in = g_new (GepardCudaStepInput, n);
  for (int k = 0; k < n; k++)
    in[k] = (GepardCudaStepInput){.sequence = inputs[k].sequence->slot,
                                  .prefix = inputs[k].prefix,
                                  .n_prefix = inputs[k].n_prefix,
                                  .ids = inputs[k].ids,
                                  .n_ids = inputs[k].n_ids,
                                  .codes = inputs[k].codes,
                                  .guided = inputs[k].guided,
                                  .cfg_scale = inputs[k].cfg_scale};
  if (self->fn.step (self->gpu, in, n, codes, stop_logits, logits, message, sizeof message) != 0)
    {
      g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE,
                   "GPU step failed: %s", message);
      return FALSE;
    }
  return TRUE;
}

static gboolean
cuda_step (GepardCompute *compute, const GepardStepInput *inputs, int n, gint32 *codes,
           float *stop_logits, GError **error)
{
  return cuda_step_full (compute, inputs, n, codes, stop_logits, NULL, error);
}

/* ---- audio: the codec's decoder on the GPU, else the CPU backend's ---- */

struct _GepardAudioStream
{
  int slot;
};

static GepardAudioStream *
cuda_audio_stream_new (GepardCompute *compute, GError **error)
{
  CudaCompute *self = (CudaCompute *)compute;
  char message[256] = "";
  int slot;

  if (self->codec_gpu == NULL)
    return self->host_audio->funcs->audio_stream_new (self->host_audio, error);
  if (self->fn.codec_stream_new (self->codec_gpu, &slot, message, sizeof message) != 0)
    {
      g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE, "%s", message);
      return NULL;
    }
  GepardAudioStream *stream = g_new (GepardAudioStream, 1);
  stream->slot = slot;
  return stream;
}

static void
cuda_audio_stream_free (GepardCompute *compute, GepardAudioStream *stream)
{
  CudaCompute *self = (CudaCompute *)compute;
  if (self->codec_gpu == NULL)
    {
      self->host_audio->funcs->audio_stream_free (self->host_audio, stream);
      return;
    }
  if (stream == NULL)
    return;
  self->fn.codec_stream_free (self->codec_gpu, stream->slot);
  g_free (stream);
}

static void
cuda_audio_stream_reset (GepardCompute *compute, GepardAudioStream *stream)
{
  CudaCompute *self = (CudaCompute *)compute;
  if (self->codec_gpu == NULL)
    self->host_audio->funcs->audio_stream_reset (self->host_audio, stream);
  else
    self->fn.codec_stream_reset (self->codec_gpu, stream->slot);
}

/* Every stream's frames in batched passes on the GPU: each round decodes, for every stream that
 * has frames left, as many as the stream with the fewest left has, so that one frame of each
 * stream (the usual case) is one pass and one stream's several queued frames are a multi-frame
 * pass (the codec splits a round into passes of 1, 2, 4 or 8 frames). */
static gboolean
cuda_decode_audio (GepardCompute *compute, GepardAudioStream *const *streams,
                   const gint32 *const *codes, const int *n_frames, float *const *samples, int n,
                   GError **error)
{
  CudaCompute *self = (CudaCompute *)compute;
  if (self->codec_gpu == NULL)
    return self->host_audio->funcs->decode_audio (self->host_audio, streams, codes, n_frames,
                                                  samples, n, error);

  const GepardCodecConfig *c = gepard_codec_get_config (self->codec);
  gsize latent_floats = 0;
  for (int i = 0; i < n; i++)
    if (n_frames[i] > 0)
      {
        if (!gepard_fsq_check_codes (c, codes[i], (gsize)n_frames[i], error))
          {
            g_prefix_error (error, "Stream %d: ", i);
            return FALSE;
          }
        latent_floats += (gsize)n_frames[i] * c->latent_dim;
      }
  g_autofree int *slots = g_new (int, MAX (n, 1));
  g_autofree int *done = g_new0 (int, MAX (n, 1));
  g_autofree float *latent = g_new (float, MAX (latent_floats, 1));
  g_autofree float **out = g_new (float *, MAX (n, 1));
  char message[512] = "";
  for (;;)
    {
      int frames = G_MAXINT, batch = 0;
      for (int i = 0; i < n; i++)
        if (n_frames[i] > done[i])
          frames = MIN (frames, n_frames[i] - done[i]);
      if (frames == G_MAXINT)
        return TRUE;
      for (int i = 0; i < n; i++)
        if (n_frames[i] > done[i])
          {
            slots[batch] = streams[i]->slot;
            gepard_fsq_decode (c, codes[i] + (gsize)done[i] * c->latent_dim, frames,
                               latent + (gsize)batch * frames * c->latent_dim);
            out[batch] = samples[i] + (gsize)done[i] * c->samples_per_frame;
            done[i] += frames;
            batch++;
          }
      if (self->fn.codec_decode (self->codec_gpu, slots, latent, batch, frames, out, message,
                                 sizeof message)
          != 0)
        {
          g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE,
                       "GPU audio decoding failed: %s", message);
          return FALSE;
        }
    }
}

static const GepardComputeFuncs cuda_funcs = {
    .kind = GEPARD_BACKEND_CUDA,
    .free = cuda_free,
    .sequence_new = cuda_sequence_new,
    .sequence_free = cuda_sequence_free,
    .step = cuda_step,
    .audio_stream_new = cuda_audio_stream_new,
    .audio_stream_free = cuda_audio_stream_free,
    .audio_stream_reset = cuda_audio_stream_reset,
    .decode_audio = cuda_decode_audio,
};

/* ---- loading ---- */

typedef struct
{
  const GepardCheckpoint *checkpoint;
  float *converted; /* a tensor of another type, as fp32, until the next lookup */
} TensorLookup;

static int
lookup_tensor (void *user_data, const char *name, GepardCudaTensor *out)
{
  TensorLookup *lookup = user_data;
  const GepardTensor *t = gepard_checkpoint_lookup (lookup->checkpoint, name);

  g_clear_pointer (&lookup->converted, g_free);
  if (t == NULL || t->n_dims > G_N_ELEMENTS (out->shape))
    return -1;
  out->n_dims = (int)t->n_dims;
  for (guint d = 0; d < t->n_dims; d++)
    out->shape[d] = t->shape[d];
  out->data = t->data;
  switch (t->dtype)
    {
    case GEPARD_DTYPE_BF16:
      out->dtype = GEPARD_CUDA_DTYPE_BF16;
      break;
    case GEPARD_DTYPE_F16:
      out->dtype = GEPARD_CUDA_DTYPE_F16;
      break;
    case GEPARD_DTYPE_F32:
      out->dtype = GEPARD_CUDA_DTYPE_F32;
      break;
    default:
      lookup->converted = g_new (float, MAX (t->n_elements, 1));
      gepard_tensor_to_f32 (t, lookup->converted);
      out->dtype = GEPARD_CUDA_DTYPE_F32;
      out->data = lookup->converted;
      break;
    }
  return 0;
}

/* §1.5 with GEPARD's runner's bf16 inv_freq (what every user of gepard_model_new asks for):
 * cos and sin of fp32 angles rounded to bf16, [max_context][cos | sin][rotary_dim / 2]. The same
 * arithmetic as gepard-model.c, so both backends rotate by the same bits. */
static float *
rope_table_new (const GepardModelConfig *c, int rotary_dim, int max_context)
{
  int half = rotary_dim / 2;
  g_autofree float *inv_freq = g_new (float, MAX (half, 1));
  float *table = g_new (float, (gsize)MAX (max_context, 1) * MAX (rotary_dim, 1));

  for (int j = 0; j < half; j++)
    {
      float exponent = (float)(2 * j) / (float)rotary_dim;
      inv_freq[j] = gepard_bf16_round (1.0f / powf ((float)c->rope_theta, exponent));
    }
  for (int p = 0; p < max_context; p++)
    for (int j = 0; j < half; j++)
      {
        float angle = inv_freq[j] * (float)p;
        table[(gsize)p * rotary_dim + j] = gepard_bf16_round (cosf (angle));
        table[(gsize)p * rotary_dim + half + j] = gepard_bf16_round (sinf (angle));
      }
  return table;
}

static gint64
env_int (const char *name, gint64 fallback, gint64 min, gint64 max)
{
  const char *value = g_getenv (name);
  gint64 n;
  if (value == NULL || *value == '\0')
    return fallback;
  if (!g_ascii_string_to_signed (value, 10, min, max, &n, NULL))
    {
      g_warning ("%s=%s is not a number in %" G_GINT64_FORMAT "…%" G_GINT64_FORMAT
                 "; using %" G_GINT64_FORMAT,
                 name, value, min, max, fallback);
      return fallback;
    }
  return n;
}

static double
env_fraction (const char *name, double fallback)
{
  const char *value = g_getenv (name);
  char *end = NULL;
  if (value == NULL || *value == '\0')
    return fallback;
  double x = g_ascii_strtod (value, &end);
  if (end == value || *end != '\0' || !(x > 0 && x <= 1))
    {
      g_warning ("%s=%s is not a fraction in (0, 1]; using %g", name, value, fallback);
      return fallback;
    }
  return x;
}

static gboolean
resolve (CudaEntryPoints *fn, GError **error)
{
  struct
  {
    const char *name;
    gpointer *slot;
  } entries[] = {
      {"gepard_cuda_model_new", (gpointer *)&fn->model_new},
      {"gepard_cuda_model_free", (gpointer *)&fn->model_free},
      {"gepard_cuda_model_info", (gpointer *)&fn->model_info},
      {"gepard_cuda_sequence_new", (gpointer *)&fn->sequence_new},
      {"gepard_cuda_sequence_free", (gpointer *)&fn->sequence_free},
      {"gepard_cuda_step", (gpointer *)&fn->step},
      {"gepard_cuda_codec_new", (gpointer *)&fn->codec_new},
      {"gepard_cuda_codec_free", (gpointer *)&fn->codec_free},
      {"gepard_cuda_codec_info", (gpointer *)&fn->codec_info},
      {"gepard_cuda_codec_stream_new", (gpointer *)&fn->codec_stream_new},
      {"gepard_cuda_codec_stream_free", (gpointer *)&fn->codec_stream_free},
      {"gepard_cuda_codec_stream_reset", (gpointer *)&fn->codec_stream_reset},
      {"gepard_cuda_codec_decode", (gpointer *)&fn->codec_decode},
  };
  for (guint i = 0; i < G_N_ELEMENTS (entries); i++)
    if ((*entries[i].slot = gepard_backend_cuda_symbol (entries[i].name, error)) == NULL)
      return FALSE;
  return TRUE;
}

/* the codec's tensors as gepard_codec_weights_get hands them out: fp32, weight norm folded */
static int
lookup_codec_tensor (void *user_data, const char *name, GepardCudaTensor *out)
{
  gint64 shape[GEPARD_TENSOR_MAX_DIMS];
  guint n_dims = 0;
  const float *data = gepard_codec_weights_get (user_data, name, &n_dims, shape);
  if (data == NULL || n_dims > G_N_ELEMENTS (out->shape))
    return -1;
  out->dtype = GEPARD_CUDA_DTYPE_F32;
  out->n_dims = (int)n_dims;
  for (guint d = 0; d < n_dims; d++)
    out->shape[d] = shape[d];
  out->data = data;
  return 0;
}

/* The decoder of the codec at `path` on the GPU, with room for max_streams streams. */
static GepardCudaCodec *
codec_gpu_new (const CudaEntryPoints *fn, const char *path, const GepardCodecConfig *c,
               int device_index, int max_streams, GError **error)
{
  const GepardCodecDecoderConfig *d = &c->decoder;
  if (!d->n_groups_equal_to_out_channels)
    {
      g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE,
                   "the GPU decoder takes grouped up-sampling convolutions only");
      return NULL;
    }
  g_autoptr (GepardCodecWeights) weights = gepard_codec_weights_open (path, error);
  if (weights == NULL)
    return NULL;
  GepardCudaCodecConfig config = {
      .latent_dim = c->latent_dim,
      .samples_per_frame = c->samples_per_frame,
      .base_channels = d->base_channels,
      .n_stages = d->n_stages,
      .in_kernel_size = d->in_kernel_size,
      .out_kernel_size = d->out_kernel_size,
      .n_kernels = d->n_resblock_kernel_sizes,
      .n_dilations = d->n_resblock_dilation_sizes,
      .half_snake = d->activation == GEPARD_CODEC_ACTIVATION_HALF_SNAKE,
      .output_tanh = d->output_activation == GEPARD_CODEC_OUTPUT_TANH,
      .max_streams = max_streams,
  };
  G_STATIC_ASSERT (G_N_ELEMENTS (config.up_sample_rates) >= GEPARD_CODEC_MAX_STAGES);
  G_STATIC_ASSERT (G_N_ELEMENTS (config.kernels) >= GEPARD_CODEC_MAX_RESBLOCK_KERNELS);
  G_STATIC_ASSERT (G_N_ELEMENTS (config.dilations) >= GEPARD_CODEC_MAX_RESBLOCK_DILATIONS);
  memcpy (config.up_sample_rates, d->up_sample_rates, sizeof d->up_sample_rates);
  memcpy (config.kernels, d->resblock_kernel_sizes, sizeof d->resblock_kernel_sizes);
  memcpy (config.dilations, d->resblock_dilation_sizes, sizeof d->resblock_dilation_sizes);

  char message[512] = "";
  GepardCudaCodec *codec = NULL;
  if (fn->codec_new (device_index, &config, lookup_codec_tensor, weights, &codec, message,
                     sizeof message)
      != 0)
    {
      g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE, "%s", message);
      return NULL;
    }
  return codec;
}

GepardCompute *
gepard_compute_cuda_new (const GepardCheckpoint *checkpoint, const GepardModel *model,
                         GepardCodec *codec, int device_index, GError **error)
{
  const GepardModelConfig *c = gepard_model_get_config (model);
  CudaEntryPoints fn;
  int n_devices = 0;

  if (!resolve (&fn, error) || !gepard_backend_cuda_probe (&n_devices, error))
    return NULL;
  if (device_index < 0 || device_index >= n_devices)
    {
      g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE,
                   "GPU %d does not exist: the machine has %d", device_index, n_devices);
      return NULL;
    }

  int rotary_dim = (int)(c->head_dim * c->partial_rotary_factor);
  rotary_dim -= rotary_dim % 2;
  int max_context = (int)env_int ("GEPARD_GPU_MAX_CONTEXT", 8192, 64, 1 << 20);
  g_autofree float *rope = rope_table_new (c, rotary_dim, max_context);
  GepardCudaModelConfig config = {
      .hidden_size = c->hidden_size,
      .n_layers = c->n_layers,
      .n_q_heads = c->n_q_heads,
      .n_kv_heads = c->n_kv_heads,
      .head_dim = c->head_dim,
      .intermediate_size = c->intermediate_size,
      .vocab_size = c->vocab_size,
      .rms_norm_eps = (float)c->rms_norm_eps,
      .rotary_dim = rotary_dim,
      .rope_table = rope,
      .n_audio_heads = c->n_audio_heads,
      .head_levels = c->head_levels,
      .audio_embed_dim = c->audio_embed_dim,
      .max_context = max_context,
      .max_sequences = (int)env_int ("GEPARD_GPU_MAX_SEQUENCES", 1024, 1, 1 << 16),
      .kv_cache_bytes = (size_t)env_int ("GEPARD_KV_CACHE_MIB", 0, 0, G_GINT64_CONSTANT (1) << 24)
                        << 20,
      .memory_fraction = env_fraction ("TTS_GPU_MEMORY_UTILIZATION", 0.9),
  };

  /* the codec first, so that the KV cache is sized from what it leaves */
  GepardCudaCodec *codec_gpu = NULL;
  const char *codec_path = gepard_checkpoint_get_codec_path (checkpoint);
  if (codec != NULL && codec_path != NULL && g_strcmp0 (g_getenv ("GEPARD_CUDA_CODEC"), "0") != 0)
    {
      g_autoptr (GError) codec_error = NULL;
      codec_gpu = codec_gpu_new (&fn, codec_path, gepard_codec_get_config (codec), device_index,
                                 config.max_sequences, &codec_error);
      if (codec_gpu == NULL)
        g_message ("The codec decodes on the CPU: %s", codec_error->message);
    }

  TensorLookup lookup = {checkpoint, NULL};
  char message[512] = "";
  GepardCudaModel *gpu = NULL;
  int status
      = fn.model_new (device_index, &config, lookup_tensor, &lookup, &gpu, message, sizeof message);
  g_free (lookup.converted);
  if (status != 0)
    {
      g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE,
                   "The model cannot be loaded on GPU %d: %s", device_index, message);
      if (codec_gpu != NULL)
        fn.codec_free (codec_gpu);
      return NULL;
    }

  CudaCompute *self = g_new0 (CudaCompute, 1);
  self->parent.funcs = &cuda_funcs;
  self->model = model;
  self->codec = codec;
  self->host_audio = gepard_compute_cpu_new (model, codec);
  self->fn = fn;
  self->gpu = gpu;
  self->codec_gpu = codec_gpu;
  GepardCudaModelInfo info;
  fn.model_info (gpu, &info);
  /* one step for every stream: a GPU step's time grows far slower than its batch */
  self->parent.max_batch = self->parent.default_batch = info.max_sequences;
  self->parent.text_cfg = TRUE;
  /* the step and the codec pass run on streams of their own: the GPU overlaps them */
  self->parent.decode_alongside = TRUE;
  return &self->parent;
}

gboolean
gepard_compute_cuda_step_with_logits (GepardCompute *compute, const GepardStepInput *inputs, int n,
                                      gint32 *codes, float *stop_logits, float *logits,
                                      GError **error)
{
  g_return_val_if_fail (compute->funcs == &cuda_funcs, FALSE);
  return cuda_step_full (compute, inputs, n, codes, stop_logits, logits, error);
}

char *
gepard_compute_cuda_describe (GepardCompute *compute)
{
  if (compute->funcs != &cuda_funcs)
    return NULL;
  CudaCompute *self = (CudaCompute *)compute;
  GepardCudaModelInfo info;
  self->fn.model_info (self->gpu, &info);
  g_autofree char *audio = NULL;
  if (self->codec_gpu != NULL)
    {
      GepardCudaCodecInfo ci;
      self->fn.codec_info (self->codec_gpu, &ci);
      audio = g_strdup_printf ("codec on the GPU (%s, %s): weights %.1f MiB, %.0f KiB of state "
                               "per stream, %.2f GiB for %d streams",
                               ci.tensor_cores == 3   ? "fp16 tensor cores"
                               : ci.tensor_cores == 2 ? "cuBLAS, TF32 tensor cores"
                               : ci.tensor_cores == 1 ? "TF32 tensor cores"
                                                      : "fp32",
                               ci.graphs ? "passes as CUDA graphs" : "passes kernel by kernel",
                               ci.weight_bytes / 1048576.0, ci.state_bytes / 1024.0,
                               ci.work_bytes / 1073741824.0, ci.max_streams);
    }
  else
    audio = g_strdup (self->codec != NULL ? "codec on the CPU" : "no codec");
  return g_strdup_printf ("%s: weights %.2f GiB, KV cache %.2f GiB (%d blocks of %d positions), "
                          "up to %d sequences of %d positions; %s",
                          info.device, info.weight_bytes / 1073741824.0,
                          info.kv_cache_bytes / 1073741824.0, info.kv_blocks, info.kv_block_tokens,
                          info.max_sequences, info.max_context, audio);
}
