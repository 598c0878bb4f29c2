/* Backend selection: CPU always works, CUDA only where the module, a driver and a GPU exist. */
#include "gepard-backend.h"
#include "gepard-error.h"

#include <string.h>

static void
test_parse_device (void)
{
  GepardBackendKind kind;
  int index;
  gboolean is_auto;
  g_autoptr (GError) error = NULL;

  g_assert_true (gepard_backend_parse_device ("cpu", &kind, &index, &is_auto, &error));
  g_assert_cmpint (kind, ==, GEPARD_BACKEND_CPU);
  g_assert_false (is_auto);
  g_assert_true (gepard_backend_parse_device ("auto", &kind, &index, &is_auto, &error));
  g_assert_true (is_auto);
  g_assert_true (gepard_backend_parse_device (NULL, &kind, &index, &is_auto, &error));
  g_assert_true (is_auto);
  g_assert_true (gepard_backend_parse_device ("cuda", &kind, &index, &is_auto, &error));
  g_assert_cmpint (kind, ==, GEPARD_BACKEND_CUDA);
  g_assert_cmpint (index, ==, 0);
  g_assert_true (gepard_backend_parse_device ("cuda:3", &kind, &index, &is_auto, &error));
  g_assert_cmpint (index, ==, 3);

  const char *bad[] = {"gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "CPU", ""};
  for (guint i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_assert_false (gepard_backend_parse_device (bad[i], &kind, &index, &is_auto, &error));
      g_assert_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_INVALID);
      g_clear_error (&error);
    }
}

static void
test_cpu_always (void)
{
  GepardDeviceInfo info = {0};
  g_autoptr (GError) error = NULL;
  g_assert_true (gepard_backend_select ("cpu", &info, NULL, &error));
  g_assert_no_error (error);
  g_assert_cmpint (info.kind, ==, GEPARD_BACKEND_CPU);
  g_assert_nonnull (strstr (info.description, "CPU"));
  gepard_device_info_clear (&info);
}

/* Whatever this machine has, auto and cuda must agree with the probe. */
static void
test_auto_matches_probe (void)
{
  int n_devices = 0;
  g_autoptr (GError) probe_error = NULL;
  gboolean has_gpu = gepard_backend_cuda_probe (&n_devices, &probe_error);

  GepardDeviceInfo info = {0};
  g_autofree char *reason = NULL;
  g_autoptr (GError) error = NULL;
  g_assert_true (gepard_backend_select ("auto", &info, &reason, &error));
  g_assert_no_error (error);

  if (has_gpu)
    {
      g_assert_cmpint (n_devices, >, 0);
      g_assert_cmpint (info.kind, ==, GEPARD_BACKEND_CUDA);
      g_assert_null (reason);
      g_test_message ("GPU: %s", info.description);
    }
  else
    {
      g_assert_error (probe_error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE);
      g_assert_cmpint (info.kind, ==, GEPARD_BACKEND_CPU);
      g_assert_cmpstr (reason, ==, probe_error->message);
      g_test_message ("no GPU: %s", reason);

      GepardDeviceInfo cuda = {0};
      g_assert_false (gepard_backend_select ("cuda", &cuda, NULL, &error));
      g_assert_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE);
      g_assert_nonnull (strstr (error->message, "cuda"));
    }
  gepard_device_info_clear (&info);
}

static void
test_nonexistent_gpu_index (void)
{
  GepardDeviceInfo info = {0};
  g_autoptr (GError) error = NULL;
  g_assert_false (gepard_backend_select ("cuda:1000", &info, NULL, &error));
  g_assert_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE);
}

/* Built with -Dcuda=enabled|auto where nvcc exists, the module loads even without a driver. */
static void
test_module_loads_without_driver (void)
{
  g_autofree char *module
      = g_build_filename (g_getenv ("GEPARD_BUILD_DIR"), "kernels", "libgepard-cuda.so", NULL);
  if (!g_file_test (module, G_FILE_TEST_EXISTS))
    {
      g_test_skip ("built without the CUDA backend");
      return;
    }
  int n = 0;
  g_autoptr (GError) error = NULL;
  if (!gepard_backend_cuda_probe (&n, &error))
    /* the module was found: the reason is the driver or the GPU, not a missing module */
    g_assert_null (strstr (error->message, "built without"));
}

static void
test_missing_module_subprocess (void)
{
  if (g_test_subprocess ())
    {
      g_setenv ("GEPARD_BACKEND_DIR", "/nonexistent", TRUE);
      GepardDeviceInfo info = {0};
      g_autofree char *reason = NULL;
      g_assert_true (gepard_backend_select ("auto", &info, &reason, NULL));
      g_assert_cmpint (info.kind, ==, GEPARD_BACKEND_CPU);
      gepard_device_info_clear (&info);
      return;
    }
  g_test_trap_subprocess (NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_passed ();
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/backend/parse-device", test_parse_device);
  g_test_add_func ("/backend/cpu-always", test_cpu_always);
  g_test_add_func ("/backend/auto-matches-probe", test_auto_matches_probe);
  g_test_add_func ("/backend/nonexistent-gpu-index", test_nonexistent_gpu_index);
  g_test_add_func ("/backend/module-loads-without-driver", test_module_loads_without_driver);
  g_test_add_func ("/backend/missing-module", test_missing_module_subprocess);
  return g_test_run ();
}
