/* Opening GEPARD checkpoints written by gepard-make-test-model, and rejecting broken ones with
 * errors that name the problem. */
#include "gepard-checkpoint.h"
#include "gepard-error.h"
#include "gepard-test-model.h"

#include <json-glib/json-glib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *work_dir;

/* backbone 1 + 11 per layer + 1; overlay 32 embeddings + 4 proj + scale + 64 heads + 2 stop;
 * compressor 3 + 14 per block + 2; null_prefix (gepard-model.md §2.3) */
#define TINY_LAYERS 2
#define TINY_TENSORS (2 + 11 * TINY_LAYERS + 103 + 3 + 14 * 2 + 2 + 1)

static void
make_model (const char *dir, const char *extra_args)
{
  g_autofree char *options = g_strdup_printf ("--preset tiny --seed 7 %s", extra_args);
  gepard_test_make_model (options, dir);
}

static char *
fresh_model (const char *name, const char *extra_args)
{
  char *dir = g_build_filename (work_dir, name, NULL);
  make_model (dir, extra_args);
  return dir;
}

static GepardCheckpoint *
open_ok (const char *dir)
{
  g_autoptr (GError) error = NULL;
  GepardCheckpoint *checkpoint = gepard_checkpoint_open (dir, &error);
  g_assert_no_error (error);
  g_assert_nonnull (checkpoint);
  return checkpoint;
}

static GError *
open_fails (const char *dir)
{
  GError *error = NULL;
  GepardCheckpoint *checkpoint = gepard_checkpoint_open (dir, &error);
  g_assert_null (checkpoint);
  g_assert_nonnull (error);
  g_test_message ("%s", error->message);
  return error;
}

/* ---- editing files ---- */

typedef void (*JsonEditFunc) (JsonObject *root);

static void
edit_json (const char *dir, const char *file, JsonEditFunc edit)
{
  g_autofree char *path = g_build_filename (dir, file, NULL);
  g_autoptr (JsonParser) parser = json_parser_new ();
  g_assert_true (json_parser_load_from_file (parser, path, NULL));
  edit (json_node_get_object (json_parser_get_root (parser)));
  g_autoptr (JsonGenerator) generator = json_generator_new ();
  json_generator_set_root (generator, json_parser_get_root (parser));
  g_assert_true (json_generator_to_file (generator, path, NULL));
}

typedef struct
{
  const char *drop;    /* tensor left out */
  const char *reshape; /* tensor whose shape changes */
  guint n_dims;        /* its new shape */
  gint64 shape[2];
  const char *retype; /* tensor stored as I32 instead */
} WeightEdit;

static void
copy_bytes (gpointer user_data, const char *name, void *dst, gsize n_bytes)
{
  const GepardTensor *tensor = user_data;
  memcpy (dst, tensor->data, MIN (n_bytes, tensor->n_bytes));
}

/* Rewrites model.safetensors with one edit; new bytes are zero. */
static void
edit_weights (const char *dir, const WeightEdit *edit)
{
  g_autofree char *path = g_build_filename (dir, "model.safetensors", NULL);
  g_autofree char *copy = g_build_filename (dir, "original.bin", NULL);
  g_assert_cmpint (rename (path, copy), ==, 0);
  {
    g_autoptr (GepardSafetensors) file = gepard_safetensors_open (copy, NULL);
    g_assert_nonnull (file);
    g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
    for (guint i = 0; i < gepard_safetensors_get_n_tensors (file); i++)
      {
        const GepardTensor *t = gepard_safetensors_get_nth (file, i);
        if (g_strcmp0 (t->name, edit->drop) == 0)
          continue;
        if (g_strcmp0 (t->name, edit->reshape) == 0)
          gepard_safetensors_writer_add (writer, t->name, t->dtype, edit->n_dims, edit->shape,
                                         copy_bytes, (gpointer)t);
        else if (g_strcmp0 (t->name, edit->retype) == 0)
          gepard_safetensors_writer_add (writer, t->name, GEPARD_DTYPE_I32, t->n_dims, t->shape,
                                         copy_bytes, (gpointer)t);
        else
          gepard_safetensors_writer_add (writer, t->name, t->dtype, t->n_dims, t->shape, copy_bytes,
                                         (gpointer)t);
      }
    g_assert_true (gepard_safetensors_writer_write (writer, path, NULL));
  }
  g_assert_cmpint (remove (copy), ==, 0);
}

