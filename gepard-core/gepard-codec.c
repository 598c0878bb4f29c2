/* gepard-codec.c: loading a NanoCodec checkpoint into packed decoder and encoder layers. */
#include "gepard-codec-private.h"

#include "gepard-error.h"

#include <string.h>

#define MAX_THREADS 16

typedef struct
{
  GepardCodec *codec;
  const GepardCodecWeights *weights;
  GError *error;
} Loader;

static const float *
get_tensor (Loader *loader, const char *name, guint n_dims, const gint64 *shape)
{
  gint64 got[GEPARD_TENSOR_MAX_DIMS];
  guint got_dims = 0;
  const float *data = gepard_codec_weights_get (loader->weights, name, &got_dims, got);
  gboolean same;

  if (data == NULL)
    {
      g_set_error (&loader->error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_MISSING,
                   "The codec checkpoint has no tensor “%s”", name);
      return NULL;
    }
  same = got_dims == n_dims;
  for (guint i = 0; same && i < n_dims; i++)
    same = got[i] == shape[i];
  if (!same)
    {
      g_set_error (&loader->error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "Codec tensor “%s” does not have the shape its config implies", name);
      return NULL;
    }
  return data;
}

/* The polyphase form of a strided conv (nanocodec.md §3.4: kernel 2r, stride r): output i reads
 * x[i·r + m − p] for m = q·r + ρ, i.e. phase ρ of the input at step i + q. With rows (c, ρ) of
 * the phases P[c·r + ρ][j] = x[j·r + ρ − p] it is a stride-1 conv of kernel 2 over P. */
static void
init_down_conv (GepardConv *conv, int out_channels, int in_channels, int rate, const float *weight,
                const float *bias)
{
  gsize rows = (gsize)in_channels * rate;
  gsize n_weights = 2 * rows * out_channels;
  g_autofree float *phased = g_new (float, n_weights);

  for (int o = 0; o < out_channels; o++)
    for (int c = 0; c < in_channels; c++)
      for (int phase = 0; phase < rate; phase++)
        for (int q = 0; q < 2; q++)
          phased[(((gsize)o * in_channels + c) * rate + phase) * 2 + q]
              = weight[((gsize)o * in_channels + c) * 2 * rate + q * rate + phase];
  gepard_conv_init (conv, out_channels, (int)rows, 2, 1, phased, bias);
}

static GepardConv *
conv_slot (GepardCodec *codec, const GepardCodecTensorInfo *info)
{
  gboolean decoder = info->part == GEPARD_CODEC_PART_DECODER;
  int stage = info->stage, branch = info->branch, block = info->block;

  switch (info->layer)
    {
    case GEPARD_CODEC_LAYER_PRE_CONV:
      return decoder ? &codec->decoder.pre_conv : &codec->encoder.pre_conv;
    case GEPARD_CODEC_LAYER_POST_CONV:
      return decoder ? &codec->decoder.post_conv : &codec->encoder.post_conv;
    case GEPARD_CODEC_LAYER_RESAMPLE_CONV:
      return decoder ? NULL : &codec->encoder.stages[stage].down_conv;
    case GEPARD_CODEC_LAYER_RES_INPUT_CONV:
      return decoder ? &codec->decoder.stages[stage].blocks[branch][block].input_conv
                     : &codec->encoder.stages[stage].blocks[branch][block].input_conv;
    case GEPARD_CODEC_LAYER_RES_SKIP_CONV:
      return decoder ? &codec->decoder.stages[stage].blocks[branch][block].skip_conv
                     : &codec->encoder.stages[stage].blocks[branch][block].skip_conv;
    default:
      return NULL;
    }
}

