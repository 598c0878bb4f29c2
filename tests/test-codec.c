/* NanoCodec on the CPU (tiny preset written by gepard-make-test-model): GroupFSQ constants, table,
 * rounding and packing; the decoder's streaming/one-shot bit identity, causality, state size and
 * input validation, and batches of streams against the same streams decoded one by one; the
 * encoder's frame count, end padding and windowing; decoder and encoder against a plain
 * double-precision transcription of nanocodec.md. Parity with the PyTorch reference is in
 * tests/python. */
#include "gepard-codec-private.h"
#include "gepard-codec-weights.h"
#include "gepard-codec.h"
#include "gepard-error.h"
#include "gepard-fsq.h"
#include "gepard-safetensors.h"
#include "gepard-test-model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N_FRAMES 40

static char *work_dir;
static char *codec_path;
static char *test_program;
static GepardCodec *codec;

static int
latent_dim (void)
{
  return gepard_codec_get_config (codec)->latent_dim;
}

static int
samples_per_frame (void)
{
  return gepard_codec_get_config (codec)->samples_per_frame;
}

static gsize
samples_for (int n_frames)
{
  return (gsize)n_frames * samples_per_frame ();
}

static gint32 *
random_codes (guint32 seed, int n_frames)
{
  const GepardCodecConfig *config = gepard_codec_get_config (codec);
  g_autoptr (GRand) rand = g_rand_new_with_seed (seed);
  gint32 *codes = g_new (gint32, (gsize)n_frames * config->latent_dim);

  for (gsize i = 0; i < (gsize)n_frames * config->latent_dim; i++)
    codes[i] = g_rand_int_range (rand, 0, config->fsq_levels[i % config->fsq_n_dims]);
  return codes;
}

static float *
decode_one_shot (const gint32 *codes, int n_frames)
{
  float *samples = g_new (float, samples_for (n_frames));
  g_autoptr (GError) error = NULL;

  g_assert_true (gepard_codec_decode (codec, codes, n_frames, samples, &error));
  g_assert_no_error (error);
  return samples;
}

static guint32
float_bits (float value)
{
  guint32 bits;

  memcpy (&bits, &value, sizeof bits);
  return bits;
}

static float *
test_clip (gsize n, guint32 seed)
{
  g_autoptr (GRand) rand = g_rand_new_with_seed (seed);
  float *clip = g_new (float, MAX (n, 1));

  for (gsize i = 0; i < n; i++)
    clip[i] = (float)(0.4 * sin (2.0 * G_PI * 180.0 * i / 22050.0)
                      + 0.1 * g_rand_double_range (rand, -1.0, 1.0));
  return clip;
}

/* --- a plain double-precision reference, written straight from the spec --- */

static GepardCodecWeights *weights;

static const float *weight (const char *format, ...) G_GNUC_PRINTF (1, 2);

static const float *
weight (const char *format, ...)
{
  g_autofree char *name = NULL;
  gint64 shape[GEPARD_TENSOR_MAX_DIMS];
  guint n_dims = 0;
  const float *data;
  va_list args;

  va_start (args, format);
  name = g_strdup_vprintf (format, args);
  va_end (args);
  data = gepard_codec_weights_get (weights, name, &n_dims, shape);
  if (data == NULL)
    g_error ("no tensor %s", name);
  return data;
}

/* y[o][t] = b[o] + Σ_c Σ_m W[o][c][m] · x_pad[c][t·stride + m·dilation − left] (§2.3, §3.4),
 * x_pad zero or replicated outside [0, n). Returns [out][n_out]. */
static double *
ref_conv (const double *x, int in, int n, const char *prefix, int out, int k, int dilation,
          int stride, int left, int right, gboolean replicate, int *n_out)
{
  g_autofree char *w_name = g_strconcat (prefix, ".conv.weight", NULL);
  g_autofree char *b_name = g_strconcat (prefix, ".conv.bias", NULL);
  const float *w = weight ("%s", w_name), *b = weight ("%s", b_name);
  int m_out = (n + left + right - (k - 1) * dilation - 1) / stride + 1;
  gsize n_values = (gsize)out * m_out;
  double *y = g_new (double, n_values);

  for (int o = 0; o < out; o++)
    for (int t = 0; t < m_out; t++)
      {
        double acc = b[o];

        for (int c = 0; c < in; c++)
          for (int m = 0; m < k; m++)
            {
              int at = t * stride + m * dilation - left;
              double value;

              if (at >= 0 && at < n)
                value = x[(gsize)c * n + at];
              else
                value = replicate ? x[(gsize)c * n + CLAMP (at, 0, n - 1)] : 0.0;
              acc += w[((gsize)o * in + c) * k + m] * value;
            }
        y[(gsize)o * m_out + t] = acc;
      }
  *n_out = m_out;
  return y;
}

/* §2.3: Snake on the first C // 2 channels (alphas from `prefix`, NULL for none), LeakyReLU 0.01 on
 * the rest */
static double *
ref_activation (const double *x, int channels, int n, const char *prefix)
{
  gsize n_values = (gsize)channels * n;
  double *y = g_new (double, n_values);
  const float *alpha = NULL;
  int n_snake = 0;

  if (prefix != NULL)
    {
      alpha = weight ("%s.activation.snake_act.alpha", prefix);
      n_snake = channels / 2;
    }
  for (int c = 0; c < channels; c++)
    for (int t = 0; t < n; t++)
      {
        double v = x[(gsize)c * n + t];

        if (c < n_snake)
          {
            double s = sin (alpha[c] * v);

            y[(gsize)c * n + t] = v + 1.0 / ((double)alpha[c] + 1e-9) * s * s;
          }
        else
          y[(gsize)c * n + t] = v > 0 ? v : 0.01 * v;
      }
  return y;
}

