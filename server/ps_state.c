/* A shard's state: its parameters (shared with replies in flight, copied on write), the
 * optimizer, every rank's clock (the next step it pushes) and the consistency rules that
 * decide when a push is taken, when it is applied and when a pull may be answered.
 *
 *   sync   a rank pushes step t only when the shard is at step t (each rank once); the
 *          pushes are held until all W arrived, then averaged in rank order weighted by batch
 *          counts, g = (sum_w batch_w * g_w) / (sum_w batch_w), and applied once with the
 *          learning rate of step t. A pull for step t waits until t steps are applied.
 *   async  a rank's steps only increase; each push is applied on arrival, scaled by
 *          async_scale, with the learning rate of its step. Pulls never wait.
 *   ssp    as async, but a push of step t beyond (slowest clock + s) is refused, and a pull
 *          for step t waits until the slowest rank has completed step t - s.
 * A push with batch 0 (the rank skips the step) moves the rank's clock without an update; a
 * sync step whose ranks all skipped applies nothing. No sockets here. */
#include "ps_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct ps_params {
    _Atomic int refs;
    float *data;
};

struct ps_state {
    ps_state_opts_t o;
    fl_opt_t *opt;    /* NULL for an empty shard */
    ps_params_t *cur; /* NULL until initialised */
    uint64_t version;
    uint64_t *clock; /* world entries */
    uint64_t skipped;
    /* sync: the pushes of the current step, by rank */
    ps_src_t *held;
    bool *has;
    int nheld;
    const ps_src_t **order;
    float *weights;
};

void fl_ps__src_release(ps_src_t *src)
{
    if (src->release != NULL)
        src->release(src->ud);
    src->release = NULL;
    src->ud = NULL;
}

static ps_params_t *params_new(uint64_t count)
{
    ps_params_t *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    if (count > 0 && posix_memalign((void **)&p->data, 64, count * sizeof(float)) != 0) {
        free(p);
        return NULL;
    }
    atomic_init(&p->refs, 1);
    return p;
}

/* The shard's parameters from now on: a copy of params. */
static int set_params(ps_state_t *st, const float *params)
{
    ps_params_t *p = params_new(st->o.count);
    if (p == NULL)
        return fl_fail(FL_ENOMEM, "shard: out of memory for %" PRIu64 " parameters", st->o.count);
    if (st->o.count > 0)
        memcpy(p->data, params, st->o.count * sizeof(float));
    st->cur = p;
    return FL_OK;
}

ps_params_t *fl_ps__params_ref(ps_params_t *p)
{
    atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
    return p;
}

void fl_ps__params_unref(ps_params_t *p)
{
    if (p != NULL && atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) == 1) {
        free(p->data);
        free(p);
    }
}

const float *fl_ps__params_data(const ps_params_t *p)
{
    return p->data;
}

int fl_ps__state_create(const ps_state_opts_t *o, ps_state_t **out)
{
    *out = NULL;
    if (o->world < 1)
        return fl_fail(FL_EINVAL, "shard state: world %d", o->world);
    if (o->consistency != FL_PS_SYNC && o->consistency != FL_PS_ASYNC &&
        o->consistency != FL_PS_SSP)
        return fl_fail(FL_EINVAL, "shard state: consistency %d", (int)o->consistency);
    if (!(o->async_scale >= 0.0) || isinf(o->async_scale))
        return fl_fail(FL_EINVAL, "shard state: async scale %g", o->async_scale);
    ps_state_t *st = calloc(1, sizeof *st);
    if (st == NULL)
        return fl_fail(FL_ENOMEM, "shard state: out of memory");
    st->o = *o;
    int rc = FL_OK;
    if (o->count > 0 && (rc = fl_opt_create(&o->opt, (size_t)o->count, &st->opt)) != FL_OK)
        goto fail;
    st->clock = calloc((size_t)o->world, sizeof *st->clock);
    st->held = calloc((size_t)o->world, sizeof *st->held);
    st->has = calloc((size_t)o->world, sizeof *st->has);
    st->order = calloc((size_t)o->world, sizeof *st->order);
    st->weights = calloc((size_t)o->world, sizeof *st->weights);
    if (st->clock == NULL || st->held == NULL || st->has == NULL || st->order == NULL ||
        st->weights == NULL) {
        rc = fl_fail(FL_ENOMEM, "shard state: out of memory for %d ranks", o->world);
        goto fail;
    }
    *out = st;
    return FL_OK;
fail:
    fl_ps__state_destroy(&st);
    return rc;
}

