/* Compiled, not run (tests/CMakeLists.txt): host code that reads through a device address must
 * be a compile error. dev_misuse_compile expects this file to fail; dev_use_compile builds it
 * with FL_DEV_MISUSE_NONE to show the rest of it compiles, so the failure is the dereference. */
#include "fl_dev.h"

float first(fl_dptr_t p);
float first(fl_dptr_t p)
{
#ifdef FL_DEV_MISUSE_NONE
    (void)p;
    return 0.0f;
#else
    const float *h = p; /* a device address is no host pointer */
    return *h + p[1];
#endif
}
