/* The cuda backend's place in a build without the CUDA toolkit: no device can be counted or
 * opened, and each attempt says why. dev_cuda.cu replaces this file when nvcc is found. */
#include "dev_int.h"

#include <stdio.h>

bool fl_dev_cuda_built(void)
{
    return false;
}

static int count(char *why, size_t cap)
{
    if (why != NULL && cap > 0)
        snprintf(why, cap, "CUDA not built in (FLODL_CUDA=off or no toolkit at build time)");
    return 0;
}

static int open_dev(fl_dev_t *d)
{
    return fl_fail(FL_EGPU,
                   "device cuda:%d: CUDA not built in (FLODL_CUDA=off or no toolkit "
                   "at build time)",
                   d->o.id);
}

/* Never reached: no cuda device is ever opened in this build. */
const dev_backend_t fl_dev_cuda_backend = {
    .name = "cuda",
    .count = count,
    .open = open_dev,
};
