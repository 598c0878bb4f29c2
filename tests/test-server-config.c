/* gepard-server's GPU placement settings: device ids, memory fraction, the device they imply,
 * the MPS daemon's control pipe, and how the variables and flags combine. */
#include "gepard-server-config.h"

#include <errno.h>
#include <glib/gstdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void
check_ids (const char *text, guint n, const int *expected)
{
  g_autoptr (GError) error = NULL;
  g_autofree int *ids = NULL;
  guint n_ids = 0;
  g_assert_true (gepard_server_parse_device_ids ("TTS_GPU_DEVICE_IDS", text, &ids, &n_ids, &error));
  g_assert_no_error (error);
  g_assert_cmpuint (n_ids, ==, n);
  for (guint i = 0; i < n; i++)
    g_assert_cmpint (ids[i], ==, expected[i]);
}

static void
check_bad_ids (const char *text, const char *fragment)
{
  g_autoptr (GError) error = NULL;
  g_autofree int *ids = NULL;
  guint n_ids = 0;
  g_assert_false (gepard_server_parse_device_ids ("GPU_DEVICE_IDS", text, &ids, &n_ids, &error));
  g_assert_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE);
  g_assert_null (ids);
  /* the error names the variable and what is wrong */
  g_assert_true (g_str_has_prefix (error->message, "GPU_DEVICE_IDS="));
  if (strstr (error->message, fragment) == NULL)
    g_error ("“%s”: “%s” lacks “%s”", text, error->message, fragment);
}

static void
test_device_ids (void)
{
  check_ids ("0", 1, (int[]){0});
  check_ids ("3", 1, (int[]){3});
  check_ids ("0,1", 2, (int[]){0, 1});
  check_ids (" 2 , 0 ,7", 3, (int[]){2, 0, 7});
  check_ids ("1023", 1, (int[]){1023});

  check_bad_ids ("", "empty");
  check_bad_ids ("0,", "empty");
  check_bad_ids (",1", "empty");
  check_bad_ids ("0,,1", "empty");
  check_bad_ids ("-1", "not a GPU index");
  check_bad_ids ("+1", "not a GPU index");
  check_bad_ids ("1.5", "not a GPU index");
  check_bad_ids ("0x1", "not a GPU index");
  check_bad_ids ("1024", "not a GPU index");
  check_bad_ids ("99999999999999999999", "not a GPU index");
  check_bad_ids ("GPU-8f6e0c1a", "not a GPU index");
  check_bad_ids ("0 1", "not a GPU index");
  check_bad_ids ("0;1", "not a GPU index");
  check_bad_ids ("1,0,1", "listed twice");
}

static void
test_fraction (void)
{
  const struct
  {
    const char *text;
    double value;
  } good[]
      = {{"0.5", 0.5}, {"1", 1.0}, {"1.0", 1.0}, {"0.05", 0.05}, {" 0.9 ", 0.9}, {"5e-1", 0.5}};
  for (gsize i = 0; i < G_N_ELEMENTS (good); i++)
    {
      g_autoptr (GError) error = NULL;
      double value = 0;
      g_assert_true (gepard_server_parse_fraction ("F", good[i].text, &value, &error));
      g_assert_no_error (error);
      g_assert_cmpfloat (value, ==, good[i].value);
    }

  const char *bad[]
      = {"", "0", "0.0", "-0.5", "1.01", "2", "abc", "0.5x", "nan", "inf", "0x0.8", "50%", "0,5"};
  for (gsize i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_autoptr (GError) error = NULL;
      double value = 0.25;
      g_assert_false (
          gepard_server_parse_fraction ("TTS_GPU_MEMORY_UTILIZATION", bad[i], &value, &error));
      g_assert_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE);
      g_assert_nonnull (strstr (error->message, "TTS_GPU_MEMORY_UTILIZATION="));
      g_assert_nonnull (strstr (error->message, "(0, 1]"));
      g_assert_cmpfloat (value, ==, 0.25);
    }
}

static void
check_device (const char *device, const int *ids, guint n, gboolean given, const char *expected)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *result = gepard_server_placement_device (device, ids, n, given, &error);
  g_assert_no_error (error);
  g_assert_cmpstr (result, ==, expected);
}