static double *
ref_res_layer (const double *x, int channels, int n, const char *module, int stage, gboolean causal)
{
  static const int kernels[] = {3, 7, 11}, dilations[] = {1, 3, 5};
  gsize n_values = (gsize)channels * n;
  double *sum = g_new0 (double, n_values);

  /* §2.2: the mean of three parallel branches, each three residual blocks in sequence */
  for (int j = 0; j < 3; j++)
    {
      double *h = g_memdup2 (x, sizeof (double) * channels * n);

      for (int m = 0; m < 3; m++)
        {
          g_autofree char *block = g_strdup_printf ("%s.res_layers.%d.res_blocks.%d.res_blocks.%d",
                                                    module, stage, j, m);
          g_autofree char *in_act = g_strconcat (block, ".input_activation", NULL);
          g_autofree char *skip_act = g_strconcat (block, ".skip_activation", NULL);
          g_autofree char *in_conv = g_strconcat (block, ".input_conv", NULL);
          g_autofree char *skip_conv = g_strconcat (block, ".skip_conv", NULL);
          int k = kernels[j], d = dilations[m], n_out;
          int pad_in = (k - 1) * d, pad_skip = k - 1;
          g_autofree double *a = ref_activation (h, channels, n, causal ? in_act : NULL);
          g_autofree double *c1
              = ref_conv (a, channels, n, in_conv, channels, k, d, 1, causal ? pad_in : pad_in / 2,
                          causal ? 0 : pad_in / 2, !causal, &n_out);
          g_autofree double *a2 = ref_activation (c1, channels, n, causal ? skip_act : NULL);
          g_autofree double *c2 = ref_conv (a2, channels, n, skip_conv, channels, k, 1, 1,
                                            causal ? pad_skip : pad_skip / 2,
                                            causal ? 0 : pad_skip / 2, !causal, &n_out);

          for (gsize e = 0; e < (gsize)channels * n; e++)
            h[e] += c2[e];
        }
      for (gsize e = 0; e < (gsize)channels * n; e++)
        sum[e] += h[e];
      g_free (h);
    }
  for (gsize e = 0; e < (gsize)channels * n; e++)
    sum[e] /= 3.0;
  return sum;
}

static double *
ref_decode (const gint32 *codes, int n_frames)
{
  const GepardCodecConfig *config = gepard_codec_get_config (codec);
  int n = n_frames, channels = config->decoder.base_channels, n_out;
  g_autofree double *latent = g_new (double, 32 * (gsize)n);
  double *x, *y;

  /* §4: value = (k − L // 2) / (L // 2) */
  for (int c = 0; c < 32; c++)
    for (int t = 0; t < n; t++)
      {
        int half = config->fsq_levels[c % 4] / 2;

        latent[(gsize)c * n + t] = (double)(codes[t * 32 + c] - half) / half;
      }
  x = ref_conv (latent, 32, n, "audio_decoder.pre_conv", channels, 7, 1, 1, 6, 0, FALSE, &n_out);
  for (int i = 0; i < config->decoder.n_stages; i++)
    {
      g_autofree char *act = g_strdup_printf ("audio_decoder.activations.%d", i);
      int s = config->decoder.up_sample_rates[i], half = channels / 2;
      const float *w = weight ("audio_decoder.up_sample_conv_layers.%d.conv.weight", i);
      const float *b = weight ("audio_decoder.up_sample_conv_layers.%d.conv.bias", i);
      g_autofree double *a = ref_activation (x, channels, n, act);

      /* §2.3: grouped transposed conv, groups = C_out, keep [0, n·s) */
      g_free (x);
      x = g_new0 (double, (gsize)(half * n * s));
      for (int j = 0; j < half; j++)
        for (int t = 0; t < n * s; t++)
          {
            double acc = b[j];

            for (int frame = t / s - 1; frame <= t / s; frame++)
              if (frame >= 0)
                for (int c = 2 * j; c <= 2 * j + 1; c++)
                  acc += a[(gsize)c * n + frame] * w[(gsize)c * 2 * s + (t - frame * s)];
            x[(gsize)j * n * s + t] = acc;
          }
      channels = half;
      n *= s;
      y = ref_res_layer (x, channels, n, "audio_decoder", i, TRUE);
      g_free (x);
      x = y;
    }
  y = ref_activation (x, channels, n, "audio_decoder.post_activation");
  g_free (x);
  x = ref_conv (y, channels, n, "audio_decoder.post_conv", 1, 3, 1, 1, 2, 0, FALSE, &n_out);
  g_free (y);
  for (int t = 0; t < n; t++)
    x[t] = CLAMP (x[t], -1.0, 1.0);
  return x;
}

/* n samples (a multiple of 1024) → latent [32][n / 1024] */
static double *
ref_encode (const float *clip, int n)
{
  const GepardCodecConfig *config = gepard_codec_get_config (codec);
  int channels = config->encoder.base_channels, n_out;
  g_autofree double *audio = g_new (double, n);
  double *x, *y;

  for (int t = 0; t < n; t++)
    audio[t] = clip[t];
  /* §3.3, §3.4: replicate padding everywhere, LeakyReLU between stages */
  x = ref_conv (audio, 1, n, "audio_encoder.pre_conv", channels, 7, 1, 1, 3, 3, TRUE, &n_out);
  for (int i = 0; i < config->encoder.n_stages; i++)
    {
      g_autofree char *down = g_strdup_printf ("audio_encoder.down_sample_conv_layers.%d", i);
      int r = config->encoder.down_sample_rates[i];
      g_autofree double *a = NULL;

      y = ref_res_layer (x, channels, n, "audio_encoder", i, FALSE);
      g_free (x);
      a = ref_activation (y, channels, n, NULL);
      g_free (y);
      x = ref_conv (a, channels, n, down, 2 * channels, 2 * r, 1, r, (r + 1) / 2, (r + 1) / 2, TRUE,
                    &n_out);
      g_assert_cmpint (n_out, ==, n / r);
      channels *= 2;
      n /= r;
    }
  y = ref_activation (x, channels, n, NULL);
  g_free (x);
  x = ref_conv (y, channels, n, "audio_encoder.post_conv", 32, 7, 1, 1, 3, 3, TRUE, &n_out);
  g_free (y);
  return x;
}

static void
test_decode_matches_reference (void)
{
  g_autofree gint32 *codes = random_codes (17, 6);
  g_autofree float *samples = decode_one_shot (codes, 6);
  g_autofree double *reference = ref_decode (codes, 6);
  double max_diff = 0.0, max_value = 0.0;

  for (int t = 0; t < 6 * samples_per_frame (); t++)
    {
      max_diff = MAX (max_diff, fabs (samples[t] - reference[t]));
      max_value = MAX (max_value, fabs (reference[t]));
    }
  g_test_message ("decoder vs fp64 reference: max |difference| %.3g (max |sample| %.3g)", max_diff,
                  max_value);
  g_assert_cmpfloat (max_value, >, 0.05);
  g_assert_cmpfloat (max_diff, <, 2e-5);
}

