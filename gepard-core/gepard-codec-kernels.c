/* gepard-codec-kernels.c: the codec's CPU kernels — convolutions as register-blocked GEMMs over
 * the implicitly unfolded input, HalfSnake / LeakyReLU, and a small worker pool.
 *
 * Streaming must give the same bits as one-shot decoding for any chunking (nanocodec.md §6.1), so
 * every output element is computed by the same sequence of fp32 operations wherever it falls in a
 * call: the convolution accumulates each element in one fixed chain (input row, then tap, then the
 * bias), its kernels only ever run over whole vectors of columns, and threads split work along
 * output channels and column blocks, never along the sum. A BLAS sgemm gives no such guarantee (its
 * blocking and kernel choice depend on the matrix sizes), hence the hand-written kernels. */
#include "gepard-codec-private.h"

#include <math.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_X86_AVX2_KERNEL 1
#include <immintrin.h>
#endif

#define TILE_ROWS GEPARD_CONV_TILE_ROWS
#define TILE_COLUMNS 16

/* --- worker pool --- */

struct _GepardCodecPool
{
  int n_workers;
  GThread **workers;
  GMutex owner; /* held by the one caller whose job the workers run */
  GMutex mutex;
  GCond wake;
  GCond done;
  guint64 generation;
  gboolean quit;
  GepardPoolFunc func;
  gpointer data;
  int n_items;
  gint next_item;
  int n_running;
};

static void
pool_work (GepardCodecPool *pool)
{
  for (;;)
    {
      int item = g_atomic_int_add (&pool->next_item, 1);

      if (item >= pool->n_items)
        break;
      pool->func (pool->data, item);
    }
}

static gpointer
pool_worker (gpointer user_data)
{
  GepardCodecPool *pool = user_data;
  guint64 seen = 0;

  for (;;)
    {
      g_mutex_lock (&pool->mutex);
      while (pool->generation == seen && !pool->quit)
        g_cond_wait (&pool->wake, &pool->mutex);
      if (pool->quit)
        {
          g_mutex_unlock (&pool->mutex);
          return NULL;
        }
      seen = pool->generation;
      g_mutex_unlock (&pool->mutex);

      pool_work (pool);

      g_mutex_lock (&pool->mutex);
      if (--pool->n_running == 0)
        g_cond_signal (&pool->done);
      g_mutex_unlock (&pool->mutex);
    }
}

GepardCodecPool *
gepard_codec_pool_new (int n_threads)
{
  GepardCodecPool *pool = g_new0 (GepardCodecPool, 1);

  g_mutex_init (&pool->owner);
  g_mutex_init (&pool->mutex);
  g_cond_init (&pool->wake);
  g_cond_init (&pool->done);
  pool->n_workers = MAX (n_threads, 1) - 1;
  pool->workers = g_new0 (GThread *, MAX (pool->n_workers, 1));
  for (int i = 0; i < pool->n_workers; i++)
    pool->workers[i] = g_thread_new ("gepard-codec", pool_worker, pool);
  return pool;
}

void
gepard_codec_pool_free (GepardCodecPool *pool)
{
  if (pool == NULL)
    return;

  g_mutex_lock (&pool->mutex);
  pool->quit = TRUE;
  g_cond_broadcast (&pool->wake);
  g_mutex_unlock (&pool->mutex);
  for (int i = 0; i < pool->n_workers; i++)
    g_thread_join (pool->workers[i]);
  g_free (pool->workers);
  g_cond_clear (&pool->done);
  g_cond_clear (&pool->wake);
  g_mutex_clear (&pool->mutex);
  g_mutex_clear (&pool->owner);
  g_free (pool);
}

