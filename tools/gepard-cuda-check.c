/* gepard-cuda-check: the CUDA backend against the CPU reference, and its step time.
 *
 *   gepard-cuda-check parity MODEL [--frames N] [--batches 1,8]
 *   gepard-cuda-check cfg MODEL [--frames N]
 *   gepard-cuda-check bench MODEL [--batches 1,8,64,256] [--contexts 64,1024] [--steps N]
 *
 * parity: for each batch size B, B sequences with different prompt lengths (every third one
 * with a speaker prefix of 8 rows) join one step after another, so steps mix prefills and
 * decodes, and generate N frames each, on the CPU (gepard-model.c, the numerics of record) and on
 * the GPU in lockstep. Each side feeds back its own frames. Reported per run: the largest stop and
 * head logit errors while both sides had the same inputs, how often the heads' argmax agreed, and
 * how many frames came out identical — greedy (temperature 0) and sampled (temperature 0.4, the
 * same seeds; both sides use the same RNG and arithmetic, so they match unless a logit or an
 * expf differs by an ulp at a boundary). For B > 1 each sequence also runs alone on the CPU: its
 * difference from the batched CPU run (BLAS sums in another order) is the floor the GPU's error
 * is to be read against: the check fails where the GPU's mean logit error is more than
 * TOLERANCE times that floor. Greedy frames are compared too, but random weights make near ties
 * common, so they diverge within a few frames even between two CPU runs.
 *
 * cfg: text-CFG through both backends' step (guided sequences beside their unconditional
 * branches, and a plain one), greedy, fed the same frames; judged by head argmax agreement
 * (cfg_check).
 *
 * bench: B sequences prefilled to each context length, then decode steps timed one by one (the
 * whole step: upload, forward, sampling on the device, copy back).
 *
 *   gepard-cuda-check codec MODEL [--frames N] [--batches 1,8,64,256,1024] [--steps N]
 *                               [--pass-frames 1,8]
 *
 * codec: the GPU's audio decoder against the CPU codec (gepard-codec.c) on the model's codec with
 * random codes: 8 streams joining one pass after another decode N frames each, frame by frame in
 * batched passes, against each stream decoded in one shot on the CPU; reported are the largest
 * and the RMS error and the signal-to-error ratio, a stream decoded alone against the same stream
 * in the batch, a reset stream against a fresh one, and the 8 streams decoded again (reset) in
 * calls of several frames each (1, 2, 3, 5 or 8, different for each stream, so that calls mix
 * multi-frame passes of every size with one-frame ones). Then the time of one call for each B and
 * each F of --pass-frames (default 1): F frames for each of B streams, copied back to the host.
 *
 * Exits 77 (skipped) where no GPU can run the model. */
#include "gepard-backend.h"
#include "gepard-checkpoint.h"
#include "gepard-codec.h"
#include "gepard-compute-cuda.h"
#include "gepard-error.h"
#include "gepard-generate.h"
#include "gepard-model.h"

#include <locale.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_SKIP 77
/* The GPU sums its GEMMs on tensor cores and its reductions in other orders than the CPU, so its
 * logits differ from the CPU's by a few bf16 ulps, which decides near ties differently; what it
 * must not exceed is a small multiple of the CPU's own order-dependence. Measured on an H200 in
 * greedy runs: 1.2× on the tiny preset, 1.7–2.0× on the gepard-1.0 shapes (1.4–1.45× with the
 * GEMMs in plain fp32). Sampled runs are reported but not judged: their two comparisons cover
 * different frames, as each pair parts at its own first differing sample. */
#define TOLERANCE 4.0
/* where the CPU runs agree exactly (short runs of a small model), an eighth of a bf16 ulp at 1 */
#define ABSOLUTE_TOLERANCE 1e-3
/* The GPU decoder against the CPU codec: the signal-to-error ratio in dB it must reach with TF32
 * tensor cores, and the largest sample error with the sums in plain fp32
 * (GEPARD_CUDA_CODEC_PEDANTIC=1), where only summation order and sinf differ. */
#define CODEC_MIN_SNR_DB 50.0
#define CODEC_PEDANTIC_MAX_ERROR 1e-4

typedef struct
{
  const GepardModel *model;
  const GepardModelConfig *c;
  GepardCompute *gpu;
  int h, nh, n_logits;
} Context;

static GArray *
parse_list (const char *text)
{
  g_auto (GStrv) parts = g_strsplit (text, ",", -1);
  GArray *list = g_array_new (FALSE, FALSE, sizeof (int));
  for (int i = 0; parts[i] != NULL; i++)
    {
      gint64 v;
      if (g_ascii_string_to_signed (parts[i], 10, 1, 1 << 20, &v, NULL))
        {
          int x = (int)v;
          g_array_append_val (list, x);
        }
    }
  return list;
}

/* ---- parity ---- */

typedef struct
{
  int join_step;
  int n_prefix;
  float *prefix;
  gint32 *ids;
  int n_ids;
  GepardKvCache *cache;
  GepardSampler *sampler;
  GepardSequence *gpu_seq;
  gint32 cpu_codes[GEPARD_MAX_AUDIO_HEADS];
  gint32 gpu_codes[GEPARD_MAX_AUDIO_HEADS];
  int frames;
  int diverged_at; /* first frame that differs, or -1 */
  /* the noise floor: the same sequence on the CPU alone, which sums in another order */
  GepardKvCache *alone_cache;
  GepardSampler *alone_sampler;
  gint32 alone_codes[GEPARD_MAX_AUDIO_HEADS];
  int alone_diverged_at;
} Seq;

