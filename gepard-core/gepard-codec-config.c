/* gepard-codec-config.c: NanoCodec presets, validation, tensor enumeration and model_config.yaml.
 */
#include "gepard-codec-config.h"

#include "gepard-error.h"

#include <string.h>

static void
set_default_resblocks (int *n_kernels, int *kernels, int *n_dilations, int *dilations)
{
  /* nanocodec.md §2.1, §3.1: the class defaults (3, 7, 11) and (1, 3, 5) apply to both stacks */
  static const int default_kernels[] = {3, 7, 11};
  static const int default_dilations[] = {1, 3, 5};

  *n_kernels = G_N_ELEMENTS (default_kernels);
  memcpy (kernels, default_kernels, sizeof default_kernels);
  *n_dilations = G_N_ELEMENTS (default_dilations);
  memcpy (dilations, default_dilations, sizeof default_dilations);
}

void
gepard_codec_config_init_nanocodec_22khz (GepardCodecConfig *config)
{
  static const int down_rates[] = {2, 2, 4, 8, 8};
  static const int up_rates[] = {8, 8, 4, 2, 2};
  static const int levels[] = {8, 7, 6, 6};
  GepardCodecEncoderConfig *enc = &config->encoder;
  GepardCodecDecoderConfig *dec = &config->decoder;

  g_return_if_fail (config != NULL);

  memset (config, 0, sizeof *config);

  /* nanocodec.md §1 */
  config->sample_rate = 22050;
  config->samples_per_frame = 1024;
  config->latent_dim = 32;

  /* nanocodec.md §4 */
  config->fsq_groups = 8;
  config->fsq_n_dims = G_N_ELEMENTS (levels);
  memcpy (config->fsq_levels, levels, sizeof levels);
  config->fsq_eps = 1e-3;

  /* nanocodec.md §3.1 */
  enc->base_channels = 24;
  enc->n_stages = G_N_ELEMENTS (down_rates);
  memcpy (enc->down_sample_rates, down_rates, sizeof down_rates);
  enc->in_kernel_size = 7;
  enc->out_kernel_size = 7;
  set_default_resblocks (&enc->n_resblock_kernel_sizes, enc->resblock_kernel_sizes,
                         &enc->n_resblock_dilation_sizes, enc->resblock_dilation_sizes);
  enc->activation = GEPARD_CODEC_ACTIVATION_LRELU;
  enc->pad_mode = GEPARD_CODEC_PAD_REPLICATE;

  /* nanocodec.md §2.1 */
  dec->base_channels = 864;
  dec->n_stages = G_N_ELEMENTS (up_rates);
  memcpy (dec->up_sample_rates, up_rates, sizeof up_rates);
  dec->in_kernel_size = 7;
  dec->out_kernel_size = 3;
  set_default_resblocks (&dec->n_resblock_kernel_sizes, dec->resblock_kernel_sizes,
                         &dec->n_resblock_dilation_sizes, dec->resblock_dilation_sizes);
  dec->activation = GEPARD_CODEC_ACTIVATION_HALF_SNAKE;
  dec->output_activation = GEPARD_CODEC_OUTPUT_CLAMP;
  dec->pad_mode = GEPARD_CODEC_PAD_ZEROS;
  dec->n_groups_equal_to_out_channels = TRUE;
}

void
gepard_codec_config_init_tiny (GepardCodecConfig *config)
{
  g_return_if_fail (config != NULL);

  /* Everything but the widths stays as published, so code paths (HalfSnake splits, grouped
   * transposed convs, three branches of three blocks, FSQ packing) are the real ones. Decoder
   * channels 64 → 32 → 16 → 8 → 4 → 2 keep every HalfSnake with at least one Snake channel. */
  gepard_codec_config_init_nanocodec_22khz (config);
  config->encoder.base_channels = 4;
  config->decoder.base_channels = 64;
}