void
gepard_codec_pool_run (GepardCodecPool *pool, GepardPoolFunc func, gpointer data, int n_items,
                       gboolean parallel)
{
  if (n_items <= 0)
    return;

  /* another stream's decode owns the workers: this one runs on its own thread, which is what a
   * server decoding several streams at once wants anyway */
  if (pool == NULL || pool->n_workers == 0 || n_items == 1 || !parallel
      || !g_mutex_trylock (&pool->owner))
    {
      for (int item = 0; item < n_items; item++)
        func (data, item);
      return;
    }

  g_mutex_lock (&pool->mutex);
  pool->func = func;
  pool->data = data;
  pool->n_items = n_items;
  g_atomic_int_set (&pool->next_item, 0);
  pool->n_running = pool->n_workers;
  pool->generation++;
  g_cond_broadcast (&pool->wake);
  g_mutex_unlock (&pool->mutex);

  pool_work (pool);

  g_mutex_lock (&pool->mutex);
  while (pool->n_running > 0)
    g_cond_wait (&pool->done, &pool->mutex);
  g_mutex_unlock (&pool->mutex);
  g_mutex_unlock (&pool->owner);
}

/* --- convolution --- */

void
gepard_conv_init (GepardConv *conv, int out_channels, int rows, int kernel, int dilation,
                  const float *weight, const float *bias)
{
  gsize tile_size, n_bias;

  conv->rows = rows;
  conv->out_channels = out_channels;
  conv->kernel = kernel;
  conv->dilation = dilation;
  conv->n_tiles = (out_channels + TILE_ROWS - 1) / TILE_ROWS;
  tile_size = (gsize)rows * kernel * TILE_ROWS;
  conv->packed = g_new0 (float, tile_size * conv->n_tiles);
  n_bias = (gsize)conv->n_tiles * TILE_ROWS;
  conv->bias = g_new0 (float, n_bias);

  /* tile-major, then the order of the sum (row, tap), then the tile's output channels: the
   * kernel reads the weights strictly sequentially */
  for (int o = 0; o < out_channels; o++)
    {
      float *tile = conv->packed + (gsize)(o / TILE_ROWS) * tile_size;

      for (int r = 0; r < rows; r++)
        for (int m = 0; m < kernel; m++)
          tile[((gsize)r * kernel + m) * TILE_ROWS + o % TILE_ROWS]
              = weight[((gsize)o * rows + r) * kernel + m];
      conv->bias[o] = bias[o];
    }
}

void
gepard_conv_clear (GepardConv *conv)
{
  g_clear_pointer (&conv->packed, g_free);
  g_clear_pointer (&conv->bias, g_free);
}

/* The portable kernel: one tile of TILE_ROWS output channels × `width` (8 or 16) columns. */
static void
conv_tile_generic (const float *w, const float *x, gsize ldx, int rows, int kernel, int dilation,
                   int width, float acc[TILE_ROWS][TILE_COLUMNS])
{
  for (int o = 0; o < TILE_ROWS; o++)
    for (int t = 0; t < TILE_COLUMNS; t++)
      acc[o][t] = 0.0f;

  for (int r = 0; r < rows; r++)
    {
      const float *xr = x + (gsize)r * ldx;

      for (int m = 0; m < kernel; m++, w += TILE_ROWS)
        {
          const float *xp = xr + (gsize)m * dilation;

          for (int o = 0; o < TILE_ROWS; o++)
            for (int t = 0; t < width; t++)
              acc[o][t] += w[o] * xp[t];
        }
    }
}

#ifdef HAVE_X86_AVX2_KERNEL
/* AVX2 + FMA: 6 × 16 accumulators in 12 registers; per (row, tap) two column loads, six weight
 * broadcasts and twelve fused multiply-adds. Each lane is its own chain, so the 6 × 8 variant
 * gives the same bits per element. */
