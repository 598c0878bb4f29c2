/* gepard-model.c: the GEPARD forward pass on the CPU (gepard-model.md §1, §3.5, §3.6).
 *
 * Plain and close to the spec: every op is a loop or one BLAS call, followed by the bf16 rounding
 * the bf16 eager reference applies at that point (§1.9). */
#include "gepard-model.h"

#include "gepard-bf16.h"
#include "gepard-error.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

typedef struct
{
  float *weight; /* [out, in], bf16-rounded */
  float *bias;   /* [out] or NULL */
  int out;
  int in;
} Linear;

typedef struct
{
  float *input_scale; /* 1 + w of the zero-centred norms (§1.2) */
  float *post_scale;
  float *q_scale;
  float *k_scale;
  Linear q, k, v, o;
  Linear gate, up, down;
} Layer;

typedef struct
{
  float *norm_self, *norm_cross, *norm_ffn; /* plain RMSNorm weights (§3.6 step 6) */
  Linear self_q, self_k, self_v, self_out;
  Linear cross_q, cross_k, cross_v, cross_out;
  Linear gate, up, down;
} CompressorBlock;

struct _GepardModel
{
  GepardModelConfig config;
  GepardRopeMode rope_mode;
  const GepardTensor *embed_tokens; /* in the checkpoint's mapping */
  Layer *layers;
  float *final_scale;
  int rotary_dim;
  float *inv_freq; /* [rotary_dim / 2] */

  float **audio_embeddings; /* per head [levels, audio_embed_dim] */
  int head_offset[GEPARD_MAX_AUDIO_HEADS + 1];
  Linear embed_proj0, embed_proj2;
  float audio_embed_scale;
  Linear heads; /* the 32 codebook heads stacked: [216, H] */
  Linear stop;

  Linear input_proj;
  float *queries;
  CompressorBlock *blocks;
  float *compressor_final_norm;
  float output_scale;
  float *null_prefix;
};

struct _GepardKvCache
{
  const GepardModel *model;
  int length;
  int capacity;
  float **k; /* per layer [n_kv, capacity, head_dim], after k_norm and RoPE */
  float **v; /* per layer [n_kv, capacity, head_dim] */
};

/* ---- loading ---- */

/* the checkpoint was validated when opened (gepard-checkpoint.c), so every name is present */
static float *
load_f32 (const GepardCheckpoint *checkpoint, const char *name)
{
  const GepardTensor *t = gepard_checkpoint_lookup (checkpoint, name);
  g_assert (t != NULL);
  float *data = g_new (float, t->n_elements);
  gepard_tensor_to_f32 (t, data);
  /* the runner casts the whole model to bf16 (gepard-model.md §2.3) */
  gepard_bf16_round_array (data, t->n_elements);
  return data;
}

static float
load_scalar (const GepardCheckpoint *checkpoint, const char *name)
{
  g_autofree float *value = load_f32 (checkpoint, name);
  return value[0];
}

/* zero-centred norm weight → the fp32 factor (1 + w) of §1.2 */
static float *
load_norm_scale (const GepardCheckpoint *checkpoint, const char *name, int n)
{
  float *w = load_f32 (checkpoint, name);
  for (int i = 0; i < n; i++)
    w[i] = 1.0f + w[i];
  return w;
}

static void
load_linear (Linear *l, const GepardCheckpoint *checkpoint, const char *prefix, gboolean bias)
{
  g_autofree char *weight_name = g_strconcat (prefix, ".weight", NULL);
  const GepardTensor *t = gepard_checkpoint_lookup (checkpoint, weight_name);
  g_assert (t != NULL && t->n_dims == 2);
  l->out = (int)t->shape[0];
  l->in = (int)t->shape[1];
  l->weight = load_f32 (checkpoint, weight_name);
  if (bias)
    {
      g_autofree char *bias_name = g_strconcat (prefix, ".bias", NULL);
      l->bias = load_f32 (checkpoint, bias_name);
    }
}

static void
linear_clear (Linear *l)
{
  g_clear_pointer (&l->weight, g_free);
  g_clear_pointer (&l->bias, g_free);
}