gboolean
gepard_codec_config_init_preset (GepardCodecConfig *config, const char *preset, GError **error)
{
  g_return_val_if_fail (config != NULL, FALSE);
  g_return_val_if_fail (preset != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (g_strcmp0 (preset, "nanocodec-22khz") == 0)
    gepard_codec_config_init_nanocodec_22khz (config);
  else if (g_strcmp0 (preset, "tiny") == 0)
    gepard_codec_config_init_tiny (config);
  else
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "Unknown codec preset “%s” (known: nanocodec-22khz, tiny)", preset);
      return FALSE;
    }
  return TRUE;
}

/* --- validation --- */

#define MAX_CHANNELS (1 << 20)
#define MAX_KERNEL 1024

static gboolean
validate_resblocks (const char *what, int n_kernels, const int *kernels, int n_dilations,
                    const int *dilations, gboolean need_odd, GError **error)
{
  if (n_kernels < 1 || n_kernels > GEPARD_CODEC_MAX_RESBLOCK_KERNELS)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "%s: %d residual kernel sizes (1 to %d supported)", what, n_kernels,
                   GEPARD_CODEC_MAX_RESBLOCK_KERNELS);
      return FALSE;
    }
  if (n_dilations < 1 || n_dilations > GEPARD_CODEC_MAX_RESBLOCK_DILATIONS)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "%s: %d residual dilations (1 to %d supported)", what, n_dilations,
                   GEPARD_CODEC_MAX_RESBLOCK_DILATIONS);
      return FALSE;
    }
  for (int j = 0; j < n_kernels; j++)
    {
      /* nanocodec.md §3.4: a non-causal conv pads (k-1)·d/2 on each side; only an odd kernel
       * keeps the length */
      if (kernels[j] < 1 || kernels[j] > MAX_KERNEL || (need_odd && kernels[j] % 2 == 0))
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                       "%s: residual kernel size %d is not %s between 1 and %d", what, kernels[j],
                       need_odd ? "an odd number" : "a number", MAX_KERNEL);
          return FALSE;
        }
    }
  for (int m = 0; m < n_dilations; m++)
    {
      if (dilations[m] < 1 || dilations[m] > MAX_KERNEL)
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                       "%s: residual dilation %d is not between 1 and %d", what, dilations[m],
                       MAX_KERNEL);
          return FALSE;
        }
    }
  return TRUE;
}

static gboolean
validate_kernel (const char *what, const char *name, int k, gboolean need_odd, GError **error)
{
  if (k < 1 || k > MAX_KERNEL || (need_odd && k % 2 == 0))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "%s: %s %d is not %s between 1 and %d", what, name, k,
                   need_odd ? "an odd number" : "a number", MAX_KERNEL);
      return FALSE;
    }
  return TRUE;
}

static gboolean
validate_rates (const char *what, int n_stages, const int *rates, int min_rate,
                int samples_per_frame, GError **error)
{
  gint64 product = 1;

  if (n_stages < 1 || n_stages > GEPARD_CODEC_MAX_STAGES)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "%s: %d stages (1 to %d supported)", what, n_stages, GEPARD_CODEC_MAX_STAGES);
      return FALSE;
    }
  for (int i = 0; i < n_stages; i++)
    {
      if (rates[i] < min_rate || rates[i] > MAX_KERNEL / 2)
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                       "%s: stage %d has rate %d (must be %d to %d)", what, i, rates[i], min_rate,
                       MAX_KERNEL / 2);
          return FALSE;
        }
      product *= rates[i];
    }
  /* nanocodec.md §1: hop = product of rates */
  if (product != samples_per_frame)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "%s: rates multiply to %" G_GINT64_FORMAT ", not samples_per_frame %d", what,
                   product, samples_per_frame);
      return FALSE;
    }
  return TRUE;
}