/* ---- tests ---- */

static void
test_open_tiny (void)
{
  g_autofree char *dir = fresh_model ("tiny", "");
  g_autoptr (GepardCheckpoint) checkpoint = open_ok (dir);
  const GepardModelConfig *c = gepard_checkpoint_get_config (checkpoint);

  g_assert_cmpint (c->hidden_size, ==, 64);
  g_assert_cmpint (c->n_layers, ==, TINY_LAYERS);
  g_assert_cmpint (c->n_q_heads, ==, 4);
  g_assert_cmpint (c->n_kv_heads, ==, 2);
  g_assert_cmpint (c->head_dim, ==, 16);
  g_assert_cmpint (c->intermediate_size, ==, 128);
  g_assert_cmpfloat (c->rope_theta, ==, 1e7);
  /* the flat copy says 0.25; the nested value wins (gepard-model.md §1.5) */
  g_assert_cmpfloat (c->partial_rotary_factor, ==, 1.0);
  g_assert_cmpint (c->n_audio_heads, ==, 32);
  static const int levels[4] = {8, 7, 6, 6};
  for (int i = 0; i < 32; i++)
    g_assert_cmpint (c->head_levels[i], ==, levels[i % 4]);
  g_assert_true (c->repetition_enabled);
  g_assert_true (c->voice_cloning);
  g_assert_cmpint (c->compressor_queries, ==, 8);
  g_assert_cmpint (c->compressor_ffn_hidden, ==, 256);
  g_assert_cmpstr (c->model_dtype, ==, "bfloat16");

  g_assert_cmpuint (gepard_checkpoint_get_n_tensors (checkpoint), ==, TINY_TENSORS);
  const GepardTensor *embed = gepard_checkpoint_lookup (checkpoint, "model.embed_tokens.weight");
  g_assert_nonnull (embed);
  g_assert_cmpint (embed->dtype, ==, GEPARD_DTYPE_BF16);
  g_assert_cmpint (embed->shape[0], ==, c->vocab_size);
  g_assert_cmpint (c->vocab_size % 64, ==, 0);
  g_assert_cmpstr (gepard_checkpoint_get_metadata (checkpoint, "gepard.test_model"), ==, "tiny");

  /* the special ids of gepard_config.json name the GEPARD tokens in tokenizer.json */
  GepardTokenizer *tokenizer = gepard_checkpoint_get_tokenizer (checkpoint);
  g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, "<tts_text_bos>"), ==,
                   c->start_of_text);
  g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, "<tts_text_eod>"), ==, c->end_of_text);
  g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, "<|audio_start|>"), ==,
                   c->start_of_speech);
  g_assert_cmpint (c->tokenizer_length, ==, (int)gepard_tokenizer_get_n_ids (tokenizer));

  g_autofree char *codec = g_build_filename (dir, "codec.nemo", NULL);
  g_assert_cmpstr (gepard_checkpoint_get_codec_path (checkpoint), ==, codec);
}