typedef struct
{
  double max_stop, max_logit, sum_logit;
  gint64 n_logit;
  gint64 heads_compared, heads_agreed;
  int frames_compared, frames_identical;
  int first_divergence;
} Stats;

static int
argmax (const float *x, int n)
{
  int best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best])
      best = i;
  return best;
}

/* Adds one sequence's outputs for one step (the same inputs on both sides) to `st`; returns
 * whether the sampled frames are identical. */
static gboolean
compare (const Context *ctx, Stats *st, const float *logits_a, float stop_a, const gint32 *codes_a,
         const float *logits_b, float stop_b, const gint32 *codes_b, int frame)
{
  st->max_stop = MAX (st->max_stop, fabs (stop_a - stop_b));
  int offset = 0;
  for (int i = 0; i < ctx->nh; i++)
    {
      int levels = ctx->c->head_levels[i];
      for (int j = 0; j < levels; j++)
        {
          double d = fabs (logits_a[offset + j] - logits_b[offset + j]);
          st->max_logit = MAX (st->max_logit, d);
          st->sum_logit += d;
          st->n_logit++;
        }
      st->heads_compared++;
      st->heads_agreed += argmax (logits_a + offset, levels) == argmax (logits_b + offset, levels);
      offset += levels;
    }
  st->frames_compared++;
  if (memcmp (codes_a, codes_b, sizeof (gint32) * ctx->nh) == 0)
    {
      st->frames_identical++;
      return TRUE;
    }
  if (st->first_divergence < 0 || frame < st->first_divergence)
    st->first_divergence = frame;
  return FALSE;
}

/* B sequences in lockstep on both backends (and, for B > 1, each alone on the CPU); FALSE on an
 * error */
