/* gepard-backend.c: choosing the CPU or the CUDA backend. */
#include "gepard-backend.h"

#include "gepard-build-config.h"
#include "gepard-error.h"
#include "../kernels/gepard-cuda.h"

#include <gmodule.h>

void
gepard_device_info_clear (GepardDeviceInfo *info)
{
  g_clear_pointer (&info->description, g_free);
}

gboolean
gepard_backend_parse_device (const char *device, GepardBackendKind *kind, int *index,
                             gboolean *is_auto, GError **error)
{
  *is_auto = FALSE;
  *index = -1;
  *kind = GEPARD_BACKEND_CPU;

  if (device == NULL || g_strcmp0 (device, "auto") == 0)
    {
      *is_auto = TRUE;
      return TRUE;
    }
  if (g_strcmp0 (device, "cpu") == 0)
    return TRUE;
  if (g_strcmp0 (device, "cuda") == 0)
    {
      *kind = GEPARD_BACKEND_CUDA;
      *index = 0;
      return TRUE;
    }
  if (g_str_has_prefix (device, "cuda:"))
    {
      guint64 n;
      if (g_ascii_string_to_unsigned (device + 5, 10, 0, 1023, &n, NULL))
        {
          *kind = GEPARD_BACKEND_CUDA;
          *index = (int)n;
          return TRUE;
        }
    }
  g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_INVALID,
               "Unknown device “%s”: use auto, cpu, cuda or cuda:N", device);
  return FALSE;
}

/* The CUDA module, loaded once per process and never unloaded (the runtime it links keeps
 * threads and handlers that must not vanish). */
typedef struct
{
  GModule *module;
  GepardCudaProbeFunc probe;
  GepardCudaDescribeFunc describe;
  char *load_error;
} CudaModule;

static CudaModule *
cuda_module_get (void)
{
  static gsize initialized = 0;
  static CudaModule cuda;

  if (g_once_init_enter (&initialized))
    {
      /* GEPARD_BACKEND_DIR replaces the default places (for tests and relocated installs);
       * otherwise the install directory, then the build tree */
      const char *override = g_getenv ("GEPARD_BACKEND_DIR");
      const char *dirs[] = {override, override ? NULL : GEPARD_BACKEND_DIR,
                            override ? NULL : GEPARD_BUILD_BACKEND_DIR};
      g_autoptr (GString) tried = g_string_new (NULL);

      for (guint i = 0; i < G_N_ELEMENTS (dirs) && cuda.module == NULL; i++)
        {
          if (dirs[i] == NULL || *dirs[i] == '\0')
            continue;
          g_autofree char *path = g_build_filename (dirs[i], "libgepard-cuda.so", NULL);
          if (!g_file_test (path, G_FILE_TEST_EXISTS))
            {
              g_string_append_printf (tried, "%s%s", tried->len ? ", " : "", path);
              continue;
            }
          cuda.module = g_module_open (path, G_MODULE_BIND_LOCAL | G_MODULE_BIND_LAZY);
          if (cuda.module == NULL)
            {
              cuda.load_error
                  = g_strdup_printf ("%s cannot be loaded: %s", path, g_module_error ());
              break;
            }
          GepardCudaAbiVersionFunc abi = NULL;
          if (!g_module_symbol (cuda.module, "gepard_cuda_abi_version", (gpointer *)&abi)
              || !g_module_symbol (cuda.module, "gepard_cuda_probe", (gpointer *)&cuda.probe)
              || !g_module_symbol (cuda.module, "gepard_cuda_describe", (gpointer *)&cuda.describe)
              || abi () != GEPARD_CUDA_ABI_VERSION)
            {
              cuda.load_error
                  = g_strdup_printf ("%s is from another Gepard version; reinstall it", path);
              cuda.probe = NULL;
            }
        }
      if (cuda.module == NULL && cuda.load_error == NULL)
        cuda.load_error
            = g_strdup_printf ("Gepard was built without the CUDA backend (no %s)", tried->str);
      g_once_init_leave (&initialized, 1);
    }
  return &cuda;
}

gboolean
gepard_backend_cuda_probe (int *n_devices, GError **error)
{
  CudaModule *cuda = cuda_module_get ();
  if (cuda->probe == NULL)
    {
      g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE, "%s",
                   cuda->load_error);
      return FALSE;
    }
  char message[256] = "";
  int count = 0;
  if (cuda->probe (&count, message, sizeof message) != 0)
    {
      g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE,
                   "No usable GPU: %s", message);
      return FALSE;
    }
  *n_devices = count;
  return TRUE;
}

gpointer
gepard_backend_cuda_symbol (const char *name, GError **error)
{
  CudaModule *cuda = cuda_module_get ();
  gpointer symbol = NULL;

  /* probe is only resolved for a module of this ABI version */
  if (cuda->probe == NULL)
    {
      g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE, "%s",
                   cuda->load_error);
      return NULL;
    }
  if (!g_module_symbol (cuda->module, name, &symbol) || symbol == NULL)
    {
      g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE,
                   "The CUDA module %s has no entry point %s", g_module_name (cuda->module), name);
      return NULL;
    }
  return symbol;
}

static void
set_cpu (GepardDeviceInfo *info)
{
  info->kind = GEPARD_BACKEND_CPU;
  info->device_index = -1;
  info->description = g_strdup_printf ("CPU (%u threads)", g_get_num_processors ());
}

gboolean
gepard_backend_select (const char *device, GepardDeviceInfo *info, char **fallback_reason,
                       GError **error)
{
  GepardBackendKind kind;
  int index;
  gboolean is_auto;

  if (fallback_reason != NULL)
    *fallback_reason = NULL;
  if (!gepard_backend_parse_device (device, &kind, &index, &is_auto, error))
    return FALSE;

  if (kind == GEPARD_BACKEND_CPU && !is_auto)
    {
      set_cpu (info);
      return TRUE;
    }

  g_autoptr (GError) probe_error = NULL;
  int n_devices = 0;
  if (!gepard_backend_cuda_probe (&n_devices, &probe_error))
    {
      if (!is_auto)
        {
          g_propagate_prefixed_error (error, g_steal_pointer (&probe_error),
                                      "Device “%s” is not available: ", device);
          return FALSE;
        }
      if (fallback_reason != NULL)
        *fallback_reason = g_strdup (probe_error->message);
      set_cpu (info);
      return TRUE;
    }
  if (is_auto)
    index = 0;
  if (index >= n_devices)
    {
      g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE,
                   "Device “%s” does not exist: the machine has %d GPU%s", device, n_devices,
                   n_devices == 1 ? "" : "s");
      return FALSE;
    }

  char description[256] = "";
  CudaModule *cuda = cuda_module_get ();
  if (cuda->describe (index, description, sizeof description) != 0)
    {
      g_set_error (error, GEPARD_BACKEND_ERROR, GEPARD_BACKEND_ERROR_UNAVAILABLE,
                   "GPU %d cannot be queried: %s", index, description);
      return FALSE;
    }
  info->kind = GEPARD_BACKEND_CUDA;
  info->device_index = index;
  info->description = g_strdup (description);
  return TRUE;
}
