/* gepard-cuda.cu: device discovery for the CUDA backend. The runtime is linked statically, so the
 * module loads on machines without a driver and reports that instead of failing to load. */
#include "gepard-cuda.h"

#include <cuda_runtime.h>
#include <stdio.h>

#define GEPARD_CUDA_EXPORT extern "C" __attribute__ ((visibility ("default")))

GEPARD_CUDA_EXPORT int
gepard_cuda_abi_version (void)
{
  return GEPARD_CUDA_ABI_VERSION;
}

GEPARD_CUDA_EXPORT int
gepard_cuda_probe (int *n_devices, char *message, size_t message_len)
{
  int count = 0;
  cudaError_t status = cudaGetDeviceCount (&count);
  if (status != cudaSuccess)
    {
      snprintf (message, message_len, "%s (%s)", cudaGetErrorString (status),
                cudaGetErrorName (status));
      return -1;
    }
  if (count == 0)
    {
      snprintf (message, message_len, "the CUDA driver sees no GPU");
      return -1;
    }
  *n_devices = count;
  return 0;
}

GEPARD_CUDA_EXPORT int
gepard_cuda_describe (int device, char *description, size_t description_len)
{
  cudaDeviceProp prop;
  cudaError_t status = cudaGetDeviceProperties (&prop, device);
  if (status != cudaSuccess)
    {
      snprintf (description, description_len, "%s", cudaGetErrorString (status));
      return -1;
    }
  snprintf (description, description_len, "%s, %.1f GiB, sm_%d%d", prop.name,
            (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), prop.major, prop.minor);
  return 0;
}