static void
load_layer (Layer *layer, const GepardCheckpoint *checkpoint, int n, const GepardModelConfig *c)
{
  char prefix[96];
#define P(suffix) (g_snprintf (prefix, sizeof prefix, "model.layers.%d.%s", n, suffix), prefix)
  layer->input_scale = load_norm_scale (checkpoint, P ("input_layernorm.weight"), c->hidden_size);
  layer->post_scale
      = load_norm_scale (checkpoint, P ("post_attention_layernorm.weight"), c->hidden_size);
  layer->q_scale = load_norm_scale (checkpoint, P ("self_attn.q_norm.weight"), c->head_dim);
  layer->k_scale = load_norm_scale (checkpoint, P ("self_attn.k_norm.weight"), c->head_dim);
  load_linear (&layer->q, checkpoint, P ("self_attn.q_proj"), FALSE);
  load_linear (&layer->k, checkpoint, P ("self_attn.k_proj"), FALSE);
  load_linear (&layer->v, checkpoint, P ("self_attn.v_proj"), FALSE);
  load_linear (&layer->o, checkpoint, P ("self_attn.o_proj"), FALSE);
  load_linear (&layer->gate, checkpoint, P ("mlp.gate_proj"), FALSE);
  load_linear (&layer->up, checkpoint, P ("mlp.up_proj"), FALSE);
  load_linear (&layer->down, checkpoint, P ("mlp.down_proj"), FALSE);
#undef P
}

static void
load_compressor_block (CompressorBlock *block, const GepardCheckpoint *checkpoint, int b)
{
  char prefix[96];
#define P(suffix)                                                                                  \
  (g_snprintf (prefix, sizeof prefix, "ref_compressor.blocks.%d.%s", b, suffix), prefix)
  block->norm_self = load_f32 (checkpoint, P ("norm_self.weight"));
  block->norm_cross = load_f32 (checkpoint, P ("norm_cross.weight"));
  block->norm_ffn = load_f32 (checkpoint, P ("norm_ffn.weight"));
  load_linear (&block->self_q, checkpoint, P ("self_attn.q_proj"), FALSE);
  load_linear (&block->self_k, checkpoint, P ("self_attn.k_proj"), FALSE);
  load_linear (&block->self_v, checkpoint, P ("self_attn.v_proj"), FALSE);
  load_linear (&block->self_out, checkpoint, P ("self_attn.out_proj"), FALSE);
  load_linear (&block->cross_q, checkpoint, P ("cross_attn.q_proj"), FALSE);
  load_linear (&block->cross_k, checkpoint, P ("cross_attn.k_proj"), FALSE);
  load_linear (&block->cross_v, checkpoint, P ("cross_attn.v_proj"), FALSE);
  load_linear (&block->cross_out, checkpoint, P ("cross_attn.out_proj"), FALSE);
  load_linear (&block->gate, checkpoint, P ("ffn.gate_proj"), FALSE);
  load_linear (&block->up, checkpoint, P ("ffn.up_proj"), FALSE);
  load_linear (&block->down, checkpoint, P ("ffn.down_proj"), FALSE);
#undef P
}

/* §1.5: inv_freq[j] = 1 / theta^(2j / rotary_dim), computed in fp32 as torch does when the module
 * is built; GEPARD's runner then rounds the buffer to bf16. */
static float *
compute_inv_freq (double theta, int rotary_dim, GepardRopeMode mode)
{
  int n = rotary_dim / 2;
  float *inv_freq = g_new (float, n);
  for (int j = 0; j < n; j++)
    {
      float exponent = (float)(2 * j) / (float)rotary_dim;
      inv_freq[j] = 1.0f / powf ((float)theta, exponent);
      if (mode == GEPARD_ROPE_INV_FREQ_BF16)
        inv_freq[j] = gepard_bf16_round (inv_freq[j]);
    }
  return inv_freq;
}

