/* gepard-codec-decoder.c: NanoCodec's causal decoder (nanocodec.md §2), one-shot and streamed,
 * for one stream or a batch of them.
 *
 * Every path runs the same block function: a block of frames goes through every layer with each
 * causal conv reading [cached history | new columns] and each transposed conv adding its carried
 * overlap (§6.1 steps 1–5). One-shot decoding starts from zero state — exactly NeMo's zero left
 * padding (§2.3) — and a stream keeps its state between calls. Long inputs are cut into blocks of
 * at most MAX_BLOCK_FRAMES frames to bound memory; as every kernel computes each element the same
 * way wherever it sits in a block (gepard-codec-kernels.c), the cut points never change a bit.
 *
 * A batch takes the blocks of many streams through the first layers together, each stream on its
 * own state and buffers. Pointwise work stays per stream; a causal conv at a layer where streams
 * have few columns (a frame is one column at the pre_conv, rate_0 at the first stage) runs as one
 * GEMM over all those streams' columns, reading its weights once instead of once per stream, and
 * gives each element the bits it gets alone (see conv_batched). From the first stage where no
 * conv would batch, each stream finishes its block alone. A single stream is a batch of one. */
#include "gepard-codec-private.h"

#include "gepard-error.h"
#include "gepard-fsq.h"

#include <math.h>
#include <string.h>

#define MAX_BLOCK_FRAMES 32

/* A causal conv runs batched for the streams with at most this many new columns at its layer:
 * alone, such a stream reads the conv's whole weight matrix for one or two column groups (and
 * with fewer than 16 columns takes the narrower, slower kernel), while at the later layers
 * (hundreds of columns per frame) a stream keeps the kernel busy by itself and unfolding its input
 * would only add copies. */
#define BATCH_MAX_COLUMNS 16

/* The unfolded matrix of a batched conv is stored in panels of this many columns, each
 * [rows · kernel][PANEL_COLUMNS]: the convolution kernel's widest tile then reads one contiguous
 * 64-byte line per row rather than a piece of a long row, and each panel is one GEMM call. */
#define PANEL_COLUMNS (2 * GEPARD_COLUMN_GROUP)

/* A batched conv's unfolded input (rows × kernel × columns) is built in pieces of at most this
 * many floats (16 MiB), cut between streams. */
#define BATCH_MAX_FLOATS ((gsize)1 << 22)

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

/* --- causal convs over a batch of streams --- */

/* One stream's operands of a causal conv: its input `in` starts at the first cached column (the
 * new columns already written after them), its history lives in `cache`; y (+ residual) receives
 * the n new output columns. */
typedef struct
{
  float *in;
  gsize ld;
  float *cache;
  float *y;
  gsize ldy;
  const float *residual;
  gsize ldr;
  int n;
  gboolean batched; /* computed with the other streams' columns */
  gsize column;     /* where its columns start in the unfolded matrix */
} ConvSlot;

/* The batched convs' unfolded inputs and outputs, 64-byte aligned like the panels' rows; grown
 * as needed, kept for one call. */
typedef struct
{
  float *memory;
  gsize size;
} BatchWork;

static gsize
round_panels (gsize n)
{
  return (n + PANEL_COLUMNS - 1) / PANEL_COLUMNS * PANEL_COLUMNS;
}

typedef struct
{
  const ConvSlot *slots; /* the batched ones among them */
  int n_slots;
  int kernel;
  int dilation;
  gsize panel_size; /* rows · kernel · PANEL_COLUMNS */
  float *x;         /* the unfolded input, in panels */
  float *y;         /* [out_channels][ldy] */
  gsize ldy;
  gsize n_columns;
} BatchConvJob;

/* Row r · kernel + m of the unfolded matrix holds, for every batched stream, its input row r
 * from tap m on: x[r][t + m·dilation] for its new columns t. One work item per input row. */