static gboolean
validate_encoder (const GepardCodecConfig *config, GError **error)
{
  const GepardCodecEncoderConfig *enc = &config->encoder;
  const char *what = "audio_encoder";
  gint64 channels = enc->base_channels;

  /* nanocodec.md §3.4: the down conv pads (r+1)//2 with kernel 2r; rate 1 would add a sample */
  if (!validate_rates (what, enc->n_stages, enc->down_sample_rates, 2, config->samples_per_frame,
                       error))
    return FALSE;
  if (enc->base_channels < 1 || enc->base_channels > MAX_CHANNELS)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "%s: base_channels %d is out of range", what, enc->base_channels);
      return FALSE;
    }
  for (int i = 0; i < enc->n_stages; i++)
    channels *= 2;
  if (channels > MAX_CHANNELS)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "%s: channels double to %" G_GINT64_FORMAT ", more than %d", what, channels,
                   MAX_CHANNELS);
      return FALSE;
    }
  if (!validate_kernel (what, "in_kernel_size", enc->in_kernel_size, TRUE, error)
      || !validate_kernel (what, "out_kernel_size", enc->out_kernel_size, TRUE, error)
      || !validate_resblocks (what, enc->n_resblock_kernel_sizes, enc->resblock_kernel_sizes,
                              enc->n_resblock_dilation_sizes, enc->resblock_dilation_sizes, TRUE,
                              error))
    return FALSE;
  /* Only parameter-free activations have a known place in the encoder's state dict. */
  if (enc->activation != GEPARD_CODEC_ACTIVATION_LRELU)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "%s: only the lrelu activation is supported", what);
      return FALSE;
    }
  if ((guint)enc->pad_mode > GEPARD_CODEC_PAD_REFLECT)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "%s: unknown pad_mode %d", what, (int)enc->pad_mode);
      return FALSE;
    }
  return TRUE;
}

static gboolean
validate_decoder (const GepardCodecConfig *config, GError **error)
{
  const GepardCodecDecoderConfig *dec = &config->decoder;
  const char *what = "audio_decoder";
  int channels = dec->base_channels;

  if (!validate_rates (what, dec->n_stages, dec->up_sample_rates, 1, config->samples_per_frame,
                       error))
    return FALSE;
  if (dec->base_channels < 1 || dec->base_channels > MAX_CHANNELS)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "%s: base_channels %d is out of range", what, dec->base_channels);
      return FALSE;
    }
  /* nanocodec.md §2.2: every stage halves the channels (C → C // 2 in NeMo); an odd count would
   * drop a channel and break the grouped transposed conv's two inputs per output */
  for (int i = 0; i < dec->n_stages; i++)
    {
      if (channels % 2 != 0)
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                       "%s: base_channels %d cannot be halved %d times (stage %d has %d)", what,
                       dec->base_channels, dec->n_stages, i, channels);
          return FALSE;
        }
      channels /= 2;
    }
  /* nanocodec.md §2.3: HalfSnake gives C // 2 channels to Snake; with one channel that is none */
  if (dec->activation == GEPARD_CODEC_ACTIVATION_HALF_SNAKE && channels < 2)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "%s: the last stage has %d channel(s); half_snake needs at least 2", what,
                   channels);
      return FALSE;
    }
  if (!validate_kernel (what, "in_kernel_size", dec->in_kernel_size, FALSE, error)
      || !validate_kernel (what, "out_kernel_size", dec->out_kernel_size, FALSE, error)
      || !validate_resblocks (what, dec->n_resblock_kernel_sizes, dec->resblock_kernel_sizes,
                              dec->n_resblock_dilation_sizes, dec->resblock_dilation_sizes, FALSE,
                              error))
    return FALSE;
  if ((guint)dec->activation > GEPARD_CODEC_ACTIVATION_HALF_SNAKE
      || (guint)dec->output_activation > GEPARD_CODEC_OUTPUT_TANH
      || (guint)dec->pad_mode > GEPARD_CODEC_PAD_REFLECT)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "%s: unknown activation, output activation or pad mode", what);
      return FALSE;
    }
  return TRUE;
}