GepardModel *
gepard_model_new (const GepardCheckpoint *checkpoint, GepardRopeMode rope_mode, GError **error)
{
  const GepardModelConfig *c = gepard_checkpoint_get_config (checkpoint);
  GepardModel *model = g_new0 (GepardModel, 1);

  model->config = *c;
  model->config.model_dtype = g_strdup (c->model_dtype);
  model->rope_mode = rope_mode;
  model->embed_tokens = gepard_checkpoint_lookup (checkpoint, "model.embed_tokens.weight");

  model->layers = g_new0 (Layer, c->n_layers);
  for (int n = 0; n < c->n_layers; n++)
    load_layer (&model->layers[n], checkpoint, n, c);
  model->final_scale = load_norm_scale (checkpoint, "model.norm.weight", c->hidden_size);
  model->rotary_dim = (int)(c->head_dim * c->partial_rotary_factor);
  model->rotary_dim -= model->rotary_dim % 2;
  model->inv_freq = compute_inv_freq (c->rope_theta, model->rotary_dim, rope_mode);

  model->audio_embeddings = g_new0 (float *, c->n_audio_heads);
  model->head_offset[0] = 0;
  for (int i = 0; i < c->n_audio_heads; i++)
    {
      char name[64];
      g_snprintf (name, sizeof name, "audio_embeddings.%d.weight", i);
      model->audio_embeddings[i] = load_f32 (checkpoint, name);
      model->head_offset[i + 1] = model->head_offset[i] + c->head_levels[i];
    }
  if (model->head_offset[c->n_audio_heads] > GEPARD_MAX_HEAD_LOGITS)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "The heads have %d logits in all, more than the %d Gepard supports",
                   model->head_offset[c->n_audio_heads], GEPARD_MAX_HEAD_LOGITS);
      gepard_model_free (model);
      return NULL;
    }
  load_linear (&model->embed_proj0, checkpoint, "audio_embed_proj.0", TRUE);
  load_linear (&model->embed_proj2, checkpoint, "audio_embed_proj.2", TRUE);
  model->audio_embed_scale = load_scalar (checkpoint, "audio_embed_scale");

  /* stack the heads into one [216, H] linear: each row is independent, so this is the same math */
  int n_logits = model->head_offset[c->n_audio_heads];
  model->heads.out = n_logits;
  model->heads.in = c->hidden_size;
  model->heads.weight = g_new (float, (gsize)n_logits * c->hidden_size);
  model->heads.bias = g_new (float, n_logits);
  for (int i = 0; i < c->n_audio_heads; i++)
    {
      Linear head = {0};
      char prefix[64];
      g_snprintf (prefix, sizeof prefix, "codebook_heads.%d", i);
      load_linear (&head, checkpoint, prefix, TRUE);
      memcpy (model->heads.weight + (gsize)model->head_offset[i] * c->hidden_size, head.weight,
              sizeof (float) * head.out * head.in);
      memcpy (model->heads.bias + model->head_offset[i], head.bias, sizeof (float) * head.out);
      linear_clear (&head);
    }
  load_linear (&model->stop, checkpoint, "stop_head", TRUE);

  if (c->voice_cloning)
    {
      load_linear (&model->input_proj, checkpoint, "ref_compressor.input_proj", TRUE);
      model->queries = load_f32 (checkpoint, "ref_compressor.queries");
      model->blocks = g_new0 (CompressorBlock, c->compressor_layers);
      for (int b = 0; b < c->compressor_layers; b++)
        load_compressor_block (&model->blocks[b], checkpoint, b);
      model->compressor_final_norm = load_f32 (checkpoint, "ref_compressor.final_norm.weight");
      model->output_scale = load_scalar (checkpoint, "ref_compressor.output_scale");
      model->null_prefix = load_f32 (checkpoint, "null_prefix");
    }
  return model;
}

void
gepard_model_free (GepardModel *model)
{
  if (model == NULL)
    return;
  const GepardModelConfig *c = &model->config;
  for (int n = 0; n < c->n_layers && model->layers != NULL; n++)
    {
      Layer *l = &model->layers[n];
      g_free (l->input_scale);
      g_free (l->post_scale);
      g_free (l->q_scale);
      g_free (l->k_scale);
      linear_clear (&l->q);
      linear_clear (&l->k);
      linear_clear (&l->v);
      linear_clear (&l->o);
      linear_clear (&l->gate);
      linear_clear (&l->up);
      linear_clear (&l->down);
    }
  g_free (model->layers);
  g_free (model->final_scale);
  g_free (model->inv_freq);
  for (int i = 0; i < c->n_audio_heads && model->audio_embeddings != NULL; i++)
    g_free (model->audio_embeddings[i]);
  g_free (model->audio_embeddings);
  linear_clear (&model->embed_proj0);
  linear_clear (&model->embed_proj2);
  linear_clear (&model->heads);
  linear_clear (&model->stop);
  linear_clear (&model->input_proj);
  g_free (model->queries);
  for (int b = 0; model->blocks != NULL && b < c->compressor_layers; b++)
    {
      CompressorBlock *k = &model->blocks[b];
      g_free (k->norm_self);
      g_free (k->norm_cross);
      g_free (k->norm_ffn);
      Linear *linears[]
          = {&k->self_q,  &k->self_k,    &k->self_v, &k->self_out, &k->cross_q, &k->cross_k,
             &k->cross_v, &k->cross_out, &k->gate,   &k->up,       &k->down};
      for (guint i = 0; i < G_N_ELEMENTS (linears); i++)
        linear_clear (linears[i]);
    }
  g_free (model->blocks);
  g_free (model->compressor_final_norm);
  g_free (model->null_prefix);
  g_free (model->config.model_dtype);
  g_free (model);
}

