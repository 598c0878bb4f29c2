/* gepard-checkpoint.c: opening and validating a GEPARD checkpoint directory
 * (gepard-model.md §2.3, §2.4). */
#include "gepard-checkpoint.h"

#include "gepard-error.h"
#include "gepard-hub.h"
#include "gepard-json.h"

#include <json-glib/json-glib.h>
#include <string.h>

/* The codec GEPARD is trained with (gepard-model.md §3); a published model directory carries no
 * codec, so it is looked up by this repo id in the local cache. */
#define PUBLISHED_CODEC_REPO "nvidia/nemo-nano-codec-22khz-1.89kbps-21.5fps"

struct _GepardCheckpoint
{
  char *dir;
  GepardModelConfig config;
  GPtrArray *shards;   /* GepardSafetensors* */
  GHashTable *tensors; /* name → const GepardTensor* (borrowed from shards) */
  GepardTokenizer *tokenizer;
  char *codec_path;
  guint64 n_bytes;
};

/* ---- reading config values ---- */

/* Collects every problem of a config file so that one error lists them all. */
typedef struct
{
  const char *file;
  GString *problems;
} ConfigReader;

static void config_problem (ConfigReader *reader, const char *format, ...) G_GNUC_PRINTF (2, 3);

static void
config_problem (ConfigReader *reader, const char *format, ...)
{
  va_list args;
  va_start (args, format);
  if (reader->problems->len > 0)
    g_string_append (reader->problems, "; ");
  g_string_append_vprintf (reader->problems, format, args);
  va_end (args);
}

static JsonNode *
member (JsonObject *object, const char *name)
{
  return object != NULL && json_object_has_member (object, name)
             ? json_object_get_member (object, name)
             : NULL;
}

static JsonObject *
get_object (ConfigReader *reader, JsonObject *object, const char *name, gboolean required)
{
  JsonNode *node = member (object, name);
  if (node == NULL || JSON_NODE_HOLDS_NULL (node))
    {
      if (required)
        config_problem (reader, "“%s” is missing", name);
      return NULL;
    }
  if (!JSON_NODE_HOLDS_OBJECT (node))
    {
      config_problem (reader, "“%s” is not an object", name);
      return NULL;
    }
  return json_node_get_object (node);
}

static gboolean
node_is_number (JsonNode *node)
{
  if (node == NULL || !JSON_NODE_HOLDS_VALUE (node))
    return FALSE;
  GType type = json_node_get_value_type (node);
  return type == G_TYPE_INT64 || type == G_TYPE_DOUBLE;
}

/* An integer in [min, max]; `fallback` (when >= min) stands in for a missing member. */
static int
get_int (ConfigReader *reader, JsonObject *object, const char *name, gint64 min, gint64 max,
         gint64 fallback)
{
  JsonNode *node = member (object, name);
  if (node == NULL || JSON_NODE_HOLDS_NULL (node))
    {
      if (fallback >= min)
        return (int)fallback;
      config_problem (reader, "“%s” is missing", name);
      return (int)min;
    }
  if (!JSON_NODE_HOLDS_VALUE (node) || json_node_get_value_type (node) != G_TYPE_INT64)
    {
      config_problem (reader, "“%s” is not an integer", name);
      return (int)min;
    }
  gint64 value = json_node_get_int (node);
  if (value < min || value > max)
    {
      config_problem (reader,
                      "“%s” is %" G_GINT64_FORMAT ", outside [%" G_GINT64_FORMAT
                      ", %" G_GINT64_FORMAT "]",
                      name, value, min, max);
      return (int)min;
    }
  return (int)value;
}

static double
get_double (ConfigReader *reader, JsonObject *object, const char *name, double min, double max,
            gboolean required, double fallback)
{
  JsonNode *node = member (object, name);
  if (node == NULL || JSON_NODE_HOLDS_NULL (node))
    {
      if (required)
        config_problem (reader, "“%s” is missing", name);
      return fallback;
    }
  if (!node_is_number (node))
    {
      config_problem (reader, "“%s” is not a number", name);
      return fallback;
    }
  double value = json_node_get_double (node);
  if (!(value >= min && value <= max))
    {
      config_problem (reader, "“%s” is %g, outside [%g, %g]", name, value, min, max);
      return fallback;
    }
  return value;
}