static void
unfold_item (gpointer data, int r)
{
  const BatchConvJob *job = data;

  for (int m = 0; m < job->kernel; m++)
    {
      float *row = job->x + ((gsize)r * job->kernel + m) * PANEL_COLUMNS;

      for (int s = 0; s < job->n_slots; s++)
        {
          const ConvSlot *slot = &job->slots[s];
          const float *src = slot->in + (gsize)r * slot->ld + (gsize)m * job->dilation;

          if (!slot->batched)
            continue;
          /* in runs that end at panel boundaries */
          for (int t = 0, run; t < slot->n; t += run)
            {
              gsize column = slot->column + t, lane = column % PANEL_COLUMNS;
              float *dst = row + column / PANEL_COLUMNS * job->panel_size + lane;

              run = (int)MIN ((gsize)(slot->n - t), PANEL_COLUMNS - lane);
              for (int u = 0; u < run; u++)
                dst[u] = src[t + u];
            }
        }
      /* the last panel's spare lanes only feed discarded outputs, but should hold ordinary
       * numbers */
      for (gsize column = job->n_columns; column % PANEL_COLUMNS != 0; column++)
        row[column / PANEL_COLUMNS * job->panel_size + column % PANEL_COLUMNS] = 0.0f;
    }
}

/* One work item per output channel: the streams' residual rows side by side in y. */
static void
gather_residual_item (gpointer data, int o)
{
  const BatchConvJob *job = data;

  for (int s = 0; s < job->n_slots; s++)
    {
      const ConvSlot *slot = &job->slots[s];

      if (slot->batched)
        memcpy (job->y + (gsize)o * job->ldy + slot->column, slot->residual + (gsize)o * slot->ldr,
                slot->n * sizeof (float));
    }
}

/* One work item per output channel: each stream's columns of y back to its own output. */
static void
scatter_item (gpointer data, int o)
{
  const BatchConvJob *job = data;

  for (int s = 0; s < job->n_slots; s++)
    {
      const ConvSlot *slot = &job->slots[s];

      if (slot->batched)
        memcpy (slot->y + (gsize)o * slot->ldy, job->y + (gsize)o * job->ldy + slot->column,
                slot->n * sizeof (float));
    }
}

/* The batched slots among `slots` as one GEMM over an explicitly unfolded input. The packed
 * weights [tile][row][tap][TILE_ROWS] are, read as [tile][row · kernel + tap][1][TILE_ROWS], a
 * kernel-1 conv over that matrix whose every output element is the same chain of fused
 * multiply-adds, in the same (row, tap) order, over the same values, followed by the same bias and
 * residual additions: the bits of the stream alone, with every stream's columns side by side. */
static void
conv_batched (GepardCodec *codec, const GepardConv *conv, ConvSlot *slots, int n_slots,
              BatchWork *work)
{
  GepardConv unfolded = *conv;
  BatchConvJob job = {slots, n_slots, conv->kernel, conv->dilation, 0, NULL, NULL, 0, 0};
  gboolean residual = FALSE;
  gsize n_panels, need;

  for (int s = 0; s < n_slots; s++)
    {
      if (!slots[s].batched)
        continue;
      slots[s].column = job.n_columns;
      job.n_columns += slots[s].n;
      residual = slots[s].residual != NULL;
    }
  unfolded.rows = conv->rows * conv->kernel;
  unfolded.kernel = 1;
  unfolded.dilation = 1;
  job.ldy = round_panels (job.n_columns);
  n_panels = job.ldy / PANEL_COLUMNS;
  job.panel_size = (gsize)unfolded.rows * PANEL_COLUMNS;

  need = ((gsize)unfolded.rows + conv->out_channels) * job.ldy;
  if (work->size < need)
    {
      g_aligned_free (work->memory);
      work->memory = g_aligned_alloc (need, sizeof (float), 64);
      work->size = need;
    }
  job.x = work->memory;
  job.y = work->memory + n_panels * job.panel_size;

  gepard_codec_pool_run (codec->pool, unfold_item, &job, conv->rows,
                         unfolded.rows * job.n_columns >= 65536);
  if (residual)
    gepard_codec_pool_run (codec->pool, gather_residual_item, &job, conv->out_channels,
                           conv->out_channels * job.n_columns >= 65536);
  for (gsize p = 0; p < n_panels; p++)
    {
      float *y = job.y + p * PANEL_COLUMNS;
      int columns = (int)MIN (PANEL_COLUMNS, job.n_columns - p * PANEL_COLUMNS);

      gepard_conv_forward (&unfolded, job.x + p * job.panel_size, PANEL_COLUMNS, y, job.ldy,
                           residual ? y : NULL, job.ldy, columns, codec->pool);
    }
  gepard_codec_pool_run (codec->pool, scatter_item, &job, conv->out_channels,
                         conv->out_channels * job.n_columns >= 65536);
}