static void
load_conv (Loader *loader, const GepardCodecTensorInfo *info)
{
  GepardCodec *codec = loader->codec;
  gint64 bias_shape[1] = {info->out_channels};
  gint64 weight_shape[3];
  g_autofree char *stem = NULL;
  g_autofree char *weight_name = NULL;
  const float *weight, *bias;
  GepardConv *conv;

  /* gepard-codec-weights.h: "<conv>.weight" next to "<conv>.bias", weight norm folded */
  g_assert (g_str_has_suffix (info->name, ".bias"));
  stem = g_strndup (info->name, strlen (info->name) - strlen ("bias"));
  weight_name = g_strconcat (stem, "weight", NULL);

  /* nanocodec.md §2.4: a ConvTranspose1d weight is (C_in, C_out / groups, k) */
  weight_shape[0] = info->transposed ? info->in_channels : info->out_channels;
  weight_shape[1] = (info->transposed ? info->out_channels : info->in_channels) / info->groups;
  weight_shape[2] = info->kernel_size;
  bias = get_tensor (loader, info->name, 1, bias_shape);
  if (bias == NULL)
    return;
  weight = get_tensor (loader, weight_name, 3, weight_shape);
  if (weight == NULL)
    return;

  if (info->part == GEPARD_CODEC_PART_DECODER && info->layer == GEPARD_CODEC_LAYER_RESAMPLE_CONV)
    {
      GepardDecoderStage *stage = &codec->decoder.stages[info->stage];

      /* nanocodec.md §2.3: groups = C_out, two input channels per output channel */
      if (info->groups != info->out_channels || info->in_channels != 2 * info->out_channels
          || info->kernel_size != 2 * info->stride)
        {
          g_set_error (&loader->error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                       "%s: only transposed convs with groups = out_channels are supported",
                       weight_name);
          return;
        }
      stage->in_channels = info->in_channels;
      stage->channels = info->out_channels;
      stage->rate = info->stride;
      stage->up_weight = g_memdup2 (weight, sizeof (float) * info->in_channels * info->kernel_size);
      stage->up_bias = g_memdup2 (bias, sizeof (float) * info->out_channels);
      return;
    }

  conv = conv_slot (codec, info);
  g_assert (conv != NULL);
  if (info->groups != 1)
    {
      g_set_error (&loader->error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "%s: grouped convolution where NanoCodec has none", weight_name);
      return;
    }
  if (info->stride != 1)
    {
      GepardEncoderStage *stage = &codec->encoder.stages[info->stage];

      /* nanocodec.md §3.3: kernel 2r, stride r, padding (r + 1) // 2 */
      g_assert (info->part == GEPARD_CODEC_PART_ENCODER
                && info->layer == GEPARD_CODEC_LAYER_RESAMPLE_CONV);
      if (info->kernel_size != 2 * info->stride)
        {
          g_set_error (&loader->error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                       "%s: a strided conv whose kernel is not twice its stride", weight_name);
          return;
        }
      stage->channels = info->in_channels;
      stage->rate = info->stride;
      stage->pad = (info->stride + 1) / 2;
      init_down_conv (conv, info->out_channels, info->in_channels, info->stride, weight, bias);
      return;
    }
  gepard_conv_init (conv, info->out_channels, info->in_channels, info->kernel_size, info->dilation,
                    weight, bias);
}

static GepardActivation *
activation_slot (GepardCodec *codec, const GepardCodecTensorInfo *info)
{
  GepardDecoder *dec = &codec->decoder;

  if (info->part != GEPARD_CODEC_PART_DECODER)
    return NULL;
  switch (info->layer)
    {
    case GEPARD_CODEC_LAYER_STAGE_ACTIVATION:
      return &dec->stages[info->stage].act;
    case GEPARD_CODEC_LAYER_RES_INPUT_ACTIVATION:
      return &dec->stages[info->stage].blocks[info->branch][info->block].input_act;
    case GEPARD_CODEC_LAYER_RES_SKIP_ACTIVATION:
      return &dec->stages[info->stage].blocks[info->branch][info->block].skip_act;
    case GEPARD_CODEC_LAYER_POST_ACTIVATION:
      return &dec->post_act;
    default:
      return NULL;
    }
}

static void
load_tensor (const GepardCodecTensorInfo *info, gpointer user_data)
{
  Loader *loader = user_data;

  if (loader->error != NULL)
    return;

  if (info->param == GEPARD_CODEC_PARAM_BIAS
      && (info->part == GEPARD_CODEC_PART_DECODER || info->part == GEPARD_CODEC_PART_ENCODER))
    load_conv (loader, info);
  else if (info->param == GEPARD_CODEC_PARAM_SNAKE_ALPHA)
    {
      GepardActivation *act = activation_slot (loader->codec, info);
      const float *alpha;

      if (act == NULL)
        {
          g_set_error (&loader->error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                       "Snake alpha “%s” where NanoCodec has none", info->name);
          return;
        }
      alpha = get_tensor (loader, info->name, info->n_dims, info->shape);
      if (alpha == NULL)
        return;
      /* (1, C // 2, 1): the Snake half of a HalfSnake over act->channels (§2.3) */
      gepard_activation_init (act, act->channels, (int)info->shape[1], alpha);
    }
}

