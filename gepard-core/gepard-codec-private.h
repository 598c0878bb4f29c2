/* gepard-codec-private.h: the codec's packed layers and the CPU kernels shared by its decoder and
 * encoder (not installed). */
#pragma once

#include "gepard-codec-weights.h"
#include "gepard-codec.h"

G_BEGIN_DECLS

/* Output channels per packed weight tile: the register block of the convolution kernel. */
#define GEPARD_CONV_TILE_ROWS 6

/* Time columns are processed in groups of 8 (one AVX vector). Every activation buffer row has room
 * for its valid columns rounded up to this, and kernels run over whole groups, so that a sample
 * goes through the same instructions wherever a chunk boundary puts it. */
#define GEPARD_COLUMN_GROUP 8

static inline gsize
gepard_round_columns (gsize n)
{
  return (n + GEPARD_COLUMN_GROUP - 1) / GEPARD_COLUMN_GROUP * GEPARD_COLUMN_GROUP;
}

/* A stride-1 convolution as a GEMM over an implicitly unfolded input:
 *   y[o][t] = (Σ_r Σ_m W[o][r][m] · x[r][t + m·dilation]) + bias[o]
 * for t in [0, n), where x points at the first input column the output column 0 reads (the
 * left padding or causal history included). `rows` are input channels, or for a strided
 * convolution rearranged into polyphase form, channel × phase. Every output element is one chain
 * of multiply-adds in the fixed order r, then m, then the bias — the same for any n and any
 * position of t in a call (nanocodec.md §6.1 Recommendation). */
typedef struct
{
  int rows;
  int out_channels;
  int kernel;
  int dilation;
  int n_tiles;   /* ceil(out_channels / GEPARD_CONV_TILE_ROWS) */
  float *packed; /* [n_tiles][rows][kernel][GEPARD_CONV_TILE_ROWS], zero past out_channels */
  float *bias;   /* [n_tiles · GEPARD_CONV_TILE_ROWS], zero past out_channels */
} GepardConv;

/* nanocodec.md §2.3: HalfSnake — Snake on channels [0, n_snake), LeakyReLU (0.01) on the rest.
 * n_snake = 0 is a plain LeakyReLU (the encoder, §3.1). */
typedef struct
{
  int channels;
  int n_snake;
  float *alpha;     /* [n_snake] */
  float *inv_alpha; /* [n_snake]: 1 / (alpha + 1e-9), as NeMo's reciprocal in fp32 */
} GepardActivation;

typedef struct
{
  GepardActivation input_act;
  GepardActivation skip_act;
  GepardConv input_conv; /* kernel k_j, dilation d_m */
  GepardConv skip_conv;  /* kernel k_j, dilation 1 */
} GepardResBlock;

typedef struct
{
  int in_channels; /* 2 × channels */
  int channels;
  int rate;
  GepardActivation act; /* activations.i, on in_channels */
  float *up_weight;     /* [in_channels][2·rate]: the grouped transposed conv (§2.3) */
  float *up_bias;       /* [channels] */
  GepardResBlock blocks[GEPARD_CODEC_MAX_RESBLOCK_KERNELS][GEPARD_CODEC_MAX_RESBLOCK_DILATIONS];
} GepardDecoderStage;

typedef struct
{
  GepardConv pre_conv;
  GepardDecoderStage stages[GEPARD_CODEC_MAX_STAGES];
  GepardActivation post_act;
  GepardConv post_conv;
} GepardDecoder;

typedef struct
{
  int channels;
  int rate;
  int pad;              /* (rate + 1) // 2 on each side (§3.4) */
  GepardConv down_conv; /* polyphase: rows = channels × rate, kernel 2 */
  GepardResBlock blocks[GEPARD_CODEC_MAX_RESBLOCK_KERNELS][GEPARD_CODEC_MAX_RESBLOCK_DILATIONS];
} GepardEncoderStage;

typedef struct
{
  GepardConv pre_conv;
  GepardEncoderStage stages[GEPARD_CODEC_MAX_STAGES];
  GepardConv post_conv;
} GepardEncoder;

/* Where each cached piece of a stream's causal state lives, in floats (nanocodec.md §6.1). */
typedef struct
{
  gsize pre_conv;
  gsize carry[GEPARD_CODEC_MAX_STAGES];
  gsize res_input[GEPARD_CODEC_MAX_STAGES][GEPARD_CODEC_MAX_RESBLOCK_KERNELS]
                 [GEPARD_CODEC_MAX_RESBLOCK_DILATIONS];
  gsize res_skip[GEPARD_CODEC_MAX_STAGES][GEPARD_CODEC_MAX_RESBLOCK_KERNELS]
                [GEPARD_CODEC_MAX_RESBLOCK_DILATIONS];
  gsize post_conv;
  gsize total;
} GepardStateLayout;

typedef struct _GepardCodecPool GepardCodecPool;

struct _GepardCodec
{
  GepardCodecConfig config;
  GepardDecoder decoder;
  GepardEncoder encoder;
  GepardStateLayout state_layout;
  GepardCodecPool *pool;
  int n_threads;
  int encoder_window;
};

/* --- gepard-codec-kernels.c --- */

/* Runs func (data, item) for item in [0, n_items) on up to n_threads threads (the caller's
 * included). When another caller holds the workers, or `parallel` is FALSE, the items run on the
 * calling thread; the result never depends on which thread runs an item. */
typedef void (*GepardPoolFunc) (gpointer data, int item);

GepardCodecPool *gepard_codec_pool_new (int n_threads);
void gepard_codec_pool_free (GepardCodecPool *pool);
void gepard_codec_pool_run (GepardCodecPool *pool, GepardPoolFunc func, gpointer data, int n_items,
                            gboolean parallel);

/* Packs W [out_channels][rows][kernel] (row-major, as a Conv1d weight) and the bias. */
void gepard_conv_init (GepardConv *conv, int out_channels, int rows, int kernel, int dilation,
                       const float *weight, const float *bias);
void gepard_conv_clear (GepardConv *conv);

/* y[o][t] = (residual[o][t] +) conv(x)[o][t] for t in [0, n). Rows of x must be readable up to
 * column gepard_round_columns (n) + (kernel − 1)·dilation (what lies past the valid columns only
 * reaches discarded lanes). Only columns [0, n) of y are written; y may be `residual`. */
void gepard_conv_forward (const GepardConv *conv, const float *x, gsize ldx, float *y, gsize ldy,
                          const float *residual, gsize ldr, int n, GepardCodecPool *pool);

void gepard_activation_init (GepardActivation *act, int channels, int n_snake, const float *alpha);
void gepard_activation_clear (GepardActivation *act);
/* y = act(x) over columns [0, gepard_round_columns (n)) of every channel; y may be x. */
void gepard_activation_forward (const GepardActivation *act, const float *x, gsize ldx, float *y,
                                gsize ldy, int n, GepardCodecPool *pool);

/* --- gepard-codec-decoder.c --- */

/* the offsets of every cached piece and their total, for `config` */
void gepard_state_layout_init (GepardStateLayout *layout, const GepardCodecConfig *config);
/* A stream's causal state (state_layout.total floats), so that tests can compare two streams'
 * states bit for bit. */
const float *gepard_codec_stream_peek_state (const GepardCodecStream *stream);

G_END_DECLS