static gboolean
get_bool (ConfigReader *reader, JsonObject *object, const char *name, gboolean fallback)
{
  JsonNode *node = member (object, name);
  if (node == NULL || JSON_NODE_HOLDS_NULL (node))
    return fallback;
  if (!JSON_NODE_HOLDS_VALUE (node) || json_node_get_value_type (node) != G_TYPE_BOOLEAN)
    {
      config_problem (reader, "“%s” is not a boolean", name);
      return fallback;
    }
  return json_node_get_boolean (node);
}

static const char *
get_string (ConfigReader *reader, JsonObject *object, const char *name, const char *fallback)
{
  JsonNode *node = member (object, name);
  if (node == NULL || JSON_NODE_HOLDS_NULL (node))
    return fallback;
  if (!JSON_NODE_HOLDS_VALUE (node) || json_node_get_value_type (node) != G_TYPE_STRING)
    {
      config_problem (reader, "“%s” is not a string", name);
      return fallback;
    }
  return json_node_get_string (node);
}

/* Backbone fields (gepard-model.md §2.1): `backbone` is gepard_config.json's backbone_config or
 * config.json. */
static void
read_backbone (ConfigReader *reader, JsonObject *backbone, JsonObject *gepard,
               GepardModelConfig *config)
{
  config->hidden_size = get_int (reader, backbone, "hidden_size", 1, 65536, -1);
  config->n_layers = get_int (reader, backbone, "num_hidden_layers", 1, 1024, -1);
  config->n_q_heads = get_int (reader, backbone, "num_attention_heads", 1, 1024, -1);
  config->n_kv_heads = get_int (reader, backbone, "num_key_value_heads", 1, 1024, -1);
  config->intermediate_size = get_int (reader, backbone, "intermediate_size", 1, 1 << 20, -1);
  config->vocab_size = get_int (reader, backbone, "vocab_size", 1, 1 << 24, -1);
  config->head_dim = get_int (reader, backbone, "head_dim", 2, 4096,
                              config->n_q_heads > 0 ? config->hidden_size / config->n_q_heads : -1);
  config->rms_norm_eps = get_double (reader, backbone, "rms_norm_eps", 0, 1, FALSE, 1e-6);

  if (config->n_kv_heads > 0 && config->n_q_heads % config->n_kv_heads != 0)
    config_problem (reader,
                    "num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                    config->n_q_heads, config->n_kv_heads);
  if (config->head_dim % 2 != 0)
    config_problem (reader, "head_dim (%d) is odd; RoPE needs pairs", config->head_dim);

  if (get_bool (reader, backbone, "attention_bias", FALSE))
    config_problem (reader, "attention_bias is true; the GEPARD backbone has no biases");
  const char *act = get_string (reader, backbone, "hidden_act", "silu");
  if (g_strcmp0 (act, "silu") != 0)
    config_problem (reader, "hidden_act is “%s”; only silu is supported", act);

  JsonNode *layer_types = member (backbone, "layer_types");
  if (layer_types != NULL && JSON_NODE_HOLDS_ARRAY (layer_types))
    {
      JsonArray *types = json_node_get_array (layer_types);
      for (guint i = 0; i < json_array_get_length (types); i++)
        {
          JsonNode *type = json_array_get_element (types, i);
          if (!JSON_NODE_HOLDS_VALUE (type) || json_node_get_value_type (type) != G_TYPE_STRING
              || strcmp (json_node_get_string (type), "full_attention") != 0)
            {
              config_problem (reader,
                              "layer %u is not a full_attention layer; GEPARD's backbone has "
                              "only full attention",
                              i);
              break;
            }
        }
    }

  /* gepard-model.md §1.5: transformers 5 reads only the nested rope_parameters; the flat
   * partial_rotary_factor is a legacy copy (0.25 in the stock backbone) and is ignored when the
   * nested one exists. Older configs carry only the flat values. */
  JsonObject *rope = get_object (reader, backbone, "rope_parameters", FALSE);
  if (rope != NULL)
    {
      const char *rope_type = get_string (reader, rope, "rope_type", "default");
      if (g_strcmp0 (rope_type, "default") != 0)
        config_problem (reader, "rope_type is “%s”; only default RoPE is supported", rope_type);
    }
  double flat_theta = get_double (reader, backbone, "rope_theta", 1, 1e12, FALSE, 1e7);
  config->rope_theta = get_double (reader, rope, "rope_theta", 1, 1e12, FALSE, flat_theta);

  double flat_factor
      = get_double (reader, gepard, "partial_rotary_factor", 0, 1, FALSE,
                    get_double (reader, backbone, "partial_rotary_factor", 0, 1, FALSE, 1.0));
  config->partial_rotary_factor
      = get_double (reader, rope, "partial_rotary_factor", 0, 1, FALSE, flat_factor);
  int rotary_dim = (int)(config->head_dim * config->partial_rotary_factor);
  if (rotary_dim <= 0 || rotary_dim % 2 != 0)
    config_problem (reader, "partial_rotary_factor %g gives a rotary dimension of %d",
                    config->partial_rotary_factor, rotary_dim);
}

static void
read_overlay (ConfigReader *reader, JsonObject *gepard, GepardModelConfig *config)
{
  JsonObject *heads = get_object (reader, gepard, "audio_heads", TRUE);
  if (heads != NULL)
    {
      /* json-glib keeps members in file order, which is the head wiring (gepard-model.md §2.4) */
      g_autoptr (GList) names = json_object_get_members (heads);
      config->n_audio_heads = g_list_length (names);
      if (config->n_audio_heads == 0 || config->n_audio_heads > GEPARD_MAX_AUDIO_HEADS)
        {
          config_problem (reader, "audio_heads has %d entries", config->n_audio_heads);
          config->n_audio_heads = 0;
        }
      else
        {
          int i = 0;
          for (GList *l = names; l != NULL; l = l->next, i++)
            {
              g_autofree char *expected = g_strdup_printf ("level_audio_%d", i);
              if (strcmp (l->data, expected) != 0)
                config_problem (reader, "audio_heads entry %d is “%s”, expected “%s”", i,
                                (const char *)l->data, expected);
              config->head_levels[i] = get_int (reader, heads, l->data, 2, 65536, -1);
            }
        }
    }
  config->audio_embed_dim = get_int (reader, gepard, "audio_embed_dim", 1, 65536, -1);

  JsonObject *special = get_object (reader, gepard, "special_tokens", FALSE);
  /* fallbacks: gepard-model.md §2.4, the ids the runner falls back to */
  config->tokenizer_length = get_int (reader, special, "tokeniser_length", 1, 1 << 24, 248077);
  config->start_of_text = get_int (reader, special, "start_of_text", 0, 1 << 24, 248073);
  config->end_of_text = get_int (reader, special, "end_of_text", 0, 1 << 24, 248074);
  config->start_of_speech = get_int (reader, special, "start_of_speech", 0, 1 << 24, 248070);
  config->end_of_speech = get_int (reader, special, "end_of_speech", 0, 1 << 24, 248071);
  config->tts_pad = get_int (reader, special, "tts_pad", 0, 1 << 24, 248076);

  /* gepard-model.md §3.1 */
  JsonObject *repetition = get_object (reader, gepard, "text_repetition", FALSE);
  config->repetition_enabled = get_bool (reader, repetition, "enabled", FALSE);
  config->repetition_target_tokens
      = get_int (reader, repetition, "target_text_tokens", 1, 4096, 16);
  config->repetition_apply_below = get_int (reader, repetition, "apply_below", 0, 4096, 13);
  config->repetition_max_repeats = get_int (reader, repetition, "max_repeats", 1, 64, 8);

  JsonObject *cloning = get_object (reader, gepard, "voice_cloning", FALSE);
  config->voice_cloning = get_bool (reader, cloning, "enabled", cloning != NULL);
  if (config->voice_cloning)
    {
      JsonObject *compressor = get_object (reader, cloning, "compressor", TRUE);
      config->compressor_queries = get_int (reader, compressor, "num_queries", 1, 1024, 8);
      config->compressor_layers = get_int (reader, compressor, "num_layers", 1, 64, 2);
      config->compressor_heads = get_int (reader, compressor, "num_heads", 1, 1024, 8);
      int d_model = get_int (reader, compressor, "d_model", 1, 65536, config->hidden_size);
      int multiplier = get_int (reader, compressor, "ffn_hidden_size_multiplier", 1, 64, 4);
      config->compressor_ffn_hidden = d_model * multiplier;
      /* the prefix sits in front of the text embeddings, so it has the backbone's width */
      if (d_model != config->hidden_size)
        config_problem (reader,
                        "voice_cloning.compressor.d_model (%d) differs from hidden_size (%d)",
                        d_model, config->hidden_size);
      if (d_model % config->compressor_heads != 0)
        config_problem (reader, "compressor d_model %d is not a multiple of num_heads %d", d_model,
                        config->compressor_heads);
    }

  JsonObject *codec = get_object (reader, gepard, "codec", FALSE);
  config->codec_codebooks = get_int (reader, codec, "num_layers", 1, 64, 8);
  config->frame_rate_hz = get_double (reader, codec, "frame_rate_hz", 1, 1000, FALSE, 21.5);
  static const int default_levels[4] = {8, 7, 6, 6};
  memcpy (config->codec_fsq_levels, default_levels, sizeof default_levels);
  JsonNode *levels = member (codec, "fsq_levels");
  if (levels != NULL)
    {
      JsonArray *array = JSON_NODE_HOLDS_ARRAY (levels) ? json_node_get_array (levels) : NULL;
      if (array == NULL || json_array_get_length (array) != 4)
        config_problem (reader, "codec.fsq_levels is not a list of 4 integers");
      else
        for (guint i = 0; i < 4; i++)
          {
            JsonNode *level = json_array_get_element (array, i);
            if (!JSON_NODE_HOLDS_VALUE (level) || json_node_get_value_type (level) != G_TYPE_INT64
                || json_node_get_int (level) < 2 || json_node_get_int (level) > 1024)
              config_problem (reader, "codec.fsq_levels[%u] is not an integer in [2, 1024]", i);
            else
              config->codec_fsq_levels[i] = (int)json_node_get_int (level);
          }
    }
  if (config->n_audio_heads > 0 && config->n_audio_heads != config->codec_codebooks * 4)
    config_problem (reader, "%d audio heads for %d codebooks of 4 FSQ dimensions",
                    config->n_audio_heads, config->codec_codebooks);
  for (int i = 0; i < config->n_audio_heads && config->n_audio_heads == config->codec_codebooks * 4;
       i++)
    if (config->head_levels[i] != config->codec_fsq_levels[i % 4])
      config_problem (reader, "level_audio_%d has %d levels, the codec's FSQ dimension %d has %d",
                      i, config->head_levels[i], i % 4, config->codec_fsq_levels[i % 4]);

  config->model_dtype = g_strdup (get_string (reader, gepard, "model_dtype", "bfloat16"));
}

static gboolean
read_configs (const char *dir, GepardModelConfig *config, GError **error)
{
  g_autofree char *gepard_path = g_build_filename (dir, "gepard_config.json", NULL);
  g_autofree char *hf_path = g_build_filename (dir, "config.json", NULL);

  g_autoptr (JsonNode) gepard_root = gepard_json_parse_file (gepard_path, error);
  if (gepard_root == NULL)
    return FALSE;
  g_autoptr (JsonNode) hf_root = gepard_json_parse_file (hf_path, error);
  if (hf_root == NULL)
    return FALSE;

  JsonObject *gepard = json_node_get_object (gepard_root);
  g_autoptr (GString) problems = g_string_new (NULL);
  ConfigReader reader = {gepard_path, problems};

  /* gepard-model.md §2.2: gepard_config.json's backbone_config is the full backbone config; the
   * backbone-only config.json is the fallback for files that lack it. */
  JsonObject *backbone = get_object (&reader, gepard, "backbone_config", FALSE);
  if (backbone == NULL)
    {
      reader.file = hf_path;
      backbone = json_node_get_object (hf_root);
    }
  read_backbone (&reader, backbone, gepard, config);
  reader.file = gepard_path;
  read_overlay (&reader, gepard, config);

  if (problems->len > 0)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE, "%s: %s", reader.file,
                   problems->str);
      return FALSE;
    }
  return TRUE;
}

