/* test-codec.c: NanoCodec checkpoints with seeded random weights (.nemo or safetensors). */
#include "test-codec.h"

#include "gepard-error.h"
#include "nemo-writer.h"

#include <math.h>
#include <string.h>

/* One tensor to generate. The values depend only on the run's seed and the tensor's name, never on
 * the order in which a writer asks for them. */
typedef struct
{
  char *name;
  GepardCodecTensorInfo info; /* info.name is not kept */
  gboolean extra;             /* a non-codec tensor of the .nemo */
  guint64 seed;
} TestTensor;

static void
test_tensor_free (gpointer data)
{
  TestTensor *tensor = data;

  g_free (tensor->name);
  g_free (tensor);
}

static GRand *
tensor_rand (const TestTensor *tensor)
{
  /* FNV-1a of the name, mixed with the seed, seeds a Mersenne Twister per tensor */
  guint64 hash = G_GUINT64_CONSTANT (0xcbf29ce484222325);
  guint32 words[4];

  for (const char *p = tensor->name; *p != '\0'; p++)
    hash = (hash ^ (guint8)*p) * G_GUINT64_CONSTANT (0x100000001b3);
  words[0] = tensor->seed & 0xffffffffu;
  words[1] = tensor->seed >> 32;
  words[2] = hash & 0xffffffffu;
  words[3] = hash >> 32;
  return g_rand_new_with_seed_array (words, G_N_ELEMENTS (words));
}

/* uniform in (0, 1), never 0 so that log() below is finite */
static double
rand_open01 (GRand *rand)
{
  return (g_rand_int (rand) + 0.5) / 4294967296.0;
}

static void
fill_uniform (GRand *rand, float *dst, guint64 n, double lo, double hi)
{
  for (guint64 i = 0; i < n; i++)
    dst[i] = (float)(lo + (hi - lo) * rand_open01 (rand));
}

/* Box–Muller: two standard normal values from two uniforms */
static void
fill_normal (GRand *rand, float *dst, guint64 n, double std)
{
  for (guint64 i = 0; i < n; i += 2)
    {
      double radius = std * sqrt (-2.0 * log (rand_open01 (rand)));
      double angle = 2.0 * G_PI * rand_open01 (rand);

      dst[i] = (float)(radius * cos (angle));
      if (i + 1 < n)
        dst[i + 1] = (float)(radius * sin (angle));
    }
}

/* The magnitude g of a weight-normed conv's rows. The effective weight W = g·v/‖v‖ has rows of norm
 * g, so a layer maps inputs of mean square s² to outputs of mean square ≈ g²·s² (taps × channels
 * of independent inputs). These gains keep the decoder's signal near unit scale at every stage
 * and its output well inside clamp(−1, 1) (nanocodec.md §2.2). */
static double
conv_gain (const GepardCodecTensorInfo *info)
{
  switch (info->layer)
    {
    case GEPARD_CODEC_LAYER_PRE_CONV:
      /* FSQ values lie in [−1, 1] with mean square ≈ 0.4 */
      return info->part == GEPARD_CODEC_PART_DECODER ? 1.5 : 1.0;
    case GEPARD_CODEC_LAYER_RESAMPLE_CONV:
      if (info->transposed)
        {
          /* nanocodec.md §2.3: each output sample sums 2 input channels × 2 overlapping taps of a
           * row of 2s taps, so the mean square scales by 2g²/s */
          if (info->groups == info->out_channels)
            return sqrt (info->stride / 2.0);
          return 1.0;
        }
      return 1.0;
    case GEPARD_CODEC_LAYER_RES_INPUT_CONV:
      return 1.0;
    case GEPARD_CODEC_LAYER_RES_SKIP_CONV:
      /* residual branches add a fraction of the signal, so nine blocks do not blow it up */
      return 0.3;
    case GEPARD_CODEC_LAYER_POST_CONV:
      return info->part == GEPARD_CODEC_PART_DECODER ? 0.2 : 1.0;
    default:
      return 1.0;
    }
}

static void
fill_fsq (const TestTensor *tensor, gint32 *dst, const GepardCodecConfig *config)
{
  gint32 base = 1;

  /* nanocodec.md §4: dim_base_index = cumulative products [1, 8, 56, 336]; num_levels as given */
  for (int d = 0; d < config->fsq_n_dims; d++)
    {
      if (tensor->info.param == GEPARD_CODEC_PARAM_FSQ_DIM_BASE_INDEX)
        dst[d] = base;
      else
        dst[d] = config->fsq_levels[d];
      base *= config->fsq_levels[d];
    }
}

