/* The parameter server's consistency models by name (include/flodl/ps.h): shared by the
 * server, its client and the binaries' flags. */
#include "fl_core.h"

#include <flodl/ps.h>
#include <strings.h>

static const char *const consistency_names[] = {"sync", "async", "ssp"};

const char *fl_ps_consistency_name(fl_ps_consistency_t c)
{
    return (unsigned)c < 3 ? consistency_names[c] : "unknown";
}

int fl_ps_consistency_parse(const char *s, fl_ps_consistency_t *out)
{
    if (s != NULL && strcasecmp(s, "bsp") == 0) {
        *out = FL_PS_SYNC;
        return FL_OK;
    }
    for (int i = 0; s != NULL && i < 3; i++) {
        if (strcasecmp(s, consistency_names[i]) == 0) {
            *out = (fl_ps_consistency_t)i;
            return FL_OK;
        }
    }
    return fl_fail(FL_EINVAL, "consistency '%s' is not one of sync|async|ssp", s ? s : "(null)");
}