/* ---- tensors ---- */

static gboolean
add_shard (GepardCheckpoint *checkpoint, const char *path, GError **error)
{
  GepardSafetensors *shard = gepard_safetensors_open (path, error);
  if (shard == NULL)
    return FALSE;
  g_ptr_array_add (checkpoint->shards, shard);

  for (guint i = 0; i < gepard_safetensors_get_n_tensors (shard); i++)
    {
      const GepardTensor *tensor = gepard_safetensors_get_nth (shard, i);
      if (g_hash_table_contains (checkpoint->tensors, tensor->name))
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT,
                       "%s: tensor “%s” is also in another shard", path, tensor->name);
          return FALSE;
        }
      g_hash_table_insert (checkpoint->tensors, (gpointer)tensor->name, (gpointer)tensor);
      checkpoint->n_bytes += tensor->n_bytes;
    }
  return TRUE;
}

static gboolean
is_safe_shard_name (const char *name)
{
  return *name != '\0' && strchr (name, '/') == NULL && strcmp (name, "..") != 0
         && strcmp (name, ".") != 0 && g_str_has_suffix (name, ".safetensors");
}

static gboolean
open_tensors (GepardCheckpoint *checkpoint, GError **error)
{
  g_autofree char *single = g_build_filename (checkpoint->dir, "model.safetensors", NULL);
  g_autofree char *index_path
      = g_build_filename (checkpoint->dir, "model.safetensors.index.json", NULL);

  if (g_file_test (single, G_FILE_TEST_EXISTS))
    return add_shard (checkpoint, single, error);

  if (!g_file_test (index_path, G_FILE_TEST_EXISTS))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_MISSING,
                   "%s: neither model.safetensors nor model.safetensors.index.json is there",
                   checkpoint->dir);
      return FALSE;
    }

  g_autoptr (JsonNode) root = gepard_json_parse_file (index_path, error);
  if (root == NULL)
    return FALSE;
  JsonNode *map_node = member (json_node_get_object (root), "weight_map");
  if (map_node == NULL || !JSON_NODE_HOLDS_OBJECT (map_node))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT,
                   "%s: “weight_map” is missing or not an object", index_path);
      return FALSE;
    }
  JsonObject *weight_map = json_node_get_object (map_node);

  /* open each shard once, in the order first named */
  g_autoptr (GHashTable) opened = g_hash_table_new (g_str_hash, g_str_equal);
  g_autoptr (GList) names = json_object_get_members (weight_map);
  for (GList *l = names; l != NULL; l = l->next)
    {
      JsonNode *file = json_object_get_member (weight_map, l->data);
      if (!JSON_NODE_HOLDS_VALUE (file) || json_node_get_value_type (file) != G_TYPE_STRING
          || !is_safe_shard_name (json_node_get_string (file)))
        {
          g_set_error (
              error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT,
              "%s: the shard of “%s” is not a .safetensors file name in the same directory",
              index_path, (const char *)l->data);
          return FALSE;
        }
      const char *shard_name = json_node_get_string (file);
      if (g_hash_table_contains (opened, shard_name))
        continue;
      g_hash_table_add (opened, (gpointer)shard_name);
      g_autofree char *shard_path = g_build_filename (checkpoint->dir, shard_name, NULL);
      if (!add_shard (checkpoint, shard_path, error))
        return FALSE;
    }

  /* every tensor the index names must be in the shard it names */
  for (GList *l = names; l != NULL; l = l->next)
    {
      const GepardTensor *tensor = g_hash_table_lookup (checkpoint->tensors, l->data);
      if (tensor == NULL)
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_MISSING,
                       "%s names tensor “%s”, which is in none of the shards", index_path,
                       (const char *)l->data);
          return FALSE;
        }
    }
  return TRUE;
}