typedef struct
{
  const GepardCodecConfig *config;
  TestTensor *tensor;
} FillContext;

static void
fill_tensor (gpointer user_data, const char *name, void *dst, gsize n_bytes)
{
  FillContext *ctx = user_data;
  const TestTensor *tensor = ctx->tensor;
  const GepardCodecTensorInfo *info = &tensor->info;
  float *values = dst;
  guint64 n = info->n_elements;
  GRand *rand;

  g_assert (n_bytes == n * 4); /* F32 and I32 alike */

  if (info->param == GEPARD_CODEC_PARAM_FSQ_DIM_BASE_INDEX
      || info->param == GEPARD_CODEC_PARAM_FSQ_NUM_LEVELS)
    {
      fill_fsq (tensor, dst, ctx->config);
      return;
    }

  rand = tensor_rand (tensor);
  if (tensor->extra && g_str_has_suffix (tensor->name, ".window"))
    {
      /* loss-function STFT windows: a periodic Hann window, as torch.hann_window gives */
      for (guint64 i = 0; i < n; i++)
        values[i] = (float)(0.5 - 0.5 * cos (2.0 * G_PI * (double)i / (double)n));
    }
  else if (tensor->extra && g_str_has_suffix (tensor->name, ".fb"))
    fill_uniform (rand, values, n, 0.0, 0.1);
  else
    {
      switch (info->param)
        {
        case GEPARD_CODEC_PARAM_BIAS:
          fill_normal (rand, values, n, 0.02);
          break;
        case GEPARD_CODEC_PARAM_WEIGHT_G:
          {
            double gain = tensor->extra ? 1.0 : conv_gain (info);

            /* positive, within ±20 % of the layer's gain */
            fill_uniform (rand, values, n, 0.8 * gain, 1.2 * gain);
            break;
          }
        case GEPARD_CODEC_PARAM_WEIGHT_V:
          /* only the direction matters; a random norm makes readers apply weight norm */
          fill_normal (rand, values, n, 1.0);
          break;
        case GEPARD_CODEC_PARAM_SNAKE_ALPHA:
          fill_uniform (rand, values, n, 0.8, 1.2);
          break;
        case GEPARD_CODEC_PARAM_FSQ_DIM_BASE_INDEX:
        case GEPARD_CODEC_PARAM_FSQ_NUM_LEVELS:
        default:
          g_assert_not_reached ();
        }
    }
  g_rand_free (rand);
}

typedef struct
{
  GPtrArray *tensors; /* TestTensor */
  guint64 seed;
} Collector;

static void
collect_tensor (const GepardCodecTensorInfo *info, gpointer user_data)
{
  Collector *collector = user_data;
  TestTensor *tensor = g_new0 (TestTensor, 1);

  tensor->name = g_strdup (info->name);
  tensor->info = *info;
  tensor->info.name = NULL;
  tensor->seed = collector->seed;
  g_ptr_array_add (collector->tensors, tensor);
}

/* A few of the published file's training-only tensors (its discriminator and loss functions; the
 * names and shapes are theirs), appended after the codec as in the published state dict. */
static void
collect_extras (Collector *collector)
{
  static const struct
  {
    const char *name;
    GepardCodecParam param;
    guint n_dims;
    gint64 shape[4];
  } extras[] = {
      {"discriminator.discriminators.0.discriminators.0.conv_layers.0.conv.bias",
       GEPARD_CODEC_PARAM_BIAS,
       1,
       {32}},
      {"discriminator.discriminators.0.discriminators.0.conv_layers.0.conv.parametrizations.weight."
       "original0",
       GEPARD_CODEC_PARAM_WEIGHT_G,
       4,
       {32, 1, 1, 1}},
      {"discriminator.discriminators.0.discriminators.0.conv_layers.0.conv.parametrizations.weight."
       "original1",
       GEPARD_CODEC_PARAM_WEIGHT_V,
       4,
       {32, 1, 5, 1}},
      {"discriminator.discriminators.1.discriminators.0.window", GEPARD_CODEC_PARAM_BIAS, 1, {512}},
      {"mel_loss_fn.mel_features.0.window", GEPARD_CODEC_PARAM_BIAS, 1, {32}},
      {"mel_loss_fn.mel_features.0.fb", GEPARD_CODEC_PARAM_BIAS, 3, {1, 5, 17}},
      {"stft_loss_fn.loss_fns.0.window", GEPARD_CODEC_PARAM_BIAS, 1, {32}},
  };

  for (guint i = 0; i < G_N_ELEMENTS (extras); i++)
    {
      TestTensor *tensor = g_new0 (TestTensor, 1);

      tensor->name = g_strdup (extras[i].name);
      tensor->extra = TRUE;
      tensor->seed = collector->seed;
      tensor->info.dtype = GEPARD_DTYPE_F32;
      tensor->info.param = extras[i].param;
      tensor->info.n_dims = extras[i].n_dims;
      tensor->info.n_elements = 1;
      for (guint d = 0; d < extras[i].n_dims; d++)
        {
          tensor->info.shape[d] = extras[i].shape[d];
          tensor->info.n_elements *= extras[i].shape[d];
        }
      tensor->info.stage = -1;
      tensor->info.branch = -1;
      tensor->info.block = -1;
      g_ptr_array_add (collector->tensors, tensor);
    }
}