static void
test_placement_device (void)
{
  int zero[] = {0}, two[] = {2, 3}, one[] = {1};
  check_device ("auto", zero, 1, FALSE, "auto");
  check_device ("auto", zero, 1, TRUE, "auto");
  check_device ("auto", two, 2, TRUE, "cuda:2");
  check_device ("cuda", zero, 1, FALSE, "cuda:0");
  check_device ("cuda", two, 2, TRUE, "cuda:2");
  check_device ("cpu", two, 2, TRUE, "cpu");
  check_device ("cuda:1", zero, 1, FALSE, "cuda:1"); /* the default list does not overrule it */
  check_device ("cuda:1", one, 1, TRUE, "cuda:1");

  g_autoptr (GError) error = NULL;
  g_autofree char *result = gepard_server_placement_device ("cuda:1", two, 2, TRUE, &error);
  g_assert_null (result);
  g_assert_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE);
  g_assert_nonnull (strstr (error->message, "cuda:1"));
  g_assert_nonnull (strstr (error->message, "disagree"));
}

static void
test_mps (void)
{
  g_autofree char *dir = g_dir_make_tmp ("gepard-mps-XXXXXX", NULL);
  g_autofree char *control = g_build_filename (dir, "control", NULL);
  g_autofree char *seen = NULL;

  g_setenv ("CUDA_MPS_PIPE_DIRECTORY", dir, TRUE);
  g_assert_false (gepard_server_detect_mps (&seen));
  g_assert_cmpstr (seen, ==, dir);
  g_clear_pointer (&seen, g_free);

  /* a plain file is not the daemon's pipe */
  g_assert_true (g_file_set_contents (control, "", 0, NULL));
  g_assert_false (gepard_server_detect_mps (NULL));
  g_unlink (control);

  g_assert_cmpint (mkfifo (control, 0600), ==, 0);
  g_assert_true (gepard_server_detect_mps (&seen));
  g_assert_cmpstr (seen, ==, dir);
  g_clear_pointer (&seen, g_free);
  g_unlink (control);
  g_rmdir (dir);

  g_unsetenv ("CUDA_MPS_PIPE_DIRECTORY");
  gepard_server_detect_mps (&seen);
  g_assert_cmpstr (seen, ==, "/tmp/nvidia-mps");
}

static const char *const placement_variables[] = {
    "TTS_GPU_DEVICE_IDS", "GPU_DEVICE_IDS", "TTS_GPU_MEMORY_UTILIZATION", "TTS_DEVICE", "TTS_MODEL",
};

static void
clear_variables (void)
{
  for (gsize i = 0; i < G_N_ELEMENTS (placement_variables); i++)
    g_unsetenv (placement_variables[i]);
}

/* gepard_server_config_load on a command line */
static gboolean
load_line (GepardServerConfig *config, const char *line, GError **error)
{
  char **argv = NULL;
  int argc = 0;
  g_assert_true (g_shell_parse_argv (line, &argc, &argv, NULL));
  char **original = g_memdup2 (argv, sizeof (char *) * (argc + 1));
  gboolean ok = gepard_server_config_load (config, &argc, &argv, error);
  g_free (argv);
  g_strfreev (original);
  return ok;
}

/* gepard_server_config_load on "gepard-server --model m ARGS…" */
static gboolean
load (GepardServerConfig *config, const char *args, GError **error)
{
  g_autofree char *line = g_strdup_printf ("gepard-server --model m %s", args);
  return load_line (config, line, error);
}