/* Checks one expected tensor; `n_dims` -1 accepts a scalar stored as [] or [1] (gepard-model.md
 * §2.3: legacy checkpoints store audio_embed_scale and output_scale as 0-dim tensors). */
static void
expect_tensor (GepardCheckpoint *checkpoint, GString *problems, const char *name, int n_dims,
               gint64 d0, gint64 d1)
{
  const GepardTensor *tensor = g_hash_table_lookup (checkpoint->tensors, name);
  if (tensor == NULL)
    {
      g_string_append_printf (problems, "\n  %s: missing", name);
      return;
    }
  if (tensor->dtype != GEPARD_DTYPE_BF16 && tensor->dtype != GEPARD_DTYPE_F16
      && tensor->dtype != GEPARD_DTYPE_F32)
    {
      g_string_append_printf (problems, "\n  %s: dtype %s, expected a float type", name,
                              gepard_dtype_name (tensor->dtype));
      return;
    }

  gint64 shape[2] = {d0, d1};
  gboolean ok;
  g_autofree char *expected = NULL;
  if (n_dims < 0)
    {
      ok = tensor->n_elements == 1 && tensor->n_dims <= 1;
      expected = g_strdup ("[] or [1]");
    }
  else
    {
      ok = gepard_tensor_has_shape (tensor, n_dims, shape);
      expected = n_dims == 1
                     ? g_strdup_printf ("[%" G_GINT64_FORMAT "]", d0)
                     : g_strdup_printf ("[%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "]", d0, d1);
    }
  if (!ok)
    {
      g_autofree char *actual = gepard_tensor_shape_to_string (tensor);
      g_string_append_printf (problems, "\n  %s: shape %s, expected %s", name, actual, expected);
    }
}