gboolean
gepard_codec_config_validate (const GepardCodecConfig *config, GError **error)
{
  gint64 codebook_size = 1;

  g_return_val_if_fail (config != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (config->sample_rate < 1)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "sample_rate %d is not positive", config->sample_rate);
      return FALSE;
    }
  if (config->samples_per_frame < 1)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "samples_per_frame %d is not positive", config->samples_per_frame);
      return FALSE;
    }
  if (config->fsq_n_dims < 1 || config->fsq_n_dims > GEPARD_CODEC_MAX_FSQ_DIMS)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "vector_quantizer: %d levels per group (1 to %d supported)", config->fsq_n_dims,
                   GEPARD_CODEC_MAX_FSQ_DIMS);
      return FALSE;
    }
  for (int d = 0; d < config->fsq_n_dims; d++)
    {
      if (config->fsq_levels[d] < 2 || config->fsq_levels[d] > 65536)
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                       "vector_quantizer: level count %d of dim %d is not between 2 and 65536",
                       config->fsq_levels[d], d);
          return FALSE;
        }
      codebook_size *= config->fsq_levels[d];
    }
  /* nanocodec.md §4: packed indices are int32 */
  if (codebook_size > G_MAXINT32)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "vector_quantizer: %" G_GINT64_FORMAT " codes per codebook do not fit int32",
                   codebook_size);
      return FALSE;
    }
  if (config->fsq_groups < 1 || config->fsq_groups > 1024)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "vector_quantizer: %d groups (1 to 1024 supported)", config->fsq_groups);
      return FALSE;
    }
  if (!(config->fsq_eps >= 0.0 && config->fsq_eps < 1.0))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "vector_quantizer: eps %g is not in [0, 1)", config->fsq_eps);
      return FALSE;
    }
  /* nanocodec.md §4: the latent is split into fsq_groups chunks of fsq_n_dims channels */
  if (config->latent_dim != config->fsq_groups * config->fsq_n_dims)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "latent dim %d is not num_groups %d × %d levels per group", config->latent_dim,
                   config->fsq_groups, config->fsq_n_dims);
      return FALSE;
    }

  return validate_encoder (config, error) && validate_decoder (config, error);
}

int
gepard_codec_config_get_codebook_size (const GepardCodecConfig *config)
{
  int size = 1;

  g_return_val_if_fail (config != NULL, 0);

  for (int d = 0; d < config->fsq_n_dims; d++)
    size *= config->fsq_levels[d];
  return size;
}

int
gepard_codec_config_get_decoder_channels (const GepardCodecConfig *config, int stage)
{
  g_return_val_if_fail (config != NULL, 0);
  g_return_val_if_fail (stage >= 0 && stage <= config->decoder.n_stages, 0);

  return config->decoder.base_channels >> stage;
}

int
gepard_codec_config_get_encoder_channels (const GepardCodecConfig *config, int stage)
{
  g_return_val_if_fail (config != NULL, 0);
  g_return_val_if_fail (stage >= 0 && stage <= config->encoder.n_stages, 0);

  return config->encoder.base_channels << stage;
}

/* --- tensor enumeration (nanocodec.md §5, Appendix A) --- */

typedef struct
{
  GepardCodecTensorFunc func;
  gpointer user_data;
  GString *name;
} Enumerator;

static void
info_reset (GepardCodecTensorInfo *info, GepardCodecPart part, GepardCodecLayer layer)
{
  memset (info, 0, sizeof *info);
  info->part = part;
  info->layer = layer;
  info->stage = -1;
  info->branch = -1;
  info->block = -1;
  info->in_channels = -1;
  info->out_channels = -1;
  info->kernel_size = -1;
  info->stride = -1;
  info->dilation = -1;
  info->groups = -1;
}

static void
emit (Enumerator *e, GepardCodecTensorInfo *info, const char *prefix, const char *suffix,
      GepardCodecParam param, GepardDType dtype, guint n_dims, const gint64 *shape)
{
  info->param = param;
  info->dtype = dtype;
  info->n_dims = n_dims;
  info->n_elements = 1;
  for (guint i = 0; i < n_dims; i++)
    {
      info->shape[i] = shape[i];
      info->n_elements *= (guint64)shape[i];
    }
  g_string_assign (e->name, prefix);
  g_string_append (e->name, suffix);
  info->name = e->name->str;
  e->func (info, e->user_data);
  info->name = NULL;
}