const GepardModelConfig *
gepard_model_get_config (const GepardModel *model)
{
  return &model->config;
}

int
gepard_model_get_n_head_logits (const GepardModel *model)
{
  return model->head_offset[model->config.n_audio_heads];
}

const float *
gepard_model_get_null_prefix (const GepardModel *model)
{
  return model->null_prefix;
}

/* ---- ops ---- */

/* y[n, out] = bf16(x[n, in] · Wᵀ + b): fp32 accumulation, the bias inside the accumulator, one
 * rounding (§1.9, §3.5) */
static void
linear_forward (const Linear *l, const float *x, int n, float *y)
{
  if (n == 1)
    cblas_sgemv (CblasRowMajor, CblasNoTrans, l->out, l->in, 1.0f, l->weight, l->in, x, 1, 0.0f, y,
                 1);
  else
    cblas_sgemm (CblasRowMajor, CblasNoTrans, CblasTrans, n, l->out, l->in, 1.0f, x, l->in,
                 l->weight, l->in, 0.0f, y, l->out);
  for (int t = 0; t < n; t++)
    {
      float *row = y + (gsize)t * l->out;
      if (l->bias != NULL)
        for (int o = 0; o < l->out; o++)
          row[o] += l->bias[o];
      gepard_bf16_round_array (row, l->out);
    }
}

static float
inverse_rms (const float *x, int n, float eps)
{
  double sum = 0;
  for (int i = 0; i < n; i++)
    sum += (double)x[i] * x[i];
  return 1.0f / sqrtf ((float)(sum / n) + eps);
}

/* §1.2: zero-centred RMSNorm, fp32 inside, one bf16 rounding; `scale` holds 1 + w */
static void
rms_norm (const float *x, const float *scale, int n, float eps, float *y)
{
  float r = inverse_rms (x, n, eps);
  for (int i = 0; i < n; i++)
    y[i] = gepard_bf16_round ((x[i] * r) * scale[i]);
}

/* §3.6 step 6: the compressor's plain RMSNorm, rounded to bf16 before the weight multiply */
static void
plain_rms_norm (const float *x, const float *weight, int n, float *y)
{
  float r = inverse_rms (x, n, 1e-6f);
  for (int i = 0; i < n; i++)
    y[i] = gepard_bf16_round (gepard_bf16_round (x[i] * r) * weight[i]);
}

static float
silu (float x)
{
  return x / (1.0f + expf (-x));
}

static float
sigmoid (float x)
{
  return 1.0f / (1.0f + expf (-x));
}

/* §1.5: half-split RoPE over the first rotary_dim dims at position p; each product and the sum are
 * rounded to bf16, cos and sin too */
static void
apply_rope (const GepardModel *model, float *x, int position)
{
  int half = model->rotary_dim / 2;
  for (int j = 0; j < half; j++)
    {
      float angle = model->inv_freq[j] * (float)position;
      float c = gepard_bf16_round (cosf (angle));
      float s = gepard_bf16_round (sinf (angle));
      float a = x[j], b = x[j + half];
      x[j] = gepard_bf16_round (gepard_bf16_round (a * c) + gepard_bf16_round (-b * s));
      x[j + half] = gepard_bf16_round (gepard_bf16_round (b * c) + gepard_bf16_round (a * s));
    }
}

static void
kv_cache_reserve (GepardKvCache *cache, int needed)
{
  if (needed <= cache->capacity)
    return;
  const GepardModelConfig *c = &cache->model->config;
  int capacity = MAX (needed, MAX (64, cache->capacity * 2));
  gsize row = (gsize)c->head_dim;
  for (int n = 0; n < c->n_layers; n++)
    for (int which = 0; which < 2; which++)
      {
        float **store = which == 0 ? &cache->k[n] : &cache->v[n];
        float *grown = g_new0 (float, (gsize)c->n_kv_heads *capacity *row);
        for (int j = 0; j < c->n_kv_heads && *store != NULL; j++)
          memcpy (grown + (gsize)j * capacity * row, *store + (gsize)j * cache->capacity * row,
                  sizeof (float) * cache->length * row);
        g_free (*store);
        *store = grown;
      }
  cache->capacity = capacity;
}