#define EXPECT1(name, a) expect_tensor (checkpoint, problems, name, 1, a, 0)
#define EXPECT2(name, a, b) expect_tensor (checkpoint, problems, name, 2, a, b)

static gboolean
validate_tensors (GepardCheckpoint *checkpoint, GError **error)
{
  const GepardModelConfig *c = &checkpoint->config;
  g_autoptr (GString) problems = g_string_new (NULL);
  gint64 h = c->hidden_size, hd = c->head_dim;

  /* gepard-model.md §2.3, backbone */
  EXPECT2 ("model.embed_tokens.weight", c->vocab_size, h);
  for (int n = 0; n < c->n_layers; n++)
    {
      g_autofree char *p = g_strdup_printf ("model.layers.%d.", n);
#define L(suffix) g_strconcat (p, suffix, NULL)
      g_autofree char *in_norm = L ("input_layernorm.weight");
      g_autofree char *q = L ("self_attn.q_proj.weight");
      g_autofree char *k = L ("self_attn.k_proj.weight");
      g_autofree char *v = L ("self_attn.v_proj.weight");
      g_autofree char *o = L ("self_attn.o_proj.weight");
      g_autofree char *qn = L ("self_attn.q_norm.weight");
      g_autofree char *kn = L ("self_attn.k_norm.weight");
      g_autofree char *post_norm = L ("post_attention_layernorm.weight");
      g_autofree char *gate = L ("mlp.gate_proj.weight");
      g_autofree char *up = L ("mlp.up_proj.weight");
      g_autofree char *down = L ("mlp.down_proj.weight");
#undef L
      EXPECT1 (in_norm, h);
      /* per head [query | gate] interleaved: 2 × head_dim rows per query head (§1.4) */
      EXPECT2 (q, (gint64)c->n_q_heads * hd * 2, h);
      EXPECT2 (k, (gint64)c->n_kv_heads * hd, h);
      EXPECT2 (v, (gint64)c->n_kv_heads * hd, h);
      EXPECT2 (o, h, (gint64)c->n_q_heads * hd);
      EXPECT1 (qn, hd);
      EXPECT1 (kn, hd);
      EXPECT1 (post_norm, h);
      EXPECT2 (gate, c->intermediate_size, h);
      EXPECT2 (up, c->intermediate_size, h);
      EXPECT2 (down, h, c->intermediate_size);
    }
  EXPECT1 ("model.norm.weight", h);

  /* overlay */
  for (int i = 0; i < c->n_audio_heads; i++)
    {
      g_autofree char *embed = g_strdup_printf ("audio_embeddings.%d.weight", i);
      g_autofree char *head_w = g_strdup_printf ("codebook_heads.%d.weight", i);
      g_autofree char *head_b = g_strdup_printf ("codebook_heads.%d.bias", i);
      EXPECT2 (embed, c->head_levels[i], c->audio_embed_dim);
      EXPECT2 (head_w, c->head_levels[i], h);
      EXPECT1 (head_b, c->head_levels[i]);
    }
  EXPECT2 ("audio_embed_proj.0.weight", h, (gint64)c->n_audio_heads * c->audio_embed_dim);
  EXPECT1 ("audio_embed_proj.0.bias", h);
  EXPECT2 ("audio_embed_proj.2.weight", h, h);
  EXPECT1 ("audio_embed_proj.2.bias", h);
  expect_tensor (checkpoint, problems, "audio_embed_scale", -1, 0, 0);
  EXPECT2 ("stop_head.weight", 1, h);
  EXPECT1 ("stop_head.bias", 1);

  /* compressor (§3.6) and null prefix (§3.7) */
  if (c->voice_cloning)
    {
      EXPECT2 ("ref_compressor.input_proj.weight", h, c->n_audio_heads);
      EXPECT1 ("ref_compressor.input_proj.bias", h);
      EXPECT2 ("ref_compressor.queries", c->compressor_queries, h);
      for (int b = 0; b < c->compressor_layers; b++)
        {
          static const char *const attns[] = {"self_attn", "cross_attn"};
          static const char *const projs[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
          static const char *const norms[] = {"norm_self", "norm_cross", "norm_ffn"};
          for (guint n = 0; n < G_N_ELEMENTS (norms); n++)
            {
              g_autofree char *name
                  = g_strdup_printf ("ref_compressor.blocks.%d.%s.weight", b, norms[n]);
              EXPECT1 (name, h);
            }
          for (guint a = 0; a < G_N_ELEMENTS (attns); a++)
            for (guint p = 0; p < G_N_ELEMENTS (projs); p++)
              {
                g_autofree char *name = g_strdup_printf ("ref_compressor.blocks.%d.%s.%s.weight", b,
                                                         attns[a], projs[p]);
                EXPECT2 (name, h, h);
              }
          g_autofree char *gate
              = g_strdup_printf ("ref_compressor.blocks.%d.ffn.gate_proj.weight", b);
          g_autofree char *up = g_strdup_printf ("ref_compressor.blocks.%d.ffn.up_proj.weight", b);
          g_autofree char *down
              = g_strdup_printf ("ref_compressor.blocks.%d.ffn.down_proj.weight", b);
          EXPECT2 (gate, c->compressor_ffn_hidden, h);
          EXPECT2 (up, c->compressor_ffn_hidden, h);
          EXPECT2 (down, h, c->compressor_ffn_hidden);
        }
      EXPECT1 ("ref_compressor.final_norm.weight", h);
      expect_tensor (checkpoint, problems, "ref_compressor.output_scale", -1, 0, 0);
      EXPECT2 ("null_prefix", c->compressor_queries, h);
    }

  if (problems->len > 0)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "%s: the checkpoint does not match its config:%s", checkpoint->dir,
                   problems->str);
      return FALSE;
    }
  return TRUE;
}