/* A weight-normed conv: bias, then g, then v (nanocodec.md §5). `info` carries the geometry. For a
 * ConvTranspose1d the weight is (C_in, C_out / groups, k), so dim 0 — and g — is C_in (§2.4). */
static void
emit_conv (Enumerator *e, GepardCodecTensorInfo *info, const char *prefix)
{
  gint64 bias_shape[1] = {info->out_channels};
  gint64 weight_shape[3];
  gint64 g_shape[3];

  if (info->transposed)
    {
      weight_shape[0] = info->in_channels;
      weight_shape[1] = info->out_channels / info->groups;
    }
  else
    {
      weight_shape[0] = info->out_channels;
      weight_shape[1] = info->in_channels / info->groups;
    }
  weight_shape[2] = info->kernel_size;
  g_shape[0] = weight_shape[0];
  g_shape[1] = 1;
  g_shape[2] = 1;

  emit (e, info, prefix, ".conv.bias", GEPARD_CODEC_PARAM_BIAS, GEPARD_DTYPE_F32, 1, bias_shape);
  emit (e, info, prefix, ".conv.parametrizations.weight.original0", GEPARD_CODEC_PARAM_WEIGHT_G,
        GEPARD_DTYPE_F32, 3, g_shape);
  emit (e, info, prefix, ".conv.parametrizations.weight.original1", GEPARD_CODEC_PARAM_WEIGHT_V,
        GEPARD_DTYPE_F32, 3, weight_shape);
}

static void
set_conv (GepardCodecTensorInfo *info, int in_channels, int out_channels, int kernel_size,
          int stride, int dilation, int groups, gboolean transposed)
{
  info->in_channels = in_channels;
  info->out_channels = out_channels;
  info->kernel_size = kernel_size;
  info->stride = stride;
  info->dilation = dilation;
  info->groups = groups;
  info->transposed = transposed;
}

/* nanocodec.md §2.3: HalfSnake holds one alpha per Snake channel, (1, C // 2, 1) */
static void
emit_alpha (Enumerator *e, GepardCodecTensorInfo *info, const char *prefix, int channels)
{
  gint64 shape[3] = {1, channels / 2, 1};

  emit (e, info, prefix, ".activation.snake_act.alpha", GEPARD_CODEC_PARAM_SNAKE_ALPHA,
        GEPARD_DTYPE_F32, 3, shape);
}

/* HiFiGANResLayer on `channels`: res_blocks.j (kernel k_j) → res_blocks.m (dilation d_m), each a
 * ResidualBlock with input/skip activation then input/skip conv (nanocodec.md §2.2, §5). */
static void
emit_res_layer (Enumerator *e, GepardCodecPart part, const char *module, int stage, int channels,
                int n_kernels, const int *kernels, int n_dilations, const int *dilations,
                gboolean has_alpha)
{
  GepardCodecTensorInfo info;

  for (int j = 0; j < n_kernels; j++)
    {
      for (int m = 0; m < n_dilations; m++)
        {
          g_autofree char *block = g_strdup_printf ("%s.res_layers.%d.res_blocks.%d.res_blocks.%d",
                                                    module, stage, j, m);
          g_autofree char *prefix = NULL;

          if (has_alpha)
            {
              info_reset (&info, part, GEPARD_CODEC_LAYER_RES_INPUT_ACTIVATION);
              info.stage = stage;
              info.branch = j;
              info.block = m;
              prefix = g_strconcat (block, ".input_activation", NULL);
              emit_alpha (e, &info, prefix, channels);
              g_free (prefix);

              info.layer = GEPARD_CODEC_LAYER_RES_SKIP_ACTIVATION;
              prefix = g_strconcat (block, ".skip_activation", NULL);
              emit_alpha (e, &info, prefix, channels);
              g_free (prefix);
            }

          info_reset (&info, part, GEPARD_CODEC_LAYER_RES_INPUT_CONV);
          info.stage = stage;
          info.branch = j;
          info.block = m;
          set_conv (&info, channels, channels, kernels[j], 1, dilations[m], 1, FALSE);
          prefix = g_strconcat (block, ".input_conv", NULL);
          emit_conv (e, &info, prefix);
          g_free (prefix);

          /* nanocodec.md §2.2: the skip conv always has dilation 1 */
          info.layer = GEPARD_CODEC_LAYER_RES_SKIP_CONV;
          set_conv (&info, channels, channels, kernels[j], 1, 1, 1, FALSE);
          prefix = g_strconcat (block, ".skip_conv", NULL);
          emit_conv (e, &info, prefix);
        }
    }
}