static void
test_sharded_equals_single (void)
{
  g_autofree char *single_dir = fresh_model ("single", "--codec none");
  g_autofree char *sharded_dir = fresh_model ("sharded", "--codec none --shards 3");
  g_autofree char *index = g_build_filename (sharded_dir, "model.safetensors.index.json", NULL);
  g_assert_true (g_file_test (index, G_FILE_TEST_EXISTS));

  g_autoptr (GepardCheckpoint) single = open_ok (single_dir);
  g_autoptr (GepardCheckpoint) sharded = open_ok (sharded_dir);
  g_assert_null (gepard_checkpoint_get_codec_path (single));
  g_assert_cmpuint (gepard_checkpoint_get_n_tensors (sharded), ==,
                    gepard_checkpoint_get_n_tensors (single));
  g_assert_cmpuint (gepard_checkpoint_get_n_bytes (sharded), ==,
                    gepard_checkpoint_get_n_bytes (single));

  const char *names[] = {"model.layers.1.mlp.down_proj.weight", "codebook_heads.31.bias",
                         "ref_compressor.output_scale", "null_prefix"};
  for (guint i = 0; i < G_N_ELEMENTS (names); i++)
    {
      const GepardTensor *a = gepard_checkpoint_lookup (single, names[i]);
      const GepardTensor *b = gepard_checkpoint_lookup (sharded, names[i]);
      g_assert_nonnull (a);
      g_assert_nonnull (b);
      g_assert_cmpmem (a->data, a->n_bytes, b->data, b->n_bytes);
    }
}

static void
test_f32_weights (void)
{
  g_autofree char *dir = fresh_model ("f32", "--codec none --dtype f32");
  g_autoptr (GepardCheckpoint) checkpoint = open_ok (dir);
  const GepardTensor *t = gepard_checkpoint_lookup (checkpoint, "stop_head.weight");
  g_assert_cmpint (t->dtype, ==, GEPARD_DTYPE_F32);
}

static void
test_missing_tensor (void)
{
  g_autofree char *dir = fresh_model ("missing", "--codec none");
  WeightEdit edit = {.drop = "model.layers.1.mlp.up_proj.weight"};
  edit_weights (dir, &edit);
  g_autoptr (GError) error = open_fails (dir);
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE);
  g_assert_nonnull (strstr (error->message, "model.layers.1.mlp.up_proj.weight: missing"));
}

static void
test_misshaped_tensor (void)
{
  g_autofree char *dir = fresh_model ("misshaped", "--codec none");
  WeightEdit edit = {.reshape = "codebook_heads.5.weight", .n_dims = 2, .shape = {6, 64}};
  edit_weights (dir, &edit);
  g_autoptr (GError) error = open_fails (dir);
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE);
  g_assert_nonnull (
      strstr (error->message, "codebook_heads.5.weight: shape [6, 64], expected [7, 64]"));
}

static void
test_integer_tensor (void)
{
  g_autofree char *dir = fresh_model ("int", "--codec none");
  WeightEdit edit = {.retype = "model.norm.weight"};
  edit_weights (dir, &edit);
  g_autoptr (GError) error = open_fails (dir);
  g_assert_nonnull (strstr (error->message, "model.norm.weight: dtype I32"));
}

/* gepard-model.md §2.3: scalars are [] in published files and [1] in current code */
static void
test_scalar_shapes (void)
{
  g_autofree char *dir = fresh_model ("scalar", "--codec none");
  WeightEdit edit = {.reshape = "audio_embed_scale", .n_dims = 1, .shape = {1}};
  edit_weights (dir, &edit);
  g_autoptr (GepardCheckpoint) checkpoint = open_ok (dir);
  g_assert_cmpint (gepard_checkpoint_lookup (checkpoint, "audio_embed_scale")->n_dims, ==, 1);
  g_assert_cmpint (gepard_checkpoint_lookup (checkpoint, "ref_compressor.output_scale")->n_dims, ==,
                   0);

  g_autofree char *dir2 = fresh_model ("scalar2", "--codec none");
  WeightEdit bad = {.reshape = "audio_embed_scale", .n_dims = 1, .shape = {2}};
  edit_weights (dir2, &bad);
  g_autoptr (GError) error = open_fails (dir2);
  g_assert_nonnull (strstr (error->message, "audio_embed_scale: shape [2], expected [] or [1]"));
}

static void
drop_rope_parameters (JsonObject *root)
{
  json_object_remove_member (json_object_get_object_member (root, "backbone_config"),
                             "rope_parameters");
}