#undef EXPECT1
#undef EXPECT2

/* ---- tokenizer and codec ---- */

static gboolean
open_tokenizer (GepardCheckpoint *checkpoint, GError **error)
{
  const GepardModelConfig *c = &checkpoint->config;
  g_autofree char *path = g_build_filename (checkpoint->dir, "tokenizer.json", NULL);

  if (!g_file_test (path, G_FILE_TEST_EXISTS))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_MISSING, "%s: file is missing",
                   path);
      return FALSE;
    }
  checkpoint->tokenizer = gepard_tokenizer_new_from_file (path, error);
  if (checkpoint->tokenizer == NULL)
    return FALSE;

  guint n_ids = gepard_tokenizer_get_n_ids (checkpoint->tokenizer);
  if (n_ids > (guint)c->vocab_size)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "%s: the tokenizer has %u ids but the embedding only %d rows", path, n_ids,
                   c->vocab_size);
      return FALSE;
    }

  const struct
  {
    const char *role;
    int id;
  } specials[] = {
      {"start_of_text", c->start_of_text},
      {"end_of_text", c->end_of_text},
      {"start_of_speech", c->start_of_speech},
  };
  for (guint i = 0; i < G_N_ELEMENTS (specials); i++)
    if (gepard_tokenizer_id_to_token (checkpoint->tokenizer, specials[i].id) == NULL)
      {
        g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                     "%s: %s is id %d in gepard_config.json, but the tokenizer has no such id",
                     path, specials[i].role, specials[i].id);
        return FALSE;
      }
  return TRUE;
}