static void
test_encode_matches_reference (void)
{
  int n = 3 * 1024;
  g_autofree float *clip = test_clip (n, 25);
  g_autoptr (GArray) latent = gepard_codec_encode_latent (codec, clip, n, NULL);
  g_autofree double *reference = ref_encode (clip, n);
  double max_diff = 0.0, max_value = 0.0;

  g_assert_nonnull (latent);
  for (int t = 0; t < 3; t++)
    for (int c = 0; c < 32; c++)
      {
        double ref = reference[c * 3 + t];

        max_diff = MAX (max_diff, fabs (g_array_index (latent, float, t * 32 + c) - ref));
        max_value = MAX (max_value, fabs (ref));
      }
  g_test_message ("encoder vs fp64 reference: max |difference| %.3g (max |latent| %.3g)", max_diff,
                  max_value);
  g_assert_cmpfloat (max_value, >, 1e-3);
  g_assert_cmpfloat (max_diff, <, 1e-5 * MAX (max_value, 1.0));
}

/* --- GroupFSQ (nanocodec.md §4) --- */

static void
test_fsq_constants (void)
{
  static const struct
  {
    int levels;
    guint32 scale, shift;
    float offset;
  } expected[] = {
      {8, 0x405fc6a8, 0x3e137042, 0.5f},
      {7, 0x403fced9, 0x00000000, 0.0f},
      {6, 0x401fd70a, 0x3e4fc9dc, 0.5f},
  };

  for (guint i = 0; i < G_N_ELEMENTS (expected); i++)
    {
      GepardFsqDim dim;

      gepard_fsq_dim_init (&dim, expected[i].levels, 1e-3);
      g_assert_cmphex (float_bits (dim.scale), ==, expected[i].scale);
      g_assert_cmphex (float_bits (dim.shift), ==, expected[i].shift);
      g_assert_cmpfloat (dim.offset, ==, expected[i].offset);
      g_assert_cmpint (dim.half, ==, expected[i].levels / 2);
    }
}

static void
test_fsq_lut (void)
{
  /* §4 table: the values of each dimension, in code order */
  static const float dim0[] = {-1.0f, -0.75f, -0.5f, -0.25f, 0.0f, 0.25f, 0.5f, 0.75f};
  const float third = 1.0f / 3.0f, two_thirds = 2.0f / 3.0f;
  const float dim1[] = {-1.0f, -two_thirds, -third, 0.0f, third, two_thirds, 1.0f};
  const float dim23[] = {-1.0f, -two_thirds, -third, 0.0f, third, two_thirds};
  const float *tables[] = {dim0, dim1, dim23, dim23};
  const GepardCodecConfig *config = gepard_codec_get_config (codec);
  g_autofree float *lut = gepard_fsq_lut_new (config);
  gint32 codes[4];

  g_assert_cmpint (gepard_codec_config_get_codebook_size (config), ==, 2016);
  for (int index = 0; index < 2016; index++)
    {
      g_assert_true (gepard_fsq_unpack (config, index, codes));
      for (int d = 0; d < 4; d++)
        g_assert_cmphex (float_bits (lut[index * 4 + d]), ==, float_bits (tables[d][codes[d]]));
    }
  /* index 0 ↔ (−1, −1, −1, −1); the last index is every dimension's top code */
  for (int d = 0; d < 4; d++)
    g_assert_cmpfloat (lut[d], ==, -1.0f);
  g_assert_cmpfloat (lut[2015 * 4 + 0], ==, 0.75f);
  g_assert_cmpfloat (lut[2015 * 4 + 1], ==, 1.0f);
  g_assert_cmpfloat (lut[2015 * 4 + 2], ==, two_thirds);

  /* the decoder's per-channel dequantization is the same table */
  {
    gint32 frame[32];
    float latent[32];

    for (int i = 0; i < 32; i++)
      frame[i] = (i * 5 + 3) % config->fsq_levels[i % 4];
    gepard_fsq_decode (config, frame, 1, latent);
    for (int g = 0; g < 8; g++)
      {
        gint32 index = gepard_fsq_pack (config, frame + 4 * g);

        for (int d = 0; d < 4; d++)
          g_assert_cmphex (float_bits (latent[4 * g + d]), ==, float_bits (lut[index * 4 + d]));
      }
  }
}

static void
test_fsq_packing (void)
{
  const GepardCodecConfig *config = gepard_codec_get_config (codec);
  const gint32 codes[4] = {1, 2, 3, 4};
  const gint32 top[4] = {7, 6, 5, 5};
  const gint32 bad[4] = {8, 0, 0, 0};
  gint32 back[4];

  /* §4: k0 + 8·k1 + 56·k2 + 336·k3, dim 0 least significant */
  g_assert_cmpint (gepard_fsq_pack (config, codes), ==, 1 + 8 * 2 + 56 * 3 + 336 * 4);
  g_assert_cmpint (gepard_fsq_pack (config, top), ==, 2015);
  g_assert_cmpint (gepard_fsq_pack (config, bad), ==, -1);
  g_assert_true (gepard_fsq_unpack (config, 1529, back));
  g_assert_cmpmem (back, sizeof back, codes, sizeof codes);
  g_assert_false (gepard_fsq_unpack (config, 2016, back));
  g_assert_false (gepard_fsq_unpack (config, -1, back));
}

