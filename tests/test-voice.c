/* Speaker prefixes: prefix files read back bit-exact and refuse anything that is not one, cloning
 * from audio runs the codec encoder and the compressor, and the engine's voice registry. */
#include "gepard-bf16.h"
#include "gepard-error.h"
#include "gepard-test-model.h"
#include "gepard-voice.h"

#include <glib/gstdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static char *work_dir;
static char *model_dir;
static GepardEngine *engine;

static const GepardModelConfig *
config (void)
{
  return gepard_engine_get_config (engine);
}

/* A voice whose values are bf16 numbers of varied magnitude and sign, as a compressor gives. */
static GepardVoice *
make_voice (const char *id, guint32 seed)
{
  int rows = config ()->compressor_queries, hidden = config ()->hidden_size;
  g_autofree float *prefix = g_new (float, rows *hidden);
  g_autoptr (GRand) rand = g_rand_new_with_seed (seed);
  for (int i = 0; i < rows * hidden; i++)
    prefix[i] = gepard_bf16_round ((float)g_rand_double_range (rand, -1, 1)
                                   * powf (2.0f, (float)g_rand_int_range (rand, -20, 8)));
  return gepard_voice_new (id, prefix, rows, hidden);
}

static char *
write_file (const char *name, const void *data, gsize size)
{
  char *path = g_build_filename (work_dir, name, NULL);
  g_assert_true (g_file_set_contents (path, data, (gssize)size, NULL));
  return path;
}

static void
assert_same_prefix (const GepardVoice *a, const GepardVoice *b)
{
  int rows_a = 0, rows_b = 0;
  const float *pa = gepard_voice_get_prefix (a, &rows_a);
  const float *pb = gepard_voice_get_prefix (b, &rows_b);
  g_assert_cmpint (rows_a, ==, rows_b);
  g_assert_cmpmem (pa, sizeof (float) * rows_a * config ()->hidden_size, pb,
                   sizeof (float) * rows_b * config ()->hidden_size);
}

static guint
count_entries (const char *dir)
{
  g_autoptr (GDir) d = g_dir_open (dir, 0, NULL);
  guint n = 0;
  while (g_dir_read_name (d) != NULL)
    n++;
  return n;
}

