/* Optimizers: SGD (momentum, dampening, Nesterov), Adam and AdamW over flat float32 buffers,
 * with PyTorch 1.13's update rules, operation order and rounding, so a worker, the parameter
 * server and a user's PyTorch run produce the same bits from the same gradients. Learning-rate
 * schedules live in lr_sched.c; checkpoint files are the caller's (st_write.c). */
#include "fl_core.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* How torch 1.13 computes each step for float32 CPU tensors (torch/optim/sgd.py, adam.py and
 * adamw.py, _single_tensor_*; foreach is off by default in 1.13):
 * - Python floats (lr, betas, 1 - beta1, lr / bias1, ...) are doubles; a scalar reaching a
 *   tensor op is cast to float once, and the op runs in float.
 * - t.add(u, alpha=a) and t.addcmul(u, w, value=s) are fused multiply-adds in the AVX2 and
 *   AVX-512 kernels (vec::fmadd, and the compiler contracts the scalar tail too): fma(u, a, t)
 *   and fma(s * u, w, t). fmaf() below reproduces that everywhere: it is correctly rounded
 *   whether or not the CPU has an FMA unit, so flodl's result does not depend on the host.
 *   Torch's "default" kernels (ATEN_CPU_CAPABILITY=default, CPUs without AVX2) round the
 *   product separately and may differ from both by an ulp per operation.
 * - t.addcdiv(u, w, value=s) is t + (s * u) / w, unfused; mul, div and sqrt round once each.
 * No a * b + c is left outside fmaf(), so a compiler that contracts on its own (GCC's
 * -ffp-contract=fast, clang) cannot change the bits either. */

/* fmaf() is a library call on baseline x86-64, which keeps the loops scalar and slow; a clone
 * built for x86-64-v3 (AVX2 and FMA) inlines it and vectorises, 2-4x faster on large n. fmaf is
 * correctly rounded in both, so the clone the loader picks changes the speed, never the bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 &&           \
    !defined(__SANITIZE_THREAD__)
/* (Not under ThreadSanitizer: the clones' resolver runs at load time, before its runtime is up.) */
#define FMA_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FMA_CLONES
#endif

struct fl_opt {
    fl_opt_opts_t o;
    size_t n;
    uint64_t steps;
    float *buf1;         /* SGD: momentum buffer; Adam(W): first moment m */
    float *buf2;         /* Adam(W): second moment v */
    fl_opt_scalars_t sc; /* the step in progress (fl_opt_step_begin) */
};

void fl_opt_opts_init(fl_opt_opts_t *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->kind = FL_OPT_SGD;
    opts->momentum = 0.0;
    opts->dampening = 0.0;
    opts->nesterov = false;
    opts->weight_decay = 0.0;
    opts->beta1 = 0.9;
    opts->beta2 = 0.999;
    opts->eps = 1e-8;
}

static const char *const kind_names[] = {"sgd", "adam", "adamw"};

int fl_opt_kind_parse(const char *s, fl_opt_kind_t *out)
{
    if (s != NULL) {
        for (size_t i = 0; i < sizeof kind_names / sizeof kind_names[0]; i++) {
            if (strcasecmp(s, kind_names[i]) == 0) {
                *out = (fl_opt_kind_t)i;
                return FL_OK;
            }
        }
    }
    return fl_fail(FL_EINVAL, "optimizer '%s' is not one of sgd|adam|adamw", s ? s : "(null)");
}

const char *fl_opt_kind_name(fl_opt_kind_t kind)
{
    if ((unsigned)kind < sizeof kind_names / sizeof kind_names[0])
        return kind_names[kind];
    return "unknown";
}

static bool has_buf1(const fl_opt_t *opt)
{
    return opt->o.kind != FL_OPT_SGD || opt->o.momentum != 0.0;
}

static bool has_buf2(const fl_opt_t *opt)
{
    return opt->o.kind != FL_OPT_SGD;
}

/* !(x >= 0) also refuses NaN. */
static int check_rate(const char *field, double x)
{
    if (!(x >= 0.0) || isinf(x))
        return fl_fail(FL_EINVAL, "optimizer: %s = %g must be a finite number >= 0", field, x);
    return FL_OK;
}