static void
emit_encoder (Enumerator *e, const GepardCodecConfig *config)
{
  const GepardCodecEncoderConfig *enc = &config->encoder;
  const GepardCodecPart part = GEPARD_CODEC_PART_ENCODER;
  GepardCodecTensorInfo info;
  int channels;

  /* nanocodec.md §5: pre_conv, down_sample_conv_layers 0..n, res_layers 0..n, post_conv */
  info_reset (&info, part, GEPARD_CODEC_LAYER_PRE_CONV);
  set_conv (&info, 1, enc->base_channels, enc->in_kernel_size, 1, 1, 1, FALSE);
  emit_conv (e, &info, "audio_encoder.pre_conv");

  for (int i = 0; i < enc->n_stages; i++)
    {
      g_autofree char *prefix = g_strdup_printf ("audio_encoder.down_sample_conv_layers.%d", i);
      int rate = enc->down_sample_rates[i];

      channels = gepard_codec_config_get_encoder_channels (config, i);
      info_reset (&info, part, GEPARD_CODEC_LAYER_RESAMPLE_CONV);
      info.stage = i;
      /* nanocodec.md §3.3: C → 2C, kernel 2r, stride r */
      set_conv (&info, channels, 2 * channels, 2 * rate, rate, 1, 1, FALSE);
      emit_conv (e, &info, prefix);
    }

  for (int i = 0; i < enc->n_stages; i++)
    emit_res_layer (e, part, "audio_encoder", i,
                    gepard_codec_config_get_encoder_channels (config, i),
                    enc->n_resblock_kernel_sizes, enc->resblock_kernel_sizes,
                    enc->n_resblock_dilation_sizes, enc->resblock_dilation_sizes, FALSE);

  channels = gepard_codec_config_get_encoder_channels (config, enc->n_stages);
  info_reset (&info, part, GEPARD_CODEC_LAYER_POST_CONV);
  set_conv (&info, channels, config->latent_dim, enc->out_kernel_size, 1, 1, 1, FALSE);
  emit_conv (e, &info, "audio_encoder.post_conv");
}

static void
emit_quantizer (Enumerator *e, const GepardCodecConfig *config)
{
  GepardCodecTensorInfo info;
  gint64 shape[3] = {1, config->fsq_n_dims, 1};

  /* nanocodec.md §4: int32 buffers only, no learned parameters */
  for (int g = 0; g < config->fsq_groups; g++)
    {
      g_autofree char *prefix = g_strdup_printf ("vector_quantizer.fsqs.%d", g);

      info_reset (&info, GEPARD_CODEC_PART_QUANTIZER, GEPARD_CODEC_LAYER_FSQ);
      info.stage = g;
      emit (e, &info, prefix, ".dim_base_index", GEPARD_CODEC_PARAM_FSQ_DIM_BASE_INDEX,
            GEPARD_DTYPE_I32, 3, shape);
      emit (e, &info, prefix, ".num_levels", GEPARD_CODEC_PARAM_FSQ_NUM_LEVELS, GEPARD_DTYPE_I32, 3,
            shape);
    }
}