void fl_ps__state_destroy(ps_state_t **pst)
{
    if (pst == NULL || *pst == NULL)
        return;
    ps_state_t *st = *pst;
    for (int r = 0; st->has != NULL && r < st->o.world; r++)
        if (st->has[r])
            fl_ps__src_release(&st->held[r]);
    fl_opt_destroy(&st->opt);
    fl_ps__params_unref(st->cur);
    free(st->clock);
    free(st->held);
    free(st->has);
    free(st->order);
    free(st->weights);
    free(st);
    *pst = NULL;
}

static int check_finite(const ps_uf32 *x, uint64_t n, const char *what)
{
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return fl_fail(FL_ENONFINITE, "%s hold %s at index %" PRIu64 " of %" PRIu64, what,
                           isnan(x[i]) ? "NaN" : "Inf", i, n);
    return FL_OK;
}

int fl_ps__state_init(ps_state_t *st, const float *params, uint64_t step)
{
    if (st->cur != NULL)
        return fl_fail(FL_EINVAL, "shard already has parameters");
    int rc = check_finite(params, st->o.count, "initial parameters");
    if (rc != FL_OK)
        return rc;
    if ((rc = set_params(st, params)) != FL_OK)
        return rc;
    st->version = 0;
    for (int r = 0; r < st->o.world; r++)
        st->clock[r] = step;
    return FL_OK;
}

int fl_ps__state_restore(ps_state_t *st, const float *params, const float *buf1, const float *buf2,
                         uint64_t opt_steps, uint64_t version, const uint64_t *clocks,
                         size_t nclocks)
{
    if (st->cur != NULL)
        return fl_fail(FL_EINVAL, "shard already has parameters");
    if (nclocks == 0)
        return fl_fail(FL_EINVAL, "checkpoint without rank clocks");
    int rc = check_finite(params, st->o.count, "checkpointed parameters");
    if (rc != FL_OK)
        return rc;
    if (st->opt != NULL &&
        (rc = fl_opt_restore(st->opt, buf1, buf2, (size_t)st->o.count, opt_steps)) != FL_OK)
        return rc;
    uint64_t lo = UINT64_MAX;
    for (size_t i = 0; i < nclocks; i++)
        lo = clocks[i] < lo ? clocks[i] : lo;
    for (int r = 0; r < st->o.world; r++)
        st->clock[r] = nclocks == (size_t)st->o.world ? clocks[r] : lo;
    if (st->o.consistency == FL_PS_SYNC) {
        /* A sync shard's ranks are always at its step between steps. */
        for (int r = 0; r < st->o.world; r++)
            st->clock[r] = lo;
    }
    if ((rc = set_params(st, params)) != FL_OK)
        return rc;
    st->version = version;
    return FL_OK;
}

bool fl_ps__state_ready(const ps_state_t *st)
{
    return st->cur != NULL;
}

uint64_t fl_ps__state_count(const ps_state_t *st)
{
    return st->o.count;
}

uint64_t fl_ps__state_version(const ps_state_t *st)
{
    return st->version;
}

static int slowest(const ps_state_t *st)
{
    int who = 0;
    for (int r = 1; r < st->o.world; r++)
        if (st->clock[r] < st->clock[who])
            who = r;
    return who;
}

uint64_t fl_ps__state_min_clock(const ps_state_t *st)
{
    return st->clock[slowest(st)];
}

uint64_t fl_ps__state_clock(const ps_state_t *st, int rank)
{
    return st->clock[rank];
}

const uint64_t *fl_ps__state_clocks(const ps_state_t *st)
{
    return st->clock;
}