static void
test_fsq_rounding (void)
{
  GepardFsqDim l8, l7, l6;

  gepard_fsq_dim_init (&l8, 8, 1e-3);
  gepard_fsq_dim_init (&l7, 7, 1e-3);
  gepard_fsq_dim_init (&l6, 6, 1e-3);

  /* §4: torch.round is half to even; k = q + L // 2 */
  g_assert_cmpint (gepard_fsq_dim_quantize (&l8, 0.5f), ==, 4);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l8, -0.5f), ==, 4);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l8, 1.5f), ==, 6);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l8, 2.5f), ==, 6);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l8, -1.5f), ==, 2);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l8, -2.5f), ==, 2);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l8, -3.5f), ==, 0);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l8, nextafterf (0.5f, 1.0f)), ==, 5);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l8, nextafterf (-0.5f, -1.0f)), ==, 3);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l7, 2.5f), ==, 5);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l7, -2.5f), ==, 1);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l7, 0.5f), ==, 3);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l6, 1.5f), ==, 5);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l6, -0.5f), ==, 3);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l6, -2.5f), ==, 1);
  /* never out of range, even for values compress() cannot produce */
  g_assert_cmpint (gepard_fsq_dim_quantize (&l6, 100.0f), ==, 5);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l6, -100.0f), ==, 0);
  g_assert_cmpint (gepard_fsq_dim_quantize (&l6, NAN), ==, 3);

  /* through compress: a latent whose compressed value is exactly a half lands on the even
   * neighbour (found by walking the fp32 latents around the boundary; tanh makes them exist) */
  {
    const GepardFsqDim *dims[] = {&l8, &l7, &l6};
    int found = 0;

    for (guint i = 0; i < G_N_ELEMENTS (dims); i++)
      {
        for (float target = -2.5f; target <= 2.5f; target += 1.0f)
          {
            const GepardFsqDim *dim = dims[i];
            double want = (target + dim->offset) / dim->scale;
            float x;

            if (fabs (want) >= 1.0)
              continue;
            x = (float)(atanh (want) - dim->shift);
            for (int step = 0; step < 4096; step++, x = nextafterf (x, -INFINITY))
              if (gepard_fsq_dim_compress (dim, x) <= target)
                break;
            for (int step = 0; step < 64; step++, x = nextafterf (x, INFINITY))
              {
                float y = gepard_fsq_dim_compress (dim, x);

                if (y == target)
                  {
                    g_assert_cmpint (gepard_fsq_dim_quantize (dim, y), ==,
                                     (gint32)nearbyintf (target) + dim->half);
                    g_assert_cmpint ((gint32)nearbyintf (target) % 2, ==, 0);
                    found++;
                  }
                if (y > target)
                  break;
              }
          }
      }
    g_test_message ("%d latents compress exactly onto a half", found);
  }
}

/* The centre of every bin maps to its code, the extremes to the end codes, and whole frames keep
 * the unfolded layout (channel i → dimension i % 4). */
static void
test_fsq_encode (void)
{
  const GepardCodecConfig *config = gepard_codec_get_config (codec);
  float latent[3 * 32];
  gint32 codes[3 * 32];

  for (int d = 0; d < 4; d++)
    {
      GepardFsqDim dim;

      gepard_fsq_dim_init (&dim, config->fsq_levels[d], config->fsq_eps);
      for (int k = 0; k < dim.levels; k++)
        {
          /* the value k − L // 2, pulled inside (−scale − offset, scale − offset) for the end
           * codes, whose bins reach past what tanh can give */
          double y = k - dim.half;
          double ratio;
          float x;

          if (y + dim.offset <= -dim.scale)
            y += 0.3;
          if (y + dim.offset >= dim.scale)
            y -= 0.3;
          ratio = (y + dim.offset) / dim.scale;
          x = (float)(atanh (ratio) - dim.shift);

          g_assert_cmpint (gepard_fsq_dim_quantize (&dim, gepard_fsq_dim_compress (&dim, x)), ==,
                           k);
        }
      g_assert_cmpint (gepard_fsq_dim_quantize (&dim, gepard_fsq_dim_compress (&dim, 0.0f)), ==,
                       dim.half);
      g_assert_cmpint (gepard_fsq_dim_quantize (&dim, gepard_fsq_dim_compress (&dim, 30.0f)), ==,
                       dim.levels - 1);
      g_assert_cmpint (gepard_fsq_dim_quantize (&dim, gepard_fsq_dim_compress (&dim, -30.0f)), ==,
                       0);
    }

  for (int i = 0; i < 32; i++)
    {
      latent[i] = 0.0f;
      latent[32 + i] = 30.0f;
      latent[64 + i] = -30.0f;
    }
  gepard_fsq_encode (config, latent, 3, codes);
  for (int i = 0; i < 32; i++)
    {
      int levels = config->fsq_levels[i % 4];

      g_assert_cmpint (codes[i], ==, levels / 2);
      g_assert_cmpint (codes[32 + i], ==, levels - 1);
      g_assert_cmpint (codes[64 + i], ==, 0);
    }
  /* a top frame packs to the last index of every codebook */
  for (int g = 0; g < 8; g++)
    g_assert_cmpint (gepard_fsq_pack (config, codes + 32 + 4 * g), ==, 2015);
}

/* --- decoder --- */

/* nanocodec.md §6.1: any chunking of the stream gives the one-shot bits. */
static void
test_streaming_matches_one_shot (void)
{
  static const int chunkings[] = {1, 2, 3, 5, 0 /* random */};
  g_autofree gint32 *codes = random_codes (11, N_FRAMES);
  g_autofree float *reference = decode_one_shot (codes, N_FRAMES);
  gsize spf = samples_per_frame ();
  g_autofree float *streamed = g_new (float, samples_for (N_FRAMES));
  g_autoptr (GepardCodecStream) stream = gepard_codec_stream_new (codec);
  g_autoptr (GRand) rand = g_rand_new_with_seed (7);

  for (guint c = 0; c < G_N_ELEMENTS (chunkings); c++)
    {
      GString *split = g_string_new (NULL);

      memset (streamed, 0, N_FRAMES * spf * sizeof (float));
      gepard_codec_stream_reset (stream);
      for (int done = 0; done < N_FRAMES;)
        {
          int n = chunkings[c] > 0 ? chunkings[c] : g_rand_int_range (rand, 1, 9);
          g_autoptr (GError) error = NULL;

          n = MIN (n, N_FRAMES - done);
          g_string_append_printf (split, "%d ", n);
          g_assert_true (gepard_codec_stream_decode (stream, codes + done * latent_dim (), n,
                                                     streamed + done * spf, &error));
          g_assert_no_error (error);
          done += n;
        }
      g_test_message ("chunks %s", split->str);
      g_string_free (split, TRUE);
      g_assert_cmpmem (streamed, N_FRAMES * spf * sizeof (float), reference,
                       N_FRAMES * spf * sizeof (float));
    }
}