static void
emit_decoder (Enumerator *e, const GepardCodecConfig *config)
{
  const GepardCodecDecoderConfig *dec = &config->decoder;
  const GepardCodecPart part = GEPARD_CODEC_PART_DECODER;
  const gboolean has_alpha = dec->activation == GEPARD_CODEC_ACTIVATION_HALF_SNAKE;
  GepardCodecTensorInfo info;
  int channels;

  /* nanocodec.md §5: pre_conv, activations, up_sample_conv_layers, res_layers, post_activation,
   * post_conv */
  info_reset (&info, part, GEPARD_CODEC_LAYER_PRE_CONV);
  set_conv (&info, config->latent_dim, dec->base_channels, dec->in_kernel_size, 1, 1, 1, FALSE);
  emit_conv (e, &info, "audio_decoder.pre_conv");

  if (has_alpha)
    {
      for (int i = 0; i < dec->n_stages; i++)
        {
          g_autofree char *prefix = g_strdup_printf ("audio_decoder.activations.%d", i);

          info_reset (&info, part, GEPARD_CODEC_LAYER_STAGE_ACTIVATION);
          info.stage = i;
          emit_alpha (e, &info, prefix, gepard_codec_config_get_decoder_channels (config, i));
        }
    }

  for (int i = 0; i < dec->n_stages; i++)
    {
      g_autofree char *prefix = g_strdup_printf ("audio_decoder.up_sample_conv_layers.%d", i);
      int rate = dec->up_sample_rates[i];
      int in_channels = gepard_codec_config_get_decoder_channels (config, i);
      int out_channels = in_channels / 2;

      info_reset (&info, part, GEPARD_CODEC_LAYER_RESAMPLE_CONV);
      info.stage = i;
      /* nanocodec.md §2.3: kernel 2s, stride s, groups = C_out */
      set_conv (&info, in_channels, out_channels, 2 * rate, rate, 1,
                dec->n_groups_equal_to_out_channels ? out_channels : 1, TRUE);
      emit_conv (e, &info, prefix);
    }

  for (int i = 0; i < dec->n_stages; i++)
    emit_res_layer (e, part, "audio_decoder", i,
                    gepard_codec_config_get_decoder_channels (config, i + 1),
                    dec->n_resblock_kernel_sizes, dec->resblock_kernel_sizes,
                    dec->n_resblock_dilation_sizes, dec->resblock_dilation_sizes, has_alpha);

  channels = gepard_codec_config_get_decoder_channels (config, dec->n_stages);
  if (has_alpha)
    {
      info_reset (&info, part, GEPARD_CODEC_LAYER_POST_ACTIVATION);
      emit_alpha (e, &info, "audio_decoder.post_activation", channels);
    }

  info_reset (&info, part, GEPARD_CODEC_LAYER_POST_CONV);
  set_conv (&info, channels, 1, dec->out_kernel_size, 1, 1, 1, FALSE);
  emit_conv (e, &info, "audio_decoder.post_conv");
}

void
gepard_codec_config_foreach_tensor (const GepardCodecConfig *config, GepardCodecTensorFunc func,
                                    gpointer user_data)
{
  Enumerator e;

  g_return_if_fail (config != NULL);
  g_return_if_fail (func != NULL);
  g_return_if_fail (gepard_codec_config_validate (config, NULL));

  e.func = func;
  e.user_data = user_data;
  e.name = g_string_new (NULL);

  emit_encoder (&e, config);
  emit_quantizer (&e, config);
  emit_decoder (&e, config);

  g_string_free (e.name, TRUE);
}

/* --- model_config.yaml --- */

static void
append_int_list (GString *out, const char *indent, const char *key, const int *values, int n)
{
  g_string_append_printf (out, "%s%s: [", indent, key);
  for (int i = 0; i < n; i++)
    g_string_append_printf (out, "%s%d", i > 0 ? ", " : "", values[i]);
  g_string_append (out, "]\n");
}

static const char *
activation_name (GepardCodecActivation activation)
{
  return activation == GEPARD_CODEC_ACTIVATION_HALF_SNAKE ? "half_snake" : "lrelu";
}

static const char *
pad_mode_name (GepardCodecPadMode pad_mode)
{
  switch (pad_mode)
    {
    case GEPARD_CODEC_PAD_REPLICATE:
      return "replicate";
    case GEPARD_CODEC_PAD_REFLECT:
      return "reflect";
    case GEPARD_CODEC_PAD_ZEROS:
    default:
      return "zeros";
    }
}

