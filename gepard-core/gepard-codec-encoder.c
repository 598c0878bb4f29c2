/* gepard-codec-encoder.c: NanoCodec's non-causal encoder (HiFiGANEncoder, nanocodec.md §3) and
 * GroupFSQ encoding (§4), for turning a reference clip into codes.
 *
 * A clip is encoded in windows: the frames [f0, f1) are computed from the clip's frames
 * [f0 − margin, f1 + margin) (clipped to the clip), as if that stretch were the whole clip. The
 * margin covers the encoder's receptive field (§6.2: 12722 samples each way, 13 frames), so the
 * replicated edges of a window only reach frames that are thrown away, and every kept frame sees
 * exactly the values — and, the kernels being position-independent, gets exactly the bits — of a
 * single pass over the clip. Memory then grows with the window, not with the clip. */
#include "gepard-codec-private.h"

#include "gepard-error.h"
#include "gepard-fsq.h"

#include <math.h>
#include <string.h>

#define DEFAULT_WINDOW_FRAMES 128

/* nanocodec.md §6.2: samples a latent frame depends on before its first sample (`left`) and after
 * its first sample (`right`). Each layer widens the field by its own reach at its own rate: a
 * non-causal conv by (k − 1)·d / 2 on both sides, a residual layer by its widest branch, a down
 * conv reading [i·r − p, i·r − p + 2r − 1] by p to the left and 2r − 1 − p to the right. */
static void
receptive_field (const GepardCodecConfig *config, gsize *left, gsize *right)
{
  const GepardCodecEncoderConfig *enc = &config->encoder;
  gsize step = 1, l, r;

  l = r = (gsize)(enc->in_kernel_size - 1) / 2;
  for (int i = 0; i < enc->n_stages; i++)
    {
      gsize widest = 0;
      int rate = enc->down_sample_rates[i];
      int pad = (rate + 1) / 2;

      for (int j = 0; j < enc->n_resblock_kernel_sizes; j++)
        {
          gsize half = (gsize)(enc->resblock_kernel_sizes[j] - 1) / 2;
          gsize reach = 0;

          for (int m = 0; m < enc->n_resblock_dilation_sizes; m++)
            reach += half * enc->resblock_dilation_sizes[m] + half;
          widest = MAX (widest, reach);
        }
      l += widest * step;
      r += widest * step;
      l += (gsize)pad * step;
      r += (gsize)(2 * rate - 1 - pad) * step;
      step *= rate;
    }
  l += (gsize)(enc->out_kernel_size - 1) / 2 * step;
  r += (gsize)(enc->out_kernel_size - 1) / 2 * step;
  *left = l;
  *right = r;
}

static int
margin_frames (const GepardCodecConfig *config)
{
  gsize left, right, spf = config->samples_per_frame;

  receptive_field (config, &left, &right);
  return (int)MAX ((left + spf - 1) / spf, (right + spf) / spf - 1);
}

/* nanocodec.md §3.4: the p columns on each side of a row's data [p, p + n) — copies of the edge
 * sample (replicate) or zeros. */
static void
pad_edges (float *in, gsize ld, int rows, int n, int p, GepardCodecPadMode mode)
{
  for (int c = 0; c < rows; c++)
    {
      float *row = in + (gsize)c * ld;
      float first = mode == GEPARD_CODEC_PAD_REPLICATE ? row[p] : 0.0f;
      float last = mode == GEPARD_CODEC_PAD_REPLICATE ? row[p + n - 1] : 0.0f;

      for (int i = 0; i < p; i++)
        {
          row[i] = first;
          row[p + n + i] = last;
        }
    }
}

static inline float
leaky_relu (float x)
{
  /* torch.nn.LeakyReLU(): slope 0.01 in fp32, as the activation kernel */
  return x > 0.0f ? x : x * 0.01f;
}

