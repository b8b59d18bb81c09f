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