static void
nested_half_rotary (JsonObject *root)
{
  JsonObject *rope = json_object_get_object_member (
      json_object_get_object_member (root, "backbone_config"), "rope_parameters");
  json_object_set_double_member (rope, "partial_rotary_factor", 0.5);
  json_object_set_double_member (rope, "rope_theta", 1e6);
}

static void
test_partial_rotary_factor (void)
{
  /* no nested value: GEPARD's own top-level 1.0, not the backbone's flat 0.25 */
  g_autofree char *dir = fresh_model ("rope-flat", "--codec none");
  edit_json (dir, "gepard_config.json", drop_rope_parameters);
  {
    g_autoptr (GepardCheckpoint) checkpoint = open_ok (dir);
    g_assert_cmpfloat (gepard_checkpoint_get_config (checkpoint)->partial_rotary_factor, ==, 1.0);
  }

  g_autofree char *dir2 = fresh_model ("rope-nested", "--codec none");
  edit_json (dir2, "gepard_config.json", nested_half_rotary);
  g_autoptr (GepardCheckpoint) checkpoint = open_ok (dir2);
  g_assert_cmpfloat (gepard_checkpoint_get_config (checkpoint)->partial_rotary_factor, ==, 0.5);
  g_assert_cmpfloat (gepard_checkpoint_get_config (checkpoint)->rope_theta, ==, 1e6);
}

static void
bad_config_values (JsonObject *root)
{
  JsonObject *backbone = json_object_get_object_member (root, "backbone_config");
  json_object_set_string_member (backbone, "hidden_size", "wide");
  json_object_set_int_member (backbone, "num_key_value_heads", 3);
  JsonObject *heads = json_object_get_object_member (root, "audio_heads");
  json_object_set_int_member (heads, "level_audio_1", 8);
}

static void
test_bad_config (void)
{
  g_autofree char *dir = fresh_model ("bad-config", "--codec none");
  edit_json (dir, "gepard_config.json", bad_config_values);
  g_autoptr (GError) error = open_fails (dir);
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE);
  /* every problem in one message */
  g_assert_nonnull (strstr (error->message, "“hidden_size” is not an integer"));
  g_assert_nonnull (strstr (error->message, "not a multiple of num_key_value_heads"));
  g_assert_nonnull (strstr (error->message, "level_audio_1 has 8 levels"));
}

static void
test_missing_files (void)
{
  const char *files[]
      = {"config.json", "gepard_config.json", "tokenizer.json", "model.safetensors"};
  for (guint i = 0; i < G_N_ELEMENTS (files); i++)
    {
      g_autofree char *name = g_strdup_printf ("no-%s", files[i]);
      g_autofree char *dir = fresh_model (name, "--codec none");
      g_autofree char *path = g_build_filename (dir, files[i], NULL);
      g_assert_cmpint (remove (path), ==, 0);
      g_autoptr (GError) error = open_fails (dir);
      g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_MISSING);
    }
}

static void
test_corrupt_json (void)
{
  g_autofree char *dir = fresh_model ("corrupt-json", "--codec none");
  g_autofree char *path = g_build_filename (dir, "gepard_config.json", NULL);
  g_assert_true (g_file_set_contents (path, "{\"audio_heads\": [", -1, NULL));
  g_autoptr (GError) error = open_fails (dir);
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT);
  g_assert_nonnull (strstr (error->message, "gepard_config.json"));
  g_clear_error (&error);

  g_assert_true (g_file_set_contents (path, "[1, 2]", -1, NULL));
  error = open_fails (dir);
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT);
  g_clear_error (&error);

  /* nesting that would exhaust json-glib's recursive parser is refused before it */
  g_autofree char *deep = g_strnfill (200000, '[');
  g_assert_true (g_file_set_contents (path, deep, -1, NULL));
  error = open_fails (dir);
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT);
  g_assert_nonnull (strstr (error->message, "nested"));
  g_clear_error (&error);

  /* json-glib alone would accept comments and single quotes */
  g_assert_true (g_file_set_contents (path, "{'a': 1 /* no */}", -1, NULL));
  error = open_fails (dir);
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT);
}