typedef struct
{
  float *cur;    /* the signal between layers */
  float *sum[2]; /* a residual branch's running value and the branch sum */
  float *input;  /* input conv input with its padding */
  float *skip;   /* skip conv input with its padding */
  float *memory;
  int input_pad; /* widest (k − 1)·d / 2 */
  int skip_pad;  /* widest (k − 1) / 2 */
} Scratch;

static void
scratch_init (Scratch *scratch, const GepardCodecConfig *config, int n_frames)
{
  const GepardCodecEncoderConfig *enc = &config->encoder;
  gsize columns = (gsize)n_frames * config->samples_per_frame;
  gsize size = 0;
  int pad = 0;

  scratch->input_pad = scratch->skip_pad = 0;
  for (int j = 0; j < enc->n_resblock_kernel_sizes; j++)
    {
      int half = (enc->resblock_kernel_sizes[j] - 1) / 2;

      scratch->skip_pad = MAX (scratch->skip_pad, half);
      for (int m = 0; m < enc->n_resblock_dilation_sizes; m++)
        scratch->input_pad = MAX (scratch->input_pad, half * enc->resblock_dilation_sizes[m]);
    }
  pad = MAX (scratch->input_pad, scratch->skip_pad);
  pad = MAX (pad, (enc->in_kernel_size - 1) / 2);
  pad = MAX (pad, (enc->out_kernel_size - 1) / 2);

  for (int i = 0; i <= enc->n_stages; i++)
    {
      gsize channels = gepard_codec_config_get_encoder_channels (config, i);

      /* a stage's signal with padding, and its polyphase view (rows C·r, one extra column) */
      size = MAX (size, channels * (2 * pad + gepard_round_columns (columns)));
      if (i < enc->n_stages)
        {
          columns /= enc->down_sample_rates[i];
          size = MAX (size, channels * enc->down_sample_rates[i]
                                * (gepard_round_columns (columns) + GEPARD_COLUMN_GROUP));
        }
    }
  size = MAX (size, (gsize)config->latent_dim * gepard_round_columns (n_frames));

  scratch->memory = g_new0 (float, 5 * size);
  scratch->cur = scratch->memory;
  scratch->sum[0] = scratch->memory + size;
  scratch->sum[1] = scratch->memory + 2 * size;
  scratch->input = scratch->memory + 3 * size;
  scratch->skip = scratch->memory + 4 * size;
}

/* nanocodec.md §3.3: a residual layer with non-causal, padded convs and LeakyReLU. */
static float *
res_layer (GepardCodec *codec, int i, const float *x, int n, Scratch *scratch)
{
  const GepardCodecEncoderConfig *enc = &codec->config.encoder;
  const GepardEncoderStage *stage = &codec->encoder.stages[i];
  GepardActivation lrelu = {stage->channels, 0, NULL, NULL};
  gsize ld = gepard_round_columns (n);
  gsize ld_input = 2 * scratch->input_pad + ld, ld_skip = 2 * scratch->skip_pad + ld;
  float *h = scratch->sum[0], *sum = scratch->sum[1];
  int n_branches = enc->n_resblock_kernel_sizes;

  for (int j = 0; j < n_branches; j++)
    {
      const float *src = x;
      int half = (enc->resblock_kernel_sizes[j] - 1) / 2;

      for (int m = 0; m < enc->n_resblock_dilation_sizes; m++)
        {
          const GepardResBlock *block = &stage->blocks[j][m];
          int p = half * enc->resblock_dilation_sizes[m];
          float *in = scratch->input + (scratch->input_pad - p);
          float *skip = scratch->skip + (scratch->skip_pad - half);

          gepard_activation_forward (&lrelu, src, ld, in + p, ld_input, n, codec->pool);
          pad_edges (in, ld_input, stage->channels, n, p, enc->pad_mode);
          gepard_conv_forward (&block->input_conv, in, ld_input, skip + half, ld_skip, NULL, 0, n,
                               codec->pool);
          gepard_activation_forward (&lrelu, skip + half, ld_skip, skip + half, ld_skip, n,
                                     codec->pool);
          pad_edges (skip, ld_skip, stage->channels, n, half, enc->pad_mode);
          gepard_conv_forward (&block->skip_conv, skip, ld_skip, h, ld, src, ld, n, codec->pool);
          src = h;
        }

      if (j == 0)
        {
          float *first = h;

          h = sum;
          sum = first;
        }
      else
        {
          for (gsize e = 0; e < (gsize)stage->channels * ld; e++)
            sum[e] += h[e];
        }
    }
  for (gsize e = 0; e < (gsize)stage->channels * ld; e++)
    sum[e] = sum[e] / (float)n_branches;
  return sum;
}

