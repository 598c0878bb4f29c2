/* gepard-codec-config.h: NanoCodec hyperparameters and the checkpoint geometry they imply.
 *
 * One GepardCodecConfig describes the codec's encoder (HiFiGANEncoder), quantizer
 * (GroupFiniteScalarQuantizer) and decoder (CausalHiFiGANDecoder) the way NeMo's constructor
 * arguments do (nanocodec.md §2.1, §3.1, §4). From it follow every tensor name, dtype and shape of
 * the checkpoint, in checkpoint order (nanocodec.md §5, Appendix A), and the model_config.yaml a
 * .nemo archive carries. */
#pragma once

#include "gepard-safetensors.h"

G_BEGIN_DECLS

#define GEPARD_CODEC_MAX_STAGES 8
#define GEPARD_CODEC_MAX_RESBLOCK_KERNELS 4
#define GEPARD_CODEC_MAX_RESBLOCK_DILATIONS 4
#define GEPARD_CODEC_MAX_FSQ_DIMS 8

typedef enum
{
  /* torch.nn.LeakyReLU(), negative slope 0.01; no parameters */
  GEPARD_CODEC_ACTIVATION_LRELU,
  /* nanocodec.md §2.3: Snake on the first C // 2 channels (one alpha each), LeakyReLU on the rest
   */
  GEPARD_CODEC_ACTIVATION_HALF_SNAKE,
} GepardCodecActivation;

typedef enum
{
  GEPARD_CODEC_OUTPUT_CLAMP, /* nanocodec.md §2.3: clamp(x, -1, 1) */
  GEPARD_CODEC_OUTPUT_TANH,
} GepardCodecOutputActivation;

typedef enum
{
  GEPARD_CODEC_PAD_ZEROS,
  GEPARD_CODEC_PAD_REPLICATE,
  GEPARD_CODEC_PAD_REFLECT,
} GepardCodecPadMode;

/* HiFiGANEncoder (non-causal): pre_conv 1 → base, then per stage a residual layer on C channels and
 * a strided conv C → 2C (kernel 2·rate), then post_conv → latent_dim (nanocodec.md §3). */
typedef struct
{
  int base_channels;
  int n_stages;
  int down_sample_rates[GEPARD_CODEC_MAX_STAGES];
  int in_kernel_size;
  int out_kernel_size;
  int n_resblock_kernel_sizes;
  int resblock_kernel_sizes[GEPARD_CODEC_MAX_RESBLOCK_KERNELS];
  int n_resblock_dilation_sizes;
  int resblock_dilation_sizes[GEPARD_CODEC_MAX_RESBLOCK_DILATIONS];
  GepardCodecActivation activation;
  GepardCodecPadMode pad_mode;
} GepardCodecEncoderConfig;

/* CausalHiFiGANDecoder: pre_conv latent_dim → base, then per stage an activation, a transposed
 * conv C → C/2 (kernel 2·rate, stride rate) and a residual layer on C/2 channels, then
 * post_activation and post_conv → 1 channel, then the output activation (nanocodec.md §2). */
typedef struct
{
  int base_channels;
  int n_stages;
  int up_sample_rates[GEPARD_CODEC_MAX_STAGES];
  int in_kernel_size;
  int out_kernel_size;
  int n_resblock_kernel_sizes;
  int resblock_kernel_sizes[GEPARD_CODEC_MAX_RESBLOCK_KERNELS];
  int n_resblock_dilation_sizes;
  int resblock_dilation_sizes[GEPARD_CODEC_MAX_RESBLOCK_DILATIONS];
  GepardCodecActivation activation;
  GepardCodecOutputActivation output_activation;
  GepardCodecPadMode pad_mode;
  /* transposed convs use groups = out_channels (weight (C_in, 1, k)) instead of groups = 1 */
  gboolean n_groups_equal_to_out_channels;
} GepardCodecDecoderConfig;

typedef struct
{
  int sample_rate;       /* 22050 */
  int samples_per_frame; /* 1024: product of the encoder's and of the decoder's rates */
  int latent_dim;        /* 32: encoded_dim of the encoder, input_dim of the decoder */

  /* GroupFSQ (nanocodec.md §4): latent_dim = fsq_groups × fsq_n_dims */
  int fsq_groups;                            /* 8 codebooks */
  int fsq_n_dims;                            /* 4 */
  int fsq_levels[GEPARD_CODEC_MAX_FSQ_DIMS]; /* [8, 7, 6, 6] */
  double fsq_eps;                            /* 1e-3, the class default */

  GepardCodecEncoderConfig encoder;
  GepardCodecDecoderConfig decoder;
} GepardCodecConfig;

/* The published nvidia/nemo-nano-codec-22khz-1.89kbps-21.5fps (nanocodec.md §1–§4). */
void gepard_codec_config_init_nanocodec_22khz (GepardCodecConfig *config);
/* Same FSQ geometry, hop and layer structure as the published codec with narrow layers (encoder
 * base 4, decoder base 64), so that a CPU decodes it in milliseconds. */