/* nanocodec.md §6.1: output sample n depends only on frames ≤ n / 1024. */
static void
test_causal_prefix (void)
{
  static const int prefixes[] = {1, 2, 7, 26, 33};
  g_autofree gint32 *codes = random_codes (12, N_FRAMES);
  g_autofree float *all = decode_one_shot (codes, N_FRAMES);
  gsize spf = samples_per_frame ();

  for (guint i = 0; i < G_N_ELEMENTS (prefixes); i++)
    {
      g_autofree float *prefix = decode_one_shot (codes, prefixes[i]);

      g_assert_cmpmem (prefix, prefixes[i] * spf * sizeof (float), all,
                       prefixes[i] * spf * sizeof (float));
    }

  /* and changing frame 20 leaves samples before 20·1024 as they were, but not the ones after */
  {
    g_autofree gint32 *changed = g_memdup2 (codes, N_FRAMES * latent_dim () * sizeof (gint32));
    g_autofree float *other = NULL;

    changed[20 * latent_dim () + 3] = (changed[20 * latent_dim () + 3] + 3) % 6;
    other = decode_one_shot (changed, N_FRAMES);
    g_assert_cmpmem (other, 20 * spf * sizeof (float), all, 20 * spf * sizeof (float));
    g_assert_true (memcmp (other + 20 * spf, all + 20 * spf, spf * sizeof (float)) != 0);
  }
}

static void
test_output_range (void)
{
  g_autofree gint32 *codes = random_codes (13, N_FRAMES);
  g_autofree float *samples = decode_one_shot (codes, N_FRAMES);
  gsize n = N_FRAMES * samples_per_frame ();
  double energy = 0.0;

  for (gsize i = 0; i < n; i++)
    {
      g_assert_true (samples[i] >= -1.0f && samples[i] <= 1.0f);
      energy += (double)samples[i] * samples[i];
    }
  /* not trivially silent */
  g_assert_cmpfloat (sqrt (energy / n), >, 1e-3);
}

/* A constant code pattern (every channel at its zero level) decodes the same every time, in a
 * stream or not, and — the decoder being time-invariant with a finite memory (§6.1: 26 frames) —
 * every frame past that memory is the same bits. */
static void
test_silence_deterministic (void)
{
  const GepardCodecConfig *config = gepard_codec_get_config (codec);
  g_autofree gint32 *codes = g_new (gint32, N_FRAMES * latent_dim ());
  g_autofree float *first = NULL, *second = NULL;
  g_autofree float *streamed = g_new (float, samples_for (N_FRAMES));
  g_autoptr (GepardCodecStream) stream = gepard_codec_stream_new (codec);
  gsize spf = samples_per_frame ();

  for (int i = 0; i < N_FRAMES * latent_dim (); i++)
    codes[i] = config->fsq_levels[i % config->fsq_n_dims] / 2;
  first = decode_one_shot (codes, N_FRAMES);
  second = decode_one_shot (codes, N_FRAMES);
  g_assert_cmpmem (first, N_FRAMES * spf * sizeof (float), second, N_FRAMES * spf * sizeof (float));
  for (int t = 0; t < N_FRAMES; t++)
    g_assert_true (gepard_codec_stream_decode (stream, codes + t * latent_dim (), 1,
                                               streamed + t * spf, NULL));
  g_assert_cmpmem (streamed, N_FRAMES * spf * sizeof (float), first,
                   N_FRAMES * spf * sizeof (float));
  for (int t = 28; t < N_FRAMES; t++)
    g_assert_cmpmem (first + t * spf, spf * sizeof (float), first + 27 * spf, spf * sizeof (float));
}

static void
test_bad_codes (void)
{
  g_autofree gint32 *codes = random_codes (14, 4);
  g_autofree float *reference = decode_one_shot (codes, 4);
  gsize spf = samples_per_frame ();
  g_autofree float *samples = g_new (float, 4 * spf);
  g_autoptr (GepardCodecStream) stream = gepard_codec_stream_new (codec);
  const gint32 bad_values[] = {-1, 8, 7, 6, G_MAXINT32, G_MININT32};
  const int bad_channels[] = {0, 0, 1, 2, 31, 17};

  /* frame 0 fine, then a bad code in frame 2: nothing is decoded and the stream does not move */
  for (guint i = 0; i < G_N_ELEMENTS (bad_values); i++)
    {
      g_autofree gint32 *bad = g_memdup2 (codes, 4 * latent_dim () * sizeof (gint32));
      g_autoptr (GError) error = NULL;

      bad[2 * latent_dim () + bad_channels[i]] = bad_values[i];
      g_assert_false (gepard_codec_stream_decode (stream, bad, 4, samples, &error));
      g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE);
      g_clear_error (&error);
      g_assert_false (gepard_codec_decode (codec, bad, 4, samples, &error));
      g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE);
    }
  g_assert_true (gepard_codec_stream_decode (stream, codes, 4, samples, NULL));
  g_assert_cmpmem (samples, 4 * spf * sizeof (float), reference, 4 * spf * sizeof (float));

  {
    g_autoptr (GError) error = NULL;

    g_assert_false (gepard_codec_stream_decode (stream, codes, -1, samples, &error));
    g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE);
    g_clear_error (&error);
    g_assert_false (gepard_codec_decode (codec, NULL, 3, samples, &error));
    g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE);
    g_clear_error (&error);
    /* zero frames is a valid, empty request */
    g_assert_true (gepard_codec_stream_decode (stream, NULL, 0, NULL, &error));
    g_assert_no_error (error);
  }
}

/* --- batched decoding --- */

#define N_BATCH 6

static void
assert_same_state (GepardCodecStream *a, GepardCodecStream *b)
{
  gsize bytes = gepard_codec_stream_state_bytes (a);

  g_assert_cmpuint (gepard_codec_stream_state_bytes (b), ==, bytes);
  g_assert_cmpmem (gepard_codec_stream_peek_state (a), bytes, gepard_codec_stream_peek_state (b),
                   bytes);
}

/* Streams with different histories and different frame counts per call (none, one, a few, more
 * than a block) decode in one batch to the bits and the state each gets alone. */