GepardKvCache *
gepard_kv_cache_new (const GepardModel *model)
{
  GepardKvCache *cache = g_new0 (GepardKvCache, 1);
  cache->model = model;
  cache->k = g_new0 (float *, model->config.n_layers);
  cache->v = g_new0 (float *, model->config.n_layers);
  return cache;
}

void
gepard_kv_cache_free (GepardKvCache *cache)
{
  if (cache == NULL)
    return;
  for (int n = 0; n < cache->model->config.n_layers; n++)
    {
      g_free (cache->k[n]);
      g_free (cache->v[n]);
    }
  g_free (cache->k);
  g_free (cache->v);
  g_free (cache);
}

int
gepard_kv_cache_get_length (const GepardKvCache *cache)
{
  return cache->length;
}

void
gepard_kv_cache_reset (GepardKvCache *cache)
{
  cache->length = 0;
}

/* §1.4: gated GQA attention for one sequence: `n` new tokens whose projections `qg` [n, nq·2·hd]
 * (per head [query | gate]), `k`, `v` [n, nkv·hd] are normed and rotated here, appended to the
 * cache at positions len … len+n−1, and attended causally; writes the gated head outputs
 * `o` [n, nq·hd] */
static void
attend (const GepardModel *model, const Layer *layer, GepardKvCache *cache, int layer_index,
        float *qg, float *k, const float *v, int n, float *o)
{
  const GepardModelConfig *c = &model->config;
  int hd = c->head_dim, nq = c->n_q_heads, nkv = c->n_kv_heads, group = nq / nkv;
  int start = cache->length;
  int total = start + n;
  /* head_dim^-0.5 as torch's Python float, applied to the bf16 scores (exact for 1/16) */
  float scaling = (float)pow (hd, -0.5);
  g_autofree float *scores = g_new (float, total);

  float *k_cache = cache->k[layer_index], *v_cache = cache->v[layer_index];
  gsize cap = cache->capacity;
  for (int t = 0; t < n; t++)
    {
      for (int j = 0; j < nkv; j++)
        {
          float *kt = k + ((gsize)t * nkv + j) * hd;
          rms_norm (kt, layer->k_scale, hd, (float)c->rms_norm_eps, kt);
          apply_rope (model, kt, start + t);
          memcpy (k_cache + ((gsize)j * cap + start + t) * hd, kt, sizeof (float) * hd);
          memcpy (v_cache + ((gsize)j * cap + start + t) * hd, v + ((gsize)t * nkv + j) * hd,
                  sizeof (float) * hd);
        }
      for (int h = 0; h < nq; h++)
        {
          /* per head [query | gate] (§1.4 step 1) */
          float *q = qg + ((gsize)t * nq + h) * 2 * hd;
          rms_norm (q, layer->q_scale, hd, (float)c->rms_norm_eps, q);
          apply_rope (model, q, start + t);
        }
    }

  for (int t = 0; t < n; t++)
    {
      int visible = start + t + 1; /* causal */
      for (int h = 0; h < nq; h++)
        {
          const float *q = qg + ((gsize)t * nq + h) * 2 * hd;
          const float *keys = k_cache + (gsize)(h / group) * cap * hd;
          const float *values = v_cache + (gsize)(h / group) * cap * hd;
          float max = -INFINITY;
          for (int s = 0; s < visible; s++)
            {
              float dot = 0;
              for (int d = 0; d < hd; d++)
                dot += q[d] * keys[(gsize)s * hd + d];
              /* eager attention rounds QKᵀ to bf16 before scaling and softmax (§1.4) */
              scores[s] = gepard_bf16_round (gepard_bf16_round (dot) * scaling);
              max = MAX (max, scores[s]);
            }
          float sum = 0;
          for (int s = 0; s < visible; s++)
            {
              scores[s] = expf (scores[s] - max);
              sum += scores[s];
            }
          for (int s = 0; s < visible; s++)
            scores[s] = gepard_bf16_round (scores[s] / sum);
          float *oh = o + ((gsize)t * nq + h) * hd;
          for (int d = 0; d < hd; d++)
            oh[d] = 0;
          for (int s = 0; s < visible; s++)
            for (int d = 0; d < hd; d++)
              oh[d] += scores[s] * values[(gsize)s * hd + d];
          /* output gate (§1.4 step 8): bf16 sigmoid, bf16 product */
          const float *gate = q + hd;
          for (int d = 0; d < hd; d++)
            oh[d] = gepard_bf16_round (gepard_bf16_round (oh[d])
                                       * gepard_bf16_round (sigmoid (gate[d])));
        }
    }
}