static void
escaping_shard (JsonObject *root)
{
  JsonObject *map = json_object_get_object_member (root, "weight_map");
  json_object_set_string_member (map, "null_prefix", "../elsewhere.safetensors");
}

static void
unknown_tensor_in_index (JsonObject *root)
{
  JsonObject *map = json_object_get_object_member (root, "weight_map");
  json_object_set_string_member (map, "phantom.weight", "model-00001-of-00002.safetensors");
}

static void
test_bad_index (void)
{
  g_autofree char *dir = fresh_model ("bad-index", "--codec none --shards 2");
  edit_json (dir, "model.safetensors.index.json", escaping_shard);
  g_autoptr (GError) error = open_fails (dir);
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT);
  g_assert_nonnull (strstr (error->message, "null_prefix"));

  g_autofree char *dir2 = fresh_model ("phantom-index", "--codec none --shards 2");
  edit_json (dir2, "model.safetensors.index.json", unknown_tensor_in_index);
  g_autoptr (GError) error2 = open_fails (dir2);
  g_assert_error (error2, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_MISSING);
  g_assert_nonnull (strstr (error2->message, "phantom.weight"));
}

static void
test_repo_id_from_cache (void)
{
  const char *commit = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  g_autofree char *cache = g_build_filename (work_dir, "hf-cache", NULL);
  g_autofree char *snapshot
      = g_build_filename (cache, "models--tester--tiny", "snapshots", commit, NULL);
  g_autofree char *refs = g_build_filename (cache, "models--tester--tiny", "refs", NULL);
  g_autofree char *ref = g_build_filename (refs, "main", NULL);
  make_model (snapshot, "--codec safetensors");
  g_assert_cmpint (g_mkdir_with_parents (refs, 0755), ==, 0);
  g_assert_true (g_file_set_contents (ref, commit, -1, NULL));

  g_setenv ("HF_HUB_CACHE", cache, TRUE);
  g_autoptr (GepardCheckpoint) checkpoint = open_ok ("tester/tiny");
  g_assert_cmpstr (gepard_checkpoint_get_dir (checkpoint), ==, snapshot);
  g_assert_true (
      g_str_has_suffix (gepard_checkpoint_get_codec_path (checkpoint), "codec.safetensors"));

  g_autoptr (GError) error = open_fails ("tester/absent");
  g_assert_error (error, GEPARD_HUB_ERROR, GEPARD_HUB_ERROR_NOT_FOUND);
  g_unsetenv ("HF_HUB_CACHE");
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  work_dir = g_dir_make_tmp ("gepard-checkpoint-XXXXXX", NULL);

  g_test_add_func ("/checkpoint/open-tiny", test_open_tiny);
  g_test_add_func ("/checkpoint/sharded-equals-single", test_sharded_equals_single);
  g_test_add_func ("/checkpoint/f32-weights", test_f32_weights);
  g_test_add_func ("/checkpoint/missing-tensor", test_missing_tensor);
  g_test_add_func ("/checkpoint/misshaped-tensor", test_misshaped_tensor);
  g_test_add_func ("/checkpoint/integer-tensor", test_integer_tensor);
  g_test_add_func ("/checkpoint/scalar-shapes", test_scalar_shapes);
  g_test_add_func ("/checkpoint/partial-rotary-factor", test_partial_rotary_factor);
  g_test_add_func ("/checkpoint/bad-config", test_bad_config);
  g_test_add_func ("/checkpoint/missing-files", test_missing_files);
  g_test_add_func ("/checkpoint/corrupt-json", test_corrupt_json);
  g_test_add_func ("/checkpoint/bad-index", test_bad_index);
  g_test_add_func ("/checkpoint/repo-id-from-cache", test_repo_id_from_cache);
  int status = g_test_run ();

  g_autofree char *command = g_strdup_printf ("rm -rf '%s'", work_dir);
  (void)!system (command);
  g_free (work_dir);
  return status;
}
