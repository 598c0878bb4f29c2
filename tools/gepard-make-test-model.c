/* gepard-make-test-model: writes a complete GEPARD checkpoint directory with seeded random weights
 * in exactly the published layout (gepard-model.md §2.3, §2.4), optionally with a NanoCodec beside
 * it, or a NanoCodec checkpoint alone (nanocodec.md §5).
 *
 * The weights are untrained: the model runs through every code path of a real one but does not
 * speak. Every file says so (safetensors metadata "gepard.test_model"). */
#include "gepard-build-config.h"
#include "gepard-safetensors.h"
#include "test-codec.h"

#include <errno.h>
#include <json-glib/json-glib.h>
#include <math.h>
#include <string.h>

typedef struct
{
  const char *name;
  int hidden_size;
  int n_layers;
  int n_q_heads;
  int n_kv_heads;
  int head_dim;
  int intermediate_size;
  int vocab_size; /* 0: the tokenizer's id count rounded up to a multiple of 64 */
  int audio_embed_dim;
  int compressor_heads;
  int special_base; /* id of the first added token, or -1 to keep the tokenizer's own */
  const char *codec_preset;
} Preset;

static const Preset presets[] = {
    /* small enough for unit tests on one core */
    {"tiny", 64, 2, 4, 2, 16, 128, 0, 8, 4, -1, "tiny"},
    /* the published shapes (gepard-model.md §1.1, §2.1): 14 layers, 248320 × 1024 embedding */
    {"gepard-1.0", 1024, 14, 8, 2, 256, 3584, 248320, 32, 8, 248044, "nanocodec-22khz"},
};

static const int fsq_levels[4] = {8, 7, 6, 6};
#define N_CODEBOOKS 8
#define N_AUDIO_HEADS (N_CODEBOOKS * 4)

/* ---- seeded random numbers: one independent stream per tensor, so files do not depend on the
 * order tensors are written in ---------------------------------------------------------------- */

typedef struct
{
  guint64 state;
} Rng;