void gepard_codec_config_init_tiny (GepardCodecConfig *config);
/* "nanocodec-22khz" or "tiny"; an unknown name is GEPARD_FORMAT_ERROR_UNSUPPORTED. */
gboolean gepard_codec_config_init_preset (GepardCodecConfig *config, const char *preset,
                                          GError **error);

/* Checks that the numbers describe a codec NeMo's classes would build and that the rest of Gepard
 * can run: rates multiply to samples_per_frame, decoder channels halve evenly, FSQ dims cover the
 * latent, kernels fit their padding scheme. Fails with GEPARD_FORMAT_ERROR_SHAPE (inconsistent) or
 * GEPARD_FORMAT_ERROR_UNSUPPORTED (consistent, but not something Gepard implements). */
gboolean gepard_codec_config_validate (const GepardCodecConfig *config, GError **error);

/* Codes per codebook: the product of fsq_levels (2016). */
int gepard_codec_config_get_codebook_size (const GepardCodecConfig *config);
/* Channels entering decoder stage `stage`; stage n_stages gives the channels of post_conv's input.
 */
int gepard_codec_config_get_decoder_channels (const GepardCodecConfig *config, int stage);
/* Channels entering encoder stage `stage`; stage n_stages gives the channels of post_conv's input.
 */
int gepard_codec_config_get_encoder_channels (const GepardCodecConfig *config, int stage);

typedef enum
{
  GEPARD_CODEC_PART_ENCODER,   /* audio_encoder.* */
  GEPARD_CODEC_PART_QUANTIZER, /* vector_quantizer.* */
  GEPARD_CODEC_PART_DECODER,   /* audio_decoder.* */
} GepardCodecPart;

typedef enum
{
  GEPARD_CODEC_LAYER_PRE_CONV,
  /* encoder down_sample_conv_layers.i (strided conv) or decoder up_sample_conv_layers.i
     (transposed) */
  GEPARD_CODEC_LAYER_RESAMPLE_CONV,
  GEPARD_CODEC_LAYER_RES_INPUT_CONV,
  GEPARD_CODEC_LAYER_RES_SKIP_CONV,
  GEPARD_CODEC_LAYER_POST_CONV,
  GEPARD_CODEC_LAYER_STAGE_ACTIVATION, /* decoder activations.i */
  GEPARD_CODEC_LAYER_RES_INPUT_ACTIVATION,
  GEPARD_CODEC_LAYER_RES_SKIP_ACTIVATION,
  GEPARD_CODEC_LAYER_POST_ACTIVATION,
  GEPARD_CODEC_LAYER_FSQ,
} GepardCodecLayer;

typedef enum
{
  GEPARD_CODEC_PARAM_BIAS,
  /* nanocodec.md §2.4: weight norm g, shape (dim 0, 1, 1), parametrizations.weight.original0 */
  GEPARD_CODEC_PARAM_WEIGHT_G,
  /* weight norm v, the conv weight's shape, parametrizations.weight.original1 */
  GEPARD_CODEC_PARAM_WEIGHT_V,
  GEPARD_CODEC_PARAM_SNAKE_ALPHA,        /* (1, C // 2, 1) */
  GEPARD_CODEC_PARAM_FSQ_DIM_BASE_INDEX, /* int32 (1, n_dims, 1): 1, 8, 56, 336 */
  GEPARD_CODEC_PARAM_FSQ_NUM_LEVELS,     /* int32 (1, n_dims, 1): 8, 7, 6, 6 */
} GepardCodecParam;

/* One checkpoint tensor. `name` lives only during the callback. For conv parameters the conv's
 * geometry is given too; other fields are -1 where they do not apply. */
typedef struct
{
  const char *name;
  GepardDType dtype;
  guint n_dims;
  gint64 shape[GEPARD_TENSOR_MAX_DIMS];
  guint64 n_elements;

  GepardCodecPart part;
  GepardCodecLayer layer;
  GepardCodecParam param;
  int stage;  /* encoder/decoder stage, or FSQ group */
  int branch; /* residual branch j (kernel resblock_kernel_sizes[j]) */
  int block;  /* residual block m in the branch (dilation resblock_dilation_sizes[m]) */

  /* conv parameters only */
  gboolean transposed;
  int in_channels;
  int out_channels;
  int kernel_size;
  int stride;
  int dilation;
  int groups;
} GepardCodecTensorInfo;

typedef void (*GepardCodecTensorFunc) (const GepardCodecTensorInfo *info, gpointer user_data);

/* Calls `func` for every tensor of audio_encoder.*, vector_quantizer.* and audio_decoder.* in
 * checkpoint order (nanocodec.md §5); for the published preset exactly the 694 tensors of
 * Appendix A. `config` must be valid. */
void gepard_codec_config_foreach_tensor (const GepardCodecConfig *config,
                                         GepardCodecTensorFunc func, gpointer user_data);

/* model_config.yaml as NeMo's AudioCodecModel writes it, reduced to the codec: block mappings,
 * flow lists of numbers and plain scalars. Free with g_free(). */
char *gepard_codec_config_to_yaml (const GepardCodecConfig *config);

G_END_DECLS
