/* Host identity for error messages and the peer table. */
#include "fl_core.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void fl_hostname(char *out, size_t cap)
{
    if (cap == 0)
        return;
    if (gethostname(out, cap) != 0)
        snprintf(out, cap, "unknown-host");
    out[cap - 1] = '\0';
}
