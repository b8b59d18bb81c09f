/* Flag values for the binaries: strict parsing with a detail text that names the flag, so the
 * entry points can print one line and exit 2. */
#include "fl_core.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fl_cli_long(const char *flag, const char *val, long lo, long hi, long *out)
{
    if (val == NULL || val[0] == '\0')
        return fl_fail(FL_EINVAL, "%s: missing value", flag);
    char *end = NULL;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno != 0 || end == val || *end != '\0' || isspace((unsigned char)val[0]) ||
        val[0] == '+')
        return fl_fail(FL_EINVAL, "%s: '%s' is not an integer", flag, val);
    if (v < lo || v > hi)
        return fl_fail(FL_EINVAL, "%s: %ld is out of range %ld..%ld", flag, v, lo, hi);
    *out = v;
    return FL_OK;
}

int fl_cli_size(const char *flag, const char *val, size_t lo, size_t hi, size_t *out)
{
    if (val == NULL || val[0] == '\0')
        return fl_fail(FL_EINVAL, "%s: missing value", flag);
    if (val[0] == '-')
        return fl_fail(FL_EINVAL, "%s: '%s' is negative", flag, val);
    if (!isdigit((unsigned char)val[0]))
        return fl_fail(FL_EINVAL, "%s: '%s' is not a size", flag, val);
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (errno != 0 || end == val)
        return fl_fail(FL_EINVAL, "%s: '%s' is not a size", flag, val);
    unsigned shift = 0;
    if (*end != '\0') {
        switch (toupper((unsigned char)*end)) {
        case 'K': shift = 10; break;
        case 'M': shift = 20; break;
        case 'G': shift = 30; break;
        default: return fl_fail(FL_EINVAL, "%s: '%s' has an unknown suffix (K, M or G)", flag, val);
        }
        end++;
        if (toupper((unsigned char)*end) == 'I')
            end++;
        if (toupper((unsigned char)*end) == 'B')
            end++;
        if (*end != '\0')
            return fl_fail(FL_EINVAL, "%s: '%s' is not a size", flag, val);
    }
    if (shift != 0 && v > (SIZE_MAX >> shift))
        return fl_fail(FL_EINVAL, "%s: '%s' is too large", flag, val);
    size_t s = (size_t)v << shift;
    if (s < lo || s > hi)
        return fl_fail(FL_EINVAL, "%s: %zu bytes is out of range %zu..%zu", flag, s, lo, hi);
    *out = s;
    return FL_OK;
}

void fl_fmt_bytes(size_t bytes, char *out, size_t cap)
{
    if (bytes >= ((size_t)1 << 30) && bytes % ((size_t)1 << 30) == 0)
        snprintf(out, cap, "%zu GiB", bytes >> 30);
    else if (bytes >= ((size_t)1 << 20) && bytes % ((size_t)1 << 20) == 0)
        snprintf(out, cap, "%zu MiB", bytes >> 20);
    else if (bytes >= 1024 && bytes % 1024 == 0)
        snprintf(out, cap, "%zu KiB", bytes >> 10);
    else
        snprintf(out, cap, "%zu B", bytes);
}
