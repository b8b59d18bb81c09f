/* GPU discovery for builds without CUDA: there is never a device. gpu_cuda.cu implements the
 * same functions when FLODL_CUDA builds the CUDA parts. */
#include "fl_core.h"

#include <stdio.h>

bool fl_gpu_available(void)
{
    return false;
}

int fl_gpu_count(void)
{
    return 0;
}

void fl_gpu_describe(char *out, size_t cap)
{
    snprintf(out, cap, "CUDA not built in (FLODL_CUDA=off or no toolkit)");
}

bool fl_gpu_is_device_ptr(const void *p)
{
    (void)p;
    return false;
}

int fl_gpu_memcpy(void *dst, const void *src, size_t bytes)
{
    (void)dst;
    (void)src;
    return fl_fail(FL_EGPU, "gpu: copy of %zu bytes: CUDA not built in", bytes);
}

int fl_gpu_alloc(void **out, size_t bytes)
{
    *out = NULL;
    return fl_fail(FL_EGPU, "gpu: allocation of %zu bytes: CUDA not built in", bytes);
}

void fl_gpu_free(void *p)
{
    (void)p;
}
