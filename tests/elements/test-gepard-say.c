/* gepard-say, run the way a user runs it: text from arguments, a file or standard input, to WAV,
 * FLAC and Ogg at any rate; clear errors and exit codes for bad input. */
#include <gio/gio.h>
#include <gst/check/gstcheck.h>

#include <stdlib.h>
#include <string.h>

#include "gepard-test-model.h"

static char *work_dir;
static char *model_dir;

/* Runs gepard-say with `args` (and `input` on stdin); returns its exit status, stderr in `err`. */
static int
say (const char *input, char **err, ...)
{
  g_autofree char *tool
      = g_build_filename (g_getenv ("GEPARD_BUILD_DIR"), "tools", "gepard-say", NULL);
  g_autoptr (GPtrArray) argv = g_ptr_array_new ();
  g_ptr_array_add (argv, tool);
  va_list args;
  va_start (args, err);
  const char *arg;
  while ((arg = va_arg (args, const char *)) != NULL)
    g_ptr_array_add (argv, (gpointer)arg);
  va_end (args);
  g_ptr_array_add (argv, NULL);

  g_autoptr (GSubprocess) process
      = g_subprocess_newv ((const char *const *)argv->pdata,
                           G_SUBPROCESS_FLAGS_STDIN_PIPE | G_SUBPROCESS_FLAGS_STDOUT_SILENCE
                               | G_SUBPROCESS_FLAGS_STDERR_PIPE,
                           NULL);
  fail_unless (process != NULL);
  fail_unless (g_subprocess_communicate_utf8 (process, input ? input : "", NULL, NULL, err, NULL));
  return g_subprocess_get_exit_status (process);
}

static gsize
file_size (const char *path)
{
  g_autofree char *data = NULL;
  gsize length = 0;
  fail_unless (g_file_get_contents (path, &data, &length, NULL), "no %s", path);
  return length;
}

GST_START_TEST (test_formats)
{
  g_autofree char *text_file = g_build_filename (work_dir, "text.txt", NULL);
  fail_unless (g_file_set_contents (text_file, "One sentence. And a second one!", -1, NULL));
  const char *formats[] = {"out.wav", "out.flac", "out.ogg"};
  for (guint i = 0; i < G_N_ELEMENTS (formats); i++)
    {
      g_autofree char *output = g_build_filename (work_dir, formats[i], NULL);
      g_autofree char *err = NULL;
      int status = say (NULL, &err, "--model", model_dir, "--device", "cpu", "--max-frames", "10",
                        "--file", text_file, "--rate", "24000", "--output", output, NULL);
      fail_unless_equals_int (status, 0);
      fail_unless (strstr (err, "2 sentences") != NULL, "%s", err);
      fail_unless (file_size (output) > 1000, "%s is too small", output);
    }
  /* the WAV holds 16-bit samples at the asked rate: at most 20 frames of 1024 at 22050 Hz */
  g_autofree char *wav = g_build_filename (work_dir, "out.wav", NULL);
  g_autofree guint8 *data = NULL;
  gsize length = 0;
  fail_unless (g_file_get_contents (wav, (char **)&data, &length, NULL));
  guint32 rate = data[24] | data[25] << 8 | data[26] << 16 | (guint32)data[27] << 24;
  fail_unless_equals_int (rate, 24000);
  fail_unless_equals_int (data[34] | data[35] << 8, 16); /* bits per sample */
  double seconds = (length - 44) / 2.0 / 24000.0;
  fail_unless (seconds > 0 && seconds <= 20 * 1024 / 22050.0 * 1.02, "%.3f s", seconds);
}
GST_END_TEST;