static gboolean
run_parity (Context *ctx, int batch, int n_frames, const GepardSampling *sampling, Stats *st,
            Stats *floor, GError **error)
{
  const GepardModelConfig *c = ctx->c;
  int h = ctx->h, nh = ctx->nh, nl = ctx->n_logits;
  static const int lengths[] = {23, 5, 12, 40, 3, 17, 31, 9, 64, 2, 28, 11};
  GRand *rand = g_rand_new_with_seed (1234 + batch);
  Seq *seqs = g_new0 (Seq, batch);
  gboolean ok = TRUE;

  memset (st, 0, sizeof *st);
  st->first_divergence = -1;
  memset (floor, 0, sizeof *floor);
  floor->first_divergence = -1;
  for (int k = 0; k < batch; k++)
    {
      Seq *s = &seqs[k];
      GepardSampling sk = *sampling;
      sk.seed = sampling->seed + k;
      s->join_step = k;
      s->n_ids = lengths[k % G_N_ELEMENTS (lengths)] + k / (int)G_N_ELEMENTS (lengths);
      s->ids = g_new (gint32, s->n_ids);
      for (int t = 0; t < s->n_ids; t++)
        s->ids[t] = g_rand_int_range (rand, 0, MIN (c->vocab_size, c->tokenizer_length));
      if (k % 3 == 1)
        {
          /* unrounded fp32 rows: both backends take them as given */
          s->n_prefix = 8;
          s->prefix = g_new (float, (gsize)s->n_prefix *h);
          for (int i = 0; i < s->n_prefix * h; i++)
            s->prefix[i] = (float)g_rand_double_range (rand, -0.1, 0.1);
        }
      s->cache = gepard_kv_cache_new (ctx->model);
      s->sampler = gepard_sampler_new (ctx->model, &sk);
      s->gpu_seq = ctx->gpu->funcs->sequence_new (ctx->gpu, &sk, error);
      s->diverged_at = -1;
      s->alone_diverged_at = -1;
      if (batch > 1)
        {
          s->alone_cache = gepard_kv_cache_new (ctx->model);
          s->alone_sampler = gepard_sampler_new (ctx->model, &sk);
        }
      if (s->gpu_seq == NULL)
        {
          ok = FALSE;
          break;
        }
    }

  g_autofree GepardStepInput *inputs = g_new (GepardStepInput, batch);
  g_autofree GepardBatchSegment *segments = g_new (GepardBatchSegment, batch);
  g_autofree int *active = g_new (int, batch);
  g_autofree float *cpu_logits = g_new (float, (gsize)batch *nl);
  g_autofree float *gpu_logits = g_new (float, (gsize)batch *nl);
  g_autofree float *cpu_stop = g_new (float, batch);
  g_autofree float *gpu_stop = g_new (float, batch);
  g_autofree gint32 *cpu_codes = g_new (gint32, (gsize)batch * nh);
  g_autofree gint32 *gpu_codes = g_new (gint32, (gsize)batch * nh);
  g_autofree float *last = g_new (float, (gsize)batch *h);
  g_autofree float *alone_logits = g_new (float, nl);
  gint32 alone_codes[GEPARD_MAX_AUDIO_HEADS];
  float alone_stop;

  for (int step = 0; ok; step++)
    {
      int n = 0, rows = 0;
      for (int k = 0; k < batch; k++)
        if (seqs[k].join_step <= step && seqs[k].frames < n_frames)
          active[n++] = k;
      if (n == 0)
        break;
      for (int a = 0; a < n; a++)
        {
          Seq *s = &seqs[active[a]];
          gboolean prefill = s->frames == 0;
          inputs[a] = (GepardStepInput){.sequence = s->gpu_seq,
                                        .prefix = prefill ? s->prefix : NULL,
                                        .n_prefix = prefill ? s->n_prefix : 0,
                                        .ids = prefill ? s->ids : NULL,
                                        .n_ids = prefill ? s->n_ids : 0,
                                        .codes = prefill ? NULL : s->gpu_codes};
          segments[a] = (GepardBatchSegment){s->cache, prefill ? s->n_prefix + s->n_ids : 1};
          rows += segments[a].n_tokens;
        }

      /* the CPU reference: what gepard-compute-cpu.c's step computes, keeping the logits */
      g_autofree float *embeds = g_new (float, (gsize)rows *h);
      g_autofree float *hidden = g_new (float, (gsize)rows *h);
      int row = 0;
      for (int a = 0; a < n && ok; a++)
        {
          Seq *s = &seqs[active[a]];
          float *e = embeds + (gsize)row * h;
          if (s->frames == 0)
            {
              if (s->n_prefix > 0)
                memcpy (e, s->prefix, sizeof (float) * s->n_prefix * h);
              ok = gepard_model_embed_tokens (ctx->model, s->ids, s->n_ids,
                                              e + (gsize)s->n_prefix * h, error);
            }
          else
            ok = gepard_model_embed_frame (ctx->model, s->cpu_codes, e, error);
          row += segments[a].n_tokens;
        }
      if (!ok)
        break;
      gepard_model_forward_batch (ctx->model, segments, n, embeds, hidden);
      row = 0;
      for (int a = 0; a < n; a++)
        {
          row += segments[a].n_tokens;
          memcpy (last + (gsize)a * h, hidden + (gsize)(row - 1) * h, sizeof (float) * h);
        }
      gepard_model_heads_batch (ctx->model, last, n, cpu_logits, cpu_stop);
      for (int a = 0; a < n; a++)
        {
          g_autofree float *scratch = g_memdup2 (cpu_logits + (gsize)a * nl, sizeof (float) * nl);
          gepard_sampler_next (seqs[active[a]].sampler, scratch, cpu_codes + (gsize)a * nh);
        }

      if (!gepard_compute_cuda_step_with_logits (ctx->gpu, inputs, n, gpu_codes, gpu_stop,
                                                 gpu_logits, error))
        {
          ok = FALSE;
          break;
        }

      for (int a = 0; a < n && ok; a++)
        {
          Seq *s = &seqs[active[a]];
          const gint32 *cc = cpu_codes + (gsize)a * nh, *gc = gpu_codes + (gsize)a * nh;
          const float *cl = cpu_logits + (gsize)a * nl;
          /* same inputs so far: compare the outputs */
          if (s->diverged_at < 0
              && !compare (ctx, st, cl, cpu_stop[a], cc, gpu_logits + (gsize)a * nl, gpu_stop[a],
                           gc, s->frames))
            s->diverged_at = s->frames;
          if (s->alone_cache != NULL)
            {
              int n_rows = segments[a].n_tokens;
              g_autofree float *e = g_new (float, (gsize)n_rows *h);
              g_autofree float *hid = g_new (float, (gsize)n_rows *h);
              if (s->frames == 0)
                {
                  if (s->n_prefix > 0)
                    memcpy (e, s->prefix, sizeof (float) * s->n_prefix * h);
                  ok = gepard_model_embed_tokens (ctx->model, s->ids, s->n_ids,
                                                  e + (gsize)s->n_prefix * h, error);
                }
              else
                ok = gepard_model_embed_frame (ctx->model, s->alone_codes, e, error);
              if (!ok)
                break;
              gepard_model_forward (ctx->model, s->alone_cache, e, n_rows, hid);
              gepard_model_heads (ctx->model, hid + (gsize)(n_rows - 1) * h, alone_logits,
                                  &alone_stop);
              g_autofree float *scratch = g_memdup2 (alone_logits, sizeof (float) * nl);
              gepard_sampler_next (s->alone_sampler, scratch, alone_codes);
              if (s->alone_diverged_at < 0
                  && !compare (ctx, floor, cl, cpu_stop[a], cc, alone_logits, alone_stop,
                               alone_codes, s->frames))
                s->alone_diverged_at = s->frames;
              memcpy (s->alone_codes, alone_codes, sizeof (gint32) * nh);
            }
          memcpy (s->cpu_codes, cc, sizeof (gint32) * nh);
          memcpy (s->gpu_codes, gc, sizeof (gint32) * nh);
          s->frames++;
        }
    }

  for (int k = 0; k < batch; k++)
    {
      Seq *s = &seqs[k];
      if (s->gpu_seq != NULL)
        ctx->gpu->funcs->sequence_free (ctx->gpu, s->gpu_seq);
      gepard_kv_cache_free (s->cache);
      gepard_sampler_free (s->sampler);
      gepard_kv_cache_free (s->alone_cache);
      gepard_sampler_free (s->alone_sampler);
      g_free (s->ids);
      g_free (s->prefix);
    }
  g_free (seqs);
  g_rand_free (rand);
  return ok;
}

static void
print_row (int batch, const char *sampling, const char *what, const Stats *st)
{
  g_print ("| %d | %s | %s | %d | %d | ", batch, sampling, what, st->frames_compared,
           st->frames_identical);
  if (st->first_divergence < 0)
    g_print ("none");
  else
    g_print ("frame %d", st->first_divergence);
  g_print (" | %.3g | %.3g | %.3g | %.3f%% |\n", st->max_stop, st->max_logit,
           st->n_logit ? st->sum_logit / st->n_logit : 0.0,
           st->heads_compared ? 100.0 * st->heads_agreed / st->heads_compared : 100.0);
}

