/* gepard-fsq.c: GroupFSQ encode, decode and index packing (nanocodec.md §4). */
#include "gepard-fsq.h"

#include "gepard-error.h"

#include <math.h>
#include <string.h>

static float
float_from_bits (guint32 bits)
{
  float value;

  memcpy (&value, &bits, sizeof value);
  return value;
}

void
gepard_fsq_dim_init (GepardFsqDim *dim, int levels, double eps)
{
  /* nanocodec.md §4: PyTorch's fp32 results, hard-coded because a C tanf/tanhf may differ from
   * PyTorch's by an ulp and a shifted constant moves every code boundary */
  static const struct
  {
    int levels;
    guint32 scale_bits;
    guint32 shift_bits;
  } published[] = {
      {8, 0x405fc6a8, 0x3e137042},
      {7, 0x403fced9, 0x00000000},
      {6, 0x401fd70a, 0x3e4fc9dc},
  };

  g_return_if_fail (dim != NULL);
  g_return_if_fail (levels >= 2);

  dim->levels = levels;
  dim->half = levels / 2;
  dim->offset = levels % 2 == 0 ? 0.5f : 0.0f;

  if (eps == 1e-3)
    {
      for (guint i = 0; i < G_N_ELEMENTS (published); i++)
        {
          if (published[i].levels == levels)
            {
              dim->scale = float_from_bits (published[i].scale_bits);
              dim->shift = float_from_bits (published[i].shift_bits);
              return;
            }
        }
    }

  /* the same steps in fp32 as FiniteScalarQuantizer.compress: (L − 1) / 2, times the fp32
   * (1 − eps), then tan of the fp32 quotient (rounded once from double); volatile keeps every
   * step a separately rounded fp32 operation */
  {
    volatile float half_range = (float)(levels - 1) / 2.0f;
    volatile float one_minus_eps = (float)(1.0 - eps);
    volatile float scale = half_range * one_minus_eps;
    volatile float ratio = dim->offset / scale;

    dim->scale = scale;
    dim->shift = (float)tan ((double)ratio);
  }
}

float
gepard_fsq_dim_compress (const GepardFsqDim *dim, float x)
{
  /* nanocodec.md §4: y = scale·tanh(x + shift) − offset, every step an fp32 tensor op; tanh is
   * evaluated in double and rounded once, which is within PyTorch's 1-ulp tanhf; volatile keeps
   * the multiply and the subtraction from fusing into one differently rounded operation */
  volatile float shifted = x + dim->shift;
  volatile float squashed = (float)tanh ((double)shifted);
  volatile float scaled = dim->scale * squashed;

  return scaled - dim->offset;
}

gint32
gepard_fsq_dim_quantize (const GepardFsqDim *dim, float y)
{
  float rounded;
  gint32 code;

  if (isnan (y))
    return dim->half;
  /* nanocodec.md §4: torch.round is round half to even, which nearbyintf does in the default
   * rounding mode */
  rounded = nearbyintf (y);
  if (rounded < (float)-dim->half)
    rounded = (float)-dim->half;
  if (rounded > (float)(dim->levels - 1 - dim->half))
    rounded = (float)(dim->levels - 1 - dim->half);
  code = (gint32)rounded + dim->half;
  return code;
}

float
gepard_fsq_dim_value (const GepardFsqDim *dim, gint32 code)
{
  /* nanocodec.md §4: value = (k − L//2) / (L//2), a true fp32 division */
  return (float)(code - dim->half) / (float)dim->half;
}

static void
init_dims (const GepardCodecConfig *config, GepardFsqDim *dims)
{
  for (int d = 0; d < config->fsq_n_dims; d++)
    gepard_fsq_dim_init (&dims[d], config->fsq_levels[d], config->fsq_eps);
}

void
gepard_fsq_encode (const GepardCodecConfig *config, const float *latent, gsize n_frames,
                   gint32 *codes)
{
  GepardFsqDim dims[GEPARD_CODEC_MAX_FSQ_DIMS];
  int n_dims, latent_dim;

  g_return_if_fail (config != NULL);
  g_return_if_fail (n_frames == 0 || (latent != NULL && codes != NULL));

  init_dims (config, dims);
  n_dims = config->fsq_n_dims;
  latent_dim = config->latent_dim;
  for (gsize t = 0; t < n_frames; t++)
    {
      for (int i = 0; i < latent_dim; i++)
        {
          const GepardFsqDim *dim = &dims[i % n_dims];
          gsize at = t * latent_dim + i;

          codes[at] = gepard_fsq_dim_quantize (dim, gepard_fsq_dim_compress (dim, latent[at]));
        }
    }
}

