/* The NCCL implementation's place in a build without CUDA or NCCL: asked for, it says why it
 * is missing. intra_nccl.c replaces this file when both are found. */
#include "intra_int.h"

bool fl_intra_nccl_built(void)
{
    return false;
}

static int open_none(fl_intra_t *x)
{
    (void)x;
    return fl_fail(FL_EINVAL, "NCCL not built in (FLODL_CUDA=off, or no nccl.h and libnccl at "
                              "build time): use the copy implementation");
}

/* Never reached: no handle is ever opened with it. */
const intra_backend_t fl_intra_nccl_backend = {
    .name = "nccl",
    .open = open_none,
};