char *
gepard_codec_config_to_yaml (const GepardCodecConfig *config)
{
  const GepardCodecEncoderConfig *enc;
  const GepardCodecDecoderConfig *dec;
  GString *out;

  g_return_val_if_fail (config != NULL, NULL);

  enc = &config->encoder;
  dec = &config->decoder;
  out = g_string_new (NULL);

  /* nanocodec.md §5: the keys and class paths NeMo's AudioCodecModel config uses; every
   * constructor argument is written out, defaults included, so a reader needs no class defaults
   * (except the quantizer's eps, which the published file does not set either) */
  g_string_append (out, "target: nemo.collections.tts.models.audio_codec.AudioCodecModel\n");
  g_string_append_printf (out, "sample_rate: %d\n", config->sample_rate);
  g_string_append_printf (out, "samples_per_frame: %d\n", config->samples_per_frame);

  g_string_append (out, "audio_encoder:\n");
  g_string_append (out,
                   "  _target_: nemo.collections.tts.modules.audio_codec_modules.HiFiGANEncoder\n");
  g_string_append_printf (out, "  encoded_dim: %d\n", config->latent_dim);
  append_int_list (out, "  ", "down_sample_rates", enc->down_sample_rates, enc->n_stages);
  g_string_append_printf (out, "  base_channels: %d\n", enc->base_channels);
  g_string_append_printf (out, "  in_kernel_size: %d\n", enc->in_kernel_size);
  g_string_append_printf (out, "  out_kernel_size: %d\n", enc->out_kernel_size);
  append_int_list (out, "  ", "resblock_kernel_sizes", enc->resblock_kernel_sizes,
                   enc->n_resblock_kernel_sizes);
  append_int_list (out, "  ", "resblock_dilation_sizes", enc->resblock_dilation_sizes,
                   enc->n_resblock_dilation_sizes);
  g_string_append_printf (out, "  activation: %s\n", activation_name (enc->activation));
  g_string_append_printf (out, "  pad_mode: %s\n", pad_mode_name (enc->pad_mode));

  g_string_append (out, "vector_quantizer:\n");
  g_string_append (out, "  _target_: "
                        "nemo.collections.tts.modules.audio_codec_modules."
                        "GroupFiniteScalarQuantizer\n");
  g_string_append_printf (out, "  num_groups: %d\n", config->fsq_groups);
  append_int_list (out, "  ", "num_levels_per_group", config->fsq_levels, config->fsq_n_dims);
  /* nanocodec.md §4: the published config leaves eps at the class default 1e-3 */
  if (config->fsq_eps != 1e-3)
    g_string_append_printf (out, "  eps: %.17g\n", config->fsq_eps);

  g_string_append (out, "audio_decoder:\n");
  g_string_append (
      out, "  _target_: nemo.collections.tts.modules.audio_codec_modules.CausalHiFiGANDecoder\n");
  g_string_append_printf (out, "  input_dim: %d\n", config->latent_dim);
  append_int_list (out, "  ", "up_sample_rates", dec->up_sample_rates, dec->n_stages);
  g_string_append_printf (out, "  base_channels: %d\n", dec->base_channels);
  g_string_append_printf (out, "  in_kernel_size: %d\n", dec->in_kernel_size);
  g_string_append_printf (out, "  out_kernel_size: %d\n", dec->out_kernel_size);
  append_int_list (out, "  ", "resblock_kernel_sizes", dec->resblock_kernel_sizes,
                   dec->n_resblock_kernel_sizes);
  append_int_list (out, "  ", "resblock_dilation_sizes", dec->resblock_dilation_sizes,
                   dec->n_resblock_dilation_sizes);
  g_string_append_printf (out, "  activation: %s\n", activation_name (dec->activation));
  g_string_append_printf (out, "  output_activation: %s\n",
                          dec->output_activation == GEPARD_CODEC_OUTPUT_TANH ? "tanh" : "clamp");
  g_string_append_printf (out, "  pad_mode: %s\n", pad_mode_name (dec->pad_mode));
  g_string_append_printf (out, "  n_groups_equal_to_out_channels: %s\n",
                          dec->n_groups_equal_to_out_channels ? "true" : "false");

  return g_string_free (out, FALSE);
}