__attribute__ ((target ("avx2,fma"))) static void
conv_tile_avx2_16 (const float *w, const float *x, gsize ldx, int rows, int kernel, int dilation,
                   float acc[TILE_ROWS][TILE_COLUMNS])
{
  __m256 a00 = _mm256_setzero_ps (), a01 = _mm256_setzero_ps ();
  __m256 a10 = _mm256_setzero_ps (), a11 = _mm256_setzero_ps ();
  __m256 a20 = _mm256_setzero_ps (), a21 = _mm256_setzero_ps ();
  __m256 a30 = _mm256_setzero_ps (), a31 = _mm256_setzero_ps ();
  __m256 a40 = _mm256_setzero_ps (), a41 = _mm256_setzero_ps ();
  __m256 a50 = _mm256_setzero_ps (), a51 = _mm256_setzero_ps ();

  for (int r = 0; r < rows; r++)
    {
      const float *xp = x + (gsize)r * ldx;

      for (int m = 0; m < kernel; m++, w += TILE_ROWS, xp += dilation)
        {
          __m256 x0 = _mm256_loadu_ps (xp);
          __m256 x1 = _mm256_loadu_ps (xp + 8);
          __m256 b;

          b = _mm256_broadcast_ss (w + 0);
          a00 = _mm256_fmadd_ps (b, x0, a00);
          a01 = _mm256_fmadd_ps (b, x1, a01);
          b = _mm256_broadcast_ss (w + 1);
          a10 = _mm256_fmadd_ps (b, x0, a10);
          a11 = _mm256_fmadd_ps (b, x1, a11);
          b = _mm256_broadcast_ss (w + 2);
          a20 = _mm256_fmadd_ps (b, x0, a20);
          a21 = _mm256_fmadd_ps (b, x1, a21);
          b = _mm256_broadcast_ss (w + 3);
          a30 = _mm256_fmadd_ps (b, x0, a30);
          a31 = _mm256_fmadd_ps (b, x1, a31);
          b = _mm256_broadcast_ss (w + 4);
          a40 = _mm256_fmadd_ps (b, x0, a40);
          a41 = _mm256_fmadd_ps (b, x1, a41);
          b = _mm256_broadcast_ss (w + 5);
          a50 = _mm256_fmadd_ps (b, x0, a50);
          a51 = _mm256_fmadd_ps (b, x1, a51);
        }
    }

  _mm256_storeu_ps (acc[0], a00);
  _mm256_storeu_ps (acc[0] + 8, a01);
  _mm256_storeu_ps (acc[1], a10);
  _mm256_storeu_ps (acc[1] + 8, a11);
  _mm256_storeu_ps (acc[2], a20);
  _mm256_storeu_ps (acc[2] + 8, a21);
  _mm256_storeu_ps (acc[3], a30);
  _mm256_storeu_ps (acc[3] + 8, a31);
  _mm256_storeu_ps (acc[4], a40);
  _mm256_storeu_ps (acc[4] + 8, a41);
  _mm256_storeu_ps (acc[5], a50);
  _mm256_storeu_ps (acc[5] + 8, a51);
}

__attribute__ ((target ("avx2,fma"))) static void
conv_tile_avx2_8 (const float *w, const float *x, gsize ldx, int rows, int kernel, int dilation,
                  float acc[TILE_ROWS][TILE_COLUMNS])
{
  __m256 a0 = _mm256_setzero_ps (), a1 = _mm256_setzero_ps (), a2 = _mm256_setzero_ps ();
  __m256 a3 = _mm256_setzero_ps (), a4 = _mm256_setzero_ps (), a5 = _mm256_setzero_ps ();

  for (int r = 0; r < rows; r++)
    {
      const float *xp = x + (gsize)r * ldx;

      for (int m = 0; m < kernel; m++, w += TILE_ROWS, xp += dilation)
        {
          __m256 x0 = _mm256_loadu_ps (xp);

          a0 = _mm256_fmadd_ps (_mm256_broadcast_ss (w + 0), x0, a0);
          a1 = _mm256_fmadd_ps (_mm256_broadcast_ss (w + 1), x0, a1);
          a2 = _mm256_fmadd_ps (_mm256_broadcast_ss (w + 2), x0, a2);
          a3 = _mm256_fmadd_ps (_mm256_broadcast_ss (w + 3), x0, a3);
          a4 = _mm256_fmadd_ps (_mm256_broadcast_ss (w + 4), x0, a4);
          a5 = _mm256_fmadd_ps (_mm256_broadcast_ss (w + 5), x0, a5);
        }
    }

  _mm256_storeu_ps (acc[0], a0);
  _mm256_storeu_ps (acc[1], a1);
  _mm256_storeu_ps (acc[2], a2);
  _mm256_storeu_ps (acc[3], a3);
  _mm256_storeu_ps (acc[4], a4);
  _mm256_storeu_ps (acc[5], a5);
}