static int
parity (Context *ctx, GArray *batches, int n_frames)
{
  g_autoptr (GError) error = NULL;
  int failures = 0;
  g_print ("| B | sampling | compared | frames compared | identical | first divergence | max abs "
           "stop err | max abs logit err | mean abs logit err | head argmax agree |\n");
  g_print ("|---|---|---|---|---|---|---|---|---|---|\n");
  for (guint b = 0; b < batches->len; b++)
    for (int mode = 0; mode < 2; mode++)
      {
        int batch = g_array_index (batches, int, b);
        const char *name = mode == 0 ? "greedy" : "T=0.4";
        GepardSampling sampling;
        gepard_sampling_init_default (&sampling);
        sampling.temperature = mode == 0 ? 0.0f : 0.4f;
        sampling.seed = 42;
        Stats st, floor;
        if (!run_parity (ctx, batch, n_frames, &sampling, &st, &floor, &error))
          {
            g_printerr ("gepard-cuda-check: %s\n", error->message);
            return 1;
          }
        print_row (batch, name, "GPU vs CPU", &st);
        if (batch > 1)
          {
            print_row (batch, name, "CPU alone vs CPU batched", &floor);
            double gpu = st.n_logit ? st.sum_logit / st.n_logit : 0;
            double cpu = floor.n_logit ? floor.sum_logit / floor.n_logit : 0;
            if (mode == 0 && gpu > MAX (TOLERANCE * cpu, ABSOLUTE_TOLERANCE))
              {
                g_print ("FAIL: B %d %s: the GPU's mean logit error %.3g is more than %g× the "
                         "CPU's own %.3g\n",
                         batch, name, gpu, TOLERANCE, cpu);
                failures++;
              }
          }
      }
  return failures > 0 ? 1 : 0;
}

/* ---- bench ---- */

static int
compare_double (const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Text-CFG (§3.4) on both backends through the engine's step interface: three guided sequences
 * (scales 1.5, 3 and 0.5, one after a speaker prefix), each with its unconditional branch after
 * it, and one plain sequence, greedy, every step fed the CPU's frames on both sides; the GPU's
 * frames must agree with the CPU's on at least CFG_MIN_AGREEMENT of the heads (the guidance
 * scales the logits' differences, and with them the GPU's rounding, by up to 2w − 1). */
#define CFG_MIN_AGREEMENT 0.98
static int
cfg_check (Context *ctx, int n_frames)
{
  enum
  {
    N_INPUTS = 7
  };
  static const float scales[] = {1.5f, 3.0f, 0.5f};
  const GepardModelConfig *c = ctx->c;
  int h = ctx->h, nh = ctx->nh;
  g_autoptr (GError) error = NULL;
  GepardCompute *cpu = gepard_compute_cpu_new (ctx->model, NULL);
  GepardCompute *backends[2] = {cpu, ctx->gpu};
  GepardSequence *seqs[2][N_INPUTS] = {{NULL}};
  GepardStepInput inputs[N_INPUTS] = {{0}};
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.temperature = 0;
  GRand *rand = g_rand_new_with_seed (77);
  const gint32 empty[3] = {c->start_of_text, c->end_of_text, c->start_of_speech};
  gint32 ids[4][12];
  g_autofree float *prefix = g_new (float, (gsize)8 * h);
  for (int i = 0; i < 8 * h; i++)
    prefix[i] = (float)g_rand_double_range (rand, -0.1, 0.1);
  gint32 fed[4][GEPARD_MAX_AUDIO_HEADS] = {{0}};
  gint32 codes[2][N_INPUTS * GEPARD_MAX_AUDIO_HEADS];
  float stops[2][N_INPUTS];
  guint64 heads = 0, agreed = 0, frames = 0, identical = 0;
  gboolean ok = TRUE;

  for (int b = 0; b < 2 && ok; b++)
    for (int k = 0; k < N_INPUTS && ok; k++)
      ok = (seqs[b][k] = backends[b]->funcs->sequence_new (backends[b], &sampling, &error)) != NULL;
  for (int u = 0; u < 4; u++)
    for (int t = 0; t < 12; t++)
      ids[u][t] = g_rand_int_range (rand, 0, MIN (c->vocab_size, c->tokenizer_length));
  for (int step = 0; step < n_frames && ok; step++)
    {
      for (int b = 0; b < 2 && ok; b++)
        {
          for (int u = 0, k = 0; u < 4; u++)
            {
              GepardStepInput in = {.sequence = seqs[b][k]};
              if (step == 0)
                {
                  in.ids = ids[u];
                  in.n_ids = 12;
                  in.prefix = u == 1 ? prefix : NULL;
                  in.n_prefix = u == 1 ? 8 : 0;
                }
              else
                in.codes = fed[u];
              inputs[k] = in;
              if (u < 3)
                {
                  inputs[k].guided = TRUE;
                  inputs[k].cfg_scale = scales[u];
                  inputs[k + 1] = in;
                  inputs[k + 1].sequence = seqs[b][k + 1];
                  inputs[k + 1].unconditional = TRUE;
                  if (step == 0)
                    {
                      inputs[k + 1].ids = empty;
                      inputs[k + 1].n_ids = 3;
                    }
                  k++;
                }
              k++;
            }
          ok = backends[b]->funcs->step (backends[b], inputs, N_INPUTS, codes[b], stops[b], &error);
        }
      for (int u = 0; u < 4 && ok; u++)
        {
          int k = u < 3 ? 2 * u : 6;
          const gint32 *cc = codes[0] + (gsize)k * nh, *gc = codes[1] + (gsize)k * nh;
          int same = 0;
          for (int i = 0; i < nh; i++)
            same += cc[i] == gc[i];
          heads += nh;
          agreed += same;
          frames++;
          identical += same == nh;
          memcpy (fed[u], cc, sizeof (gint32) * nh);
        }
    }
  for (int b = 0; b < 2; b++)
    for (int k = 0; k < N_INPUTS; k++)
      if (seqs[b][k] != NULL)
        backends[b]->funcs->sequence_free (backends[b], seqs[b][k]);
  gepard_compute_free (cpu);
  g_rand_free (rand);
  if (!ok)
    {
      g_printerr ("gepard-cuda-check: %s\n", error->message);
      return 1;
    }
  double agreement = heads ? (double)agreed / heads : 0;
  gboolean pass = agreement >= CFG_MIN_AGREEMENT;
  g_print ("text-CFG, greedy, CPU frames fed to both: %" G_GUINT64_FORMAT
           " frames, %" G_GUINT64_FORMAT " identical, head argmax agree %.3f%%: %s (≥ %.0f%%)\n",
           frames, identical, 100 * agreement, pass ? "PASS" : "FAIL", 100 * CFG_MIN_AGREEMENT);
  return pass ? 0 : 1;
}