/* The attention block for a batch: projections over all rows at once, attention per sequence,
 * the output projection over all rows. */
static void
attention (const GepardModel *model, const Layer *layer, const GepardBatchSegment *segments,
           int n_segments, int layer_index, const float *u, int n, float *out)
{
  const GepardModelConfig *c = &model->config;
  int hd = c->head_dim, nq = c->n_q_heads, nkv = c->n_kv_heads;
  g_autofree float *qg = g_new (float, (gsize)n *nq *hd * 2);
  g_autofree float *k = g_new (float, (gsize)n *nkv *hd);
  g_autofree float *v = g_new (float, (gsize)n *nkv *hd);
  g_autofree float *o = g_new (float, (gsize)n *nq *hd);

  linear_forward (&layer->q, u, n, qg);
  linear_forward (&layer->k, u, n, k);
  linear_forward (&layer->v, u, n, v);
  int row = 0;
  for (int s = 0; s < n_segments; s++)
    {
      attend (model, layer, segments[s].cache, layer_index, qg + (gsize)row * nq * hd * 2,
              k + (gsize)row * nkv * hd, v + (gsize)row * nkv * hd, segments[s].n_tokens,
              o + (gsize)row * nq * hd);
      row += segments[s].n_tokens;
    }
  linear_forward (&layer->o, o, n, out);
}

/* §1.6: SwiGLU, every op rounded to bf16 */
static void
mlp (const Linear *gate_proj, const Linear *up_proj, const Linear *down_proj, const float *x, int n,
     float *out)
{
  gsize size = (gsize)n * gate_proj->out;
  g_autofree float *gate = g_new (float, size);
  g_autofree float *up = g_new (float, size);
  linear_forward (gate_proj, x, n, gate);
  linear_forward (up_proj, x, n, up);
  for (gsize i = 0; i < size; i++)
    gate[i] = gepard_bf16_round (gepard_bf16_round (silu (gate[i])) * up[i]);
  linear_forward (down_proj, gate, n, out);
}

static void
residual_add (float *x, const float *y, gsize n)
{
  for (gsize i = 0; i < n; i++)
    x[i] = gepard_bf16_round (x[i] + y[i]);
}

void
gepard_model_forward_batch (const GepardModel *model, const GepardBatchSegment *segments,
                            int n_segments, const float *embeds, float *hidden)
{
  const GepardModelConfig *c = &model->config;
  int n = 0;
  for (int s = 0; s < n_segments; s++)
    {
      n += segments[s].n_tokens;
      kv_cache_reserve (segments[s].cache, segments[s].cache->length + segments[s].n_tokens);
    }
  if (n == 0)
    return;

  gsize size = (gsize)n * c->hidden_size;
  g_autofree float *x = g_memdup2 (embeds, sizeof (float) * size);
  g_autofree float *u = g_new (float, size);
  g_autofree float *y = g_new (float, size);

  for (int l = 0; l < c->n_layers; l++)
    {
      const Layer *layer = &model->layers[l];
      for (int t = 0; t < n; t++)
        rms_norm (x + (gsize)t * c->hidden_size, layer->input_scale, c->hidden_size,
                  (float)c->rms_norm_eps, u + (gsize)t * c->hidden_size);
      attention (model, layer, segments, n_segments, l, u, n, y);
      residual_add (x, y, size);
      for (int t = 0; t < n; t++)
        rms_norm (x + (gsize)t * c->hidden_size, layer->post_scale, c->hidden_size,
                  (float)c->rms_norm_eps, u + (gsize)t * c->hidden_size);
      mlp (&layer->gate, &layer->up, &layer->down, u, n, y);
      residual_add (x, y, size);
      /* the cache holds this layer's keys now; positions advance after the last layer */
    }
  for (int s = 0; s < n_segments; s++)
    segments[s].cache->length += segments[s].n_tokens;
  for (int t = 0; t < n; t++)
    rms_norm (x + (gsize)t * c->hidden_size, model->final_scale, c->hidden_size,
              (float)c->rms_norm_eps, hidden + (gsize)t * c->hidden_size);
}

void
gepard_model_forward (const GepardModel *model, GepardKvCache *cache, const float *embeds, int n,
                      float *hidden)
{
  GepardBatchSegment segment = {cache, n};
  gepard_model_forward_batch (model, &segment, 1, embeds, hidden);
}

/* ---- embeddings and heads ---- */