static guint64
rng_next (Rng *rng)
{
  /* splitmix64 */
  guint64 z = (rng->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double
rng_uniform (Rng *rng)
{
  return ((rng_next (rng) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double
rng_normal (Rng *rng)
{
  double u = rng_uniform (rng), v = rng_uniform (rng);
  return sqrt (-2.0 * log (u)) * cos (2.0 * G_PI * v);
}

static Rng
rng_for_tensor (guint64 seed, const char *name)
{
  guint64 h = 1469598103934665603ull; /* FNV-1a of the name */
  for (const char *p = name; *p; p++)
    h = (h ^ (guchar)*p) * 1099511628211ull;
  Rng rng = {seed ^ h};
  rng_next (&rng);
  return rng;
}

static guint16
f32_to_bf16 (float f)
{
  guint32 bits;
  memcpy (&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return 0x7fc0;                       /* NaN */
  bits += 0x7fffu + ((bits >> 16) & 1u); /* round to nearest even */
  return (guint16)(bits >> 16);
}

/* ---- tensors ---- */

typedef enum
{
  INIT_NORMAL,   /* mean + std · N(0, 1) */
  INIT_CONSTANT, /* mean */
} InitKind;

typedef struct
{
  guint64 seed;
  GepardDType dtype;
  InitKind kind;
  double mean;
  double std;
} TensorInit;

static void
fill_tensor (gpointer user_data, const char *name, void *dst, gsize n_bytes)
{
  const TensorInit *init = user_data;
  Rng rng = rng_for_tensor (init->seed, name);
  gsize n = n_bytes / gepard_dtype_size (init->dtype);

  for (gsize i = 0; i < n; i++)
    {
      double x
          = init->kind == INIT_NORMAL ? init->mean + init->std * rng_normal (&rng) : init->mean;
      if (init->dtype == GEPARD_DTYPE_BF16)
        ((guint16 *)dst)[i] = f32_to_bf16 ((float)x);
      else
        ((float *)dst)[i] = (float)x;
    }
}

typedef struct
{
  GepardSafetensorsWriter **shards;
  guint n_shards;
  guint n_tensors;
  guint64 seed;
  GepardDType dtype;
  GPtrArray *inits; /* owned TensorInit* */
  GPtrArray *names; /* names in order, for the shard index */
  GArray *shard_of; /* guint per tensor */
  guint64 total_elements;
} ModelWriter;

/* Tensors are dealt to shards in order, round robin by count: enough to exercise sharded loading.
 */
static void
add_tensor (ModelWriter *w, const char *name, InitKind kind, double mean, double std, guint n_dims,
            gint64 d0, gint64 d1)
{
  TensorInit *init = g_new (TensorInit, 1);
  *init = (TensorInit){w->seed, w->dtype, kind, mean, std};
  g_ptr_array_add (w->inits, init);
  gint64 shape[2] = {d0, d1};
  guint shard = w->n_tensors % w->n_shards;
  gepard_safetensors_writer_add (w->shards[shard], name, w->dtype, n_dims, shape, fill_tensor,
                                 init);
  g_ptr_array_add (w->names, g_strdup (name));
  g_array_append_val (w->shard_of, shard);
  w->n_tensors++;
  w->total_elements += (guint64)(n_dims >= 1 ? d0 : 1) * (guint64)(n_dims >= 2 ? d1 : 1);
}

static void
add_linear (ModelWriter *w, const char *name, gint64 out, gint64 in)
{
  /* 1/sqrt(fan_in) keeps activations of the same order through a layer */
  add_tensor (w, name, INIT_NORMAL, 0, 1.0 / sqrt ((double)in), 2, out, in);
}

/* zero-centred norm deltas (gepard-model.md §1.2), non-trivial so that (1 + w) is exercised */
static void
add_norm_delta (ModelWriter *w, const char *name, gint64 n)
{
  add_tensor (w, name, INIT_NORMAL, 0, 0.1, 1, n, 0);
}

static void
add_model_tensors (ModelWriter *w, const Preset *p, int vocab_size, int n_layers)
{
  gint64 h = p->hidden_size, hd = p->head_dim;

  add_tensor (w, "model.embed_tokens.weight", INIT_NORMAL, 0, 0.05, 2, vocab_size, h);
  for (int n = 0; n < n_layers; n++)
    {
      g_autofree char *in_norm = g_strdup_printf ("model.layers.%d.input_layernorm.weight", n);
      g_autofree char *q = g_strdup_printf ("model.layers.%d.self_attn.q_proj.weight", n);
      g_autofree char *k = g_strdup_printf ("model.layers.%d.self_attn.k_proj.weight", n);
      g_autofree char *v = g_strdup_printf ("model.layers.%d.self_attn.v_proj.weight", n);
      g_autofree char *o = g_strdup_printf ("model.layers.%d.self_attn.o_proj.weight", n);
      g_autofree char *qn = g_strdup_printf ("model.layers.%d.self_attn.q_norm.weight", n);
      g_autofree char *kn = g_strdup_printf ("model.layers.%d.self_attn.k_norm.weight", n);
      g_autofree char *post
          = g_strdup_printf ("model.layers.%d.post_attention_layernorm.weight", n);
      g_autofree char *gate = g_strdup_printf ("model.layers.%d.mlp.gate_proj.weight", n);
      g_autofree char *up = g_strdup_printf ("model.layers.%d.mlp.up_proj.weight", n);
      g_autofree char *down = g_strdup_printf ("model.layers.%d.mlp.down_proj.weight", n);
      add_norm_delta (w, in_norm, h);
      add_linear (w, q, (gint64)p->n_q_heads * hd * 2, h);
      add_linear (w, k, (gint64)p->n_kv_heads * hd, h);
      add_linear (w, v, (gint64)p->n_kv_heads * hd, h);
      add_linear (w, o, h, (gint64)p->n_q_heads * hd);
      add_norm_delta (w, qn, hd);
      add_norm_delta (w, kn, hd);
      add_norm_delta (w, post, h);
      add_linear (w, gate, p->intermediate_size, h);
      add_linear (w, up, p->intermediate_size, h);
      add_linear (w, down, h, p->intermediate_size);
    }
  add_norm_delta (w, "model.norm.weight", h);

  for (int i = 0; i < N_AUDIO_HEADS; i++)
    {
      g_autofree char *embed = g_strdup_printf ("audio_embeddings.%d.weight", i);
      add_tensor (w, embed, INIT_NORMAL, 0, 1.0, 2, fsq_levels[i % 4], p->audio_embed_dim);
    }
  add_linear (w, "audio_embed_proj.0.weight", h, (gint64)N_AUDIO_HEADS * p->audio_embed_dim);
  add_tensor (w, "audio_embed_proj.0.bias", INIT_NORMAL, 0, 0.02, 1, h, 0);
  add_linear (w, "audio_embed_proj.2.weight", h, h);
  add_tensor (w, "audio_embed_proj.2.bias", INIT_NORMAL, 0, 0.02, 1, h, 0);
  /* ≈ the text embedding's std (gepard-model.md §2.3); stored 0-dim as in the published files */
  add_tensor (w, "audio_embed_scale", INIT_CONSTANT, 0.05, 0, 0, 0, 0);
  for (int i = 0; i < N_AUDIO_HEADS; i++)
    {
      g_autofree char *weight = g_strdup_printf ("codebook_heads.%d.weight", i);
      g_autofree char *bias = g_strdup_printf ("codebook_heads.%d.bias", i);
      add_linear (w, weight, fsq_levels[i % 4], h);
      add_tensor (w, bias, INIT_NORMAL, 0, 0.1, 1, fsq_levels[i % 4], 0);
    }
  add_linear (w, "stop_head.weight", 1, h);
  /* a stop logit of about −2.5 ± 1 makes random models stop after ~7 s of frames on average,
   * like short sentences, rather than at once or never */
  add_tensor (w, "stop_head.bias", INIT_CONSTANT, -2.5, 0, 1, 1, 0);

  /* compressor (gepard-model.md §3.6): plain RMSNorm weights around 1 */
  int ffn = 4 * p->hidden_size;
  add_linear (w, "ref_compressor.input_proj.weight", h, N_AUDIO_HEADS);
  add_tensor (w, "ref_compressor.input_proj.bias", INIT_NORMAL, 0, 0.02, 1, h, 0);
  add_tensor (w, "ref_compressor.queries", INIT_NORMAL, 0, 1.0, 2, 8, h);
  for (int b = 0; b < 2; b++)
    {
      static const char *const attns[] = {"self_attn", "cross_attn"};
      static const char *const projs[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
      static const char *const norms[] = {"norm_self", "norm_cross", "norm_ffn"};
      for (guint a = 0; a < 3; a++)
        {
          g_autofree char *name
              = g_strdup_printf ("ref_compressor.blocks.%d.%s.weight", b, norms[a]);
          add_tensor (w, name, INIT_NORMAL, 1.0, 0.1, 1, h, 0);
        }
      for (guint a = 0; a < 2; a++)
        for (guint j = 0; j < 4; j++)
          {
            g_autofree char *name
                = g_strdup_printf ("ref_compressor.blocks.%d.%s.%s.weight", b, attns[a], projs[j]);
            add_linear (w, name, h, h);
          }
      g_autofree char *gate = g_strdup_printf ("ref_compressor.blocks.%d.ffn.gate_proj.weight", b);
      g_autofree char *up = g_strdup_printf ("ref_compressor.blocks.%d.ffn.up_proj.weight", b);
      g_autofree char *down = g_strdup_printf ("ref_compressor.blocks.%d.ffn.down_proj.weight", b);
      add_linear (w, gate, ffn, h);
      add_linear (w, up, ffn, h);
      add_linear (w, down, h, ffn);
    }
  add_tensor (w, "ref_compressor.final_norm.weight", INIT_NORMAL, 1.0, 0.1, 1, h, 0);
  /* init 1/sqrt(1024) (gepard-model.md §2.3), 0-dim as in all published checkpoints */
  add_tensor (w, "ref_compressor.output_scale", INIT_CONSTANT, 0.03125, 0, 0, 0, 0);
  add_tensor (w, "null_prefix", INIT_NORMAL, 0, 0.02, 2, 8, h);
}

/* ---- tokenizer ---- */

typedef struct
{
  int n_ids;
  int sot, eot, sos, eos, pad;
  int im_end, endoftext;
} TokenizerIds;

static int
find_added (JsonArray *added, const char *content)
{
  for (guint i = 0; i < json_array_get_length (added); i++)
    {
      JsonObject *token = json_array_get_object_element (added, i);
      if (g_strcmp0 (json_object_get_string_member_with_default (token, "content", ""), content)
          == 0)
        return (int)json_object_get_int_member (token, "id");
    }
  return -1;
}

/* Copies the base tokenizer to `out`, moving its added tokens to consecutive ids from
 * `special_base` when that is >= 0 (the published layout puts them at 248044…248076, §4). */
static gboolean
write_tokenizer (const char *base_path, const char *out, int special_base, TokenizerIds *ids,
                 GError **error)
{
  g_autoptr (JsonParser) parser = json_parser_new ();
  if (!json_parser_load_from_file (parser, base_path, error))
    {
      g_prefix_error (error, "%s: ", base_path);
      return FALSE;
    }
  JsonObject *root = json_node_get_object (json_parser_get_root (parser));
  JsonArray *added = json_object_get_array_member (root, "added_tokens");
  JsonObject *model = json_object_get_object_member (root, "model");
  JsonObject *vocab = json_object_get_object_member (model, "vocab");
  if (added == NULL || vocab == NULL)
    {
      g_set_error (error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                   "%s: not a BPE tokenizer.json with added_tokens", base_path);
      return FALSE;
    }

  int max_id = -1;
  g_autoptr (GList) words = json_object_get_members (vocab);
  for (GList *l = words; l != NULL; l = l->next)
    max_id = MAX (max_id, (int)json_object_get_int_member (vocab, l->data));

  for (guint i = 0; i < json_array_get_length (added); i++)
    {
      JsonObject *token = json_array_get_object_element (added, i);
      const char *content = json_object_get_string_member (token, "content");
      if (special_base >= 0)
        {
          int id = special_base + (int)i;
          json_object_set_int_member (token, "id", id);
          if (json_object_has_member (vocab, content))
            json_object_set_int_member (vocab, content, id);
        }
      max_id = MAX (max_id, (int)json_object_get_int_member (token, "id"));
    }

  ids->n_ids = max_id + 1;
  ids->sot = find_added (added, "<tts_text_bos>");
  ids->eot = find_added (added, "<tts_text_eod>");
  ids->sos = find_added (added, "<|audio_start|>");
  ids->eos = find_added (added, "<|audio_end|>");
  ids->pad = find_added (added, "<|audio_pad|>");
  ids->im_end = find_added (added, "<|im_end|>");
  ids->endoftext = find_added (added, "<|endoftext|>");
  if (ids->sot < 0 || ids->eot < 0 || ids->sos < 0 || ids->eos < 0 || ids->pad < 0
      || ids->im_end < 0 || ids->endoftext < 0)
    {
      g_set_error (error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                   "%s lacks the GEPARD special tokens (gepard-model.md §4)", base_path);
      return FALSE;
    }

  g_autoptr (JsonGenerator) generator = json_generator_new ();
  json_generator_set_root (generator, json_parser_get_root (parser));
  return json_generator_to_file (generator, out, error);
}

/* ---- configs ---- */

static JsonNode *
backbone_config (const Preset *p, int vocab_size, int n_layers, const TokenizerIds *ids)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  int n_freqs = p->head_dim / 2;
  int section = (n_freqs * 11 + 31) / 32;

  json_builder_begin_object (b);
  json_builder_set_member_name (b, "architectures");
  json_builder_begin_array (b);
  json_builder_add_string_value (b, "Qwen3_5ForCausalLM");
  json_builder_end_array (b);
  json_builder_set_member_name (b, "model_type");
  json_builder_add_string_value (b, "qwen3_5_text");
#define INT(name, value)                                                                           \
  json_builder_set_member_name (b, name);                                                          \
  json_builder_add_int_value (b, value)
#define DOUBLE(name, value)                                                                        \
  json_builder_set_member_name (b, name);                                                          \
  json_builder_add_double_value (b, value)
#define BOOL(name, value)                                                                          \
  json_builder_set_member_name (b, name);                                                          \
  json_builder_add_boolean_value (b, value)
  INT ("hidden_size", p->hidden_size);
  INT ("intermediate_size", p->intermediate_size);
  INT ("num_hidden_layers", n_layers);
  INT ("num_attention_heads", p->n_q_heads);
  INT ("num_key_value_heads", p->n_kv_heads);
  INT ("head_dim", p->head_dim);
  INT ("vocab_size", vocab_size);
  INT ("max_position_embeddings", 262144);
  DOUBLE ("rms_norm_eps", 1e-6);
  BOOL ("attention_bias", FALSE);
  DOUBLE ("attention_dropout", 0.0);
  BOOL ("tie_word_embeddings", TRUE);
  INT ("full_attention_interval", 1);
  json_builder_set_member_name (b, "hidden_act");
  json_builder_add_string_value (b, "silu");
  json_builder_set_member_name (b, "dtype");
  json_builder_add_string_value (b, "bfloat16");
  INT ("eos_token_id", ids->im_end); /* gepard-model.md §4 */
  INT ("pad_token_id", ids->endoftext);
  json_builder_set_member_name (b, "layer_types");
  json_builder_begin_array (b);
  for (int i = 0; i < n_layers; i++)
    json_builder_add_string_value (b, "full_attention");
  json_builder_end_array (b);
  /* gepard-model.md §1.5, §2.1: the flat copy diverges (0.25, as in the stock backbone repo); the
   * nested value is the one transformers 5 reads */
  DOUBLE ("partial_rotary_factor", 0.25);
  json_builder_set_member_name (b, "rope_parameters");
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "rope_type");
  json_builder_add_string_value (b, "default");
  DOUBLE ("rope_theta", 10000000.0);
  DOUBLE ("partial_rotary_factor", 1.0);
  json_builder_set_member_name (b, "mrope_section");
  json_builder_begin_array (b);
  json_builder_add_int_value (b, section);
  json_builder_add_int_value (b, section);
  json_builder_add_int_value (b, n_freqs - 2 * section);
  json_builder_end_array (b);
  BOOL ("mrope_interleaved", TRUE);
  json_builder_end_object (b);
  json_builder_end_object (b);
  return json_builder_get_root (b);
}

static JsonNode *
gepard_config (const Preset *p, JsonNode *backbone, const TokenizerIds *ids)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();

  json_builder_begin_object (b);
  json_builder_set_member_name (b, "backbone_config");
  json_builder_add_value (b, json_node_copy (backbone));
  json_builder_set_member_name (b, "audio_heads");
  json_builder_begin_object (b);
  for (int i = 0; i < N_AUDIO_HEADS; i++)
    {
      g_autofree char *name = g_strdup_printf ("level_audio_%d", i);
      INT (name, fsq_levels[i % 4]);
    }
  json_builder_end_object (b);
  INT ("audio_embed_dim", p->audio_embed_dim);
  DOUBLE ("partial_rotary_factor", 1.0);
  json_builder_set_member_name (b, "special_tokens");
  json_builder_begin_object (b);
  INT ("tokeniser_length", ids->n_ids);
  INT ("start_of_text", ids->sot);
  INT ("end_of_text", ids->eot);
  INT ("start_of_speech", ids->sos);
  INT ("end_of_speech", ids->eos);
  INT ("tts_pad", ids->pad);
  json_builder_end_object (b);
  DOUBLE ("stop_loss_weight", 1.0);
  DOUBLE ("stop_pos_weight", 1.0);
  json_builder_set_member_name (b, "model_dtype");
  json_builder_add_string_value (b, "bfloat16");
  json_builder_set_member_name (b, "codec");
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "name");
  json_builder_add_string_value (b, "nvidia/nemo-nano-codec-22khz-1.89kbps-21.5fps");
  INT ("num_layers", N_CODEBOOKS);
  json_builder_set_member_name (b, "fsq_levels");
  json_builder_begin_array (b);
  for (int i = 0; i < 4; i++)
    json_builder_add_int_value (b, fsq_levels[i]);
  json_builder_end_array (b);
  BOOL ("do_unfold", TRUE);
  DOUBLE ("frame_rate_hz", 21.5);
  INT ("sample_rate", 22050);
  json_builder_end_object (b);
  json_builder_set_member_name (b, "text_repetition");
  json_builder_begin_object (b);
  BOOL ("enabled", TRUE);
  INT ("target_text_tokens", 16);
  INT ("apply_below", 13);
  INT ("max_repeats", 8);
  DOUBLE ("mixed_keep_prob", 0.25);
  INT ("seed", 0);
  json_builder_end_object (b);
  json_builder_set_member_name (b, "voice_cloning");
  json_builder_begin_object (b);
  BOOL ("enabled", TRUE);
  json_builder_set_member_name (b, "compressor");
  json_builder_begin_object (b);
  INT ("num_queries", 8);
  INT ("num_layers", 2);
  INT ("num_heads", p->compressor_heads);
  INT ("d_model", p->hidden_size);
  INT ("ffn_hidden_size_multiplier", 4);
  DOUBLE ("dropout", 0.0);
  json_builder_end_object (b);
  json_builder_end_object (b);
  json_builder_end_object (b);
#undef INT
#undef DOUBLE
#undef BOOL
  return json_builder_get_root (b);
}

static gboolean
write_json (JsonNode *root, const char *dir, const char *name, GError **error)
{
  g_autoptr (JsonGenerator) generator = json_generator_new ();
  g_autofree char *path = g_build_filename (dir, name, NULL);
  json_generator_set_pretty (generator, TRUE);
  json_generator_set_indent (generator, 2);
  json_generator_set_root (generator, root);
  return json_generator_to_file (generator, path, error);
}

/* ---- main ---- */

static const Preset *
find_preset (const char *name)
{
  for (guint i = 0; i < G_N_ELEMENTS (presets); i++)
    if (g_strcmp0 (presets[i].name, name) == 0)
      return &presets[i];
  return NULL;
}

static char *
default_tokenizer (void)
{
  /* the source tree (GEPARD_SOURCE_DIR, else where this was built from), else the installed copy */
  const char *sources[] = {g_getenv ("GEPARD_SOURCE_DIR"), GEPARD_SOURCE_DIR};
  for (guint i = 0; i < G_N_ELEMENTS (sources); i++)
    {
      if (sources[i] == NULL)
        continue;
      char *path = g_build_filename (sources[i], "models", "tokenizer.json", NULL);
      if (g_file_test (path, G_FILE_TEST_EXISTS))
        return path;
      g_free (path);
    }
  return g_build_filename (GEPARD_DATA_DIR, "tokenizer.json", NULL);
}

static gboolean
write_model (const char *dir, const Preset *p, int n_layers, GepardDType dtype, guint64 seed,
             guint n_shards, const char *tokenizer_path, const char *codec_format,
             const char *cfg_scale, GError **error)
{
  if (g_mkdir_with_parents (dir, 0755) != 0)
    {
      g_set_error (error, G_IO_ERROR, g_io_error_from_errno (errno), "Cannot create %s: %s", dir,
                   g_strerror (errno));
      return FALSE;
    }

  TokenizerIds ids;
  g_autofree char *tokenizer_out = g_build_filename (dir, "tokenizer.json", NULL);
  if (!write_tokenizer (tokenizer_path, tokenizer_out, p->special_base, &ids, error))
    return FALSE;
  int vocab_size = p->vocab_size > 0 ? p->vocab_size : (ids.n_ids + 63) / 64 * 64;
  if (ids.n_ids > vocab_size)
    {
      g_set_error (error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                   "%s has %d ids, more than the preset's %d embedding rows", tokenizer_path,
                   ids.n_ids, vocab_size);
      return FALSE;
    }

  g_autoptr (JsonNode) backbone = backbone_config (p, vocab_size, n_layers, &ids);
  g_autoptr (JsonNode) gepard = gepard_config (p, backbone, &ids);
  if (!write_json (backbone, dir, "config.json", error)
      || !write_json (gepard, dir, "gepard_config.json", error))
    return FALSE;

  ModelWriter w = {0};
  w.n_shards = n_shards;
  w.shards = g_new0 (GepardSafetensorsWriter *, n_shards);
  w.seed = seed;
  w.dtype = dtype;
  w.inits = g_ptr_array_new_with_free_func (g_free);
  w.names = g_ptr_array_new_with_free_func (g_free);
  w.shard_of = g_array_new (FALSE, FALSE, sizeof (guint));
  g_autofree char *seed_text = g_strdup_printf ("%" G_GUINT64_FORMAT, seed);
  for (guint i = 0; i < n_shards; i++)
    {
      w.shards[i] = gepard_safetensors_writer_new ();
      gepard_safetensors_writer_set_metadata (w.shards[i], "format", "pt");
      gepard_safetensors_writer_set_metadata (w.shards[i], "gepard.test_model", p->name);
      gepard_safetensors_writer_set_metadata (w.shards[i], "gepard.seed", seed_text);
      if (cfg_scale != NULL)
        gepard_safetensors_writer_set_metadata (w.shards[i], "gepard.cfg_scale", cfg_scale);
    }
  add_model_tensors (&w, p, vocab_size, n_layers);

  gboolean ok = TRUE;
  g_autoptr (GPtrArray) shard_names = g_ptr_array_new_with_free_func (g_free);
  for (guint i = 0; i < n_shards && ok; i++)
    {
      char *name = n_shards == 1
                       ? g_strdup ("model.safetensors")
                       : g_strdup_printf ("model-%05u-of-%05u.safetensors", i + 1, n_shards);
      g_ptr_array_add (shard_names, name);
      g_autofree char *path = g_build_filename (dir, name, NULL);
      ok = gepard_safetensors_writer_write (w.shards[i], path, error);
    }

  if (ok && n_shards > 1)
    {
      g_autoptr (JsonBuilder) b = json_builder_new ();
      json_builder_begin_object (b);
      json_builder_set_member_name (b, "metadata");
      json_builder_begin_object (b);
      json_builder_set_member_name (b, "total_size");
      json_builder_add_int_value (b, (gint64)(w.total_elements * gepard_dtype_size (dtype)));
      json_builder_end_object (b);
      json_builder_set_member_name (b, "weight_map");
      json_builder_begin_object (b);
      for (guint i = 0; i < w.names->len; i++)
        {
          json_builder_set_member_name (b, g_ptr_array_index (w.names, i));
          json_builder_add_string_value (
              b, g_ptr_array_index (shard_names, g_array_index (w.shard_of, guint, i)));
        }
      json_builder_end_object (b);
      json_builder_end_object (b);
      g_autoptr (JsonNode) index = json_builder_get_root (b);
      ok = write_json (index, dir, "model.safetensors.index.json", error);
    }

  for (guint i = 0; i < n_shards; i++)
    gepard_safetensors_writer_free (w.shards[i]);
  g_free (w.shards);
  g_ptr_array_unref (w.inits);
  g_ptr_array_unref (w.names);
  g_array_unref (w.shard_of);
  if (!ok)
    return FALSE;

  if (g_strcmp0 (codec_format, "none") != 0)
    {
      g_autofree char *codec_name = g_strconcat ("codec.", codec_format, NULL);
      g_autofree char *codec_path = g_build_filename (dir, codec_name, NULL);
      if (!gepard_test_codec_write_preset (codec_path, p->codec_preset, seed, codec_format, error))
        return FALSE;
    }

  g_autofree char *readme_path = g_build_filename (dir, "README.md", NULL);
  g_autofree char *readme = g_strdup_printf (
      "# Untrained GEPARD test model (%s, seed %" G_GUINT64_FORMAT ")\n\n"
      "Written by gepard-make-test-model with random weights in the published checkpoint layout.\n"
      "It exercises every code path of a real model but does not speak.\n",
      p->name, seed);
  return g_file_set_contents (readme_path, readme, -1, error);
}

int
main (int argc, char **argv)
{
  g_autofree char *preset_name = NULL, *dtype_name = NULL, *codec = NULL, *format = NULL;
  g_autofree char *tokenizer = NULL, *cfg_scale = NULL;
  gint64 seed = 1;
  int layers = 0, shards = 1;
  gboolean codec_only = FALSE;
  g_auto (GStrv) rest = NULL;

  GOptionEntry entries[] = {
      {"preset", 'p', 0, G_OPTION_ARG_STRING, &preset_name,
       "Model shape: tiny or gepard-1.0 (codec alone: tiny or nanocodec-22khz)", "NAME"},
      {"seed", 's', 0, G_OPTION_ARG_INT64, &seed, "Random seed of the weights (default 1)", "N"},
      {"cfg-scale", 0, 0, G_OPTION_ARG_STRING, &cfg_scale,
       "The text-CFG scale the model asks for (metadata gepard.cfg_scale; default none)", "W"},
      {"dtype", 0, 0, G_OPTION_ARG_STRING, &dtype_name, "Weight type: bf16 (default) or f32",
       "TYPE"},
      {"layers", 0, 0, G_OPTION_ARG_INT, &layers, "Number of layers instead of the preset's", "N"},
      {"shards", 0, 0, G_OPTION_ARG_INT, &shards,
       "Split the weights over N files with an index (default 1)", "N"},
      {"codec", 0, 0, G_OPTION_ARG_STRING, &codec,
       "Codec written beside the model: nemo (default), safetensors or none", "FORMAT"},
      {"tokenizer", 0, 0, G_OPTION_ARG_FILENAME, &tokenizer,
       "Base tokenizer.json (default: the project's models/tokenizer.json)", "FILE"},
      {"codec-only", 0, 0, G_OPTION_ARG_NONE, &codec_only, "Write a NanoCodec checkpoint alone",
       NULL},
      {"format", 0, 0, G_OPTION_ARG_STRING, &format,
       "With --codec-only: nemo (default) or safetensors", "FORMAT"},
      {G_OPTION_REMAINING, 0, 0, G_OPTION_ARG_FILENAME_ARRAY, &rest, NULL, "OUTPUT"},
      {NULL},
  };
  g_autoptr (GOptionContext) context
      = g_option_context_new ("OUTPUT — write an untrained GEPARD model directory (or a NanoCodec "
                              "file) with random weights");
  g_option_context_add_main_entries (context, entries, NULL);
  g_autoptr (GError) error = NULL;
  if (!g_option_context_parse (context, &argc, &argv, &error))
    {
      g_printerr ("gepard-make-test-model: %s\n", error->message);
      return 2;
    }
  if (rest == NULL || g_strv_length (rest) != 1)
    {
      g_printerr ("gepard-make-test-model: give exactly one OUTPUT path (see --help)\n");
      return 2;
    }
  if (seed < 0)
    {
      g_printerr ("gepard-make-test-model: --seed must not be negative\n");
      return 2;
    }

  if (codec_only)
    {
      if (!gepard_test_codec_write_preset (rest[0], preset_name ? preset_name : "tiny",
                                           (guint64)seed, format ? format : "nemo", &error))
        {
          g_printerr ("gepard-make-test-model: %s\n", error->message);
          return 1;
        }
      return 0;
    }

  const Preset *p = find_preset (preset_name ? preset_name : "tiny");
  if (p == NULL)
    {
      g_printerr ("gepard-make-test-model: unknown preset “%s”: use tiny or gepard-1.0\n",
                  preset_name);
      return 2;
    }
  GepardDType dtype;
  if (dtype_name == NULL || g_strcmp0 (dtype_name, "bf16") == 0)
    dtype = GEPARD_DTYPE_BF16;
  else if (g_strcmp0 (dtype_name, "f32") == 0)
    dtype = GEPARD_DTYPE_F32;
  else
    {
      g_printerr ("gepard-make-test-model: unknown --dtype “%s”: use bf16 or f32\n", dtype_name);
      return 2;
    }
  if (layers < 0 || layers > 256 || shards < 1 || shards > 64)
    {
      g_printerr ("gepard-make-test-model: --layers must be 1…256 and --shards 1…64\n");
      return 2;
    }
  if (codec != NULL && g_strcmp0 (codec, "nemo") != 0 && g_strcmp0 (codec, "safetensors") != 0
      && g_strcmp0 (codec, "none") != 0)
    {
      g_printerr ("gepard-make-test-model: unknown --codec “%s”: use nemo, safetensors or none\n",
                  codec);
      return 2;
    }
  g_autofree char *tokenizer_path = tokenizer ? g_strdup (tokenizer) : default_tokenizer ();

  if (!write_model (rest[0], p, layers > 0 ? layers : p->n_layers, dtype, (guint64)seed,
                    (guint)shards, tokenizer_path, codec ? codec : "nemo", cfg_scale, &error))
    {
      g_printerr ("gepard-make-test-model: %s\n", error->message);
      return 1;
    }
  return 0;
}