static int
bench (Context *ctx, GArray *batches, GArray *contexts, int n_steps)
{
  const GepardModelConfig *c = ctx->c;
  int nh = ctx->nh;
  g_autoptr (GError) error = NULL;
  GRand *rand = g_rand_new_with_seed (7);

  g_print ("| context | B | prefill (s) | prefill tok/s | decode ms/step p50 | p90 | min | "
           "frames/s | x real time |\n");
  g_print ("|---|---|---|---|---|---|---|---|---|\n");
  for (guint ci = 0; ci < contexts->len; ci++)
    for (guint bi = 0; bi < batches->len; bi++)
      {
        int context = g_array_index (contexts, int, ci), batch = g_array_index (batches, int, bi);
        GepardSampling sampling;
        gepard_sampling_init_default (&sampling);
        g_autofree GepardSequence **seqs = g_new0 (GepardSequence *, batch);
        g_autofree gint32 *ids = g_new (gint32, (gsize)batch * context);
        g_autofree GepardStepInput *inputs = g_new (GepardStepInput, batch);
        g_autofree gint32 *codes = g_new (gint32, (gsize)batch * nh);
        g_autofree float *stops = g_new (float, batch);
        g_autofree double *times = g_new (double, n_steps);
        gboolean ok = TRUE;

        for (gsize i = 0; i < (gsize)batch * context; i++)
          ids[i] = g_rand_int_range (rand, 0, MIN (c->vocab_size, c->tokenizer_length));
        for (int k = 0; k < batch && ok; k++)
          {
            sampling.seed = k;
            ok = (seqs[k] = ctx->gpu->funcs->sequence_new (ctx->gpu, &sampling, &error)) != NULL;
          }
        /* prefill in steps of at most 8192 rows */
        gint64 t0 = g_get_monotonic_time ();
        for (int k = 0; k < batch && ok;)
          {
            int n = 0, rows = 0;
            while (k + n < batch && (n == 0 || rows + context <= 8192))
              {
                inputs[n] = (GepardStepInput){.sequence = seqs[k + n],
                                              .ids = ids + (gsize)(k + n) * context,
                                              .n_ids = context};
                rows += context;
                n++;
              }
            ok = ctx->gpu->funcs->step (ctx->gpu, inputs, n, codes + (gsize)k * nh, stops, &error);
            k += n;
          }
        double prefill_s = (g_get_monotonic_time () - t0) / 1e6;
        /* two warm-up steps, then the timed ones */
        for (int step = 0; step < n_steps + 2 && ok; step++)
          {
            for (int k = 0; k < batch; k++)
              inputs[k] = (GepardStepInput){.sequence = seqs[k], .codes = codes + (gsize)k * nh};
            g_autofree gint32 *next = g_new (gint32, (gsize)batch * nh);
            gint64 start = g_get_monotonic_time ();
            ok = ctx->gpu->funcs->step (ctx->gpu, inputs, batch, next, stops, &error);
            if (step >= 2)
              times[step - 2] = (g_get_monotonic_time () - start) / 1e3;
            memcpy (codes, next, sizeof (gint32) * batch * nh);
          }
        for (int k = 0; k < batch; k++)
          if (seqs[k] != NULL)
            ctx->gpu->funcs->sequence_free (ctx->gpu, seqs[k]);
        if (!ok)
          {
            g_printerr ("gepard-cuda-check: context %d, B %d: %s\n", context, batch,
                        error->message);
            g_clear_error (&error);
            continue;
          }
        qsort (times, n_steps, sizeof (double), compare_double);
        double p50 = times[n_steps / 2], p90 = times[MIN (n_steps - 1, n_steps * 9 / 10)];
        double fps = batch / (p50 / 1e3);
        g_print ("| %d | %d | %.3f | %.0f | %.3f | %.3f | %.3f | %.0f | %.0f |\n", context, batch,
                 prefill_s, batch * (double)context / prefill_s, p50, p90, times[0], fps,
                 fps / c->frame_rate_hz);
      }
  g_rand_free (rand);
  return 0;
}

typedef struct
{
  double max_error, sum_sq_error, sum_sq_signal;
  gsize n;
} AudioStats;

static void
audio_compare (AudioStats *st, const float *ref, const float *out, gsize n)
{
  for (gsize i = 0; i < n; i++)
    {
      double e = fabs ((double)out[i] - ref[i]);
      st->max_error = MAX (st->max_error, isnan (e) ? INFINITY : e);
      st->sum_sq_error += e * e;
      st->sum_sq_signal += (double)ref[i] * ref[i];
    }
  st->n += n;
}