gboolean
gepard_fsq_check_codes (const GepardCodecConfig *config, const gint32 *codes, gsize n_frames,
                        GError **error)
{
  int n_dims, latent_dim;

  g_return_val_if_fail (config != NULL, FALSE);
  g_return_val_if_fail (n_frames == 0 || codes != NULL, FALSE);

  n_dims = config->fsq_n_dims;
  latent_dim = config->latent_dim;
  for (gsize t = 0; t < n_frames; t++)
    {
      for (int i = 0; i < latent_dim; i++)
        {
          gint32 code = codes[t * latent_dim + i];
          int levels = config->fsq_levels[i % n_dims];

          if (code < 0 || code >= levels)
            {
              g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                           "Code %d of frame %" G_GSIZE_FORMAT ", channel %d (codebook %d, FSQ "
                           "dimension %d) is outside [0, %d)",
                           code, t, i, i / n_dims, i % n_dims, levels);
              return FALSE;
            }
        }
    }
  return TRUE;
}

void
gepard_fsq_decode (const GepardCodecConfig *config, const gint32 *codes, gsize n_frames,
                   float *latent)
{
  GepardFsqDim dims[GEPARD_CODEC_MAX_FSQ_DIMS];
  int n_dims, latent_dim;

  g_return_if_fail (config != NULL);
  g_return_if_fail (n_frames == 0 || (latent != NULL && codes != NULL));

  init_dims (config, dims);
  n_dims = config->fsq_n_dims;
  latent_dim = config->latent_dim;
  for (gsize t = 0; t < n_frames; t++)
    {
      for (int i = 0; i < latent_dim; i++)
        {
          const GepardFsqDim *dim = &dims[i % n_dims];
          gsize at = t * latent_dim + i;
          gint32 code = CLAMP (codes[at], 0, dim->levels - 1);

          latent[at] = gepard_fsq_dim_value (dim, code);
        }
    }
}

gint32
gepard_fsq_pack (const GepardCodecConfig *config, const gint32 *group_codes)
{
  gint32 index = 0, base = 1;

  g_return_val_if_fail (config != NULL, -1);
  g_return_val_if_fail (group_codes != NULL, -1);

  /* nanocodec.md §4: mixed radix, dim 0 least significant (dim_base_index 1, 8, 56, 336) */
  for (int d = 0; d < config->fsq_n_dims; d++)
    {
      if (group_codes[d] < 0 || group_codes[d] >= config->fsq_levels[d])
        return -1;
      index += group_codes[d] * base;
      base *= config->fsq_levels[d];
    }
  return index;
}

gboolean
gepard_fsq_unpack (const GepardCodecConfig *config, gint32 index, gint32 *group_codes)
{
  g_return_val_if_fail (config != NULL, FALSE);
  g_return_val_if_fail (group_codes != NULL, FALSE);

  if (index < 0 || index >= gepard_codec_config_get_codebook_size (config))
    return FALSE;
  /* nanocodec.md §4: k_d = (index // base_d) mod L_d */
  for (int d = 0; d < config->fsq_n_dims; d++)
    {
      group_codes[d] = index % config->fsq_levels[d];
      index /= config->fsq_levels[d];
    }
  return TRUE;
}

float *
gepard_fsq_lut_new (const GepardCodecConfig *config)
{
  GepardFsqDim dims[GEPARD_CODEC_MAX_FSQ_DIMS];
  gint32 codes[GEPARD_CODEC_MAX_FSQ_DIMS];
  int size, n_dims;
  gsize n_values;
  float *lut;

  g_return_val_if_fail (config != NULL, NULL);

  init_dims (config, dims);
  size = gepard_codec_config_get_codebook_size (config);
  n_dims = config->fsq_n_dims;
  n_values = (gsize)size * n_dims;
  lut = g_new (float, n_values);
  for (int index = 0; index < size; index++)
    {
      gepard_fsq_unpack (config, index, codes);
      for (int d = 0; d < n_dims; d++)
        lut[(gsize)index * n_dims + d] = gepard_fsq_dim_value (&dims[d], codes[d]);
    }
  return lut;
}
