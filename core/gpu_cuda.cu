/* GPU discovery with the CUDA runtime. A machine with the toolkit but no driver or device
 * (this build machine) reports zero devices and the CUDA error text, never fails. Asking
 * whether a pointer is device memory never loads the driver itself. */
#include <cuda_runtime.h>
#include <dlfcn.h>
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

/* Whether the CUDA driver is loaded in this process. Without it no CUDA context exists, so
 * no pointer can be device memory; asking the runtime would load and initialise the driver
 * (hundreds of milliseconds, and device memory) in processes that never use a GPU. */
static bool driver_loaded(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL)
        return false;
    dlclose(h); /* drops only the reference NOLOAD took */
    return true;
}

extern "C" bool fl_gpu_is_device_ptr(const void *p)
{
    if (p == NULL || !driver_loaded())
        return false;
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: it cannot be device memory */
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

extern "C" int fl_gpu_memcpy(void *dst, const void *src, size_t bytes)
{
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fl_fail(FL_EGPU, "gpu: copy of %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    return FL_OK;
}

extern "C" int fl_gpu_alloc(void **out, size_t bytes)
{
    *out = NULL;
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        return fl_fail(FL_EGPU, "gpu: allocation of %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    return FL_OK;
}

extern "C" void fl_gpu_free(void *p)
{
    if (p != NULL)
        cudaFree(p);
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