/* The codec beside the model, else the published codec in the local cache. */
static char *
find_codec (const char *dir)
{
  static const char *const names[] = {"codec.nemo", "codec.safetensors"};
  for (guint i = 0; i < G_N_ELEMENTS (names); i++)
    {
      char *path = g_build_filename (dir, names[i], NULL);
      if (g_file_test (path, G_FILE_TEST_IS_REGULAR))
        return path;
      g_free (path);
    }

  g_autofree char *snapshot = gepard_hub_resolve (PUBLISHED_CODEC_REPO, NULL);
  if (snapshot == NULL)
    return NULL;
  g_autoptr (GDir) listing = g_dir_open (snapshot, 0, NULL);
  const char *name;
  while (listing != NULL && (name = g_dir_read_name (listing)) != NULL)
    if (g_str_has_suffix (name, ".nemo"))
      return g_build_filename (snapshot, name, NULL);
  return NULL;
}

/* ---- public ---- */

GepardCheckpoint *
gepard_checkpoint_open (const char *model, GError **error)
{
  g_return_val_if_fail (model != NULL, NULL);

  g_autofree char *dir = gepard_hub_resolve (model, error);
  if (dir == NULL)
    return NULL;

  g_autoptr (GepardCheckpoint) checkpoint = g_new0 (GepardCheckpoint, 1);
  checkpoint->dir = g_steal_pointer (&dir);
  checkpoint->shards = g_ptr_array_new_with_free_func ((GDestroyNotify)gepard_safetensors_free);
  checkpoint->tensors = g_hash_table_new (g_str_hash, g_str_equal);

  if (!read_configs (checkpoint->dir, &checkpoint->config, error))
    return NULL;
  if (!open_tensors (checkpoint, error))
    return NULL;
  if (!validate_tensors (checkpoint, error))
    return NULL;
  if (!open_tokenizer (checkpoint, error))
    return NULL;
  checkpoint->codec_path = find_codec (checkpoint->dir);

  return g_steal_pointer (&checkpoint);
}