int fl_opt_check(const fl_opt_opts_t *o, size_t n)
{
    int rc;
    if ((unsigned)o->kind >= sizeof kind_names / sizeof kind_names[0])
        return fl_fail(FL_EINVAL, "optimizer: kind %d is not sgd, adam or adamw", (int)o->kind);
    if (n == 0)
        return fl_fail(FL_EINVAL, "optimizer: n = 0 parameters");
    if ((rc = check_rate("momentum", o->momentum)) != FL_OK ||
        (rc = check_rate("weight_decay", o->weight_decay)) != FL_OK ||
        (rc = check_rate("eps", o->eps)) != FL_OK)
        return rc;
    if (!isfinite(o->dampening))
        return fl_fail(FL_EINVAL, "optimizer: dampening = %g must be finite", o->dampening);
    if (o->nesterov && (o->momentum == 0.0 || o->dampening != 0.0))
        return fl_fail(FL_EINVAL,
                       "optimizer: nesterov needs momentum > 0 and dampening = 0 "
                       "(momentum = %g, dampening = %g)",
                       o->momentum, o->dampening);
    if (!(o->beta1 >= 0.0 && o->beta1 < 1.0))
        return fl_fail(FL_EINVAL, "optimizer: beta1 = %g is outside [0, 1)", o->beta1);
    if (!(o->beta2 >= 0.0 && o->beta2 < 1.0))
        return fl_fail(FL_EINVAL, "optimizer: beta2 = %g is outside [0, 1)", o->beta2);
    return FL_OK;
}

int fl_opt_create(const fl_opt_opts_t *opts, size_t n, fl_opt_t **out)
{
    assert(opts != NULL && out != NULL);
    *out = NULL;
    int rc = fl_opt_check(opts, n);
    if (rc != FL_OK)
        return rc;
    fl_opt_t *opt = calloc(1, sizeof *opt);
    if (opt == NULL)
        return fl_fail(FL_ENOMEM, "optimizer: out of memory");
    opt->o = *opts;
    opt->n = n;
    if (n > SIZE_MAX / sizeof(float)) {
        free(opt);
        return fl_fail(FL_ENOMEM, "optimizer: %zu parameters overflow the state size", n);
    }
    if (has_buf1(opt) && (opt->buf1 = calloc(n, sizeof(float))) == NULL)
        goto nomem;
    if (has_buf2(opt) && (opt->buf2 = calloc(n, sizeof(float))) == NULL)
        goto nomem;
    *out = opt;
    return FL_OK;

nomem:
    fl_opt_destroy(&opt);
    return fl_fail(FL_ENOMEM, "optimizer: out of memory for the state of %zu parameters", n);
}

void fl_opt_destroy(fl_opt_t **opt)
{
    if (opt == NULL || *opt == NULL)
        return;
    free((*opt)->buf1);
    free((*opt)->buf2);
    free(*opt);
    *opt = NULL;
}

size_t fl_opt_size(const fl_opt_t *opt)
{
    return opt->n;
}

uint64_t fl_opt_steps(const fl_opt_t *opt)
{
    assert(opt != NULL);
    return opt->steps;
}

void fl_opt_state(const fl_opt_t *opt, const float **buf1, const float **buf2, uint64_t *steps)
{
    assert(opt != NULL);
    if (buf1 != NULL)
        *buf1 = opt->buf1;
    if (buf2 != NULL)
        *buf2 = opt->buf2;
    if (steps != NULL)
        *steps = opt->steps;
}

static int first_nonfinite(const char *what, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            return fl_fail(FL_ENONFINITE, "optimizer: %s holds %s at index %zu of %zu", what,
                           isnan(x[i]) ? "NaN" : "Inf", i, n);
    }
    return FL_OK;
}

int fl_opt_restore(fl_opt_t *opt, const float *buf1, const float *buf2, size_t n, uint64_t steps)
{
    assert(opt != NULL);
    int rc;
    if (n != opt->n)
        return fl_fail(FL_EINVAL,
                       "optimizer restore: the state has %zu parameters, the "
                       "optimizer %zu",
                       n, opt->n);
    /* Validate everything before touching anything, so a refused restore changes nothing. */
    if (opt->buf1 != NULL && buf1 != NULL &&
        (rc = first_nonfinite(opt->o.kind == FL_OPT_SGD ? "momentum buffer" : "first moment", buf1,
                              n)) != FL_OK)
        return rc;
    if (opt->buf2 != NULL && buf2 != NULL) {
        if ((rc = first_nonfinite("second moment", buf2, n)) != FL_OK)
            return rc;
        for (size_t i = 0; i < n; i++) {
            if (buf2[i] < 0.0f)
                return fl_fail(FL_EINVAL,
                               "optimizer restore: second moment is negative (%g) at "
                               "index %zu of %zu",
                               (double)buf2[i], i, n);
        }
    }
    if (opt->buf1 != NULL) {
        if (buf1 != NULL)
            memcpy(opt->buf1, buf1, n * sizeof(float));
        else
            memset(opt->buf1, 0, n * sizeof(float));
    }
    if (opt->buf2 != NULL) {
        if (buf2 != NULL)
            memcpy(opt->buf2, buf2, n * sizeof(float));
        else
            memset(opt->buf2, 0, n * sizeof(float));
    }
    opt->steps = steps;
    return FL_OK;
}