static gboolean
have_avx2_fma (void)
{
  static gsize checked = 0;
  static gboolean result = FALSE;

  if (g_once_init_enter (&checked))
    {
      __builtin_cpu_init ();
      result = __builtin_cpu_supports ("avx2") && __builtin_cpu_supports ("fma");
      /* GEPARD_CODEC_GENERIC=1 forces the portable kernel (to compare the two) */
      if (g_strcmp0 (g_getenv ("GEPARD_CODEC_GENERIC"), "1") == 0)
        result = FALSE;
      g_once_init_leave (&checked, 1);
    }
  return result;
}
#endif

static void
conv_tile (const float *w, const float *x, gsize ldx, int rows, int kernel, int dilation, int width,
           float acc[TILE_ROWS][TILE_COLUMNS])
{
#ifdef HAVE_X86_AVX2_KERNEL
  /* one choice per process, so that every element of every call takes the same kernel */
  if (have_avx2_fma ())
    {
      if (width == TILE_COLUMNS)
        conv_tile_avx2_16 (w, x, ldx, rows, kernel, dilation, acc);
      else
        conv_tile_avx2_8 (w, x, ldx, rows, kernel, dilation, acc);
      return;
    }
#endif
  conv_tile_generic (w, x, ldx, rows, kernel, dilation, width, acc);
}

typedef struct
{
  const GepardConv *conv;
  const float *x;
  gsize ldx;
  float *y;
  gsize ldy;
  const float *residual;
  gsize ldr;
  int n;
  int block_columns;
} ConvJob;

/* One work item: one tile of output channels over one block of columns. */
static void
conv_item (gpointer data, int item)
{
  const ConvJob *job = data;
  const GepardConv *conv = job->conv;
  int tile = item % conv->n_tiles;
  int begin = item / conv->n_tiles * job->block_columns;
  int end = MIN (job->n, begin + job->block_columns);
  int o0 = tile * TILE_ROWS;
  int n_rows = MIN (TILE_ROWS, conv->out_channels - o0);
  const float *w = conv->packed + (gsize)tile * conv->rows * conv->kernel * TILE_ROWS;
  const float *bias = conv->bias + o0;
  float acc[TILE_ROWS][TILE_COLUMNS];

  for (int t0 = begin, width; t0 < end; t0 += width)
    {
      /* a 16-column tile when it stays inside the rounded-up columns, else 8 (t0 is a multiple
       * of 8, so those 8 columns exist) */
      int n_cols;

      width = end - t0 > GEPARD_COLUMN_GROUP ? TILE_COLUMNS : GEPARD_COLUMN_GROUP;
      n_cols = MIN (width, end - t0);
      conv_tile (w, job->x + t0, job->ldx, conv->rows, conv->kernel, conv->dilation, width, acc);

      /* the bias last, then the residual: y = x + conv(h) as in ResidualBlock (§2.2) */
      for (int o = 0; o < n_rows; o++)
        {
          float *yr = job->y + (gsize)(o0 + o) * job->ldy + t0;

          if (job->residual != NULL)
            {
              const float *rr = job->residual + (gsize)(o0 + o) * job->ldr + t0;

              for (int t = 0; t < n_cols; t++)
                yr[t] = rr[t] + (acc[o][t] + bias[o]);
            }
          else
            {
              for (int t = 0; t < n_cols; t++)
                yr[t] = acc[o][t] + bias[o];
            }
        }
    }
}

