/* The library's version and build features at run time, and the binaries' --version line. A
 * program built against one libflodl may run against another: fl_version_code() is what it
 * runs with, FL_VERSION_* what it was built with. */
#include "fl_core.h"

#include <stdio.h>

const char *fl_version(void)
{
    return FL_VERSION_STRING;
}

int fl_version_code(void)
{
    return FL_VERSION_MAJOR * 10000 + FL_VERSION_MINOR * 100 + FL_VERSION_PATCH;
}

const char *fl_build_features(void)
{
#ifdef FLODL_HAVE_CUDA
    return "cuda";
#else
    return "";
#endif
}

int fl_cli_version(const char *prog)
{
    const char *f = fl_build_features();
    printf("%s %s (libflodl %s; built with %s)\n", prog, FL_VERSION_STRING, fl_version(),
           f[0] ? f : "CPU only, no CUDA");
    return fflush(stdout) == 0 ? 0 : 1;
}
