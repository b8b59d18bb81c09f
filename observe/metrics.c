/* The metrics registry: series registered under a mutex, values as atomic bit patterns of
 * doubles (set and add from any thread without a lock), rendered in Prometheus' text
 * exposition format (version 0.0.4): for each name, # HELP and # TYPE once, then its series. */
#include "obs_int.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 128
#define LABELS_MAX_LEN 256
#define HELP_MAX_LEN 256

typedef struct series {
    char name[NAME_MAX_LEN];
    char labels[LABELS_MAX_LEN];
    char help[HELP_MAX_LEN];
    fl_obs_kind_t kind;
    _Atomic uint64_t bits; /* the value; a histogram: its sum */
    /* histograms: upper bounds, and the observations in each bucket (the last: above all) */
    int nb;
    double bounds[FL_OBS_MAX_BUCKETS];
    _Atomic uint64_t counts[FL_OBS_MAX_BUCKETS + 1];
} series_t;

struct fl_obs {
    pthread_mutex_t mu; /* registration and rendering */
    series_t *s;
    _Atomic int n;
    fl_obs_refresh_fn refresh;
    void *refresh_ud;
    bool process; /* fl_obs_add_process: refresh the process series at each render */
    int proc[5];  /* their ids: cpu, rss, fds, max fds, start time */
};

