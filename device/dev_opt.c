/* The optimizer with its state on a device: the step's scalars are computed on the host as
 * core/optim.c computes them (fl_opt_scalars), the per-element update runs on the device with
 * fl_math.h's bodies, so a device step gives the bits of fl_opt_step. Checkpoints go through a
 * host fl_opt_t of the same kind. */
#include "dev_int.h"

#include <math.h>
#include <stdlib.h>

struct fl_dev_opt {
    fl_dev_t *d;
    fl_opt_opts_t o;
    size_t n;
    uint64_t steps;
    fl_dptr_t buf1; /* SGD momentum, Adam m (null: plain SGD) */
    fl_dptr_t buf2; /* Adam v */
};

static bool has_buf1(const fl_opt_opts_t *o)
{
    return o->kind != FL_OPT_SGD || o->momentum != 0.0;
}

static bool has_buf2(const fl_opt_opts_t *o)
{
    return o->kind != FL_OPT_SGD;
}

/* Zeroes bytes of p, waiting for it (creation and loading happen outside any step). */
static int zero(fl_dev_t *d, fl_dptr_t p, size_t bytes)
{
    fl_stream_t *s = NULL;
    int rc = fl_stream_create(d, &s);
    if (rc == FL_OK && (rc = fl_dev_memset(s, p, 0, bytes)) == FL_OK)
        rc = fl_stream_sync(s, 0);
    fl_stream_destroy(&s);
    return rc;
}

int fl_dev_opt_create(fl_dev_t *d, const fl_opt_opts_t *o, size_t n, fl_dev_opt_t **out)
{
    *out = NULL;
    int rc = fl_opt_check(o, n);
    if (rc != FL_OK)
        return rc;
    if (n > SIZE_MAX / sizeof(float))
        return fl_fail(FL_ENOMEM, "optimizer: %zu parameters overflow the state size", n);
    fl_dev_opt_t *t = calloc(1, sizeof *t);
    if (t == NULL)
        return fl_fail(FL_ENOMEM, "device %s: out of memory for an optimizer", fl_dev_name(d));
    t->d = d;
    t->o = *o;
    t->n = n;
    size_t bytes = n * sizeof(float);
    if (has_buf1(o) && ((rc = fl_dev_alloc(d, bytes, &t->buf1)) != FL_OK ||
                        (rc = zero(d, t->buf1, bytes)) != FL_OK))
        goto fail;
    if (has_buf2(o) && ((rc = fl_dev_alloc(d, bytes, &t->buf2)) != FL_OK ||
                        (rc = zero(d, t->buf2, bytes)) != FL_OK))
        goto fail;
    *out = t;
    return FL_OK;
fail:
    fl_dev_opt_destroy(&t);
    return fl_fail_ctx(rc, "optimizer state of %zu parameters", n);
}

static void dev_opt_destroy(fl_dev_opt_t **po)
{
    if (po == NULL || *po == NULL)
        return;
    fl_dev_opt_t *t = *po;
    fl_dev_free(t->d, &t->buf1);
    fl_dev_free(t->d, &t->buf2);
    free(t);
    *po = NULL;
}

void fl_dev_opt_destroy(fl_dev_opt_t **po)
{
    fl_error_keep_begin();
    dev_opt_destroy(po);
    fl_error_keep_end();
}

size_t fl_dev_opt_size(const fl_dev_opt_t *o)
{
    return o->n;
}

size_t fl_dev_opt_state_bytes(const fl_dev_opt_t *o)
{
    return ((size_t)has_buf1(&o->o) + (size_t)has_buf2(&o->o)) * o->n * sizeof(float);
}

int fl_dev_opt_step(fl_dev_opt_t *o, fl_stream_t *s, fl_dptr_t p, fl_dptr_t g, double lr)
{
    if (!(lr >= 0.0) || isinf(lr))
        return fl_fail(FL_EINVAL, "optimizer: lr = %g must be a finite number >= 0", lr);
    fl_opt_scalars_t sc;
    fl_opt_scalars(&o->o, o->steps + 1, lr, &sc);
    int rc = fl_dev_opt_update(s, &sc, p, g, o->buf1, o->buf2, o->n);
    if (rc == FL_OK)
        o->steps++;
    return rc;
}

static int same_shape(const fl_dev_opt_t *o, const fl_opt_t *host)
{
    const float *b1;
    const float *b2;
    uint64_t steps;
    fl_opt_state(host, &b1, &b2, &steps);
    if (fl_opt_size(host) != o->n || (b1 != NULL) != has_buf1(&o->o) ||
        (b2 != NULL) != has_buf2(&o->o))
        return fl_fail(FL_EINVAL,
                       "device optimizer of %zu parameters (%s): a host optimizer of "
                       "%zu parameters with other state",
                       o->n, fl_opt_kind_name(o->o.kind), fl_opt_size(host));
    return FL_OK;
}

int fl_dev_opt_save(fl_dev_opt_t *o, fl_stream_t *s, fl_opt_t *host)
{
    int rc = same_shape(o, host);
    if (rc != FL_OK)
        return rc;
    size_t bytes = o->n * sizeof(float);
    float *b1 = NULL;
    float *b2 = NULL;
    if ((has_buf1(&o->o) && (b1 = malloc(bytes)) == NULL) ||
        (has_buf2(&o->o) && (b2 = malloc(bytes)) == NULL)) {
        free(b1);
        return fl_fail(FL_ENOMEM, "optimizer: no host memory to save %zu parameters' state", o->n);
    }
    if (b1 != NULL)
        rc = fl_dev_d2h(s, b1, o->buf1, bytes);
    if (rc == FL_OK && b2 != NULL)
        rc = fl_dev_d2h(s, b2, o->buf2, bytes);
    if (rc == FL_OK)
        rc = fl_stream_sync(s, 0);
    if (rc == FL_OK)
        rc = fl_opt_restore(host, b1, b2, o->n, o->steps);
    free(b1);
    free(b2);
    return rc;
}

int fl_dev_opt_load(fl_dev_opt_t *o, fl_stream_t *s, const fl_opt_t *host)
{
    int rc = same_shape(o, host);
    if (rc != FL_OK)
        return rc;
    const float *b1;
    const float *b2;
    uint64_t steps;
    fl_opt_state(host, &b1, &b2, &steps);
    size_t bytes = o->n * sizeof(float);
    if (b1 != NULL)
        rc = fl_dev_h2d(s, o->buf1, b1, bytes);
    if (rc == FL_OK && b2 != NULL)
        rc = fl_dev_h2d(s, o->buf2, b2, bytes);
    /* The host buffers are the caller's: the copies must have run before it may change them. */
    if (rc == FL_OK)
        rc = fl_stream_sync(s, 0);
    if (rc == FL_OK)
        o->steps = steps;
    return rc;
}