uint64_t fl_ps__state_skipped(const ps_state_t *st)
{
    return st->skipped;
}

ps_params_t *fl_ps__state_params(ps_state_t *st)
{
    return st->cur;
}

const fl_opt_t *fl_ps__state_opt(const ps_state_t *st)
{
    return st->opt;
}

int fl_ps__state_check_push(const ps_state_t *st, int rank, uint64_t step, char *why, size_t cap)
{
    if (st->cur == NULL) {
        snprintf(why, cap,
                 "the shard has no parameters yet: rank 0 pushes its initial "
                 "parameters first");
        return FL_EINVAL;
    }
    uint64_t next = st->clock[rank];
    if (next > 0 && step == next - 1)
        return PS_PUSH_DUPLICATE; /* the step it pushed last, again: a retry */
    if (step < next) {
        snprintf(why, cap,
                 "rank %d pushed step %" PRIu64 " but has pushed up to step %" PRIu64
                 " already (steps go forward, once each)",
                 rank, step, next - 1);
        return FL_EINVAL;
    }
    uint64_t lo = fl_ps__state_min_clock(st);
    switch (st->o.consistency) {
    case FL_PS_SYNC:
        /* Only the shard's current step, once: a rank that pushed it waits for the others. */
        if (step != next || step != lo || st->has[rank]) {
            snprintf(why, cap,
                     "rank %d pushed step %" PRIu64 " while the shard is at step "
                     "%" PRIu64 " (sync: one step at a time, beyond the staleness "
                     "bound 0)",
                     rank, step, lo);
            return FL_EINVAL;
        }
        return FL_OK;
    case FL_PS_SSP:
        if (step > lo + st->o.staleness) {
            int s = slowest(st);
            snprintf(why, cap,
                     "rank %d pushed step %" PRIu64 ", beyond the staleness bound %u: "
                     "the slowest rank %d has completed %" PRIu64 " steps",
                     rank, step, st->o.staleness, s, st->clock[s]);
            return FL_EINVAL;
        }
        return FL_OK;
    default:
        /* Async takes jumps (a rank going on after a restart from its own newest step), not
         * absurd ones: the step also picks the learning rate. */
        if (step - next > PS_MAX_STEP_JUMP || step >= ((uint64_t)1 << 62)) {
            snprintf(why, cap,
                     "rank %d pushed step %" PRIu64 ", %" PRIu64 " steps beyond its "
                     "last (at most %d)",
                     rank, step, step - next, PS_MAX_STEP_JUMP);
            return FL_EINVAL;
        }
        return FL_OK;
    }
}

/* Copy on write: the parameters about to change must not be the ones a reply still sends. */
static int writable(ps_state_t *st)
{
    if (atomic_load_explicit(&st->cur->refs, memory_order_acquire) == 1)
        return FL_OK;
    ps_params_t *p = params_new(st->o.count);
    if (p == NULL)
        return fl_fail(FL_ENOMEM, "shard: out of memory for a copy of %" PRIu64 " parameters",
                       st->o.count);
    memcpy(p->data, st->cur->data, st->o.count * sizeof(float));
    fl_ps__params_unref(st->cur);
    st->cur = p;
    return FL_OK;
}

/* One optimizer step from nsrc sources. A step whose weighted sum could overflow float32 is
 * skipped (counted), as a loss scaler skips a step with an infinite gradient. */
static int apply(ps_state_t *st, uint64_t step, const ps_src_t **srcs, const float *weight,
                 size_t nsrc, float scale, float divisor)
{
    if (st->o.count == 0)
        return FL_OK;
    double bound = 0.0;
    for (size_t i = 0; i < nsrc; i++)
        bound += fabs((double)weight[i]) * srcs[i]->maxabs;
    bound *= fabs((double)scale) > 1.0 ? fabs((double)scale) : 1.0;
    if (!(bound <= 1e37)) {
        st->skipped++;
        return fl_fail(FL_ENONFINITE,
                       "step %" PRIu64 " skipped: the weighted sum of the pushed "
                       "gradients could overflow float32 (up to %g)",
                       step, bound);
    }
    int rc = fl_opt_step_begin(st->opt, fl_lr_at(&st->o.lr, (long)step));
    if (rc != FL_OK)
        return rc;
    if ((rc = writable(st)) != FL_OK)
        return rc;
    fl_ps__apply(st->opt, st->cur->data, st->o.count, srcs, weight, nsrc, scale, divisor);
    return FL_OK;
}

