/* examples/gepard-embed, the embedding example the README shows, run as a user would: it speaks
 * through an engine of its own handed to the pipeline as a GstContext, and its audio covers every
 * frame at 16 kHz. */
#include <gio/gio.h>
#include <gst/check/gstcheck.h>

#include <stdlib.h>
#include <string.h>

#include "gepard-test-model.h"

static char *work_dir;
static char *model_dir;

static int
embed (char **out, char **err, const char *model, const char *text)
{
  g_autofree char *tool
      = g_build_filename (g_getenv ("GEPARD_BUILD_DIR"), "examples", "gepard-embed", NULL);
  const char *argv[] = {tool, model, text, NULL};
  g_autoptr (GSubprocess) process = g_subprocess_newv (
      argv, G_SUBPROCESS_FLAGS_STDOUT_PIPE | G_SUBPROCESS_FLAGS_STDERR_PIPE, NULL);
  fail_unless (process != NULL);
  fail_unless (g_subprocess_communicate_utf8 (process, NULL, NULL, out, err, NULL));
  return g_subprocess_get_exit_status (process);
}

GST_START_TEST (test_embed_example)
{
  g_autofree char *out = NULL, *err = NULL;
  int status = embed (&out, &err, model_dir, "Hello from an application. It has two sentences.");
  fail_unless_equals_int (status, 0);

  /* "audio <pts> +<n> samples" per buffer, then "<total> samples at 16000 Hz" */
  g_auto (GStrv) lines = g_strsplit (out, "\n", -1);
  guint64 sum = 0, total = 0;
  guint buffers = 0;
  for (guint i = 0; lines[i] != NULL; i++)
    {
      const char *plus = strstr (lines[i], " +");
      if (g_str_has_prefix (lines[i], "audio ") && plus != NULL)
        {
          sum += g_ascii_strtoull (plus + 2, NULL, 10);
          buffers++;
        }
      else if (strstr (lines[i], "samples at 16000 Hz") != NULL)
        total = g_ascii_strtoull (lines[i], NULL, 10);
    }
  fail_unless (buffers >= 2, "output: %s", out);
  fail_unless_equals_uint64 (sum, total);
  /* whole 1024-sample frames at 22050 Hz, resampled: between 1 and 2 × 200 frames */
  double frames = total * 22050.0 / 16000.0 / 1024.0;
  fail_unless (frames > 0.99 && frames < 400.5, "%.2f frames", frames);
}
GST_END_TEST;

GST_START_TEST (test_embed_bad_model)
{
  g_autofree char *out = NULL, *err = NULL;
  g_autofree char *missing = g_build_filename (work_dir, "no-such-model", NULL);
  fail_unless_equals_int (embed (&out, &err, missing, "Hello."), 1);
  fail_unless (strstr (err, "no-such-model") != NULL, "stderr: %s", err);
}
GST_END_TEST;

static Suite *
embed_suite (void)
{
  Suite *s = suite_create ("embed");
  TCase *tc = tcase_create ("general");
  tcase_set_timeout (tc, 120);
  suite_add_tcase (s, tc);
  tcase_add_test (tc, test_embed_example);
  tcase_add_test (tc, test_embed_bad_model);
  return s;
}

int
main (int argc, char **argv)
{
  gst_check_init (&argc, &argv);
  work_dir = g_dir_make_tmp ("gepard-embed-XXXXXX", NULL);
  model_dir = g_build_filename (work_dir, "tiny", NULL);
  gepard_test_make_model ("--preset tiny --seed 4", model_dir);

  int failed = gst_check_run_suite (embed_suite (), "embed", __FILE__);
  g_autofree char *rm = g_strdup_printf ("rm -rf '%s'", work_dir);
  (void)!system (rm);
  return failed;
}