/* LeakyReLU, then the strided conv (§3.3) in polyphase form: rows (c, ρ) hold
 * act(x)[c][j·r + ρ − p] for j in [0, n/r + 1), the indices outside the signal padded. */
static void
down_sample (GepardCodec *codec, int i, const float *x, int n, float *phases, float *y)
{
  const GepardEncoderStage *stage = &codec->encoder.stages[i];
  GepardCodecPadMode mode = codec->config.encoder.pad_mode;
  gsize ld = gepard_round_columns (n);
  int r = stage->rate, p = stage->pad, n_out = n / r;
  gsize ld_phases = gepard_round_columns (n_out) + GEPARD_COLUMN_GROUP;

  for (int c = 0; c < stage->channels; c++)
    {
      const float *row = x + (gsize)c * ld;

      for (int phase = 0; phase < r; phase++)
        {
          float *dst = phases + ((gsize)c * r + phase) * ld_phases;

          for (int j = 0; j <= n_out; j++)
            {
              int at = j * r + phase - p;

              if (at >= 0 && at < n)
                dst[j] = leaky_relu (row[at]);
              else if (mode == GEPARD_CODEC_PAD_REPLICATE)
                dst[j] = leaky_relu (row[CLAMP (at, 0, n - 1)]);
              else
                dst[j] = 0.0f;
            }
        }
    }
  gepard_conv_forward (&stage->down_conv, phases, ld_phases, y, gepard_round_columns (n_out), NULL,
                       0, n_out, codec->pool);
}

/* The clip's frames [first, first + n_frames) encoded as a clip of their own → latent
 * [latent_dim][n_frames]. */
static void
encode_window (GepardCodec *codec, const float *samples, gsize n_samples, gsize first, int n_frames,
               float *latent)
{
  const GepardCodecConfig *config = &codec->config;
  const GepardCodecEncoderConfig *enc = &config->encoder;
  const GepardEncoder *encoder = &codec->encoder;
  GepardActivation lrelu;
  Scratch scratch;
  gsize begin = first * config->samples_per_frame;
  int n = n_frames * config->samples_per_frame;
  int p = (enc->in_kernel_size - 1) / 2;
  gsize ld = 2 * p + gepard_round_columns (n);
  const float *cur;

  scratch_init (&scratch, config, n_frames);

  /* §3.2: the clip, zero-padded at the end to whole frames; pre_conv pads it like every layer */
  for (int t = 0; t < n; t++)
    scratch.input[p + t] = begin + t < n_samples ? samples[begin + t] : 0.0f;
  pad_edges (scratch.input, ld, 1, n, p, enc->pad_mode);
  gepard_conv_forward (&encoder->pre_conv, scratch.input, ld, scratch.cur, gepard_round_columns (n),
                       NULL, 0, n, codec->pool);
  cur = scratch.cur;

  for (int i = 0; i < enc->n_stages; i++)
    {
      const float *out = res_layer (codec, i, cur, n, &scratch);

      down_sample (codec, i, out, n, scratch.input, scratch.cur);
      cur = scratch.cur;
      n /= enc->down_sample_rates[i];
    }

  /* post_activation (LeakyReLU) → post_conv; its raw output is the latent (§3.3) */
  p = (enc->out_kernel_size - 1) / 2;
  ld = 2 * p + gepard_round_columns (n);
  lrelu.channels = gepard_codec_config_get_encoder_channels (config, enc->n_stages);
  lrelu.n_snake = 0;
  lrelu.alpha = lrelu.inv_alpha = NULL;
  gepard_activation_forward (&lrelu, cur, gepard_round_columns (n), scratch.input + p, ld, n,
                             codec->pool);
  pad_edges (scratch.input, ld, lrelu.channels, n, p, enc->pad_mode);
  gepard_conv_forward (&encoder->post_conv, scratch.input, ld, latent, n_frames, NULL, 0, n,
                       codec->pool);
  g_free (scratch.memory);
}