/* nanocodec.md §6.1 step 2, for each stream of a batch: a causal conv reads [cached (k − 1)·d
 * columns | n new columns] and leaves the last (k − 1)·d columns of that concatenation —
 * post-activation values — in the cache. Streams with few new columns share one GEMM, so that
 * the weights are read once for all of them; the others run alone, where their own columns
 * already keep the kernel busy. Either way gives the same bits. */
static void
causal_conv (GepardCodec *codec, const GepardConv *conv, ConvSlot *slots, int n_slots,
             BatchWork *work)
{
  gsize history = (gsize)(conv->kernel - 1) * conv->dilation;
  gsize unfolded_rows = (gsize)conv->rows * conv->kernel;
  int n_batched = 0;

  for (int s = 0; s < n_slots; s++)
    {
      ConvSlot *slot = &slots[s];

      for (int c = 0; c < conv->rows; c++)
        memcpy (slot->in + (gsize)c * slot->ld, slot->cache + c * history,
                history * sizeof (float));
      slot->batched = slot->n <= BATCH_MAX_COLUMNS;
      n_batched += slot->batched;
    }
  /* a batch of one gains nothing over the stream's own conv */
  if (n_batched < 2)
    for (int s = 0; s < n_slots; s++)
      slots[s].batched = FALSE;

  for (int s = 0; s < n_slots; s++)
    {
      const ConvSlot *slot = &slots[s];

      if (!slot->batched)
        gepard_conv_forward (conv, slot->in, slot->ld, slot->y, slot->ldy, slot->residual,
                             slot->ldr, slot->n, codec->pool);
    }

  /* the batched streams in runs whose unfolded input stays within BATCH_MAX_FLOATS */
  for (int begin = 0, end; begin < n_slots; begin = end)
    {
      gsize columns = 0;

      for (end = begin; end < n_slots; end++)
        {
          if (!slots[end].batched)
            continue;
          if (columns > 0
              && unfolded_rows * round_panels (columns + slots[end].n) > BATCH_MAX_FLOATS)
            break;
          columns += slots[end].n;
        }
      if (columns > 0)
        conv_batched (codec, conv, slots + begin, end - begin, work);
    }

  for (int s = 0; s < n_slots; s++)
    {
      const ConvSlot *slot = &slots[s];

      for (int c = 0; c < conv->rows; c++)
        memcpy (slot->cache + c * history, slot->in + (gsize)c * slot->ld + slot->n,
                history * sizeof (float));
    }
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

/* --- the block function --- */

/* One stream's part of a block: its state and buffers, this block's frames, and where the block
 * stands in it as it goes through the layers. */
typedef struct
{
  float *state;
  Scratch *scratch;
  const gint32 *codes;
  float *samples;
  int n_frames;
  int columns;      /* time columns at the current layer */
  const float *cur; /* the current layer's input, rows gepard_round_columns (columns) apart */
} BlockItem;

/* nanocodec.md §2.2: the mean of parallel branches (kernels k_j), each a chain of residual blocks
 * (dilations d_m): h = x + skip_conv(act(input_conv(act(x)))). Leaves each stream's result (one of
 * its scratch->sum) in its `cur`. */
static void
res_layer (GepardCodec *codec, int i, BlockItem *items, int n_items, ConvSlot *slots,
           BatchWork *work)
{
  const GepardCodecDecoderConfig *dec = &codec->config.decoder;
  const GepardStateLayout *layout = &codec->state_layout;
  const GepardDecoderStage *stage = &codec->decoder.stages[i];
  int input_history = max_input_history (dec), skip_history = max_skip_history (dec);
  int n_branches = dec->n_resblock_kernel_sizes;
  /* every stream uses its scratch->sum[h_index] for the running branch, the other for the sum */
  int h_index = 0;

  for (int j = 0; j < n_branches; j++)
    {
      int taps = dec->resblock_kernel_sizes[j] - 1;

      for (int m = 0; m < dec->n_resblock_dilation_sizes; m++)
        {
          const GepardResBlock *block = &stage->blocks[j][m];
          int in_history = taps * dec->resblock_dilation_sizes[m];

          for (int b = 0; b < n_items; b++)
            {
              Scratch *scratch = items[b].scratch;
              int n = items[b].columns;
              gsize ld = gepard_round_columns (n), ld_input = input_history + ld;
              const float *src = m == 0 ? scratch->x : scratch->sum[h_index];
              float *in = scratch->input + (input_history - in_history);

              gepard_activation_forward (&block->input_act, src, ld, in + in_history, ld_input, n,
                                         codec->pool);
              slots[b] = (ConvSlot){.in = in,
                                    .ld = ld_input,
                                    .cache = items[b].state + layout->res_input[i][j][m],
                                    .y = scratch->skip + skip_history,
                                    .ldy = skip_history + ld,
                                    .n = n};
            }
          causal_conv (codec, &block->input_conv, slots, n_items, work);

          for (int b = 0; b < n_items; b++)
            {
              Scratch *scratch = items[b].scratch;
              int n = items[b].columns;
              gsize ld = gepard_round_columns (n), ld_skip = skip_history + ld;
              const float *src = m == 0 ? scratch->x : scratch->sum[h_index];
              float *skip = scratch->skip + (skip_history - taps);

              gepard_activation_forward (&block->skip_act, skip + taps, ld_skip, skip + taps,
                                         ld_skip, n, codec->pool);
              slots[b] = (ConvSlot){.in = skip,
                                    .ld = ld_skip,
                                    .cache = items[b].state + layout->res_skip[i][j][m],
                                    .y = scratch->sum[h_index],
                                    .ldy = ld,
                                    .residual = src,
                                    .ldr = ld,
                                    .n = n};
            }
          causal_conv (codec, &block->skip_conv, slots, n_items, work);
        }

      if (j == 0)
        {
          /* the first branch's result becomes the sum */
          h_index = 1;
        }
      else
        {
          for (int b = 0; b < n_items; b++)
            {
              Scratch *scratch = items[b].scratch;
              gsize size = (gsize)stage->channels * gepard_round_columns (items[b].columns);
              const float *h = scratch->sum[h_index];
              float *sum = scratch->sum[1 - h_index];

              /* (b3 + b7) + b11, in branch order as Python's sum() */
              for (gsize e = 0; e < size; e++)
                sum[e] += h[e];
            }
        }
    }

  for (int b = 0; b < n_items; b++)
    {
      Scratch *scratch = items[b].scratch;
      gsize size = (gsize)stage->channels * gepard_round_columns (items[b].columns);
      float *sum = scratch->sum[1 - h_index];

      /* a true division, as NeMo's sum(...) / len(...) */
      for (gsize e = 0; e < size; e++)
        sum[e] = sum[e] / (float)n_branches;
      items[b].cur = sum;
    }
}

/* Whether stage i has convs that batch: at least two streams with at most BATCH_MAX_COLUMNS
 * columns after its up-sampling. */
static gboolean
stage_batches (GepardCodec *codec, int i, const BlockItem *items, int n_items)
{
  int rate = codec->config.decoder.up_sample_rates[i];
  int n_few = 0;

  for (int b = 0; b < n_items; b++)
    n_few += items[b].columns * rate <= BATCH_MAX_COLUMNS;
  return n_few >= 2;
}

/* nanocodec.md §2.2 stage i: activation, transposed conv, residual layer. */
static void
decode_stage (GepardCodec *codec, int i, BlockItem *items, int n_items, ConvSlot *slots,
              BatchWork *work)
{
  const GepardDecoderStage *stage = &codec->decoder.stages[i];
  const GepardStateLayout *layout = &codec->state_layout;

  for (int b = 0; b < n_items; b++)
    {
      Scratch *scratch = items[b].scratch;
      int columns = items[b].columns;
      gsize ld_in = gepard_round_columns (columns);
      int n_out = columns * stage->rate;

      gepard_activation_forward (&stage->act, items[b].cur, ld_in, scratch->act, ld_in, columns,
                                 codec->pool);
      up_sample (stage, scratch->act, ld_in, columns, scratch->x, gepard_round_columns (n_out),
                 items[b].state + layout->carry[i]);
      items[b].columns = n_out;
    }
  res_layer (codec, i, items, n_items, slots, work);
}

/* post_activation → post_conv (k = 3, causal) → output activation */
static void
decode_post (GepardCodec *codec, BlockItem *items, int n_items, ConvSlot *slots, BatchWork *work)
{
  const GepardCodecDecoderConfig *dec = &codec->config.decoder;
  const GepardDecoder *decoder = &codec->decoder;
  const GepardStateLayout *layout = &codec->state_layout;
  int post_history = dec->out_kernel_size - 1;

  for (int b = 0; b < n_items; b++)
    {
      Scratch *scratch = items[b].scratch;
      int columns = items[b].columns;
      gsize ld_cur = gepard_round_columns (columns);
      gsize ld_post = post_history + ld_cur;

      gepard_activation_forward (&decoder->post_act, items[b].cur, ld_cur,
                                 scratch->act + post_history, ld_post, columns, codec->pool);
      slots[b] = (ConvSlot){.in = scratch->act,
                            .ld = ld_post,
                            .cache = items[b].state + layout->post_conv,
                            .y = items[b].samples,
                            .ldy = columns,
                            .n = columns};
    }
  causal_conv (codec, &decoder->post_conv, slots, n_items, work);

  for (int b = 0; b < n_items; b++)
    {
      float *samples = items[b].samples;
      int columns = items[b].columns;

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
}

/* Each item's n_frames ≥ 1 frames of checked codes → n_frames × samples_per_frame samples,
 * advancing its state; layer by layer over all items, so that the convs can batch them. */
static void
decode_block (GepardCodec *codec, BlockItem *items, int n_items, ConvSlot *slots, BatchWork *work)
{
  const GepardCodecConfig *config = &codec->config;
  const GepardCodecDecoderConfig *dec = &config->decoder;
  const GepardDecoder *decoder = &codec->decoder;
  const GepardStateLayout *layout = &codec->state_layout;
  int latent_dim = config->latent_dim;
  int history = dec->in_kernel_size - 1;
  int i;

  /* §6.1 step 1: FSQ decode, pointwise in time, into channel-major columns after the history
   * (by way of scratch->x, which the pre_conv output overwrites next) */
  for (int b = 0; b < n_items; b++)
    {
      Scratch *scratch = items[b].scratch;
      int n = items[b].n_frames;
      gsize ld = history + gepard_round_columns (n);

      gepard_fsq_decode (config, items[b].codes, n, scratch->x);
      for (int c = 0; c < latent_dim; c++)
        for (int t = 0; t < n; t++)
          scratch->act[(gsize)c * ld + history + t] = scratch->x[(gsize)t * latent_dim + c];
      slots[b] = (ConvSlot){.in = scratch->act,
                            .ld = ld,
                            .cache = items[b].state + layout->pre_conv,
                            .y = scratch->x,
                            .ldy = gepard_round_columns (n),
                            .n = n};
      items[b].columns = n;
      items[b].cur = scratch->x;
    }
  causal_conv (codec, &decoder->pre_conv, slots, n_items, work);

  /* the stages together while some of their convs batch; the rest stream by stream, so that a
   * stream's buffers stay in cache from one layer to the next */
  for (i = 0; i < dec->n_stages && stage_batches (codec, i, items, n_items); i++)
    decode_stage (codec, i, items, n_items, slots, work);
  if (i == dec->n_stages)
    decode_post (codec, items, n_items, slots, work);
  else
    for (int b = 0; b < n_items; b++)
      {
        for (int rest = i; rest < dec->n_stages; rest++)
          decode_stage (codec, rest, items + b, 1, slots, work);
        decode_post (codec, items + b, 1, slots, work);
      }
}

/* --- decoding calls --- */

/* What can be wrong with one stream's request, before anything moves. */
static gboolean
check_request (const GepardCodecConfig *config, const gint32 *codes, int n_frames,
               const float *samples, GError **error)
{
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
  return gepard_fsq_check_codes (config, codes, n_frames, error);
}

/* Decodes checked requests: every stream's frames in blocks of MAX_BLOCK_FRAMES, the blocks of all
 * streams that still have frames going through the layers together. */
static void
decode_checked (GepardCodec *codec, GepardCodecStream *const *streams, const gint32 *const *codes,
                const int *n_frames, float *const *samples, int n)
{
  const GepardCodecConfig *config = &codec->config;
  BlockItem one_item;
  ConvSlot one_slot;
  BlockItem *items = n > 1 ? g_new (BlockItem, n) : &one_item;
  ConvSlot *slots = n > 1 ? g_new (ConvSlot, n) : &one_slot;
  BatchWork work = {NULL, 0};
  int most = 0;

  for (int s = 0; s < n; s++)
    {
      if (n_frames[s] > 0)
        scratch_reserve (&streams[s]->scratch, config, MIN (n_frames[s], MAX_BLOCK_FRAMES));
      most = MAX (most, n_frames[s]);
    }

  for (int done = 0; done < most; done += MAX_BLOCK_FRAMES)
    {
      int n_items = 0;

      for (int s = 0; s < n; s++)
        {
          if (n_frames[s] <= done)
            continue;
          items[n_items].state = streams[s]->state;
          items[n_items].scratch = &streams[s]->scratch;
          items[n_items].codes = codes[s] + (gsize)done * config->latent_dim;
          items[n_items].samples = samples[s] + (gsize)done * config->samples_per_frame;
          items[n_items].n_frames = MIN (MAX_BLOCK_FRAMES, n_frames[s] - done);
          n_items++;
        }
      decode_block (codec, items, n_items, slots, &work);
    }

  g_aligned_free (work.memory);
  if (n > 1)
    {
      g_free (items);
      g_free (slots);
    }
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

  /* everything is checked before the state moves, so a bad frame leaves a stream as it was */
  if (!check_request (&stream->codec->config, codes, n_frames, samples, error))
    return FALSE;
  if (n_frames == 0)
    return TRUE;
  decode_checked (stream->codec, &stream, &codes, &n_frames, &samples, 1);
  return TRUE;
}

gboolean
gepard_codec_decode_batch (GepardCodecStream *const *streams, const gint32 *const *codes,
                           const int *n_frames, float *const *samples, int n, GError **error)
{
  GepardCodec *codec;

  g_return_val_if_fail (n >= 0, FALSE);
  g_return_val_if_fail (
      n == 0 || (streams != NULL && codes != NULL && n_frames != NULL && samples != NULL), FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (n == 0)
    return TRUE;
  codec = streams[0] != NULL ? streams[0]->codec : NULL;
  for (int s = 0; s < n; s++)
    {
      g_return_val_if_fail (streams[s] != NULL && streams[s]->codec == codec, FALSE);
      /* a stream twice would have its state advanced from two starting points at once */
      for (int t = 0; t < s; t++)
        g_return_val_if_fail (streams[t] != streams[s], FALSE);
    }

  /* every stream's request is checked before any state moves */
  for (int s = 0; s < n; s++)
    if (!check_request (&codec->config, codes[s], n_frames[s], samples[s], error))
      {
        g_prefix_error (error, "Stream %d: ", s);
        return FALSE;
      }
  decode_checked (codec, streams, codes, n_frames, samples, n);
  return TRUE;
}

gsize
gepard_codec_stream_state_bytes (const GepardCodecStream *stream)
{
  g_return_val_if_fail (stream != NULL, 0);

  return stream->codec->state_layout.total * sizeof (float);
}

const float *
gepard_codec_stream_peek_state (const GepardCodecStream *stream)
{
  g_return_val_if_fail (stream != NULL, NULL);

  return stream->state;
}

gboolean
gepard_codec_decode (GepardCodec *codec, const gint32 *codes, int n_frames, float *samples,
                     GError **error)
{
  GepardCodecStream stream = {codec, NULL, {0}};
  GepardCodecStream *streams = &stream;

  g_return_val_if_fail (codec != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (!check_request (&codec->config, codes, n_frames, samples, error))
    return FALSE;
  if (n_frames == 0)
    return TRUE;
  /* a stream of its own, started from zero history = NeMo's zero left padding of every causal
   * conv (§2.3) */
  stream.state = g_new0 (float, MAX (codec->state_layout.total, 1));
  decode_checked (codec, &streams, &codes, &n_frames, &samples, 1);
  g_free (stream.scratch.memory);
  g_free (stream.state);
  return TRUE;
}