static void
test_batch_matches_streams (void)
{
  static const int warm_up[N_BATCH] = {0, 1, 5, 2, 30, 9};
  static const int calls[][N_BATCH] = {
      {0, 1, 3, 7, 40, 1},  {1, 1, 1, 1, 1, 1}, {40, 7, 0, 1, 3, 2},
      {3, 0, 40, 7, 1, 16}, {1, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0},
  };
  static const int thread_counts[] = {1, 3};
  int before = gepard_codec_get_n_threads (codec);
  gsize spf = samples_per_frame ();

  for (guint k = 0; k < G_N_ELEMENTS (thread_counts); k++)
    {
      GepardCodecStream *alone[N_BATCH], *batched[N_BATCH];

      gepard_codec_set_n_threads (codec, thread_counts[k]);
      for (int s = 0; s < N_BATCH; s++)
        {
          g_autofree gint32 *codes = random_codes (100 + s, warm_up[s]);
          g_autofree float *samples = g_new (float, samples_for (warm_up[s]) + 1);

          alone[s] = gepard_codec_stream_new (codec);
          batched[s] = gepard_codec_stream_new (codec);
          g_assert_true (gepard_codec_stream_decode (alone[s], codes, warm_up[s], samples, NULL));
          g_assert_true (gepard_codec_stream_decode (batched[s], codes, warm_up[s], samples, NULL));
        }

      for (guint c = 0; c < G_N_ELEMENTS (calls); c++)
        {
          gint32 *codes[N_BATCH];
          float *expected[N_BATCH], *samples[N_BATCH];
          g_autoptr (GError) error = NULL;

          for (int s = 0; s < N_BATCH; s++)
            {
              int n = calls[c][s];

              codes[s] = n > 0 ? random_codes (1000 * (c + 1) + s, n) : NULL;
              expected[s] = n > 0 ? g_new (float, samples_for (n)) : NULL;
              samples[s] = n > 0 ? g_new0 (float, samples_for (n)) : NULL;
              g_assert_true (gepard_codec_stream_decode (alone[s], codes[s], n, expected[s], NULL));
            }
          g_assert_true (gepard_codec_decode_batch (batched, (const gint32 *const *)codes, calls[c],
                                                    samples, N_BATCH, &error));
          g_assert_no_error (error);
          for (int s = 0; s < N_BATCH; s++)
            {
              g_assert_cmpmem (samples[s], calls[c][s] * spf * sizeof (float), expected[s],
                               calls[c][s] * spf * sizeof (float));
              assert_same_state (batched[s], alone[s]);
              g_free (codes[s]);
              g_free (expected[s]);
              g_free (samples[s]);
            }
        }

      for (int s = 0; s < N_BATCH; s++)
        {
          gepard_codec_stream_free (alone[s]);
          gepard_codec_stream_free (batched[s]);
        }
    }
  gepard_codec_set_n_threads (codec, before);

  /* an empty batch is a valid request */
  g_assert_true (gepard_codec_decode_batch (NULL, NULL, NULL, NULL, 0, NULL));
}

/* The same with the portable kernel (GEPARD_CODEC_GENERIC=1), which a process chooses once: in a
 * child process running the test above. */
static void
test_batch_matches_streams_generic (void)
{
  const char *argv[] = {test_program, "--tap", "-p", "/codec/decode/batch-matches-streams", NULL};
  g_auto (GStrv) envp = g_environ_setenv (g_get_environ (), "GEPARD_CODEC_GENERIC", "1", TRUE);
  g_autofree char *out = NULL;
  g_autoptr (GError) error = NULL;
  int status = 0;

  g_assert_true (g_spawn_sync (NULL, (char **)argv, envp, G_SPAWN_DEFAULT, NULL, NULL, &out, NULL,
                               &status, &error));
  g_assert_no_error (error);
  g_test_message ("%s", out);
  g_assert_true (g_spawn_check_wait_status (status, &error));
  g_assert_no_error (error);
  g_assert_nonnull (strstr (out, "ok 1 /codec/decode/batch-matches-streams"));
}

/* A bad request in one stream fails the whole batch before anything moves, naming the stream. */
static void
test_batch_bad_codes (void)
{
  static const int frames[4] = {2, 0, 3, 1};
  GepardCodecStream *streams[4];
  gint32 *codes[4];
  float *samples[4], *states[4];
  int n_frames[4];

  for (int s = 0; s < 4; s++)
    {
      g_autofree gint32 *history = random_codes (200 + s, s + 1);
      g_autofree float *scratch = g_new (float, samples_for (s + 1));

      streams[s] = gepard_codec_stream_new (codec);
      g_assert_true (gepard_codec_stream_decode (streams[s], history, s + 1, scratch, NULL));
      states[s] = g_memdup2 (gepard_codec_stream_peek_state (streams[s]),
                             gepard_codec_stream_state_bytes (streams[s]));
      codes[s] = random_codes (300 + s, 3);
      samples[s] = g_new (float, samples_for (3));
      for (gsize i = 0; i < samples_for (3); i++)
        samples[s][i] = 7.0f;
      n_frames[s] = frames[s];
    }

  for (int attempt = 0; attempt < 3; attempt++)
    {
      g_autoptr (GError) error = NULL;
      const char *prefix;

      if (attempt == 0)
        {
          /* frame 1 of stream 2 */
          codes[2][latent_dim () + 5] = 9;
          prefix = "Stream 2: ";
        }
      else if (attempt == 1)
        {
          codes[2][latent_dim () + 5] = 0;
          n_frames[3] = -1;
          prefix = "Stream 3: ";
        }
      else
        {
          n_frames[3] = frames[3];
          n_frames[1] = 2;
          g_clear_pointer (&samples[1], g_free);
          prefix = "Stream 1: ";
        }
      g_assert_false (gepard_codec_decode_batch (streams, (const gint32 *const *)codes, n_frames,
                                                 samples, 4, &error));
      g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE);
      g_test_message ("%s", error->message);
      g_assert_true (g_str_has_prefix (error->message, prefix));
      for (int s = 0; s < 4; s++)
        {
          g_assert_cmpmem (gepard_codec_stream_peek_state (streams[s]),
                           gepard_codec_stream_state_bytes (streams[s]), states[s],
                           gepard_codec_stream_state_bytes (streams[s]));
          if (samples[s] != NULL)
            for (gsize i = 0; i < samples_for (3); i++)
              g_assert_cmpfloat (samples[s][i], ==, 7.0f);
        }
    }

  for (int s = 0; s < 4; s++)
    {
      gepard_codec_stream_free (streams[s]);
      g_free (codes[s]);
      g_free (samples[s]);
      g_free (states[s]);
    }
}

