/* The benchmarks' flags: comma-separated lists of element counts and of densities. */
#include "bench_util.h"

#include <stdlib.h>
#include <string.h>

#include "fl_core.h"

/* Calls fn(flag, token, ud) for each comma-separated token of s; stops at the first failure. */
static int each_token(const char *flag, const char *s,
                      int (*fn)(const char *, const char *, void *), void *ud)
{
    char buf[512];
    if (strlen(s) >= sizeof buf) {
        fprintf(stderr, "flodl-bench: %s: list too long\n", flag);
        return -1;
    }
    strcpy(buf, s);
    char *save = NULL;
    int seen = 0;
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        if (fn(flag, t, ud) != 0)
            return -1;
        seen++;
    }
    if (seen == 0) {
        fprintf(stderr, "flodl-bench: %s: empty list\n", flag);
        return -1;
    }
    return 0;
}

typedef struct count_list {
    size_t lo;
    size_t hi;
    size_t *out;
    int *n;
} count_list_t;

static int add_count(const char *flag, const char *tok, void *ud)
{
    count_list_t *l = ud;
    size_t v;
    if (*l->n >= BENCH_MAX_LIST) {
        fprintf(stderr, "flodl-bench: %s: more than %d values\n", flag, BENCH_MAX_LIST);
        return -1;
    }
    if (fl_cli_size(flag, tok, l->lo, l->hi, &v) != FL_OK) {
        fprintf(stderr, "flodl-bench: %s\n", fl_last_error());
        return -1;
    }
    l->out[(*l->n)++] = v;
    return 0;
}

int bench_parse_counts(const char *flag, const char *s, size_t lo, size_t hi, size_t *out,
                       int *n)
{
    count_list_t l = {lo, hi, out, n};
    *n = 0;
    return each_token(flag, s, add_count, &l);
}

typedef struct density_list {
    double *out;
    int *n;
} density_list_t;

static int add_density(const char *flag, const char *tok, void *ud)
{
    density_list_t *l = ud;
    char *end = NULL;
    double d = strtod(tok, &end);
    if (end == tok || *end != '\0' || !(d > 0.0 && d <= 1.0)) {
        fprintf(stderr, "flodl-bench: %s: '%s' is not a density in (0, 1]\n", flag, tok);
        return -1;
    }
    if (*l->n >= BENCH_MAX_LIST) {
        fprintf(stderr, "flodl-bench: %s: more than %d values\n", flag, BENCH_MAX_LIST);
        return -1;
    }
    l->out[(*l->n)++] = d;
    return 0;
}

int bench_parse_densities(const char *flag, const char *s, double *out, int *n)
{
    density_list_t l = {out, n};
    *n = 0;
    return each_token(flag, s, add_density, &l);
}