gboolean
gepard_test_codec_write (const char *path, const GepardCodecConfig *config, guint64 seed,
                         GepardTestCodecFormat format, GError **error)
{
  g_autoptr (GPtrArray) tensors = NULL;
  g_autofree FillContext *contexts = NULL;
  g_autofree char *yaml = NULL;
  Collector collector;

  g_return_val_if_fail (path != NULL, FALSE);
  g_return_val_if_fail (config != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!gepard_codec_config_validate (config, error))
    return FALSE;

  tensors = g_ptr_array_new_with_free_func (test_tensor_free);
  collector.tensors = tensors;
  collector.seed = seed;
  gepard_codec_config_foreach_tensor (config, collect_tensor, &collector);
  if (format == GEPARD_TEST_CODEC_FORMAT_NEMO)
    collect_extras (&collector);

  contexts = g_new0 (FillContext, tensors->len);
  for (guint i = 0; i < tensors->len; i++)
    {
      contexts[i].config = config;
      contexts[i].tensor = g_ptr_array_index (tensors, i);
    }
  yaml = gepard_codec_config_to_yaml (config);

  switch (format)
    {
    case GEPARD_TEST_CODEC_FORMAT_NEMO:
      {
        g_autoptr (GepardNemoWriter) writer = gepard_nemo_writer_new ();

        gepard_nemo_writer_set_config_yaml (writer, yaml);
        for (guint i = 0; i < tensors->len; i++)
          {
            const TestTensor *tensor = contexts[i].tensor;

            gepard_nemo_writer_add (writer, tensor->name, tensor->info.dtype, tensor->info.n_dims,
                                    tensor->info.shape, fill_tensor, &contexts[i]);
          }
        return gepard_nemo_writer_write (writer, path, error);
      }
    case GEPARD_TEST_CODEC_FORMAT_SAFETENSORS:
      {
        g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();

        gepard_safetensors_writer_set_metadata (writer, "format", "nemo-codec");
        gepard_safetensors_writer_set_metadata (writer, "model_config.yaml", yaml);
        for (guint i = 0; i < tensors->len; i++)
          {
            const TestTensor *tensor = contexts[i].tensor;

            gepard_safetensors_writer_add (writer, tensor->name, tensor->info.dtype,
                                           tensor->info.n_dims, tensor->info.shape, fill_tensor,
                                           &contexts[i]);
          }
        return gepard_safetensors_writer_write (writer, path, error);
      }
    default:
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "Unknown codec checkpoint format %d", (int)format);
      return FALSE;
    }
}

gboolean
gepard_test_codec_write_preset (const char *path, const char *preset, guint64 seed,
                                const char *format, GError **error)
{
  GepardCodecConfig config;
  GepardTestCodecFormat fmt;

  g_return_val_if_fail (path != NULL, FALSE);
  g_return_val_if_fail (preset != NULL, FALSE);
  g_return_val_if_fail (format != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (g_strcmp0 (format, "nemo") == 0)
    fmt = GEPARD_TEST_CODEC_FORMAT_NEMO;
  else if (g_strcmp0 (format, "safetensors") == 0)
    fmt = GEPARD_TEST_CODEC_FORMAT_SAFETENSORS;
  else
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "Unknown codec checkpoint format “%s” (known: nemo, safetensors)", format);
      return FALSE;
    }
  if (!gepard_codec_config_init_preset (&config, preset, error))
    return FALSE;
  return gepard_test_codec_write (path, &config, seed, fmt, error);
}
