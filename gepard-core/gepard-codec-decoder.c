/* gepard-codec-decoder.c: NanoCodec's causal decoder (nanocodec.md §2), one-shot and streamed.
 *
 * Both paths run the same block function: a block of frames goes through every layer with each
 * causal conv reading [cached history | new columns] and each transposed conv adding its carried
 * overlap (§6.1 steps 1–5). One-shot decoding starts from zero state — exactly NeMo's zero left
 * padding (§2.3) — and a stream keeps its state between calls. Long inputs are cut into blocks of
 * at most MAX_BLOCK_FRAMES frames to bound memory; as every kernel computes each element the same
 * way wherever it sits in a block (gepard-codec-kernels.c), the cut points never change a bit. */
#include "gepard-codec-private.h"

#include "gepard-error.h"
#include "gepard-fsq.h"

#include <math.h>
#include <string.h>

#define MAX_BLOCK_FRAMES 32

typedef struct
{
  float *act;    /* latent, stage activation output, post activation output */
  float *x;      /* pre_conv output, transposed conv output = residual layer input */
  float *sum[2]; /* a residual branch's running value and the sum of the branches */
  float *input;  /* residual input conv's input with its history in front */
  float *skip;   /* residual skip conv's input with its history in front */
  float *memory;
  int n_frames; /* the block size the buffers are sized for */
} Scratch;

struct _GepardCodecStream
{
  GepardCodec *codec;
  float *state;    /* codec->state_layout.total floats */
  Scratch scratch; /* kept between calls: a frame-by-frame stream would otherwise allocate and
                    * clear its buffers for every frame */
};

void
gepard_state_layout_init (GepardStateLayout *layout, const GepardCodecConfig *config)
{
  const GepardCodecDecoderConfig *dec = &config->decoder;
  gsize at = 0;

  memset (layout, 0, sizeof *layout);

  /* nanocodec.md §6.1 table: pre_conv keeps its last (k − 1) latent frames */
  layout->pre_conv = at;
  at += (gsize)config->latent_dim * (dec->in_kernel_size - 1);
  for (int i = 0; i < dec->n_stages; i++)
    {
      gsize channels = gepard_codec_config_get_decoder_channels (config, i + 1);

      /* the transposed conv's bias-free overlap: s samples per output channel */
      layout->carry[i] = at;
      at += channels * dec->up_sample_rates[i];
      /* every residual conv: C × its left pad (k − 1)·d */
      for (int j = 0; j < dec->n_resblock_kernel_sizes; j++)
        {
          gsize taps = dec->resblock_kernel_sizes[j] - 1;

          for (int m = 0; m < dec->n_resblock_dilation_sizes; m++)
            {
              layout->res_input[i][j][m] = at;
              at += channels * taps * dec->resblock_dilation_sizes[m];
              layout->res_skip[i][j][m] = at;
              at += channels * taps;
            }
        }
    }
  layout->post_conv = at;
  at += (gsize)gepard_codec_config_get_decoder_channels (config, dec->n_stages)
        * (dec->out_kernel_size - 1);
  layout->total = at;
}

gsize
gepard_codec_stream_state_floats_for_config (const GepardCodecConfig *config)
{
  GepardStateLayout layout;

  g_return_val_if_fail (config != NULL, 0);
  g_return_val_if_fail (gepard_codec_config_validate (config, NULL), 0);

  gepard_state_layout_init (&layout, config);
  return layout.total;
}

/* --- the block function --- */

static int
max_input_history (const GepardCodecDecoderConfig *dec)
{
  int best = 0;

  for (int j = 0; j < dec->n_resblock_kernel_sizes; j++)
    for (int m = 0; m < dec->n_resblock_dilation_sizes; m++)
      best = MAX (best, (dec->resblock_kernel_sizes[j] - 1) * dec->resblock_dilation_sizes[m]);
  return best;
}

static int
max_skip_history (const GepardCodecDecoderConfig *dec)
{
  int best = 0;

  for (int j = 0; j < dec->n_resblock_kernel_sizes; j++)
    best = MAX (best, dec->resblock_kernel_sizes[j] - 1);
  return best;
}