void
gepard_conv_forward (const GepardConv *conv, const float *x, gsize ldx, float *y, gsize ldy,
                     const float *residual, gsize ldr, int n, GepardCodecPool *pool)
{
  ConvJob job = {conv, x, ldx, y, ldy, residual, ldr, n, 0};
  gsize span = (gsize)(conv->kernel - 1) * conv->dilation;
  gsize budget, columns;
  int n_blocks;
  double macs;

  if (n <= 0)
    return;

  /* column blocks whose input (rows × (columns + span) floats) stays around 256 KiB, so a block
   * is read from L2 by every tile of output channels; a multiple of 16 columns */
  budget = 65536 / (gsize)MAX (conv->rows, 1);
  columns = budget > span + TILE_COLUMNS ? budget - span : TILE_COLUMNS;
  columns = MIN (columns, 1024);
  columns = MAX (columns / TILE_COLUMNS * TILE_COLUMNS, TILE_COLUMNS);
  job.block_columns = (int)columns;
  n_blocks = (int)((n + columns - 1) / columns);

  macs = (double)conv->out_channels * conv->rows * conv->kernel * n;
  gepard_codec_pool_run (pool, conv_item, &job, n_blocks * conv->n_tiles, macs >= 4e6);
}

/* --- activations --- */

void
gepard_activation_init (GepardActivation *act, int channels, int n_snake, const float *alpha)
{
  act->channels = channels;
  act->n_snake = n_snake;
  g_clear_pointer (&act->alpha, g_free);
  g_clear_pointer (&act->inv_alpha, g_free);
  if (n_snake == 0)
    return;

  act->alpha = g_new (float, n_snake);
  act->inv_alpha = g_new (float, n_snake);
  for (int c = 0; c < n_snake; c++)
    {
      /* nanocodec.md §2.3: reciprocal(alpha + 1e-9) in fp32, computed once */
      volatile float shifted = alpha[c] + 1e-9f;

      act->alpha[c] = alpha[c];
      act->inv_alpha[c] = 1.0f / shifted;
    }
}

void
gepard_activation_clear (GepardActivation *act)
{
  g_clear_pointer (&act->alpha, g_free);
  g_clear_pointer (&act->inv_alpha, g_free);
}

typedef double v4d __attribute__ ((vector_size (32)));
typedef gint64 v4l __attribute__ ((vector_size (32)));
typedef float v4f __attribute__ ((vector_size (16)));
typedef gint32 v4i __attribute__ ((vector_size (16)));

/* ±sin(z) for four arguments, in double (the sign is lost in the square that follows): z − j·π/2
 * with π/2 split into a 33-bit head (j·head is exact for |j| < 2^20) and a tail, then Taylor
 * polynomials of sin and cos on [−π/4, π/4] (truncation error < 1e-13); an odd quadrant j takes cos
 * instead of sin. Valid for |z| < 1e6; beyond that the caller falls back to libm. */
static inline void
sin_up_to_sign_v4 (const v4d *zp, v4d *result)
{
  const v4d z = *zp;
  const double two_over_pi = 0.6366197723675814;
  const double pio2_head = 0x1.921fb544p+0;       /* π/2 to 33 bits */
  const double pio2_tail = 0x1.0b4611a626331p-34; /* π/2 − pio2_head */
  const double round_magic = 0x1.8p52;            /* adding it rounds to an integer, ties even */
  v4d shifted = z * two_over_pi + round_magic;
  v4d j = shifted - round_magic;
  v4d r = (z - j * pio2_head) - j * pio2_tail;
  v4d r2 = r * r;
  v4d s, c;
  v4l odd;

  /* Taylor series, ±1/n! in Horner form */
  s = r2 * (1.0 / 6227020800.0) - 1.0 / 39916800.0;
  s = s * r2 + 1.0 / 362880.0;
  s = s * r2 - 1.0 / 5040.0;
  s = s * r2 + 1.0 / 120.0;
  s = s * r2 - 1.0 / 6.0;
  s = r + r * r2 * s;
  c = r2 * (-1.0 / 87178291200.0) + 1.0 / 479001600.0;
  c = c * r2 - 1.0 / 3628800.0;
  c = c * r2 + 1.0 / 40320.0;
  c = c * r2 - 1.0 / 720.0;
  c = c * r2 + 1.0 / 24.0;
  c = c * r2 - 0.5;
  c = 1.0 + r2 * c;
  /* the integer j sits in the low mantissa bits of `shifted` */
  odd = ((v4l)shifted & 1) != 0;
  *result = (v4d)(((v4l)c & odd) | ((v4l)s & ~odd));
}