/* Channel counts of every activation, so that a LeakyReLU-only activation (no tensors) is
 * complete; Snake alphas fill in their half while loading. */
static void
init_activations (GepardCodec *codec)
{
  const GepardCodecConfig *config = &codec->config;
  const GepardCodecDecoderConfig *dec = &config->decoder;

  for (int i = 0; i < dec->n_stages; i++)
    {
      GepardDecoderStage *stage = &codec->decoder.stages[i];
      int channels = gepard_codec_config_get_decoder_channels (config, i + 1);

      gepard_activation_init (&stage->act, 2 * channels, 0, NULL);
      for (int j = 0; j < dec->n_resblock_kernel_sizes; j++)
        for (int m = 0; m < dec->n_resblock_dilation_sizes; m++)
          {
            gepard_activation_init (&stage->blocks[j][m].input_act, channels, 0, NULL);
            gepard_activation_init (&stage->blocks[j][m].skip_act, channels, 0, NULL);
          }
    }
  gepard_activation_init (&codec->decoder.post_act,
                          gepard_codec_config_get_decoder_channels (config, dec->n_stages), 0,
                          NULL);
}

static gboolean
conv_loaded (const GepardConv *conv)
{
  return conv->packed != NULL;
}

/* Every layer the forward passes use got its tensors, and every HalfSnake its alphas. */
static gboolean
check_complete (GepardCodec *codec, GError **error)
{
  const GepardCodecConfig *config = &codec->config;
  const GepardCodecDecoderConfig *dec = &config->decoder;
  const GepardCodecEncoderConfig *enc = &config->encoder;
  gboolean snake = dec->activation == GEPARD_CODEC_ACTIVATION_HALF_SNAKE;
  gboolean ok = conv_loaded (&codec->decoder.pre_conv) && conv_loaded (&codec->decoder.post_conv)
                && conv_loaded (&codec->encoder.pre_conv)
                && conv_loaded (&codec->encoder.post_conv);

  ok = ok && (!snake || codec->decoder.post_act.n_snake > 0);
  for (int i = 0; ok && i < dec->n_stages; i++)
    {
      const GepardDecoderStage *stage = &codec->decoder.stages[i];

      ok = stage->up_weight != NULL && (!snake || stage->act.n_snake > 0);
      for (int j = 0; ok && j < dec->n_resblock_kernel_sizes; j++)
        for (int m = 0; ok && m < dec->n_resblock_dilation_sizes; m++)
          {
            const GepardResBlock *block = &stage->blocks[j][m];

            ok = conv_loaded (&block->input_conv) && conv_loaded (&block->skip_conv)
                 && (!snake || (block->input_act.n_snake > 0 && block->skip_act.n_snake > 0));
          }
    }
  for (int i = 0; ok && i < enc->n_stages; i++)
    {
      const GepardEncoderStage *stage = &codec->encoder.stages[i];

      ok = conv_loaded (&stage->down_conv);
      for (int j = 0; ok && j < enc->n_resblock_kernel_sizes; j++)
        for (int m = 0; ok && m < enc->n_resblock_dilation_sizes; m++)
          ok = conv_loaded (&stage->blocks[j][m].input_conv)
               && conv_loaded (&stage->blocks[j][m].skip_conv);
    }
  if (!ok)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_MISSING,
                   "The codec checkpoint lacks tensors its config implies");
      return FALSE;
    }
  return TRUE;
}

static gboolean
check_supported (const GepardCodecConfig *config, GError **error)
{
  /* nanocodec.md §3.4: the published encoder pads by replication; zero padding is the same code
   * path. Reflection would need a length check per layer that NeMo leaves to PyTorch. */
  if (config->encoder.pad_mode == GEPARD_CODEC_PAD_REFLECT)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "audio_encoder: pad_mode reflect is not supported (replicate, zeros are)");
      return FALSE;
    }
  if (!config->decoder.n_groups_equal_to_out_channels)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "audio_decoder: only n_groups_equal_to_out_channels: true is supported");
      return FALSE;
    }
  return TRUE;
}