/* Floats each scratch buffer needs for a block of n frames. */
static gsize
scratch_floats (const GepardCodecConfig *config, int n)
{
  const GepardCodecDecoderConfig *dec = &config->decoder;
  gsize history = MAX (max_input_history (dec), max_skip_history (dec));
  gsize columns = n;
  gsize size;

  size = (gsize)config->latent_dim * (dec->in_kernel_size - 1 + gepard_round_columns (columns));
  for (int i = 0; i <= dec->n_stages; i++)
    {
      gsize channels = gepard_codec_config_get_decoder_channels (config, i);
      gsize rounded = gepard_round_columns (columns);

      size = MAX (size, channels * (history + rounded));
      size = MAX (size, channels * (dec->out_kernel_size - 1 + rounded));
      if (i < dec->n_stages)
        columns *= dec->up_sample_rates[i];
    }
  return size;
}

/* Buffers for blocks of up to n frames; kept when already large enough. */
static void
scratch_reserve (Scratch *scratch, const GepardCodecConfig *config, int n)
{
  gsize size;

  if (scratch->memory != NULL && scratch->n_frames >= n)
    return;
  g_free (scratch->memory);
  size = scratch_floats (config, n);
  scratch->n_frames = n;

  /* zeroed once: the columns past a row's valid ones only feed discarded lanes, but should hold
   * ordinary numbers */
  scratch->memory = g_new0 (float, 6 * size);
  scratch->act = scratch->memory;
  scratch->x = scratch->memory + size;
  scratch->sum[0] = scratch->memory + 2 * size;
  scratch->sum[1] = scratch->memory + 3 * size;
  scratch->input = scratch->memory + 4 * size;
  scratch->skip = scratch->memory + 5 * size;
}

/* nanocodec.md §6.1 step 2: a causal conv reads [cached (k − 1)·d columns | n new columns]
 * (`in` points at the first cached column; the caller has written the new ones) and leaves the
 * last (k − 1)·d columns of that concatenation — post-activation values — in the cache. */
static void
causal_conv (const GepardConv *conv, float *in, gsize ld, float *cache, int n, float *y, gsize ldy,
             const float *residual, gsize ldr, GepardCodecPool *pool)
{
  gsize history = (gsize)(conv->kernel - 1) * conv->dilation;

  for (int c = 0; c < conv->rows; c++)
    memcpy (in + (gsize)c * ld, cache + c * history, history * sizeof (float));
  gepard_conv_forward (conv, in, ld, y, ldy, residual, ldr, n, pool);
  for (int c = 0; c < conv->rows; c++)
    memcpy (cache + c * history, in + (gsize)c * ld + n, history * sizeof (float));
}

/* nanocodec.md §2.3 and §6.1 step 3: the grouped transposed conv (kernel 2s, stride s, groups =
 * C_out). Input frame i contributes a[2j][i]·W[2j][m] + a[2j+1][i]·W[2j+1][m] to output sample
 * i·s + m of channel j, m < 2s. Output sample i·s + m (m < s) is (older frame's tail + this frame's
 * head) + bias, the older tail coming from the carry at i = 0; the last frame's bias-free tail is
 * carried to the next call. The order is the same in both paths, so the sums agree bit for bit. */
static void
up_sample (const GepardDecoderStage *stage, const float *a, gsize lda, int n_in, float *y,
           gsize ldy, float *carry)
{
  int s = stage->rate;

  for (int j = 0; j < stage->channels; j++)
    {
      const float *w0 = stage->up_weight + (gsize)(2 * j) * 2 * s;
      const float *w1 = w0 + 2 * s;
      const float *a0 = a + (gsize)(2 * j) * lda;
      const float *a1 = a0 + lda;
      float *tail = carry + (gsize)j * s;
      float *yj = y + (gsize)j * ldy;
      float bias = stage->up_bias[j];

      for (int i = 0; i < n_in; i++)
        {
          float x0 = a0[i], x1 = a1[i];

          for (int m = 0; m < s; m++)
            {
              float head = x0 * w0[m] + x1 * w1[m];

              yj[(gsize)i * s + m] = (tail[m] + head) + bias;
            }
          for (int m = 0; m < s; m++)
            tail[m] = x0 * w0[s + m] + x1 * w1[s + m];
        }
    }
}