GArray *
gepard_codec_encode_latent (GepardCodec *codec, const float *samples, gsize n_samples,
                            GError **error)
{
  const GepardCodecConfig *config;
  g_autoptr (GArray) result = NULL;
  g_autofree float *latent = NULL;
  gsize spf, n_frames;
  int window, margin, latent_dim;

  g_return_val_if_fail (codec != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  config = &codec->config;
  spf = config->samples_per_frame;
  latent_dim = config->latent_dim;
  result = g_array_new (FALSE, FALSE, sizeof (float));
  if (n_samples == 0)
    return g_steal_pointer (&result);
  if (samples == NULL)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "No samples for a clip of %" G_GSIZE_FORMAT " samples", n_samples);
      return NULL;
    }
  for (gsize t = 0; t < n_samples; t++)
    {
      if (!isfinite (samples[t]))
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                       "Sample %" G_GSIZE_FORMAT " of the clip is not a finite number", t);
          return NULL;
        }
    }
  /* §3.2: zero-pad at the end to a multiple of samples_per_frame */
  n_frames = (n_samples + spf - 1) / spf;
  if (n_frames > G_MAXINT / spf)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "A clip of %" G_GSIZE_FORMAT " samples is too long to encode", n_samples);
      return NULL;
    }

  window = codec->encoder_window > 0 ? codec->encoder_window : DEFAULT_WINDOW_FRAMES;
  margin = margin_frames (config);
  if (n_frames <= (gsize)window + 2 * margin)
    window = (int)n_frames;

  g_array_set_size (result, n_frames * latent_dim);
  latent = g_new (float, result->len);
  for (gsize f0 = 0; f0 < n_frames; f0 += window)
    {
      gsize f1 = MIN (n_frames, f0 + window);
      gsize a = f0 > (gsize)margin ? f0 - margin : 0;
      gsize b = MIN (n_frames, f1 + margin);
      int n = (int)(b - a);

      encode_window (codec, samples, n_samples, a, n, latent);
      /* keep [f0, f1), stored frame-major */
      for (gsize t = f0; t < f1; t++)
        for (int c = 0; c < latent_dim; c++)
          g_array_index (result, float, t *latent_dim + c) = latent[(gsize)c * n + (t - a)];
    }

  for (guint e = 0; e < result->len; e++)
    {
      if (!isfinite (g_array_index (result, float, e)))
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                       "The encoder's output overflowed (is the clip's amplitude sane?)");
          return NULL;
        }
    }
  return g_steal_pointer (&result);
}

GArray *
gepard_codec_encode (GepardCodec *codec, const float *samples, gsize n_samples, GError **error)
{
  g_autoptr (GArray) latent = NULL;
  GArray *codes;
  gsize n_frames;

  g_return_val_if_fail (codec != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  latent = gepard_codec_encode_latent (codec, samples, n_samples, error);
  if (latent == NULL)
    return NULL;
  n_frames = latent->len / codec->config.latent_dim;
  codes = g_array_sized_new (FALSE, FALSE, sizeof (gint32), latent->len);
  g_array_set_size (codes, latent->len);
  /* §4: GroupFSQ per channel, unfolded codes */
  gepard_fsq_encode (&codec->config, (const float *)latent->data, n_frames, (gint32 *)codes->data);
  return codes;
}