static void
test_config_load (void)
{
  GepardServerConfig config;
  g_autoptr (GError) error = NULL;

  /* defaults: GPU 0, half the memory, and the backend's variable set to what was validated */
  clear_variables ();
  g_assert_true (load (&config, "", &error));
  g_assert_no_error (error);
  g_assert_cmpuint (config.n_gpu_device_ids, ==, 1);
  g_assert_cmpint (config.gpu_device_ids[0], ==, 0);
  g_assert_cmpfloat (config.gpu_memory_utilization, ==, 0.5);
  g_assert_cmpstr (config.device, ==, "auto");
  g_assert_cmpstr (g_getenv ("TTS_GPU_MEMORY_UTILIZATION"), ==, "0.5");
  gepard_server_config_clear (&config);

  /* the TTS_ variable wins over the generic one */
  clear_variables ();
  g_setenv ("GPU_DEVICE_IDS", "5", TRUE);
  g_setenv ("TTS_GPU_DEVICE_IDS", "1,2", TRUE);
  g_setenv ("TTS_GPU_MEMORY_UTILIZATION", "0.8", TRUE);
  g_assert_true (load (&config, "", &error));
  g_assert_cmpuint (config.n_gpu_device_ids, ==, 2);
  g_assert_cmpint (config.gpu_device_ids[0], ==, 1);
  g_assert_cmpint (config.gpu_device_ids[1], ==, 2);
  g_assert_cmpfloat (config.gpu_memory_utilization, ==, 0.8);
  g_assert_cmpstr (config.device, ==, "cuda:1");
  gepard_server_config_clear (&config);

  /* the generic one alone */
  g_unsetenv ("TTS_GPU_DEVICE_IDS");
  g_assert_true (load (&config, "--device cuda", &error));
  g_assert_cmpint (config.gpu_device_ids[0], ==, 5);
  g_assert_cmpstr (config.device, ==, "cuda:5");
  gepard_server_config_clear (&config);

  /* flags win over variables */
  g_assert_true (load (&config, "--gpu-device-ids 3 --gpu-memory-utilization 0.25", &error));
  g_assert_cmpint (config.gpu_device_ids[0], ==, 3);
  g_assert_cmpfloat (config.gpu_memory_utilization, ==, 0.25);
  g_assert_cmpstr (g_getenv ("TTS_GPU_MEMORY_UTILIZATION"), ==, "0.25");
  gepard_server_config_clear (&config);

  /* errors name the variable or the flag at fault */
  clear_variables ();
  g_setenv ("GPU_DEVICE_IDS", "0,x", TRUE);
  g_assert_false (load (&config, "", &error));
  g_assert_nonnull (strstr (error->message, "GPU_DEVICE_IDS=0,x"));
  g_clear_error (&error);
  gepard_server_config_clear (&config);

  clear_variables ();
  g_setenv ("TTS_GPU_MEMORY_UTILIZATION", "1.5", TRUE);
  g_assert_false (load (&config, "", &error));
  g_assert_nonnull (strstr (error->message, "TTS_GPU_MEMORY_UTILIZATION=1.5"));
  g_clear_error (&error);
  gepard_server_config_clear (&config);

  clear_variables ();
  g_assert_false (load (&config, "--gpu-memory-utilization 0", &error));
  g_assert_nonnull (strstr (error->message, "--gpu-memory-utilization=0"));
  g_clear_error (&error);
  gepard_server_config_clear (&config);

  g_assert_false (load (&config, "--device cuda:0 --gpu-device-ids 1", &error));
  g_assert_nonnull (strstr (error->message, "disagree"));
  g_clear_error (&error);
  gepard_server_config_clear (&config);
  clear_variables ();
}

/* with no --model and no TTS_MODEL, the default model (GEPARD_MODEL here); a flag wins */
static void
test_default_model (void)
{
  GepardServerConfig config;
  g_autoptr (GError) error = NULL;
  clear_variables ();
  g_unsetenv ("TTS_MODEL");
  g_setenv ("GEPARD_MODEL", "/x/default-voice", TRUE);
  g_assert_true (load_line (&config, "gepard-server", &error));
  g_assert_no_error (error);
  g_assert_cmpstr (config.model, ==, "/x/default-voice");
  gepard_server_config_clear (&config);

  g_assert_true (load (&config, "", &error));
  g_assert_cmpstr (config.model, ==, "m");
  gepard_server_config_clear (&config);
  g_unsetenv ("GEPARD_MODEL");
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/server-config/device-ids", test_device_ids);
  g_test_add_func ("/server-config/fraction", test_fraction);
  g_test_add_func ("/server-config/placement-device", test_placement_device);
  g_test_add_func ("/server-config/mps", test_mps);
  g_test_add_func ("/server-config/load", test_config_load);
  g_test_add_func ("/server-config/default-model", test_default_model);
  return g_test_run ();
}