/* nanocodec.md §2.2: the mean of parallel branches (kernels k_j), each a chain of residual blocks
 * (dilations d_m): h = x + skip_conv(act(input_conv(act(x)))). Returns the buffer holding the
 * result (one of scratch->sum). */
static float *
res_layer (GepardCodec *codec, int i, const float *x, int n, float *state, Scratch *scratch)
{
  const GepardCodecDecoderConfig *dec = &codec->config.decoder;
  const GepardStateLayout *layout = &codec->state_layout;
  const GepardDecoderStage *stage = &codec->decoder.stages[i];
  int input_history = max_input_history (dec), skip_history = max_skip_history (dec);
  gsize ld = gepard_round_columns (n);
  gsize ld_input = input_history + ld, ld_skip = skip_history + ld;
  float *h = scratch->sum[0], *sum = scratch->sum[1];
  int n_branches = dec->n_resblock_kernel_sizes;

  for (int j = 0; j < n_branches; j++)
    {
      const float *src = x;
      int taps = dec->resblock_kernel_sizes[j] - 1;

      for (int m = 0; m < dec->n_resblock_dilation_sizes; m++)
        {
          const GepardResBlock *block = &stage->blocks[j][m];
          int in_history = taps * dec->resblock_dilation_sizes[m];
          float *in = scratch->input + (input_history - in_history);
          float *skip = scratch->skip + (skip_history - taps);

          gepard_activation_forward (&block->input_act, src, ld, in + in_history, ld_input, n,
                                     codec->pool);
          causal_conv (&block->input_conv, in, ld_input, state + layout->res_input[i][j][m], n,
                       skip + taps, ld_skip, NULL, 0, codec->pool);
          gepard_activation_forward (&block->skip_act, skip + taps, ld_skip, skip + taps, ld_skip,
                                     n, codec->pool);
          causal_conv (&block->skip_conv, skip, ld_skip, state + layout->res_skip[i][j][m], n, h,
                       ld, src, ld, codec->pool);
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
          /* (b3 + b7) + b11, in branch order as Python's sum() */
          for (gsize e = 0; e < (gsize)stage->channels * ld; e++)
            sum[e] += h[e];
        }
    }

  /* a true division, as NeMo's sum(...) / len(...) */
  for (gsize e = 0; e < (gsize)stage->channels * ld; e++)
    sum[e] = sum[e] / (float)n_branches;
  return sum;
}

/* n frames of checked codes → n × samples_per_frame samples, advancing `state`. */
static void
decode_block (GepardCodec *codec, float *state, const gint32 *codes, int n, float *samples,
              Scratch *scratch)
{
  const GepardCodecConfig *config = &codec->config;
  const GepardCodecDecoderConfig *dec = &config->decoder;
  const GepardDecoder *decoder = &codec->decoder;
  const GepardStateLayout *layout = &codec->state_layout;
  int latent_dim = config->latent_dim;
  int history = dec->in_kernel_size - 1;
  gsize ld = history + gepard_round_columns (n);
  gsize n_values = (gsize)n * latent_dim;
  g_autofree float *latent = g_new (float, n_values);
  const float *cur;
  int columns = n;

  /* §6.1 step 1: FSQ decode, pointwise in time, into channel-major columns after the history */
  gepard_fsq_decode (config, codes, n, latent);
  for (int c = 0; c < latent_dim; c++)
    for (int t = 0; t < n; t++)
      scratch->act[(gsize)c * ld + history + t] = latent[(gsize)t * latent_dim + c];
  causal_conv (&decoder->pre_conv, scratch->act, ld, state + layout->pre_conv, n, scratch->x,
               gepard_round_columns (n), NULL, 0, codec->pool);
  cur = scratch->x;

  for (int i = 0; i < dec->n_stages; i++)
    {
      const GepardDecoderStage *stage = &decoder->stages[i];
      gsize ld_in = gepard_round_columns (columns);
      int n_out = columns * stage->rate;

      gepard_activation_forward (&stage->act, cur, ld_in, scratch->act, ld_in, columns,
                                 codec->pool);
      up_sample (stage, scratch->act, ld_in, columns, scratch->x, gepard_round_columns (n_out),
                 state + layout->carry[i]);
      columns = n_out;
      cur = res_layer (codec, i, scratch->x, columns, state, scratch);
    }

  /* post_activation → post_conv (k = 3, causal) → output activation */
  {
    int post_history = dec->out_kernel_size - 1;
    gsize ld_cur = gepard_round_columns (columns);
    gsize ld_post = post_history + ld_cur;

    gepard_activation_forward (&decoder->post_act, cur, ld_cur, scratch->act + post_history,
                               ld_post, columns, codec->pool);
    causal_conv (&decoder->post_conv, scratch->act, ld_post, state + layout->post_conv, columns,
                 samples, columns, NULL, 0, codec->pool);
  }

  if (dec->output_activation == GEPARD_CODEC_OUTPUT_TANH)
    {
      for (int t = 0; t < columns; t++)
        samples[t] = (float)tanh ((double)samples[t]);
    }
  else
    {
      /* nanocodec.md §2.3: clamp(x, −1, 1) */
      for (int t = 0; t < columns; t++)
        samples[t] = samples[t] < -1.0f ? -1.0f : samples[t] > 1.0f ? 1.0f : samples[t];
    }
}

