/* GPU discovery with the CUDA runtime. A machine with the toolkit but no driver or device
 * (this build machine) reports zero devices and the CUDA error text, never fails. */
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "fl_core.h"
}

extern "C" int fl_gpu_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky error for later callers */
        return 0;
    }
    return n;
}

extern "C" bool fl_gpu_available(void)
{
    return fl_gpu_count() > 0;
}

extern "C" void fl_gpu_describe(char *out, size_t cap)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(out, cap, "no usable CUDA device: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return;
    }
    if (n == 0) {
        snprintf(out, cap, "no CUDA device");
        return;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        snprintf(out, cap, "%d CUDA device(s)", n);
        return;
    }
    snprintf(out, cap, "%d x %s (%.0f GiB)", n, p.name, (double)p.totalGlobalMem / (1 << 30));
}