static void
test_prefix_file_round_trip (void)
{
  g_autoptr (GError) error = NULL;
  int rows = config ()->compressor_queries, hidden = config ()->hidden_size;
  g_autoptr (GepardVoice) voice = make_voice ("round-trip", 1);
  g_autofree char *dir = g_build_filename (work_dir, "round-trip", NULL);
  g_assert_cmpint (g_mkdir (dir, 0755), ==, 0);
  g_autofree char *path = g_build_filename (dir, "voice.prefix", NULL);

  g_assert_true (gepard_voice_save_prefix_file (voice, path, &error));
  g_assert_no_error (error);
  /* §3.7: nothing but [rows][H] little-endian fp32 */
  g_autofree char *data = NULL;
  gsize size = 0;
  g_assert_true (g_file_get_contents (path, &data, &size, NULL));
  g_assert_cmpuint (size, ==, (gsize)rows * hidden * 4);
  g_assert_cmpuint (size, ==, gepard_voice_get_prefix_file_size (config ()));
  int n_rows = 0;
  const float *prefix = gepard_voice_get_prefix (voice, &n_rows);
  for (int i = 0; i < rows * hidden; i += 37)
    {
      guint32 bits;
      memcpy (&bits, &prefix[i], 4);
      const guint8 *b = (const guint8 *)data + 4 * i;
      g_assert_cmpuint (b[0] | b[1] << 8 | b[2] << 16 | (guint32)b[3] << 24, ==, bits);
    }

  g_autoptr (GepardVoice) loaded = gepard_voice_load_prefix_file (path, config (), &error);
  g_assert_no_error (error);
  g_assert_cmpstr (gepard_voice_get_id (loaded), ==, path);
  assert_same_prefix (voice, loaded);

  /* in memory the same bytes make the same voice */
  g_autoptr (GBytes) bytes = gepard_voice_to_prefix_bytes (voice, &error);
  g_assert_no_error (error);
  g_assert_cmpmem (g_bytes_get_data (bytes, NULL), g_bytes_get_size (bytes), data, size);
  g_autoptr (GepardVoice) from_bytes
      = gepard_voice_new_from_prefix_bytes ("stored", bytes, config (), &error);
  g_assert_no_error (error);
  g_assert_cmpstr (gepard_voice_get_id (from_bytes), ==, "stored");
  assert_same_prefix (voice, from_bytes);

  /* saving over an existing file replaces it and leaves no temporary file beside it */
  g_autoptr (GepardVoice) other = make_voice ("other", 2);
  g_assert_true (gepard_voice_save_prefix_file (other, path, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (count_entries (dir), ==, 1);
  g_autoptr (GepardVoice) reloaded = gepard_voice_load_prefix_file (path, config (), &error);
  g_assert_no_error (error);
  assert_same_prefix (other, reloaded);
}

static void
test_prefix_file_rounds_to_bf16 (void)
{
  /* a prefix kept in full fp32 by another tool: the model sees its bf16 values (§3.7) */
  g_autoptr (GError) error = NULL;
  gsize n = (gsize)config ()->compressor_queries * config ()->hidden_size;
  g_autofree float *values = g_new (float, n);
  for (gsize i = 0; i < n; i++)
    values[i] = 0.1f + (float)i * 1e-4f;
  g_autofree char *path = write_file ("fp32.prefix", values, n * 4);
  g_autoptr (GepardVoice) voice = gepard_voice_load_prefix_file (path, config (), &error);
  g_assert_no_error (error);
  int rows = 0;
  const float *prefix = gepard_voice_get_prefix (voice, &rows);
  for (gsize i = 0; i < n; i++)
    g_assert_true (prefix[i] == gepard_bf16_round (values[i]));
  g_assert_true (prefix[1] != values[1]);
}

static void
test_prefix_file_refused (void)
{
  gsize size = gepard_voice_get_prefix_file_size (config ());
  g_autofree float *zeros = g_new0 (float, size / 4 + 1);

  struct
  {
    const char *name;
    gsize size;
  } sizes[] = {{"empty.prefix", 0}, {"short.prefix", size - 4}, {"long.prefix", size + 4}};
  for (guint i = 0; i < G_N_ELEMENTS (sizes); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autofree char *path = write_file (sizes[i].name, zeros, sizes[i].size);
      g_assert_null (gepard_voice_load_prefix_file (path, config (), &error));
      g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE);
      g_assert_nonnull (strstr (error->message, path));
    }

  /* NaN, infinity, and a finite fp32 that bf16 rounding takes to infinity */
  guint32 bad[] = {0x7fc00000u, 0xff800000u, 0x7f7fffffu};
  for (guint i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_autoptr (GError) error = NULL;
      guint32 *words = (guint32 *)zeros;
      words[size / 4 / 2 + 3] = GUINT32_TO_LE (bad[i]);
      g_autofree char *path = write_file ("bad-value.prefix", zeros, size);
      g_assert_null (gepard_voice_load_prefix_file (path, config (), &error));
      g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT);
      g_assert_nonnull (strstr (error->message, "column 3"));
      words[size / 4 / 2 + 3] = 0;
    }

  g_autoptr (GError) error = NULL;
  g_autofree char *missing = g_build_filename (work_dir, "no-such.prefix", NULL);
  g_assert_null (gepard_voice_load_prefix_file (missing, config (), &error));
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_MISSING);
  g_clear_error (&error);

  /* a directory is no prefix file */
  g_assert_null (gepard_voice_load_prefix_file (work_dir, config (), &error));
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO);
}

static void
test_prefix_file_save_refused (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoice) none = gepard_voice_new ("default", NULL, 0, config ()->hidden_size);
  g_autofree char *path = g_build_filename (work_dir, "default.prefix", NULL);
  g_assert_false (gepard_voice_save_prefix_file (none, path, &error));
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED);
  g_assert_false (g_file_test (path, G_FILE_TEST_EXISTS));
  g_clear_error (&error);

  g_autoptr (GepardVoice) voice = make_voice ("v", 3);
  g_autofree char *nowhere = g_build_filename (work_dir, "no-such-dir", "v.prefix", NULL);
  g_assert_false (gepard_voice_save_prefix_file (voice, nowhere, &error));
  g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO);
}

/* Two loud sines and seeded noise at 22050 Hz. The untrained test codec maps quiet or low
 * audio to the centre code of every channel; loud audio with high partials reaches the others. */
static float *
make_clip (gsize n, double f1, double f2, guint32 seed)
{
  float *clip = g_new (float, n);
  g_autoptr (GRand) rand = g_rand_new_with_seed (seed);
  for (gsize i = 0; i < n; i++)
    {
      double t = (double)i / 22050.0;
      clip[i] = (float)(0.45 * sin (2 * G_PI * f1 * t) + 0.35 * sin (2 * G_PI * f2 * t)
                        + 0.1 * g_rand_double_range (rand, -1, 1));
    }
  return clip;
}