static int
default_n_threads (void)
{
  const char *env = g_getenv ("GEPARD_CODEC_THREADS");

  if (env != NULL && *env != '\0')
    {
      gint64 value = g_ascii_strtoll (env, NULL, 10);

      if (value >= 1)
        return (int)MIN (value, MAX_THREADS);
    }
  return CLAMP ((int)g_get_num_processors (), 1, MAX_THREADS);
}

GepardCodec *
gepard_codec_new (const char *path, GError **error)
{
  g_autoptr (GepardCodecWeights) weights = NULL;
  g_autoptr (GepardCodec) codec = NULL;
  Loader loader = {NULL, NULL, NULL};

  g_return_val_if_fail (path != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  weights = gepard_codec_weights_open (path, error);
  if (weights == NULL)
    return NULL;

  codec = g_new0 (GepardCodec, 1);
  codec->config = *gepard_codec_weights_get_config (weights);
  if (!gepard_codec_config_validate (&codec->config, error)
      || !check_supported (&codec->config, error))
    return NULL;

  init_activations (codec);
  loader.codec = codec;
  loader.weights = weights;
  gepard_codec_config_foreach_tensor (&codec->config, load_tensor, &loader);
  if (loader.error != NULL)
    {
      g_propagate_error (error, loader.error);
      return NULL;
    }
  if (!check_complete (codec, error))
    return NULL;

  gepard_state_layout_init (&codec->state_layout, &codec->config);
  codec->n_threads = default_n_threads ();
  codec->pool = gepard_codec_pool_new (codec->n_threads);
  return g_steal_pointer (&codec);
}

static void
clear_res_blocks (GepardResBlock blocks[][GEPARD_CODEC_MAX_RESBLOCK_DILATIONS])
{
  for (int j = 0; j < GEPARD_CODEC_MAX_RESBLOCK_KERNELS; j++)
    for (int m = 0; m < GEPARD_CODEC_MAX_RESBLOCK_DILATIONS; m++)
      {
        gepard_activation_clear (&blocks[j][m].input_act);
        gepard_activation_clear (&blocks[j][m].skip_act);
        gepard_conv_clear (&blocks[j][m].input_conv);
        gepard_conv_clear (&blocks[j][m].skip_conv);
      }
}

void
gepard_codec_free (GepardCodec *codec)
{
  if (codec == NULL)
    return;

  gepard_codec_pool_free (codec->pool);
  gepard_conv_clear (&codec->decoder.pre_conv);
  gepard_conv_clear (&codec->decoder.post_conv);
  gepard_activation_clear (&codec->decoder.post_act);
  gepard_conv_clear (&codec->encoder.pre_conv);
  gepard_conv_clear (&codec->encoder.post_conv);
  for (int i = 0; i < GEPARD_CODEC_MAX_STAGES; i++)
    {
      GepardDecoderStage *dec = &codec->decoder.stages[i];
      GepardEncoderStage *enc = &codec->encoder.stages[i];

      gepard_activation_clear (&dec->act);
      g_free (dec->up_weight);
      g_free (dec->up_bias);
      clear_res_blocks (dec->blocks);
      gepard_conv_clear (&enc->down_conv);
      clear_res_blocks (enc->blocks);
    }
  g_free (codec);
}

const GepardCodecConfig *
gepard_codec_get_config (const GepardCodec *codec)
{
  g_return_val_if_fail (codec != NULL, NULL);

  return &codec->config;
}

void
gepard_codec_set_n_threads (GepardCodec *codec, int n_threads)
{
  g_return_if_fail (codec != NULL);

  n_threads = CLAMP (n_threads, 1, MAX_THREADS);
  if (n_threads == codec->n_threads)
    return;
  gepard_codec_pool_free (codec->pool);
  codec->n_threads = n_threads;
  codec->pool = gepard_codec_pool_new (n_threads);
}

int
gepard_codec_get_n_threads (const GepardCodec *codec)
{
  g_return_val_if_fail (codec != NULL, 0);

  return codec->n_threads;
}

void
gepard_codec_set_encoder_window (GepardCodec *codec, int n_frames)
{
  g_return_if_fail (codec != NULL);

  codec->encoder_window = MAX (n_frames, 0);
}
