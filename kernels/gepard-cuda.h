/* gepard-cuda.h: the entry points of the CUDA backend module (libgepard-cuda.so), looked up by
 * name with GModule. Plain C types only: the module has no GLib dependency. */
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C"
{
#endif

#define GEPARD_CUDA_ABI_VERSION 1

  typedef int (*GepardCudaAbiVersionFunc) (void);
  /* Number of usable GPUs in *n_devices and 0, or -1 with the reason in `message`. */
  typedef int (*GepardCudaProbeFunc) (int *n_devices, char *message, size_t message_len);
  /* "NVIDIA H200, 139.8 GiB, sm_90" into `description`; 0, or -1 with the reason. */
  typedef int (*GepardCudaDescribeFunc) (int device, char *description, size_t description_len);

#ifdef __cplusplus
}
#endif