static double
audio_snr_db (const AudioStats *st)
{
  return st->sum_sq_error > 0 ? 10.0 * log10 (st->sum_sq_signal / st->sum_sq_error) : INFINITY;
}

static void
random_codes (GRand *rand, const GepardCodecConfig *cc, gint32 *codes, int n_frames)
{
  for (int t = 0; t < n_frames; t++)
    for (int i = 0; i < cc->latent_dim; i++)
      codes[(gsize)t * cc->latent_dim + i]
          = g_rand_int_range (rand, 0, cc->fsq_levels[i % cc->fsq_n_dims]);
}

/* decodes frame by frame on the GPU: stream k decodes frames [0, n_frames) of codes[k] in passes
 * start[k] … start[k] + n_frames − 1 */
static gboolean
gpu_decode_staggered (GepardCompute *gpu, GepardAudioStream **streams, gint32 **codes,
                      const int *start, int n, int n_frames, int spf, int latent, float **out,
                      GError **error)
{
  g_autofree GepardAudioStream **batch_streams = g_new (GepardAudioStream *, n);
  g_autofree const gint32 **batch_codes = g_new (const gint32 *, n);
  g_autofree float **batch_out = g_new (float *, n);
  g_autofree int *ones = g_new (int, n);
  int last = 0;
  for (int k = 0; k < n; k++)
    last = MAX (last, start[k] + n_frames);
  for (int pass = 0; pass < last; pass++)
    {
      int b = 0;
      for (int k = 0; k < n; k++)
        if (pass >= start[k] && pass < start[k] + n_frames)
          {
            int f = pass - start[k];
            batch_streams[b] = streams[k];
            batch_codes[b] = codes[k] + (gsize)f * latent;
            batch_out[b] = out[k] + (gsize)f * spf;
            ones[b] = 1;
            b++;
          }
      if (b > 0
          && !gpu->funcs->decode_audio (gpu, batch_streams, batch_codes, ones, batch_out, b, error))
        return FALSE;
    }
  return TRUE;
}

/* decodes every stream's frames in calls that each give every stream with frames left its next
 * chunk: stream k's chunks cycle through 1, 2, 3, 5 and 8 frames from its own place */
static gboolean
gpu_decode_chunked (GepardCompute *gpu, GepardAudioStream **streams, gint32 **codes, int n,
                    int n_frames, int spf, int latent, float **out, GError **error)
{
  static const int sizes[] = {1, 2, 3, 5, 8};
  g_autofree GepardAudioStream **call_streams = g_new (GepardAudioStream *, n);
  g_autofree const gint32 **call_codes = g_new (const gint32 *, n);
  g_autofree float **call_out = g_new (float *, n);
  g_autofree int *call_frames = g_new (int, n);
  g_autofree int *done = g_new0 (int, n);
  for (int call = 0;; call++)
    {
      int b = 0;
      for (int k = 0; k < n; k++)
        if (done[k] < n_frames)
          {
            int f = MIN (sizes[(call + k) % G_N_ELEMENTS (sizes)], n_frames - done[k]);
            call_streams[b] = streams[k];
            call_codes[b] = codes[k] + (gsize)done[k] * latent;
            call_out[b] = out[k] + (gsize)done[k] * spf;
            call_frames[b] = f;
            done[k] += f;
            b++;
          }
      if (b == 0)
        return TRUE;
      if (!gpu->funcs->decode_audio (gpu, call_streams, call_codes, call_frames, call_out, b,
                                     error))
        return FALSE;
    }
}