/* nanocodec.md §6.1 table: 186,816 floats for the published codec, from its config alone. */
static void
test_state_size (void)
{
  const GepardCodecConfig *config = gepard_codec_get_config (codec);
  g_autoptr (GepardCodecStream) stream = gepard_codec_stream_new (codec);
  GepardCodecConfig published;
  gsize expected;

  gepard_codec_config_init_nanocodec_22khz (&published);
  g_assert_cmpuint (gepard_codec_stream_state_floats_for_config (&published), ==, 186816);

  /* the same table for the tiny widths: pre_conv 32 × 6, per stage C·s + 216·C (18 convs'
   * pads: 12 · (2 + 6 + 10)), post_conv 2 samples of the last width */
  expected = 32 * 6;
  for (int i = 0; i < config->decoder.n_stages; i++)
    {
      gsize channels = config->decoder.base_channels >> (i + 1);

      expected += channels * config->decoder.up_sample_rates[i] + 216 * channels;
    }
  expected += 2 * (config->decoder.base_channels >> config->decoder.n_stages);
  g_assert_cmpuint (gepard_codec_stream_state_floats_for_config (config), ==, expected);
  g_assert_cmpuint (gepard_codec_stream_state_bytes (stream), ==, expected * sizeof (float));
}

/* Threads split output channels and columns, never a sum: same bits with 1 or 3 threads. */
static void
test_threads_same_bits (void)
{
  g_autofree gint32 *codes = random_codes (15, N_FRAMES);
  g_autofree float *single = NULL, *multi = NULL;
  int before = gepard_codec_get_n_threads (codec);

  gepard_codec_set_n_threads (codec, 1);
  single = decode_one_shot (codes, N_FRAMES);
  gepard_codec_set_n_threads (codec, 3);
  multi = decode_one_shot (codes, N_FRAMES);
  gepard_codec_set_n_threads (codec, before);
  g_assert_cmpmem (single, N_FRAMES * samples_per_frame () * sizeof (float), multi,
                   N_FRAMES * samples_per_frame () * sizeof (float));
}

/* --- encoder --- */

static void
test_encode_length (void)
{
  const GepardCodecConfig *config = gepard_codec_get_config (codec);
  static const gsize lengths[] = {1, 1023, 1024, 1025, 3 * 1024 + 5};

  for (guint i = 0; i < G_N_ELEMENTS (lengths); i++)
    {
      g_autofree float *clip = test_clip (lengths[i], 21);
      g_autoptr (GError) error = NULL;
      g_autoptr (GArray) codes = gepard_codec_encode (codec, clip, lengths[i], &error);
      gsize frames = (lengths[i] + 1023) / 1024;

      g_assert_no_error (error);
      g_assert_nonnull (codes);
      g_assert_cmpuint (codes->len, ==, frames * 32);
      for (guint k = 0; k < codes->len; k++)
        {
          gint32 code = g_array_index (codes, gint32, k);

          g_assert_cmpint (code, >=, 0);
          g_assert_cmpint (code, <, config->fsq_levels[k % 4]);
        }
    }

  {
    g_autoptr (GError) error = NULL;
    g_autoptr (GArray) none = gepard_codec_encode (codec, NULL, 0, &error);

    g_assert_no_error (error);
    g_assert_cmpuint (none->len, ==, 0);
  }
}

/* §3.2: a clip is zero-padded at its end — the same latent as padding it by hand, and a
 * different one from padding it at the start. */
static void
test_encode_pads_at_end (void)
{
  gsize n = 2 * 1024 + 300;
  g_autofree float *clip = test_clip (n, 22);
  g_autofree float *padded = g_new0 (float, 3 * 1024);
  g_autofree float *front = g_new0 (float, 3 * 1024);
  g_autoptr (GArray) a = NULL, b = NULL, c = NULL;

  memcpy (padded, clip, n * sizeof (float));
  memcpy (front + (3 * 1024 - n), clip, n * sizeof (float));
  a = gepard_codec_encode_latent (codec, clip, n, NULL);
  b = gepard_codec_encode_latent (codec, padded, 3 * 1024, NULL);
  c = gepard_codec_encode_latent (codec, front, 3 * 1024, NULL);
  g_assert_nonnull (a);
  g_assert_nonnull (b);
  g_assert_nonnull (c);
  g_assert_cmpuint (a->len, ==, 3 * 32);
  g_assert_cmpmem (a->data, a->len * sizeof (float), b->data, b->len * sizeof (float));
  g_assert_true (memcmp (a->data, c->data, a->len * sizeof (float)) != 0);
}

/* nanocodec.md §6.2: windows with the receptive field as margin give one pass's bits. */
static void
test_encode_windows (void)
{
  gsize n = 30 * 1024 - 77;
  g_autofree float *clip = test_clip (n, 23);
  g_autoptr (GArray) whole = NULL, windowed = NULL;

  whole = gepard_codec_encode_latent (codec, clip, n, NULL);
  gepard_codec_set_encoder_window (codec, 8);
  windowed = gepard_codec_encode_latent (codec, clip, n, NULL);
  gepard_codec_set_encoder_window (codec, 0);
  g_assert_nonnull (whole);
  g_assert_nonnull (windowed);
  g_assert_cmpuint (whole->len, ==, 30 * 32);
  g_assert_cmpmem (whole->data, whole->len * sizeof (float), windowed->data,
                   windowed->len * sizeof (float));
}

static void
test_encode_bad_input (void)
{
  g_autofree float *clip = test_clip (2048, 24);
  g_autoptr (GError) error = NULL;
  g_autoptr (GArray) codes = NULL;

  clip[1500] = NAN;
  codes = gepard_codec_encode (codec, clip, 2048, &error);
  g_assert_null (codes);
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE);
  g_clear_error (&error);

  clip[1500] = INFINITY;
  codes = gepard_codec_encode (codec, clip, 2048, &error);
  g_assert_null (codes);
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE);
  g_clear_error (&error);

  /* loud but finite input is not an error */
  for (int i = 0; i < 2048; i++)
    clip[i] = (i % 2 == 0 ? 1e3f : -1e3f);
  codes = gepard_codec_encode (codec, clip, 2048, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (codes->len, ==, 2 * 32);
}