static void
test_new_from_audio (void)
{
  g_autoptr (GError) error = NULL;
  gsize n = 2 * 22050;
  g_autofree float *clip = make_clip (n, 1500, 3700, 7);
  int rows = config ()->compressor_queries, hidden = config ()->hidden_size;

  g_autoptr (GepardVoice) voice = gepard_voice_new_from_audio (engine, "clip", clip, n, &error);
  g_assert_no_error (error);
  g_assert_cmpstr (gepard_voice_get_id (voice), ==, "clip");
  int n_rows = 0;
  const float *prefix = gepard_voice_get_prefix (voice, &n_rows);
  g_assert_cmpint (n_rows, ==, rows);
  gboolean nonzero = FALSE;
  for (int i = 0; i < rows * hidden; i++)
    {
      g_assert_true (isfinite (prefix[i]));
      g_assert_true (prefix[i] == gepard_bf16_round (prefix[i]));
      nonzero |= prefix[i] != 0;
    }
  g_assert_true (nonzero);

  /* it is the encoder's codes through the compressor, nothing else */
  GepardCodec *codec = gepard_engine_get_codec (engine);
  g_autoptr (GArray) codes = gepard_codec_encode (codec, clip, n, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (codes->len, ==, 32 * ((n + 1023) / 1024));
  g_autofree float *expected = g_new (float, rows *hidden);
  g_assert_true (gepard_model_compress (gepard_engine_get_model (engine),
                                        (const gint32 *)codes->data, codes->len / 32, expected,
                                        &error));
  g_assert_cmpmem (prefix, sizeof (float) * rows * hidden, expected,
                   sizeof (float) * rows * hidden);

  /* deterministic */
  g_autoptr (GepardVoice) again = gepard_voice_new_from_audio (engine, "clip", clip, n, &error);
  g_assert_no_error (error);
  assert_same_prefix (voice, again);

  /* another clip is another voice (provided the codec tells the clips apart at all) */
  g_autofree float *other_clip = make_clip (n, 220, 1330, 8);
  g_autoptr (GArray) other_codes = gepard_codec_encode (codec, other_clip, n, &error);
  g_assert_no_error (error);
  g_assert_true (memcmp (codes->data, other_codes->data, codes->len * sizeof (gint32)) != 0);
  g_autoptr (GepardVoice) other
      = gepard_voice_new_from_audio (engine, "other", other_clip, n, &error);
  g_assert_no_error (error);
  const float *other_prefix = gepard_voice_get_prefix (other, &n_rows);
  g_assert_true (memcmp (prefix, other_prefix, sizeof (float) * rows * hidden) != 0);

  /* a cloned voice survives its file */
  g_autofree char *path = g_build_filename (work_dir, "clip.prefix", NULL);
  g_assert_true (gepard_voice_save_prefix_file (voice, path, &error));
  g_autoptr (GepardVoice) loaded = gepard_voice_load_prefix_file (path, config (), &error);
  g_assert_no_error (error);
  assert_same_prefix (voice, loaded);
}

static void
test_new_from_audio_refused (void)
{
  g_autoptr (GError) error = NULL;
  g_autofree float *clip = make_clip (2048, 300, 900, 9);

  /* one frame is the least the encoder can say anything about */
  g_assert_null (gepard_voice_new_from_audio (engine, "short", clip, 1023, &error));
  g_assert_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT);
  g_assert_nonnull (strstr (error->message, "1023"));
  g_clear_error (&error);
  g_assert_null (gepard_voice_new_from_audio (engine, "empty", NULL, 0, &error));
  g_assert_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT);
  g_clear_error (&error);
  g_autoptr (GepardVoice) one = gepard_voice_new_from_audio (engine, "one", clip, 1024, &error);
  g_assert_no_error (error);
  int rows = 0;
  gepard_voice_get_prefix (one, &rows);
  g_assert_cmpint (rows, ==, config ()->compressor_queries);

  clip[500] = NAN;
  g_assert_null (gepard_voice_new_from_audio (engine, "nan", clip, 2048, &error));
  g_assert_nonnull (error);
  g_clear_error (&error);

  /* a model without its codec cannot clone */
  g_autofree char *bare = g_build_filename (work_dir, "bare", NULL);
  g_assert_cmpint (g_mkdir (bare, 0755), ==, 0);
  const char *files[]
      = {"config.json", "gepard_config.json", "model.safetensors", "tokenizer.json"};
  for (guint i = 0; i < G_N_ELEMENTS (files); i++)
    {
      g_autofree char *from = g_build_filename (model_dir, files[i], NULL);
      g_autofree char *to = g_build_filename (bare, files[i], NULL);
      g_autofree char *data = NULL;
      gsize size = 0;
      g_assert_true (g_file_get_contents (from, &data, &size, NULL));
      g_assert_true (g_file_set_contents (to, data, (gssize)size, NULL));
    }
  g_autoptr (GepardEngine) no_codec = gepard_engine_new (bare, "cpu", NULL, &error);
  g_assert_no_error (error);
  if (gepard_engine_get_codec (no_codec) != NULL)
    {
      g_test_skip ("a codec was found in the local cache");
      return;
    }
  g_assert_null (gepard_voice_new_from_audio (no_codec, "x", clip, 2048, &error));
  g_assert_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_UNSUPPORTED);
  g_assert_nonnull (strstr (error->message, "codec"));
}