static int
codec_check (GepardCompute *gpu, GepardCodec *codec, GArray *batches, GArray *pass_frames,
             int n_frames, int n_steps)
{
  const GepardCodecConfig *cc = gepard_codec_get_config (codec);
  int spf = cc->samples_per_frame, latent = cc->latent_dim;
  const int n = 8;
  g_autoptr (GError) error = NULL;
  GRand *rand = g_rand_new_with_seed (11);
  gboolean pedantic = g_strcmp0 (g_getenv ("GEPARD_CUDA_CODEC_PEDANTIC"), "1") == 0;
  int status = 0;

  /* parity: 8 staggered streams, then stream 0 alone and again after a reset */
  gint32 *codes[n];
  float *ref[n], *out[n];
  GepardAudioStream *streams[n];
  int start[n];
  for (int k = 0; k < n; k++)
    {
      codes[k] = g_new (gint32, (gsize)n_frames * latent);
      random_codes (rand, cc, codes[k], n_frames);
      ref[k] = g_new (float, (gsize)n_frames *spf);
      out[k] = g_new0 (float, (gsize)n_frames *spf);
      start[k] = k;
      streams[k] = gpu->funcs->audio_stream_new (gpu, &error);
      g_assert_no_error (error);
    }
  gint64 t0 = g_get_monotonic_time ();
  for (int k = 0; k < n; k++)
    if (!gepard_codec_decode (codec, codes[k], n_frames, ref[k], &error))
      g_error ("CPU decode: %s", error->message);
  gint64 t1 = g_get_monotonic_time ();
  if (!gpu_decode_staggered (gpu, streams, codes, start, n, n_frames, spf, latent, out, &error))
    {
      g_printerr ("gepard-cuda-check: %s\n", error->message);
      return 1;
    }
  AudioStats batched = {0};
  for (int k = 0; k < n; k++)
    audio_compare (&batched, ref[k], out[k], (gsize)n_frames * spf);

  /* stream 0 alone, after a reset of its stream: the same as a fresh stream */
  g_autofree float *alone = g_new0 (float, (gsize)n_frames *spf);
  gpu->funcs->audio_stream_reset (gpu, streams[0]);
  int zero = 0;
  if (!gpu_decode_staggered (gpu, streams, codes, &zero, 1, n_frames, spf, latent, &alone, &error))
    {
      g_printerr ("gepard-cuda-check: %s\n", error->message);
      return 1;
    }
  AudioStats alone_vs_batch = {0}, alone_vs_cpu = {0};
  audio_compare (&alone_vs_batch, out[0], alone, (gsize)n_frames * spf);
  audio_compare (&alone_vs_cpu, ref[0], alone, (gsize)n_frames * spf);

  /* the 8 streams again from the start, in calls of several frames each */
  for (int k = 0; k < n; k++)
    {
      gpu->funcs->audio_stream_reset (gpu, streams[k]);
      memset (out[k], 0, (gsize)n_frames * spf * sizeof (float));
    }
  if (!gpu_decode_chunked (gpu, streams, codes, n, n_frames, spf, latent, out, &error))
    {
      g_printerr ("gepard-cuda-check: %s\n", error->message);
      return 1;
    }
  AudioStats chunked = {0};
  for (int k = 0; k < n; k++)
    audio_compare (&chunked, ref[k], out[k], (gsize)n_frames * spf);

  /* the codec's own account of how it ran, a capture that failed included */
  g_autofree char *description = gepard_compute_cuda_describe (gpu);
  const char *as_run = strstr (description, "codec on the GPU");
  g_print ("codec parity (%d streams joining one pass apart, %d frames each, random codes; CPU "
           "one-shot decode %.2f s); as run: %s\n",
           n, n_frames, (t1 - t0) / 1e6, as_run != NULL ? as_run : description);
  g_print (
      "| comparison | max abs error | RMS error | signal RMS | SNR dB |\n|---|---|---|---|---|\n");
  const struct
  {
    const char *name;
    const AudioStats *st;
  } rows[] = {
      {"GPU batched vs CPU", &batched},
      {"GPU alone (after reset) vs CPU", &alone_vs_cpu},
      {"GPU alone vs GPU batched", &alone_vs_batch},
      {"GPU in multi-frame calls vs CPU", &chunked},
  };
  for (guint r = 0; r < G_N_ELEMENTS (rows); r++)
    g_print ("| %s | %.3g | %.3g | %.3g | %.1f |\n", rows[r].name, rows[r].st->max_error,
             sqrt (rows[r].st->sum_sq_error / rows[r].st->n),
             sqrt (rows[r].st->sum_sq_signal / rows[r].st->n), audio_snr_db (rows[r].st));
  gboolean ok = pedantic ? batched.max_error <= CODEC_PEDANTIC_MAX_ERROR
                               && alone_vs_cpu.max_error <= CODEC_PEDANTIC_MAX_ERROR
                               && chunked.max_error <= CODEC_PEDANTIC_MAX_ERROR
                         : audio_snr_db (&batched) >= CODEC_MIN_SNR_DB
                               && audio_snr_db (&alone_vs_cpu) >= CODEC_MIN_SNR_DB
                               && audio_snr_db (&chunked) >= CODEC_MIN_SNR_DB;
  g_print ("codec parity: %s (%s)\n\n", ok ? "PASS" : "FAIL",
           pedantic ? "max error ≤ 1e-4" : "SNR ≥ 50 dB");
  if (!ok)
    status = 1;
  for (int k = 0; k < n; k++)
    {
      gpu->funcs->audio_stream_free (gpu, streams[k]);
      g_free (codes[k]);
      g_free (ref[k]);
      g_free (out[k]);
    }

  /* time of one call, F frames for each of B streams */
  g_print ("| B | F | ms/call p50 | p90 | min | frames/s | x real time |\n"
           "|---|---|---|---|---|---|---|\n");
  for (guint bi = 0; bi < batches->len; bi++)
    for (guint fi = 0; fi < pass_frames->len; fi++)
      {
        int batch = g_array_index (batches, int, bi), frames = g_array_index (pass_frames, int, fi);
        g_autofree GepardAudioStream **bs = g_new0 (GepardAudioStream *, batch);
        g_autofree const gint32 **bc = g_new (const gint32 *, batch);
        g_autofree float **bo = g_new (float *, batch);
        g_autofree int *counts = g_new (int, batch);
        g_autofree gint32 *all_codes = g_new (gint32, (gsize)batch * frames * latent);
        g_autofree float *all_out = g_new (float, (gsize)batch *frames *spf);
        g_autofree double *times = g_new (double, n_steps);
        gboolean good = TRUE;
        random_codes (rand, cc, all_codes, batch * frames);
        for (int k = 0; k < batch && good; k++)
          {
            good = (bs[k] = gpu->funcs->audio_stream_new (gpu, &error)) != NULL;
            bc[k] = all_codes + (gsize)k * frames * latent;
            bo[k] = all_out + (gsize)k * frames * spf;
            counts[k] = frames;
          }
        for (int step = 0; step < n_steps + 3 && good; step++)
          {
            gint64 start_us = g_get_monotonic_time ();
            good = gpu->funcs->decode_audio (gpu, bs, bc, counts, bo, batch, &error);
            if (step >= 3)
              times[step - 3] = (g_get_monotonic_time () - start_us) / 1e3;
          }
        for (int k = 0; k < batch; k++)
          if (bs[k] != NULL)
            gpu->funcs->audio_stream_free (gpu, bs[k]);
        if (!good)
          {
            g_printerr ("gepard-cuda-check: B %d, F %d: %s\n", batch, frames, error->message);
            g_clear_error (&error);
            status = 1;
            continue;
          }
        qsort (times, n_steps, sizeof (double), compare_double);
        double p50 = times[n_steps / 2], fps = (double)batch * frames / (p50 / 1e3);
        g_print ("| %d | %d | %.3f | %.3f | %.3f | %.0f | %.0f |\n", batch, frames, p50,
                 times[MIN (n_steps - 1, n_steps * 9 / 10)], times[0], fps,
                 fps * spf / cc->sample_rate);
      }
  g_rand_free (rand);
  return status;
}