static void
test_open_errors (void)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *missing = g_build_filename (work_dir, "missing.safetensors", NULL);
  g_autofree char *truncated = g_build_filename (work_dir, "truncated.safetensors", NULL);
  g_autofree char *contents = NULL;
  gsize length = 0;

  g_assert_null (gepard_codec_new (missing, &error));
  g_assert_nonnull (error);
  g_clear_error (&error);

  g_assert_true (g_file_get_contents (codec_path, &contents, &length, NULL));
  g_assert_true (g_file_set_contents (truncated, contents, length / 2, NULL));
  g_assert_null (gepard_codec_new (truncated, &error));
  g_assert_nonnull (error);
}

/* The command-line tool reads and writes the layouts the parity test uses, and its portable
 * kernel (GEPARD_CODEC_GENERIC=1) agrees with this process's decode to fp32 rounding. */
static void
test_tool_decode (void)
{
  g_autofree char *tool
      = g_build_filename (g_getenv ("GEPARD_BUILD_DIR"), "tools", "gepard-codec-tool", NULL);
  g_autofree char *codes_path = g_build_filename (work_dir, "codes.safetensors", NULL);
  g_autofree char *out_path = g_build_filename (work_dir, "samples.safetensors", NULL);
  g_autofree gint32 *codes = random_codes (16, 6);
  g_autofree float *reference = decode_one_shot (codes, 6);
  g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
  g_autoptr (GepardSafetensors) out = NULL;
  g_autofree char *command = NULL;
  const GepardTensor *tensor;
  gint64 shape[2] = {6, 32};
  gsize n = 6 * samples_per_frame ();
  int status = 0;
  float max_diff = 0.0f;

  if (!g_file_test (tool, G_FILE_TEST_IS_EXECUTABLE))
    {
      g_test_skip ("gepard-codec-tool is not built");
      return;
    }
  gepard_safetensors_writer_add_data (writer, "codes", GEPARD_DTYPE_I32, 2, shape, codes);
  g_assert_true (gepard_safetensors_writer_write (writer, codes_path, NULL));
  command = g_strdup_printf ("env GEPARD_CODEC_GENERIC=1 '%s' decode '%s' '%s' '%s' --chunk 4",
                             tool, codec_path, codes_path, out_path);
  g_assert_true (g_spawn_command_line_sync (command, NULL, NULL, &status, NULL));
  g_assert_true (g_spawn_check_wait_status (status, NULL));

  out = gepard_safetensors_open (out_path, NULL);
  g_assert_nonnull (out);
  tensor = gepard_safetensors_lookup (out, "samples");
  g_assert_nonnull (tensor);
  g_assert_cmpint (tensor->dtype, ==, GEPARD_DTYPE_F32);
  g_assert_cmpuint (tensor->n_dims, ==, 1);
  g_assert_cmpint (tensor->shape[0], ==, (gint64)n);
  for (gsize i = 0; i < n; i++)
    {
      float value;

      memcpy (&value, tensor->data + i * 4, 4);
      max_diff = MAX (max_diff, fabsf (value - reference[i]));
    }
  g_test_message ("portable vs this process's kernel: max |difference| %.3g", max_diff);
  g_assert_cmpfloat (max_diff, <, 1e-4f);
}

int
main (int argc, char **argv)
{
  g_autofree char *cleanup = NULL;
  g_autoptr (GError) error = NULL;
  int result;

  test_program = g_strdup (argv[0]);
  g_test_init (&argc, &argv, NULL);
  work_dir = g_dir_make_tmp ("gepard-codec-XXXXXX", NULL);
  codec_path = g_build_filename (work_dir, "codec.safetensors", NULL);
  gepard_test_make_model ("--codec-only --preset tiny --seed 3 --format safetensors", codec_path);
  codec = gepard_codec_new (codec_path, &error);
  g_assert_no_error (error);
  weights = gepard_codec_weights_open (codec_path, &error);
  g_assert_no_error (error);

  g_test_add_func ("/codec/fsq/constants", test_fsq_constants);
  g_test_add_func ("/codec/fsq/lut", test_fsq_lut);
  g_test_add_func ("/codec/fsq/packing", test_fsq_packing);
  g_test_add_func ("/codec/fsq/rounding", test_fsq_rounding);
  g_test_add_func ("/codec/fsq/encode", test_fsq_encode);
  g_test_add_func ("/codec/decode/matches-reference", test_decode_matches_reference);
  g_test_add_func ("/codec/decode/streaming-matches-one-shot", test_streaming_matches_one_shot);
  g_test_add_func ("/codec/decode/causal-prefix", test_causal_prefix);
  g_test_add_func ("/codec/decode/output-range", test_output_range);
  g_test_add_func ("/codec/decode/silence-deterministic", test_silence_deterministic);
  g_test_add_func ("/codec/decode/bad-codes", test_bad_codes);
  g_test_add_func ("/codec/decode/batch-matches-streams", test_batch_matches_streams);
  g_test_add_func ("/codec/decode/batch-matches-streams-generic",
                   test_batch_matches_streams_generic);
  g_test_add_func ("/codec/decode/batch-bad-codes", test_batch_bad_codes);
  g_test_add_func ("/codec/decode/state-size", test_state_size);
  g_test_add_func ("/codec/decode/threads-same-bits", test_threads_same_bits);
  g_test_add_func ("/codec/encode/matches-reference", test_encode_matches_reference);
  g_test_add_func ("/codec/encode/length", test_encode_length);
  g_test_add_func ("/codec/encode/pads-at-end", test_encode_pads_at_end);
  g_test_add_func ("/codec/encode/windows", test_encode_windows);
  g_test_add_func ("/codec/encode/bad-input", test_encode_bad_input);
  g_test_add_func ("/codec/open-errors", test_open_errors);
  g_test_add_func ("/codec/tool-decode", test_tool_decode);
  result = g_test_run ();

  gepard_codec_weights_free (weights);
  gepard_codec_free (codec);
  g_free (codec_path);
  g_free (test_program);
  cleanup = g_strdup_printf ("rm -rf '%s'", work_dir);
  (void)!system (cleanup);
  g_free (work_dir);
  return result;
}