gboolean
gepard_model_embed_tokens (const GepardModel *model, const gint32 *ids, int n, float *out,
                           GError **error)
{
  const GepardTensor *table = model->embed_tokens;
  int h = model->config.hidden_size;
  GepardTensor row = *table;
  row.n_dims = 1;
  row.shape[0] = h;
  row.n_elements = h;
  row.n_bytes = gepard_dtype_size (table->dtype) * h;

  for (int t = 0; t < n; t++)
    {
      if (ids[t] < 0 || ids[t] >= table->shape[0])
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                       "Token id %d is outside the embedding table (%" G_GINT64_FORMAT " rows)",
                       ids[t], table->shape[0]);
          return FALSE;
        }
      row.data = table->data + (gsize)ids[t] * row.n_bytes;
      gepard_tensor_to_f32 (&row, out + (gsize)t * h);
      gepard_bf16_round_array (out + (gsize)t * h, h);
    }
  return TRUE;
}

gboolean
gepard_model_embed_frame (const GepardModel *model, const gint32 *codes, float *out, GError **error)
{
  const GepardModelConfig *c = &model->config;
  int e = c->audio_embed_dim, h = c->hidden_size;
  g_autofree float *x = g_new (float, (gsize)c->n_audio_heads *e);
  g_autofree float *a = g_new (float, h);

  for (int i = 0; i < c->n_audio_heads; i++)
    {
      if (codes[i] < 0 || codes[i] >= c->head_levels[i])
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                       "Code %d of channel %d is outside its %d levels", codes[i], i,
                       c->head_levels[i]);
          return FALSE;
        }
      memcpy (x + (gsize)i * e, model->audio_embeddings[i] + (gsize)codes[i] * e,
              sizeof (float) * e);
    }
  /* §3.5: Linear → exact GELU → Linear → LayerNorm (no affine, eps 1e-5) → × scale */
  linear_forward (&model->embed_proj0, x, 1, a);
  for (int i = 0; i < h; i++)
    a[i] = gepard_bf16_round (a[i] * 0.5f * (1.0f + erff (a[i] * (float)M_SQRT1_2)));
  linear_forward (&model->embed_proj2, a, 1, out);

  double mean = 0, var = 0;
  for (int i = 0; i < h; i++)
    mean += out[i];
  mean /= h;
  for (int i = 0; i < h; i++)
    var += (out[i] - mean) * (out[i] - mean);
  float rstd = 1.0f / sqrtf ((float)(var / h) + 1e-5f);
  for (int i = 0; i < h; i++)
    {
      float normed = gepard_bf16_round ((out[i] - (float)mean) * rstd);
      out[i] = gepard_bf16_round (normed * model->audio_embed_scale);
    }
  return TRUE;
}

void
gepard_model_heads (const GepardModel *model, const float *hidden, float *logits, float *stop_logit)
{
  gepard_model_heads_batch (model, hidden, 1, logits, stop_logit);
}

void
gepard_model_heads_batch (const GepardModel *model, const float *hidden, int n, float *logits,
                          float *stop_logits)
{
  linear_forward (&model->heads, hidden, n, logits);
  linear_forward (&model->stop, hidden, n, stop_logits);
}

/* ---- compressor (§3.6) ---- */

/* bidirectional multi-head attention, fp32 inside, bf16 out, then the output projection */
static void
compressor_attention (const Linear *wq, const Linear *wk, const Linear *wv, const Linear *wo,
                      int n_heads, const float *queries_in, int n_q, const float *memory, int n_kv,
                      float *out)
{
  int d = wq->out, dh = d / n_heads;
  g_autofree float *q = g_new (float, (gsize)n_q *d);
  g_autofree float *k = g_new (float, (gsize)n_kv *d);
  g_autofree float *v = g_new (float, (gsize)n_kv *d);
  g_autofree float *o = g_new (float, (gsize)n_q *d);
  g_autofree float *p = g_new (float, n_kv);
  float scale = 1.0f / sqrtf ((float)dh);

  linear_forward (wq, queries_in, n_q, q);
  linear_forward (wk, memory, n_kv, k);
  linear_forward (wv, memory, n_kv, v);
  for (int t = 0; t < n_q; t++)
    for (int h = 0; h < n_heads; h++)
      {
        const float *qh = q + (gsize)t * d + h * dh;
        float max = -INFINITY, sum = 0;
        for (int s = 0; s < n_kv; s++)
          {
            float dot = 0;
            const float *ks = k + (gsize)s * d + h * dh;
            for (int i = 0; i < dh; i++)
              dot += qh[i] * ks[i];
            p[s] = dot * scale;
            max = MAX (max, p[s]);
          }
        for (int s = 0; s < n_kv; s++)
          {
            p[s] = expf (p[s] - max);
            sum += p[s];
          }
        float *oh = o + (gsize)t * d + h * dh;
        for (int i = 0; i < dh; i++)
          oh[i] = 0;
        for (int s = 0; s < n_kv; s++)
          for (int i = 0; i < dh; i++)
            oh[i] += (p[s] / sum) * v[(gsize)s * d + h * dh + i];
        gepard_bf16_round_array (oh, dh);
      }
  linear_forward (wo, o, n_q, out);
}