void
gepard_checkpoint_free (GepardCheckpoint *checkpoint)
{
  if (checkpoint == NULL)
    return;
  g_clear_pointer (&checkpoint->tokenizer, gepard_tokenizer_free);
  g_clear_pointer (&checkpoint->tensors, g_hash_table_unref);
  g_clear_pointer (&checkpoint->shards, g_ptr_array_unref);
  g_free (checkpoint->config.model_dtype);
  g_free (checkpoint->codec_path);
  g_free (checkpoint->dir);
  g_free (checkpoint);
}

const char *
gepard_checkpoint_get_dir (const GepardCheckpoint *checkpoint)
{
  return checkpoint->dir;
}

const GepardModelConfig *
gepard_checkpoint_get_config (const GepardCheckpoint *checkpoint)
{
  return &checkpoint->config;
}

GepardTokenizer *
gepard_checkpoint_get_tokenizer (const GepardCheckpoint *checkpoint)
{
  return checkpoint->tokenizer;
}

guint
gepard_checkpoint_get_n_tensors (const GepardCheckpoint *checkpoint)
{
  return g_hash_table_size (checkpoint->tensors);
}

const GepardTensor *
gepard_checkpoint_lookup (const GepardCheckpoint *checkpoint, const char *name)
{
  return g_hash_table_lookup (checkpoint->tensors, name);
}

guint64
gepard_checkpoint_get_n_bytes (const GepardCheckpoint *checkpoint)
{
  return checkpoint->n_bytes;
}

const char *
gepard_checkpoint_get_codec_path (const GepardCheckpoint *checkpoint)
{
  return checkpoint->codec_path;
}

const char *
gepard_checkpoint_get_metadata (const GepardCheckpoint *checkpoint, const char *key)
{
  if (checkpoint->shards->len == 0)
    return NULL;
  return gepard_safetensors_get_metadata (g_ptr_array_index (checkpoint->shards, 0), key);
}