static void
test_registry (void)
{
  /* "default" is there from the start, without a prefix (§3.2: no prefix at all) */
  g_autoptr (GepardVoice) def = gepard_engine_lookup_voice (engine, "default");
  g_assert_nonnull (def);
  g_assert_cmpstr (gepard_voice_get_id (def), ==, "default");
  int rows = -1;
  g_assert_null (gepard_voice_get_prefix (def, &rows));
  g_assert_cmpint (rows, ==, 0);
  g_assert_false (gepard_engine_remove_voice (engine, "default"));
  g_autoptr (GepardVoice) still = gepard_engine_lookup_voice (engine, "default");
  g_assert_nonnull (still);

  const char *id = "3f1c0d52-6a8e-4f0b-9d8e-2b7c1a4e5f60";
  g_assert_null (gepard_engine_lookup_voice (engine, id));
  g_assert_false (gepard_engine_remove_voice (engine, id));

  GepardVoice *voice = make_voice (id, 4);
  gepard_engine_add_voice (engine, voice);
  GepardVoice *found = gepard_engine_lookup_voice (engine, id);
  g_assert_true (found == voice);
  gepard_voice_unref (found);

  /* the registry holds its own reference */
  gepard_voice_unref (voice);
  g_autoptr (GepardVoice) kept = gepard_engine_lookup_voice (engine, id);
  g_assert_nonnull (kept);
  g_assert_cmpstr (gepard_voice_get_id (kept), ==, id);

  /* adding under the same id replaces */
  g_autoptr (GepardVoice) replacement = make_voice (id, 5);
  gepard_engine_add_voice (engine, replacement);
  g_autoptr (GepardVoice) replaced = gepard_engine_lookup_voice (engine, id);
  g_assert_true (replaced == replacement);

  g_assert_true (gepard_engine_remove_voice (engine, id));
  g_assert_null (gepard_engine_lookup_voice (engine, id));
  g_assert_false (gepard_engine_remove_voice (engine, id));
  /* a reference taken before the removal stays valid */
  g_assert_cmpstr (gepard_voice_get_id (kept), ==, id);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  work_dir = g_dir_make_tmp ("gepard-voice-XXXXXX", NULL);
  model_dir = g_build_filename (work_dir, "tiny", NULL);
  gepard_test_make_model ("--preset tiny --seed 2", model_dir);
  g_autoptr (GError) error = NULL;
  engine = gepard_engine_new (model_dir, "cpu", NULL, &error);
  g_assert_no_error (error);
  g_assert_nonnull (gepard_engine_get_codec (engine));
  g_assert_true (config ()->voice_cloning);

  g_test_add_func ("/voice/prefix-file/round-trip", test_prefix_file_round_trip);
  g_test_add_func ("/voice/prefix-file/rounds-to-bf16", test_prefix_file_rounds_to_bf16);
  g_test_add_func ("/voice/prefix-file/refused", test_prefix_file_refused);
  g_test_add_func ("/voice/prefix-file/save-refused", test_prefix_file_save_refused);
  g_test_add_func ("/voice/new-from-audio", test_new_from_audio);
  g_test_add_func ("/voice/new-from-audio/refused", test_new_from_audio_refused);
  g_test_add_func ("/voice/registry", test_registry);
  int result = g_test_run ();

  gepard_engine_unref (engine);
  g_autofree char *rm = g_strdup_printf ("rm -rf '%s'", work_dir);
  (void)!system (rm);
  g_free (model_dir);
  g_free (work_dir);
  return result;
}