gboolean
gepard_model_compress (const GepardModel *model, const gint32 *codes, int n_frames, float *prefix,
                       GError **error)
{
  const GepardModelConfig *c = &model->config;
  if (!c->voice_cloning)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "This model has no voice-cloning compressor");
      return FALSE;
    }
  if (n_frames <= 0)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "A reference needs at least one frame of codes");
      return FALSE;
    }
  int d = c->hidden_size, nq = c->compressor_queries, channels = c->n_audio_heads;
  g_autofree float *v = g_new (float, (gsize)n_frames *channels);
  g_autofree float *x = g_new (float, (gsize)n_frames *d);

  /* step 1: dequantize (c − s)/s, s = floor(L/2), fp32 then bf16 */
  for (int t = 0; t < n_frames; t++)
    for (int i = 0; i < channels; i++)
      {
        gint32 code = codes[(gsize)t * channels + i];
        int levels = c->head_levels[i];
        if (code < 0 || code >= levels)
          {
            g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                         "Reference code %d of frame %d, channel %d is outside its %d levels", code,
                         t, i, levels);
            return FALSE;
          }
        float s = (float)(levels / 2);
        v[(gsize)t * channels + i] = gepard_bf16_round (((float)code - s) / s);
      }
  /* steps 2–3: input projection plus the interleaved sinusoidal positions, built in fp32 and
   * cast to bf16 */
  linear_forward (&model->input_proj, v, n_frames, x);
  float log_base = (float)(-log (10000.0) / d);
  for (int t = 0; t < n_frames; t++)
    for (int i = 0; i < d / 2; i++)
      {
        float omega = expf ((float)(2 * i) * log_base);
        float angle = (float)t * omega;
        float *row = x + (gsize)t * d;
        row[2 * i] = gepard_bf16_round (row[2 * i] + gepard_bf16_round (sinf (angle)));
        row[2 * i + 1] = gepard_bf16_round (row[2 * i + 1] + gepard_bf16_round (cosf (angle)));
      }

  /* steps 4–5: the queries through the Q-Former blocks */
  gsize qsize = (gsize)nq * d;
  g_autofree float *q = g_memdup2 (model->queries, sizeof (float) * qsize);
  g_autofree float *h = g_new (float, qsize);
  g_autofree float *y = g_new (float, qsize);
  for (int b = 0; b < c->compressor_layers; b++)
    {
      const CompressorBlock *block = &model->blocks[b];
      for (int t = 0; t < nq; t++)
        plain_rms_norm (q + (gsize)t * d, block->norm_self, d, h + (gsize)t * d);
      compressor_attention (&block->self_q, &block->self_k, &block->self_v, &block->self_out,
                            c->compressor_heads, h, nq, h, nq, y);
      residual_add (q, y, qsize);
      for (int t = 0; t < nq; t++)
        plain_rms_norm (q + (gsize)t * d, block->norm_cross, d, h + (gsize)t * d);
      compressor_attention (&block->cross_q, &block->cross_k, &block->cross_v, &block->cross_out,
                            c->compressor_heads, h, nq, x, n_frames, y);
      residual_add (q, y, qsize);
      for (int t = 0; t < nq; t++)
        plain_rms_norm (q + (gsize)t * d, block->norm_ffn, d, h + (gsize)t * d);
      mlp (&block->gate, &block->up, &block->down, h, nq, y);
      residual_add (q, y, qsize);
    }
  /* steps 6–7: final norm, × output_scale */
  for (int t = 0; t < nq; t++)
    {
      plain_rms_norm (q + (gsize)t * d, model->compressor_final_norm, d, prefix + (gsize)t * d);
      for (int i = 0; i < d; i++)
        prefix[(gsize)t * d + i]
            = gepard_bf16_round (model->output_scale * prefix[(gsize)t * d + i]);
    }
  return TRUE;
}