static gboolean
decode_frames (GepardCodec *codec, float *state, Scratch *scratch, const gint32 *codes,
               int n_frames, float *samples, GError **error)
{
  const GepardCodecConfig *config = &codec->config;
  int block;

  if (n_frames < 0)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "Cannot decode a negative number of frames (%d)", n_frames);
      return FALSE;
    }
  if (n_frames == 0)
    return TRUE;
  if (codes == NULL || samples == NULL)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "No codes or no sample buffer for %d frames", n_frames);
      return FALSE;
    }
  /* everything is checked before the state moves, so a bad frame leaves a stream as it was */
  if (!gepard_fsq_check_codes (config, codes, n_frames, error))
    return FALSE;

  block = MIN (n_frames, MAX_BLOCK_FRAMES);
  scratch_reserve (scratch, config, block);
  for (int done = 0; done < n_frames; done += block)
    {
      int n = MIN (block, n_frames - done);

      decode_block (codec, state, codes + (gsize)done * config->latent_dim, n,
                    samples + (gsize)done * config->samples_per_frame, scratch);
    }
  return TRUE;
}

/* --- public API --- */

GepardCodecStream *
gepard_codec_stream_new (GepardCodec *codec)
{
  GepardCodecStream *stream;

  g_return_val_if_fail (codec != NULL, NULL);

  stream = g_new0 (GepardCodecStream, 1);
  stream->codec = codec;
  /* §6.1: all caches start at zero, which equals NeMo's zero left padding */
  stream->state = g_new0 (float, MAX (codec->state_layout.total, 1));
  return stream;
}

void
gepard_codec_stream_free (GepardCodecStream *stream)
{
  if (stream == NULL)
    return;

  g_free (stream->scratch.memory);
  g_free (stream->state);
  g_free (stream);
}

void
gepard_codec_stream_reset (GepardCodecStream *stream)
{
  g_return_if_fail (stream != NULL);

  memset (stream->state, 0, stream->codec->state_layout.total * sizeof (float));
}

gboolean
gepard_codec_stream_decode (GepardCodecStream *stream, const gint32 *codes, int n_frames,
                            float *samples, GError **error)
{
  g_return_val_if_fail (stream != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  return decode_frames (stream->codec, stream->state, &stream->scratch, codes, n_frames, samples,
                        error);
}

gsize
gepard_codec_stream_state_bytes (const GepardCodecStream *stream)
{
  g_return_val_if_fail (stream != NULL, 0);

  return stream->codec->state_layout.total * sizeof (float);
}

gboolean
gepard_codec_decode (GepardCodec *codec, const gint32 *codes, int n_frames, float *samples,
                     GError **error)
{
  g_autofree float *state = NULL;
  Scratch scratch = {0};
  gboolean ok;

  g_return_val_if_fail (codec != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  /* zero history = NeMo's zero left padding of every causal conv (§2.3) */
  state = g_new0 (float, MAX (codec->state_layout.total, 1));
  ok = decode_frames (codec, state, &scratch, codes, n_frames, samples, error);
  g_free (scratch.memory);
  return ok;
}
