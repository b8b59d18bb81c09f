/* The metrics registry: series registered under a mutex, values as atomic bit patterns of
 * doubles (set and add from any thread without a lock), rendered in Prometheus' text
 * exposition format (version 0.0.4): for each name, # HELP and # TYPE once, then its series. */
#include "fl_obs.h"

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
    _Atomic uint64_t bits;
} series_t;

struct fl_obs {
    pthread_mutex_t mu; /* registration and rendering */
    series_t *s;
    _Atomic int n;
    fl_obs_refresh_fn refresh;
    void *refresh_ud;
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
        bool alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' ||
                     *p == ':';
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
            rc = fl_fail(FL_EINVAL, "metrics: %s is a %s already", name,
                         x->kind == FL_OBS_COUNTER ? "counter" : "gauge");
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
        ok = put(&t, "# HELP %s %s\n# TYPE %s %s\n", x->name, x->help, x->name,
                 x->kind == FL_OBS_COUNTER ? "counter" : "gauge");
        for (int j = i; j < n && ok; j++) {
            const series_t *y = &o->s[j];
            if (strcmp(y->name, x->name) != 0)
                continue;
            ok = (y->labels[0] ? put(&t, "%s{%s} ", y->name, y->labels)
                               : put(&t, "%s ", y->name)) &&
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