/* torch.optim.SGD: d = g + wd * p; buf = d (first step) or momentum * buf + (1 - dampening) * d;
 * d = nesterov ? d + momentum * buf : buf; p -= lr * d. "First step" means steps == 0, so a
 * restore with steps > 0 continues with the momentum formula, and one with steps = 0 starts
 * afresh as torch does without a momentum_buffer in its state. The per-element bodies live in
 * fl_math.h, shared with the device kernels. p and g point at parameter off. */
FMA_CLONES static void sgd_range(const fl_opt_scalars_t *s, float *buf1, float *p, const float *g,
                                 size_t off, size_t len)
{
    /* A local copy of the scalars: the loop's stores cannot alias it (the build has
     * -fno-strict-aliasing), so they stay in registers and the loop vectorises. */
    const fl_opt_scalars_t sc = *s;
    if (buf1 != NULL) {
        float *buf = buf1 + off;
        for (size_t i = 0; i < len; i++)
            fl_sgd_elem(&sc, &p[i], g[i], &buf[i]);
    } else {
        float none = 0.0f; /* never written: no momentum buffer */
        for (size_t i = 0; i < len; i++)
            fl_sgd_elem(&sc, &p[i], g[i], &none);
    }
}

FMA_CLONES static void adam_range(const fl_opt_scalars_t *s, float *buf1, float *buf2, float *p,
                                  const float *g, size_t off, size_t len)
{
    const fl_opt_scalars_t sc = *s;
    float *m = buf1 + off;
    float *v = buf2 + off;
    for (size_t i = 0; i < len; i++)
        fl_adam_elem(&sc, &p[i], g[i], &m[i], &v[i]);
}

/* The scalars in double as Python computes them, the tensor arithmetic in float as ATen does.
 * steps: the step count after this step (1 on the first). */
void fl_opt_scalars(const fl_opt_opts_t *o, uint64_t steps, double lr, fl_opt_scalars_t *s)
{
    memset(s, 0, sizeof *s);
    s->kind = (int)o->kind;
    s->first = steps == 1;
    s->has_buf = o->kind == FL_OPT_SGD && o->momentum != 0.0;
    s->nesterov = o->nesterov;
    s->decay = o->kind == FL_OPT_SGD ? o->weight_decay != 0.0
                                     : o->kind == FL_OPT_ADAM && o->weight_decay != 0.0;
    s->wd = (float)o->weight_decay;
    s->mom = (float)o->momentum;
    s->keep = (float)(1.0 - o->dampening);
    s->neg_lr = (float)-lr;
    s->shrink = (float)(1.0 - lr * o->weight_decay);
    s->b1 = (float)o->beta1;
    s->one_b1 = (float)(1.0 - o->beta1);
    s->b2 = (float)o->beta2;
    s->one_b2 = (float)(1.0 - o->beta2);
    s->eps = (float)o->eps;
    if (o->kind != FL_OPT_SGD) {
        const double t = (double)steps;
        const double bias1 = 1.0 - pow(o->beta1, t);
        const double bias2 = 1.0 - pow(o->beta2, t);
        s->neg_step = (float)-(lr / bias1);
        s->bias2_sqrt = (float)sqrt(bias2);
    }
}

int fl_opt_step_begin(fl_opt_t *opt, double lr)
{
    assert(opt != NULL);
    /* Not in the header's list: a negative or non-finite rate is a schedule bug, refused
     * before it corrupts the parameters. */
    if (!(lr >= 0.0) || isinf(lr))
        return fl_fail(FL_EINVAL, "optimizer: lr = %g must be a finite number >= 0", lr);
    opt->steps++;
    fl_opt_scalars(&opt->o, opt->steps, lr, &opt->sc);
    return FL_OK;
}

void fl_opt_step_range(fl_opt_t *opt, float *params, const float *grad, size_t off, size_t len)
{
    assert(opt != NULL && off <= opt->n && len <= opt->n - off);
    if (opt->o.kind == FL_OPT_SGD)
        sgd_range(&opt->sc, opt->buf1, params, grad, off, len);
    else
        adam_range(&opt->sc, opt->buf1, opt->buf2, params, grad, off, len);
}

void fl_opt_apply(const fl_opt_scalars_t *s, float *p, const float *g, float *buf1, float *buf2,
                  size_t n)
{
    if (s->kind == FL_OPT_SGD)
        sgd_range(s, buf1, p, g, 0, n);
    else
        adam_range(s, buf1, buf2, p, g, 0, n);
}

int fl_opt_step(fl_opt_t *opt, float *params, const float *grad, double lr)
{
    assert(opt != NULL && params != NULL && grad != NULL);
    int rc = first_nonfinite("gradient", grad, opt->n);
    if (rc != FL_OK)
        return rc;
    if ((rc = fl_opt_step_begin(opt, lr)) != FL_OK)
        return rc;
    fl_opt_step_range(opt, params, grad, 0, opt->n);
    return FL_OK;
}