GST_START_TEST (test_stdin_and_arguments)
{
  g_autofree char *a = g_build_filename (work_dir, "stdin.wav", NULL);
  g_autofree char *b = g_build_filename (work_dir, "args.wav", NULL);
  g_autofree char *err_a = NULL, *err_b = NULL;
  fail_unless_equals_int (say ("Hello from standard input.", &err_a, "-m", model_dir, "-d", "cpu",
                               "--max-frames", "8", "-o", a, NULL),
                          0);
  fail_unless_equals_int (say (NULL, &err_b, "-m", model_dir, "-d", "cpu", "--max-frames", "8",
                               "-o", b, "Hello", "from", "standard", "input.", NULL),
                          0);
  /* same text, same seed: the same audio */
  g_autofree char *da = NULL, *db = NULL;
  gsize la = 0, lb = 0;
  fail_unless (g_file_get_contents (a, &da, &la, NULL) && g_file_get_contents (b, &db, &lb, NULL));
  fail_unless (la == lb && memcmp (da, db, la) == 0);
}
GST_END_TEST;

GST_START_TEST (test_errors)
{
  g_autofree char *err = NULL;
  fail_unless_equals_int (say (NULL, &err, "-m", model_dir, "-o", "x.mp3", "hi", NULL), 2);
  fail_unless (strstr (err, ".wav, .flac or .ogg") != NULL, "%s", err);
  g_clear_pointer (&err, g_free);

  g_autofree char *output = g_build_filename (work_dir, "never.wav", NULL);
  fail_unless_equals_int (
      say (NULL, &err, "-m", "/no/such/model", "-d", "cpu", "-o", output, "hi", NULL), 1);
  fail_unless (strstr (err, "/no/such/model") != NULL, "%s", err);
  g_clear_pointer (&err, g_free);

  fail_unless_equals_int (say ("   \n", &err, "-m", model_dir, "-o", output, NULL), 1);
  fail_unless (strstr (err, "nothing to say") != NULL, "%s", err);
  g_clear_pointer (&err, g_free);

  /* without the plugin: an error, not a hang */
  g_autofree char *plugin_path = g_strdup (g_getenv ("GST_PLUGIN_PATH_1_0"));
  g_setenv ("GST_PLUGIN_PATH_1_0", work_dir, TRUE);
  g_setenv ("GST_REGISTRY_1_0", output, TRUE); /* a fresh registry, never written */
  fail_unless_equals_int (say (NULL, &err, "-m", model_dir, "-o", output, "hi", NULL), 1);
  fail_unless (strstr (err, "GST_PLUGIN_PATH") != NULL, "%s", err);
  g_clear_pointer (&err, g_free);
  g_setenv ("GST_PLUGIN_PATH_1_0", plugin_path, TRUE);
  g_unsetenv ("GST_REGISTRY_1_0");

  g_autofree char *bad = g_build_filename (work_dir, "bad.txt", NULL);
  fail_unless (g_file_set_contents (bad, "ok \xff\xfe bad", -1, NULL));
  fail_unless_equals_int (say (NULL, &err, "-m", model_dir, "-f", bad, "-o", output, NULL), 1);
  fail_unless (strstr (err, "bad.txt") != NULL, "%s", err);
}
GST_END_TEST;

static Suite *
gepard_say_suite (void)
{
  Suite *s = suite_create ("gepard-say");
  TCase *tc = tcase_create ("general");
  tcase_set_timeout (tc, 120);
  suite_add_tcase (s, tc);
  tcase_add_test (tc, test_formats);
  tcase_add_test (tc, test_stdin_and_arguments);
  tcase_add_test (tc, test_errors);
  return s;
}

int
main (int argc, char **argv)
{
  gst_check_init (&argc, &argv);
  work_dir = g_dir_make_tmp ("gepard-say-XXXXXX", NULL);
  model_dir = g_build_filename (work_dir, "tiny", NULL);
  gepard_test_make_model ("--preset tiny --seed 3", model_dir);

  int failed = gst_check_run_suite (gepard_say_suite (), "gepard-say", __FILE__);
  g_autofree char *rm = g_strdup_printf ("rm -rf '%s'", work_dir);
  (void)!system (rm);
  return failed;
}