/* Snake on one channel over n4 (a multiple of 4) columns: y = x + inv·sin(α·x)², each step an fp32
 * tensor operation as NeMo's snake() (nanocodec.md §2.3); sin itself is evaluated in double and
 * rounded once to fp32, within PyTorch's 1-ulp sin. */
static void
snake_row (const float *x, float *y, gsize n4, float alpha, float inv_alpha)
{
  const v4f alpha4 = {alpha, alpha, alpha, alpha};
  const v4f inv4 = {inv_alpha, inv_alpha, inv_alpha, inv_alpha};

  for (gsize t = 0; t < n4; t += 4)
    {
      v4f xv, z, s, s2, scaled;
      v4d zd, sd;

      memcpy (&xv, x + t, sizeof xv);
      z = alpha4 * xv;
      zd = __builtin_convertvector(z, v4d);
      sin_up_to_sign_v4 (&zd, &sd);
      s = __builtin_convertvector(sd, v4f);
      /* rounding is symmetric, so squaring ±sin rounded to fp32 equals torch's sin().pow(2) */
      s2 = s * s;
      scaled = inv4 * s2;
      xv = xv + scaled;
      for (int i = 0; i < 4; i++)
        {
          if (!(fabsf (z[i]) < 1e6f) && isfinite (z[i]))
            {
              /* far outside the reduction's range: libm, same fp32 steps */
              volatile float sf = (float)sin ((double)z[i]);
              volatile float sq = sf * sf;
              volatile float sc = inv_alpha * sq;

              xv[i] = x[t + i] + sc;
            }
        }
      memcpy (y + t, &xv, sizeof xv);
    }
}

/* LeakyReLU over n4 (a multiple of 4) columns: x > 0 ? x : x·0.01 with the fp32 slope of
 * torch.nn.LeakyReLU(), four lanes at a time */
static void
leaky_relu_row (const float *x, float *y, gsize n4)
{
  const v4f slope = {0.01f, 0.01f, 0.01f, 0.01f};
  const v4f zero = {0.0f, 0.0f, 0.0f, 0.0f};

  for (gsize t = 0; t < n4; t += 4)
    {
      v4f xv, scaled;
      v4i positive;

      memcpy (&xv, x + t, sizeof xv);
      scaled = xv * slope;
      positive = xv > zero;
      xv = (v4f)((positive & (v4i)xv) | (~positive & (v4i)scaled));
      memcpy (y + t, &xv, sizeof xv);
    }
}

typedef struct
{
  const GepardActivation *act;
  const float *x;
  gsize ldx;
  float *y;
  gsize ldy;
  gsize columns;
} ActivationJob;

/* One work item: one channel. */
static void
activation_item (gpointer data, int c)
{
  const ActivationJob *job = data;
  const float *xr = job->x + (gsize)c * job->ldx;
  float *yr = job->y + (gsize)c * job->ldy;

  if (c < job->act->n_snake)
    snake_row (xr, yr, job->columns, job->act->alpha[c], job->act->inv_alpha[c]);
  else
    leaky_relu_row (xr, yr, job->columns);
}

void
gepard_activation_forward (const GepardActivation *act, const float *x, gsize ldx, float *y,
                           gsize ldy, int n, GepardCodecPool *pool)
{
  ActivationJob job = {act, x, ldx, y, ldy, gepard_round_columns ((gsize)MAX (n, 0))};

  /* per-element work, so threads only pay off on large blocks */
  gepard_codec_pool_run (pool, activation_item, &job, act->channels,
                         job.columns * act->channels >= 65536);
}
