/* gepard-backend.h: which compute backend runs the model.
 *
 * The CPU backend is always there. The CUDA backend lives in a separate module (kernels/, built
 * where nvcc exists) that is loaded at run time, so the same library runs on machines without a
 * GPU or driver and falls back to the CPU there. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef enum
{
  GEPARD_BACKEND_CPU,
  GEPARD_BACKEND_CUDA,
} GepardBackendKind;

typedef struct
{
  GepardBackendKind kind;
  int device_index;  /* -1 for the CPU */
  char *description; /* "CPU (2 threads)", "NVIDIA H200, 139 GiB, sm_90" */
} GepardDeviceInfo;

void gepard_device_info_clear (GepardDeviceInfo *info);

/* Parses a device name: "cpu", "cuda", "cuda:N" or "auto". */
gboolean gepard_backend_parse_device (const char *device, GepardBackendKind *kind, int *index,
                                      gboolean *is_auto, GError **error);

/* Whether the CUDA module is installed or built beside the library, and how many GPUs it sees.
 * Returns FALSE with GEPARD_BACKEND_ERROR_UNAVAILABLE and the reason (not built, no driver, no
 * device) otherwise. */
gboolean gepard_backend_cuda_probe (int *n_devices, GError **error);

/* The address of entry point `name` of the loaded CUDA module (kernels/gepard-cuda.h), for the
 * CUDA compute backend. NULL with GEPARD_BACKEND_ERROR_UNAVAILABLE where the module is missing,
 * from another version, or lacks the symbol. */
gpointer gepard_backend_cuda_symbol (const char *name, GError **error);

/* Picks the device for `device` ("auto" prefers the first GPU and falls back to the CPU, saying
 * why in `fallback_reason` when given). */
gboolean gepard_backend_select (const char *device, GepardDeviceInfo *info, char **fallback_reason,
                                GError **error);

G_END_DECLS