static uint64_t to_bits(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

static double from_bits(uint64_t b)
{
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

int fl_obs_create(fl_obs_t **out)
{
    *out = NULL;
    fl_obs_t *o = calloc(1, sizeof *o);
    if (o != NULL)
        o->s = calloc(FL_OBS_MAX_SERIES, sizeof *o->s);
    if (o == NULL || o->s == NULL) {
        free(o);
        return fl_fail(FL_ENOMEM, "metrics: out of memory");
    }
    pthread_mutex_init(&o->mu, NULL);
    *out = o;
    return FL_OK;
}

void fl_obs_destroy(fl_obs_t **po)
{
    if (po == NULL || *po == NULL)
        return;
    pthread_mutex_destroy(&(*po)->mu);
    free((*po)->s);
    free(*po);
    *po = NULL;
}

static bool valid_name(const char *s)
{
    if (s == NULL || s[0] == '\0' || strlen(s) >= NAME_MAX_LEN)
        return false;
    for (const char *p = s; *p; p++) {
        bool alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || *p == ':';
        if (!alpha && !(p > s && *p >= '0' && *p <= '9'))
            return false;
    }
    return true;
}

/* k="v" pairs, comma-separated, label names valid, values without quote, backslash, newline. */
static bool valid_labels(const char *s)
{
    if (strlen(s) >= LABELS_MAX_LEN)
        return false;
    const char *p = s;
    while (*p) {
        const char *eq = strchr(p, '=');
        if (eq == NULL || eq == p || eq[1] != '"')
            return false;
        char key[NAME_MAX_LEN];
        size_t kl = (size_t)(eq - p);
        if (kl >= sizeof key)
            return false;
        memcpy(key, p, kl);
        key[kl] = '\0';
        if (!valid_name(key) || strchr(key, ':') != NULL)
            return false;
        const char *v = eq + 2;
        const char *end = v;
        while (*end && *end != '"' && *end != '\\' && *end != '\n')
            end++;
        if (*end != '"')
            return false;
        p = end + 1;
        if (*p == ',')
            p++;
        else if (*p != '\0')
            return false;
    }
    return true;
}

static const char *kind_name(fl_obs_kind_t k)
{
    return k == FL_OBS_COUNTER ? "counter" : k == FL_OBS_GAUGE ? "gauge" : "histogram";
}

int fl_obs_add(fl_obs_t *o, const char *name, const char *help, fl_obs_kind_t kind,
               const char *labels)
{
    if (labels == NULL)
        labels = "";
    if (!valid_name(name))
        return fl_fail(FL_EINVAL, "metrics: '%s' is not a metric name", name ? name : "(null)");
    if (!valid_labels(labels))
        return fl_fail(FL_EINVAL, "metrics: %s: labels '%s' are not k=\"v\" pairs", name, labels);
    pthread_mutex_lock(&o->mu);
    int n = atomic_load(&o->n);
    int rc = FL_EINVAL;
    for (int i = 0; i < n; i++) {
        series_t *x = &o->s[i];
        if (strcmp(x->name, name) != 0)
            continue;
        if (x->kind != kind) {
            rc = fl_fail(FL_EINVAL, "metrics: %s is a %s already", name, kind_name(x->kind));
            goto out;
        }
        if (strcmp(x->labels, labels) == 0) {
            rc = i;
            goto out;
        }
    }
    if (n == FL_OBS_MAX_SERIES) {
        rc = fl_fail(FL_EINVAL, "metrics: more than %d series", FL_OBS_MAX_SERIES);
        goto out;
    }
    series_t *x = &o->s[n];
    snprintf(x->name, sizeof x->name, "%s", name);
    snprintf(x->labels, sizeof x->labels, "%s", labels);
    /* Help text on one line. */
    snprintf(x->help, sizeof x->help, "%s", help ? help : "");
    for (char *c = x->help; *c; c++)
        if (*c == '\n' || *c == '\\')
            *c = ' ';
    x->kind = kind;
    atomic_store(&x->bits, to_bits(0.0));
    atomic_store(&o->n, n + 1);
    rc = n;
out:
    pthread_mutex_unlock(&o->mu);
    return rc;
}

int fl_obs_add_histogram(fl_obs_t *o, const char *name, const char *help, const char *labels,
                         const double *bounds, int nbounds)
{
    if (nbounds < 1 || nbounds > FL_OBS_MAX_BUCKETS)
        return fl_fail(FL_EINVAL, "metrics: %s: %d buckets (1..%d)", name, nbounds,
                       FL_OBS_MAX_BUCKETS);
    for (int i = 0; i < nbounds; i++)
        if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
            return fl_fail(FL_EINVAL, "metrics: %s: bucket bounds must be finite and ascending",
                           name);
    int id = fl_obs_add(o, name, help, FL_OBS_HISTOGRAM, labels);
    if (id < 0)
        return id;
    pthread_mutex_lock(&o->mu);
    series_t *x = &o->s[id];
    if (x->nb == 0) {
        x->nb = nbounds;
        memcpy(x->bounds, bounds, (size_t)nbounds * sizeof *bounds);
    }
    pthread_mutex_unlock(&o->mu);
    return id;
}

void fl_obs_observe(fl_obs_t *o, int id, double v)
{
    if (o == NULL || id < 0 || id >= atomic_load(&o->n) || o->s[id].kind != FL_OBS_HISTOGRAM ||
        isnan(v))
        return;
    series_t *x = &o->s[id];
    int b = 0;
    while (b < x->nb && v > x->bounds[b])
        b++;
    atomic_fetch_add(&x->counts[b], 1);
    fl_obs_inc(o, id, v);
}

void fl_obs_set(fl_obs_t *o, int id, double v)
{
    if (o == NULL || id < 0 || id >= atomic_load(&o->n))
        return;
    atomic_store(&o->s[id].bits, to_bits(v));
}

void fl_obs_inc(fl_obs_t *o, int id, double by)
{
    if (o == NULL || id < 0 || id >= atomic_load(&o->n))
        return;
    _Atomic uint64_t *b = &o->s[id].bits;
    uint64_t old = atomic_load(b);
    while (!atomic_compare_exchange_weak(b, &old, to_bits(from_bits(old) + by)))
        ;
}

double fl_obs_get(const fl_obs_t *o, int id)
{
    fl_obs_t *m = (fl_obs_t *)o;
    if (o == NULL || id < 0 || id >= atomic_load(&m->n))
        return 0.0;
    const series_t *x = &m->s[id];
    if (x->kind == FL_OBS_HISTOGRAM) {
        uint64_t n = 0;
        for (int b = 0; b <= x->nb; b++)
            n += atomic_load(&m->s[id].counts[b]);
        return (double)n;
    }
    return from_bits(atomic_load(&m->s[id].bits));
}

void fl_obs_on_render(fl_obs_t *o, fl_obs_refresh_fn fn, void *ud)
{
    pthread_mutex_lock(&o->mu);
    o->refresh = fn;
    o->refresh_ud = ud;
    pthread_mutex_unlock(&o->mu);
}

/* Appends to a growing buffer; false when out of memory. */
typedef struct text {
    char *p;
    size_t len;
    size_t cap;
} text_t;

static bool put(text_t *t, const char *fmt, ...) FL_PRINTF(2, 3);
static bool put(text_t *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (w < 0)
            return false;
        if ((size_t)w < t->cap - t->len) {
            t->len += (size_t)w;
            return true;
        }
        size_t cap = t->cap * 2 + (size_t)w + 1;
        char *p = realloc(t->p, cap);
        if (p == NULL)
            return false;
        t->p = p;
        t->cap = cap;
    }
}

static bool put_value(text_t *t, double v)
{
    if (isnan(v))
        return put(t, "NaN\n");
    if (isinf(v))
        return put(t, v > 0 ? "+Inf\n" : "-Inf\n");
    return put(t, "%.17g\n", v);
}

/* A histogram's lines: cumulative buckets up to +Inf, then sum and count (the count is the
 * +Inf bucket's, so the two always agree). */
static bool put_histogram(text_t *t, series_t *y)
{
    const char *sep = y->labels[0] ? "," : "";
    uint64_t cum = 0;
    bool ok = true;
    for (int b = 0; b <= y->nb && ok; b++) {
        cum += atomic_load(&y->counts[b]);
        if (b < y->nb)
            ok = put(t, "%s_bucket{%s%sle=\"%.15g\"} %llu\n", y->name, y->labels, sep, y->bounds[b],
                     (unsigned long long)cum);
        else
            ok = put(t, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", y->name, y->labels, sep,
                     (unsigned long long)cum);
    }
    const char *open = y->labels[0] ? "{" : "";
    const char *close = y->labels[0] ? "}" : "";
    return ok && put(t, "%s_sum%s%s%s ", y->name, open, y->labels, close) &&
           put_value(t, from_bits(atomic_load(&y->bits))) &&
           put(t, "%s_count%s%s%s %llu\n", y->name, open, y->labels, close,
               (unsigned long long)cum);
}

int fl_obs_add_process(fl_obs_t *o)
{
    int ids[5];
    ids[0] = fl_obs_add(o, "process_cpu_seconds_total", "User and system CPU time spent",
                        FL_OBS_COUNTER, NULL);
    ids[1] =
        fl_obs_add(o, "process_resident_memory_bytes", "Resident memory size", FL_OBS_GAUGE, NULL);
    ids[2] = fl_obs_add(o, "process_open_fds", "Open file descriptors", FL_OBS_GAUGE, NULL);
    ids[3] = fl_obs_add(o, "process_max_fds", "The soft limit on open file descriptors",
                        FL_OBS_GAUGE, NULL);
    ids[4] =
        fl_obs_add(o, "process_start_time_seconds", "Start time, Unix seconds", FL_OBS_GAUGE, NULL);
    char labels[128];
    const char *f = fl_build_features();
    snprintf(labels, sizeof labels, "version=\"%s\",features=\"%s\"", fl_version(),
             f[0] ? f : "cpu");
    int info = fl_obs_add(o, "flodl_build_info", "1; the labels say the version and features",
                          FL_OBS_GAUGE, labels);
    for (int i = 0; i < 5; i++)
        if (ids[i] < 0)
            return ids[i];
    if (info < 0)
        return info;
    fl_obs_set(o, info, 1.0);
    pthread_mutex_lock(&o->mu);
    memcpy(o->proc, ids, sizeof ids);
    o->process = true;
    pthread_mutex_unlock(&o->mu);
    fl_obs_process_refresh(o, ids);
    return FL_OK;
}

char *fl_obs_render(fl_obs_t *o, size_t *len)
{
    fl_obs_refresh_fn fn;
    void *ud;
    pthread_mutex_lock(&o->mu);
    fn = o->refresh;
    ud = o->refresh_ud;
    pthread_mutex_unlock(&o->mu);
    if (fn != NULL)
        fn(o, ud); /* outside the lock: it may register series */
    if (o->process)
        fl_obs_process_refresh(o, o->proc);
    text_t t = {malloc(4096), 0, 4096};
    if (t.p == NULL)
        return NULL;
    t.p[0] = '\0';
    bool ok = true;
    pthread_mutex_lock(&o->mu);
    int n = atomic_load(&o->n);
    for (int i = 0; i < n && ok; i++) {
        bool first = true;
        for (int j = 0; j < i && first; j++)
            first = strcmp(o->s[j].name, o->s[i].name) != 0;
        if (!first)
            continue; /* printed with the first series of its name */
        const series_t *x = &o->s[i];
        ok = put(&t, "# HELP %s %s\n# TYPE %s %s\n", x->name, x->help, x->name, kind_name(x->kind));
        for (int j = i; j < n && ok; j++) {
            series_t *y = &o->s[j];
            if (strcmp(y->name, x->name) != 0)
                continue;
            if (y->kind == FL_OBS_HISTOGRAM) {
                ok = put_histogram(&t, y);
                continue;
            }
            ok =
                (y->labels[0] ? put(&t, "%s{%s} ", y->name, y->labels) : put(&t, "%s ", y->name)) &&
                put_value(&t, from_bits(atomic_load(&o->s[j].bits)));
        }
    }
    pthread_mutex_unlock(&o->mu);
    if (!ok) {
        free(t.p);
        return NULL;
    }
    if (len != NULL)
        *len = t.len;
    return t.p;
}