/* The weighted average: (sum_w g_w) / n when every contributing rank has the same batch count
 * (the usual case, and then the plain mean, exact for one rank), (sum_w batch_w * g_w) /
 * (sum_w batch_w) otherwise; rank order either way. */
static int apply_sync(ps_state_t *st, uint64_t step)
{
    size_t n = 0;
    uint64_t total = 0;
    bool equal = true;
    uint32_t first = 0;
    for (int r = 0; r < st->o.world; r++) {
        uint32_t b = st->held[r].batch;
        if (!st->has[r] || b == 0)
            continue;
        if (n == 0)
            first = b;
        equal = equal && b == first;
        st->order[n++] = &st->held[r];
        total += b;
    }
    for (size_t i = 0; i < n; i++)
        st->weights[i] = equal ? 1.0f : (float)st->order[i]->batch;
    int rc = FL_OK;
    if (n > 0)
        rc = apply(st, step, st->order, st->weights, n, 1.0f, equal ? (float)n : (float)total);
    for (int r = 0; r < st->o.world; r++) {
        if (st->has[r])
            fl_ps__src_release(&st->held[r]);
        memset(&st->held[r], 0, sizeof st->held[r]);
        st->has[r] = false;
    }
    st->nheld = 0;
    st->version++;
    return rc;
}

int fl_ps__state_push(ps_state_t *st, int rank, uint64_t step, ps_src_t *src, bool *updated)
{
    *updated = false;
    st->clock[rank] = step + 1;
    if (st->o.consistency == FL_PS_SYNC) {
        if (st->has[rank]) { /* fl_ps__state_check_push refuses this; never overwrite a hold */
            fl_ps__src_release(src);
            return fl_fail(FL_EINVAL, "rank %d pushed twice in one step", rank);
        }
        st->held[rank] = *src;
        st->has[rank] = true;
        src->release = NULL;
        if (++st->nheld < st->o.world)
            return FL_OK;
        *updated = true;
        return apply_sync(st, step);
    }
    int rc = FL_OK;
    if (src->batch > 0) {
        double scale = st->o.async_scale > 0.0 ? st->o.async_scale : 1.0 / st->o.world;
        const ps_src_t *one[1] = {src};
        const float w[1] = {1.0f};
        rc = apply(st, step, one, w, 1, (float)scale, 1.0f);
        st->version++;
        *updated = true;
    } else {
        *updated = true; /* the clock moved: an SSP pull may be answerable now */
    }
    fl_ps__src_release(src);
    return rc;
}

int fl_ps__state_check_pull(const ps_state_t *st, int rank, uint64_t step, bool latest,
                            int *blocker, uint64_t *blocker_step, char *why, size_t cap)
{
    *blocker = -1;
    *blocker_step = 0;
    if (st->cur == NULL) {
        *blocker = 0;
        return FL_ETIMEDOUT;
    }
    if (latest || st->o.consistency == FL_PS_ASYNC)
        return FL_OK;
    if (step > st->clock[rank]) {
        snprintf(why, cap,
                 "rank %d asked for the parameters of step %" PRIu64 " but has pushed "
                 "only up to step %" PRIu64 "%s",
                 rank, step, st->clock[rank] - 1, st->clock[rank] == 0 ? " (none)" : "");
        return FL_EINVAL;
    }
    uint64_t need = st->o.consistency == FL_PS_SYNC
                        ? step
                        : (step > st->o.staleness ? step - st->o.staleness : 0);
    int s = slowest(st);
    if (st->clock[s] >= need)
        return FL_OK;
    *blocker = s;
    *blocker_step = st->clock[s];
    return FL_ETIMEDOUT;
}