int
main (int argc, char **argv)
{
  int n_frames = 50, n_steps = 20;
  g_autofree char *batches_text = NULL, *contexts_text = NULL, *pass_frames_text = NULL;
  GOptionEntry entries[] = {
      {"frames", 0, 0, G_OPTION_ARG_INT, &n_frames, "parity: frames per sequence (50)", "N"},
      {"batches", 0, 0, G_OPTION_ARG_STRING, &batches_text,
       "batch sizes (parity 1,8; bench 1,8,64,256)", "LIST"},
      {"contexts", 0, 0, G_OPTION_ARG_STRING, &contexts_text, "bench: prompt lengths (64,1024)",
       "LIST"},
      {"steps", 0, 0, G_OPTION_ARG_INT, &n_steps, "bench: timed decode steps (20)", "N"},
      {"pass-frames", 0, 0, G_OPTION_ARG_STRING, &pass_frames_text,
       "codec: frames of each stream per timed call (1)", "LIST"},
      {NULL},
  };
  g_autoptr (GError) error = NULL;
  g_autoptr (GOptionContext) options = g_option_context_new ("parity|cfg|bench|codec MODEL");
  setlocale (LC_ALL, "");
  g_option_context_add_main_entries (options, entries, NULL);
  g_option_context_set_summary (options, "The CUDA backend against the CPU reference, and its "
                                         "decode step time. Exits 77 where no GPU can run it.");
  if (!g_option_context_parse (options, &argc, &argv, &error) || argc != 3
      || (g_strcmp0 (argv[1], "parity") != 0 && g_strcmp0 (argv[1], "bench") != 0
          && g_strcmp0 (argv[1], "codec") != 0 && g_strcmp0 (argv[1], "cfg") != 0)
      || n_frames < 1 || n_steps < 1)
    {
      g_printerr ("gepard-cuda-check: %s\n",
                  error ? error->message
                        : "give parity, cfg, bench or codec and a model directory");
      return 2;
    }
  gboolean is_bench = g_strcmp0 (argv[1], "bench") == 0;
  gboolean is_codec = g_strcmp0 (argv[1], "codec") == 0;

  g_autoptr (GepardCheckpoint) checkpoint = gepard_checkpoint_open (argv[2], &error);
  if (checkpoint == NULL)
    {
      g_printerr ("gepard-cuda-check: %s\n", error->message);
      return 1;
    }
  gint64 t0 = g_get_monotonic_time ();
  g_autoptr (GepardModel) model = gepard_model_new (checkpoint, GEPARD_ROPE_INV_FREQ_BF16, &error);
  if (model == NULL)
    {
      g_printerr ("gepard-cuda-check: %s\n", error->message);
      return 1;
    }
  g_autoptr (GepardCodec) codec = NULL;
  if (is_codec)
    {
      const char *codec_path = gepard_checkpoint_get_codec_path (checkpoint);
      if (codec_path == NULL)
        {
          g_printerr ("gepard-cuda-check: %s has no codec\n", argv[2]);
          return 1;
        }
      if ((codec = gepard_codec_new (codec_path, &error)) == NULL)
        {
          g_printerr ("gepard-cuda-check: %s\n", error->message);
          return 1;
        }
    }
  gint64 t1 = g_get_monotonic_time ();
  GepardCompute *gpu = gepard_compute_cuda_new (checkpoint, model, codec, 0, &error);
  if (gpu == NULL)
    {
      g_print ("gepard-cuda-check: skipped: %s\n", error->message);
      return g_error_matches (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE)
                 ? EXIT_SKIP
                 : 1;
    }
  gint64 t2 = g_get_monotonic_time ();
  g_autofree char *description = gepard_compute_cuda_describe (gpu);
  const GepardModelConfig *c = gepard_model_get_config (model);
  g_print ("model: %s (%d layers, hidden %d, %d/%d heads × %d)\n", argv[2], c->n_layers,
           c->hidden_size, c->n_q_heads, c->n_kv_heads, c->head_dim);
  g_print ("gpu: %s\nload: CPU model %.2f s, GPU model %.2f s\n\n", description, (t1 - t0) / 1e6,
           (t2 - t1) / 1e6);

  Context ctx
      = {model, c, gpu, c->hidden_size, c->n_audio_heads, gepard_model_get_n_head_logits (model)};
  g_autoptr (GArray) batches = parse_list (batches_text ? batches_text
                                           : is_codec   ? "1,8,64,256,1024"
                                           : is_bench   ? "1,8,64,256"
                                                        : "1,8");
  g_autoptr (GArray) contexts = parse_list (contexts_text ? contexts_text : "64,1024");
  g_autoptr (GArray) pass_frames = parse_list (pass_frames_text ? pass_frames_text : "1");
  int status = is_codec   ? codec_check (gpu, codec, batches, pass_frames, n_frames, n_steps)
               : is_bench ? bench (&ctx, batches, contexts, n_steps)
               : g_strcmp0 (argv[1], "cfg") == 0 ? cfg_check (&ctx, n_frames)
                                                 : parity (&ctx, batches, n_frames);
  gepard_compute_free (gpu);
  return status;
}
