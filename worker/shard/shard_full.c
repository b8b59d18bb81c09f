/* --shard full (ZeRO-3): parameters are sharded too. Each layer (weight and bias) is a unit,
 * padded to a multiple of W x L elements so that every device of every host owns a piece of
 * c = ceil(n / (W L)) elements of it, even a layer smaller than the device count (the padding
 * is zero and stays zero: its gradient is zero). Device t of host k owns piece t W + k: column t
 * (device t of every host) holds shard t of the padded unit. A layer's parameters exist whole
 * only while the devices compute with it: each column all-gathers its shard into the unit's
 * buffer (inside the host the buffer is shared memory), the next layer's gather runs while the
 * current one computes (at most `depth` layers ahead), and the buffer is freed once every device
 * put it back. The forward pass gathers layers 0..n-1, the backward pass n-2..1 again (the last
 * stays from the forward pass, layer 0's weight gradient needs no weight). After the backward
 * pass each column reduce-scatters its shard of every unit of the host's mean gradient, and
 * each device steps its pieces with its own optimizer. */
#include "wk_shard.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_PROG (2 * FL_MLP_MAX_LAYERS)
#define WAIT_S 600 /* a gather or a device that makes no progress for this long is an error */

typedef struct inst {
    int unit;
    float *buf;
    int filled; /* columns that wrote their shard */
} inst_t;

typedef struct col_arg {
    struct fl_wk_full *z;
    int t;
} col_arg_t;

typedef struct dev_src {
    fl_wk_full_t *z;
    int t;
} dev_src_t;

struct fl_wk_full {
    const fl_mlp_shape_t *m;
    int L;
    int W;
    int rank;
    fl_comm_t **cols; /* NULL: one host */
    int nu;
    size_t n[FL_MLP_MAX_LAYERS];    /* the unit's elements */
    size_t c[FL_MLP_MAX_LAYERS];    /* a piece of it */
    size_t at[FL_MLP_MAX_LAYERS];   /* its place in the flat parameters */
    size_t poff[FL_MLP_MAX_LAYERS]; /* its piece's place in a device's pieces */
    size_t per_dev;                 /* a device's pieces, all units */
    size_t widest;                  /* the largest padded unit */
    float *piece[FL_DEV_MAX_DEVICES];
    float *gpiece[FL_DEV_MAX_DEVICES];
    float *stage[FL_DEV_MAX_DEVICES]; /* column t's shard of a unit, padded, for the
                                         reduce-scatter */
    fl_opt_t *opt[FL_DEV_MAX_DEVICES];
    int depth;
    /* the step's gathers */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int nprog;
    inst_t prog[MAX_PROG];
    int next_get[FL_DEV_MAX_DEVICES];
    int released[FL_DEV_MAX_DEVICES];
    int upto; /* instances every device put back */
    bool running;
    bool stop;
    int first_failed; /* the device that stopped the step (-1: none) */
    int rc;
    char err[1024];
    pthread_t th[FL_DEV_MAX_DEVICES];
    col_arg_t cargs[FL_DEV_MAX_DEVICES];
    int nth;
    size_t live; /* gathered bytes now */
    size_t peak;
    fl_wk_full_stats_t st;
    dev_src_t dsrc[FL_DEV_MAX_DEVICES];
    fl_mlp_src_t src[FL_DEV_MAX_DEVICES];
};

static int src_get(void *ud, int layer, const float **w);
static void src_put(void *ud, int layer);

void fl_wk_full_layout(const fl_mlp_shape_t *m, int world, int replicas, int unit, size_t *count,
                       size_t *piece)
{
    size_t n = fl_mlp_weight_at(m, unit + 1) - fl_mlp_weight_at(m, unit);
    size_t parts = (size_t)world * (size_t)replicas;
    *count = n;
    *piece = (n + parts - 1) / parts;
}

int fl_wk_full_create(const fl_wk_train_opts_t *o, int rank, int world, fl_comm_t **cols,
                      const float *params, fl_wk_full_t **out)
{
    *out = NULL;
    if (o->replicas < 1 || o->replicas > FL_DEV_MAX_DEVICES)
        return fl_fail(FL_EINVAL, "--shard full: %d devices (1..%d)", o->replicas,
                       FL_DEV_MAX_DEVICES);
    fl_wk_full_t *z = calloc(1, sizeof *z);
    if (z == NULL)
        return fl_fail(FL_ENOMEM, "--shard full: out of memory");
    z->m = &o->shape;
    z->L = o->replicas;
    z->W = cols != NULL ? world : 1;
    z->rank = cols != NULL ? rank : 0;
    z->cols = cols;
    z->nu = o->shape.nlayers;
    z->depth = 1;
    for (int u = 0; u < z->nu; u++) {
        fl_wk_full_layout(z->m, z->W, z->L, u, &z->n[u], &z->c[u]);
        z->at[u] = fl_mlp_weight_at(z->m, u);
        z->poff[u] = z->per_dev;
        z->per_dev += z->c[u];
        size_t padded = z->c[u] * (size_t)z->W * (size_t)z->L;
        z->widest = padded > z->widest ? padded : z->widest;
    }
    pthread_mutex_init(&z->mu, NULL);
    pthread_cond_init(&z->cv, NULL);
    int rc = FL_OK;
    for (int t = 0; t < z->L && rc == FL_OK; t++) {
        z->piece[t] = calloc(z->per_dev, sizeof(float));
        z->gpiece[t] = calloc(z->per_dev, sizeof(float));
        z->stage[t] = malloc(z->widest / (size_t)z->L * sizeof(float));
        if (z->piece[t] == NULL || z->gpiece[t] == NULL || z->stage[t] == NULL)
            rc = fl_fail(FL_ENOMEM, "--shard full: out of memory for device %d's pieces", t);
        else
            rc = fl_opt_create(&o->opt, z->per_dev, &z->opt[t]);
        z->dsrc[t] = (dev_src_t){z, t};
        z->src[t] = (fl_mlp_src_t){src_get, src_put, &z->dsrc[t]};
    }
    if (rc != FL_OK) {
        fl_wk_full_destroy(&z);
        return rc;
    }
    fl_wk_full_scatter(z, params);
    /* The step's program: forward 0..n-1, backward n-2..1. */
    for (int u = 0; u < z->nu; u++)
        z->prog[z->nprog++].unit = u;
    for (int u = z->nu - 2; u >= 1; u--)
        z->prog[z->nprog++].unit = u;
    *out = z;
    return FL_OK;
}

void fl_wk_full_scatter(fl_wk_full_t *z, const float *params)
{
    for (int t = 0; t < z->L; t++)
        for (int u = 0; u < z->nu; u++) {
            size_t first = ((size_t)t * (size_t)z->W + (size_t)z->rank) * z->c[u];
            float *dst = z->piece[t] + z->poff[u];
            for (size_t i = 0; i < z->c[u]; i++)
                dst[i] = first + i < z->n[u] ? params[z->at[u] + first + i] : 0.0f;
        }
}

static void free_prog(fl_wk_full_t *z)
{
    for (int i = 0; i < z->nprog; i++) {
        free(z->prog[i].buf);
        z->prog[i].buf = NULL;
        z->prog[i].filled = 0;
    }
    z->live = 0;
}

static void wk_full_destroy(fl_wk_full_t **pz)
{
    if (pz == NULL || *pz == NULL)
        return;
    fl_wk_full_t *z = *pz;
    if (z->running)
        fl_wk_full_end(z);
    free_prog(z);
    for (int t = 0; t < z->L; t++) {
        free(z->piece[t]);
        free(z->gpiece[t]);
        free(z->stage[t]);
        fl_opt_destroy(&z->opt[t]);
    }
    pthread_mutex_destroy(&z->mu);
    pthread_cond_destroy(&z->cv);
    free(z);
    *pz = NULL;
}

void fl_wk_full_destroy(fl_wk_full_t **pz)
{
    fl_error_keep_begin();
    wk_full_destroy(pz);
    fl_error_keep_end();
}

const fl_mlp_src_t *fl_wk_full_src(fl_wk_full_t *z, int t)
{
    return &z->src[t];
}

static size_t padded(const fl_wk_full_t *z, int u)
{
    return z->c[u] * (size_t)z->W * (size_t)z->L;
}

/* Waits on the condition until the deadline: false once it passed. Called locked. */
static bool wait_until(fl_wk_full_t *z, const struct timespec *dl)
{
    return pthread_cond_timedwait(&z->cv, &z->mu, dl) != ETIMEDOUT;
}

static struct timespec deadline(void)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += WAIT_S;
    return dl;
}

static void set_error(fl_wk_full_t *z, int rc, const char *what)
{
    if (z->rc == FL_OK) {
        z->rc = rc;
        snprintf(z->err, sizeof z->err, "%s", what);
    }
    pthread_cond_broadcast(&z->cv);
}

/* Shard t of unit u (W pieces) from every host's pieces into shard: column t's part of the
 * unit's buffer, shared memory inside the host. */
static int gather_shard(fl_wk_full_t *z, int t, int u, float *shard, uint64_t *sent,
                        uint64_t *remote)
{
    const float *mine = z->piece[t] + z->poff[u];
    if (z->cols == NULL) {
        memcpy(shard, mine, z->c[u] * sizeof(float));
        return FL_OK;
    }
    fl_comm_stats_t s0;
    fl_comm_stats_t s1;
    fl_comm_get_stats(z->cols[t], &s0);
    int rc = fl_allgather(z->cols[t], mine, shard, (size_t)z->W * z->c[u], FL_FLOAT32);
    fl_comm_get_stats(z->cols[t], &s1);
    *sent += s1.bytes_sent - s0.bytes_sent;
    *remote += s1.bytes_sent_remote - s0.bytes_sent_remote;
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "--shard full: gathering layer %d on device %d's column", u, t);
    return FL_OK;
}

/* Column t's part of every gather of the step, in the program's order (the same on every host),
 * at most depth instances ahead of what the devices put back. */
static void *column_main(void *p)
{
    col_arg_t *a = p;
    fl_wk_full_t *z = a->z;
    int t = a->t;
    for (int i = 0; i < z->nprog; i++) {
        int u = z->prog[i].unit;
        pthread_mutex_lock(&z->mu);
        struct timespec dl = deadline();
        bool ok = true;
        while (!z->stop && z->rc == FL_OK && i > z->upto + z->depth && ok)
            ok = wait_until(z, &dl);
        if (!ok)
            set_error(z, FL_ETIMEDOUT,
                      "--shard full: the devices did not finish a layer within "
                      "600 s");
        if (z->stop || z->rc != FL_OK) {
            pthread_mutex_unlock(&z->mu);
            break;
        }
        if (z->prog[i].buf == NULL) {
            z->prog[i].buf = malloc(padded(z, u) * sizeof(float));
            if (z->prog[i].buf == NULL) {
                set_error(z, FL_ENOMEM, "--shard full: out of memory for a gathered layer");
                pthread_mutex_unlock(&z->mu);
                break;
            }
            z->live += padded(z, u) * sizeof(float);
            z->peak = z->live > z->peak ? z->live : z->peak;
        }
        float *buf = z->prog[i].buf;
        pthread_mutex_unlock(&z->mu);
        uint64_t sent = 0;
        uint64_t remote = 0;
        int rc = gather_shard(z, t, u, buf + (size_t)t * (size_t)z->W * z->c[u], &sent, &remote);
        pthread_mutex_lock(&z->mu);
        z->st.sent += sent;
        z->st.remote += remote;
        if (rc != FL_OK)
            set_error(z, rc, fl_last_error());
        else if (++z->prog[i].filled == z->L)
            pthread_cond_broadcast(&z->cv);
        pthread_mutex_unlock(&z->mu);
        if (rc != FL_OK)
            break;
    }
    return NULL;
}

int fl_wk_full_begin(fl_wk_full_t *z)
{
    free_prog(z);
    for (int t = 0; t < z->L; t++) {
        z->next_get[t] = 0;
        z->released[t] = 0;
    }
    z->upto = 0;
    z->stop = false;
    z->first_failed = -1;
    z->rc = FL_OK;
    z->err[0] = '\0';
    z->nth = 0;
    z->running = true;
    for (int t = 0; t < z->L; t++) {
        z->cargs[t] = (col_arg_t){z, t};
        if (pthread_create(&z->th[t], NULL, column_main, &z->cargs[t]) != 0) {
            pthread_mutex_lock(&z->mu);
            set_error(z, FL_EIO, "--shard full: cannot start a gather thread");
            pthread_mutex_unlock(&z->mu);
            return fl_wk_full_end(z);
        }
        z->nth++;
    }
    return FL_OK;
}

/* Called locked: frees the instances every device put back. */
static void advance(fl_wk_full_t *z)
{
    int least = z->nprog;
    for (int t = 0; t < z->L; t++)
        least = z->released[t] < least ? z->released[t] : least;
    for (; z->upto < least; z->upto++) {
        inst_t *in = &z->prog[z->upto];
        /* One a column is still writing (devices that stopped early) waits for free_prog,
         * after the columns are joined. */
        if (in->buf != NULL && in->filled == z->L) {
            z->live -= padded(z, in->unit) * sizeof(float);
            free(in->buf);
            in->buf = NULL;
        }
    }
    pthread_cond_broadcast(&z->cv);
}

static int src_get(void *ud, int layer, const float **w)
{
    dev_src_t *s = ud;
    fl_wk_full_t *z = s->z;
    pthread_mutex_lock(&z->mu);
    int i = z->next_get[s->t]++;
    int rc = FL_OK;
    *w = NULL;
    if (i >= z->nprog || z->prog[i].unit != layer) {
        rc = fl_fail(FL_EINVAL,
                     "--shard full: device %d asked for layer %d out of the gathers' "
                     "order",
                     s->t, layer);
    } else {
        z->st.gets++;
        if (z->prog[i].filled == z->L)
            z->st.ready++;
        int64_t t0 = fl_now_ns();
        struct timespec dl = deadline();
        bool ok = true;
        while (z->rc == FL_OK && !z->stop && z->prog[i].filled < z->L && ok)
            ok = wait_until(z, &dl);
        z->st.wait_s += (double)(fl_now_ns() - t0) / 1e9;
        if (!ok)
            set_error(z, FL_ETIMEDOUT, "--shard full: layer not gathered within 600 s");
        if (z->rc != FL_OK)
            rc = fl_fail(z->rc, "%s", z->err);
        else if (z->stop)
            rc = fl_fail(FL_ECLOSED, "--shard full: the step was stopped (another device "
                                     "failed)");
        else
            *w = z->prog[i].buf;
    }
    pthread_mutex_unlock(&z->mu);
    return rc;
}

static void src_put(void *ud, int layer)
{
    (void)layer;
    dev_src_t *s = ud;
    fl_wk_full_t *z = s->z;
    pthread_mutex_lock(&z->mu);
    if (z->released[s->t] < z->nprog)
        z->released[s->t]++;
    advance(z);
    pthread_mutex_unlock(&z->mu);
}

void fl_wk_full_device_done(fl_wk_full_t *z, int t)
{
    /* A device that failed midway will not put back what it holds or get the rest: the
     * gathers still queued are not needed. */
    pthread_mutex_lock(&z->mu);
    if (z->next_get[t] < z->nprog && !z->stop) {
        z->stop = true;
        z->first_failed = t;
    }
    z->released[t] = z->nprog;
    advance(z);
    pthread_mutex_unlock(&z->mu);
}

int fl_wk_full_end(fl_wk_full_t *z)
{
    pthread_mutex_lock(&z->mu);
    bool complete = z->upto == z->nprog && !z->stop;
    z->stop = true;
    pthread_cond_broadcast(&z->cv);
    pthread_mutex_unlock(&z->mu);
    for (int t = 0; t < z->nth; t++)
        pthread_join(z->th[t], NULL);
    z->nth = 0;
    z->running = false;
    free_prog(z);
    if (z->rc != FL_OK)
        return fl_fail(z->rc, "%s", z->err);
    if (!complete)
        return fl_fail(FL_ECLOSED, "--shard full: the step ended before its gathers");
    return FL_OK;
}

/* ---- after the backward pass: the gradient's pieces, the update ---- */

typedef struct legs {
    fl_wk_full_t *z;
    const float *grad; /* reduce: the host's mean; gather: NULL */
    float *params;     /* gather: the flat parameters */
    uint64_t sent[FL_DEV_MAX_DEVICES];
    uint64_t remote[FL_DEV_MAX_DEVICES];
} legs_t;

/* Column t: shard t of every unit of the host's mean gradient, reduce-scattered (averaged)
 * across hosts into device t's gradient pieces. */
static int reduce_column(fl_wk_full_t *z, int t, const float *grad, uint64_t *sent,
                         uint64_t *remote)
{
    for (int u = 0; u < z->nu; u++) {
        size_t span = (size_t)z->W * z->c[u];
        size_t first = (size_t)t * span;
        float *stage = z->stage[t];
        for (size_t i = 0; i < span; i++)
            stage[i] = first + i < z->n[u] ? grad[z->at[u] + first + i] : 0.0f;
        float *mine = z->gpiece[t] + z->poff[u];
        if (z->cols == NULL) {
            memcpy(mine, stage, z->c[u] * sizeof(float));
            continue;
        }
        fl_comm_stats_t s0;
        fl_comm_stats_t s1;
        fl_comm_get_stats(z->cols[t], &s0);
        int rc = fl_reduce_scatter(z->cols[t], stage, mine, span, FL_FLOAT32, FL_AVG);
        fl_comm_get_stats(z->cols[t], &s1);
        *sent += s1.bytes_sent - s0.bytes_sent;
        *remote += s1.bytes_sent_remote - s0.bytes_sent_remote;
        if (rc != FL_OK)
            return fl_fail_ctx(rc, "--shard full: reducing layer %d on device %d's column", u, t);
    }
    return FL_OK;
}

/* Column t: every unit's shard t gathered into the flat parameters (evaluation, saving). */
static int gather_column(fl_wk_full_t *z, int t, float *params, uint64_t *sent, uint64_t *remote)
{
    for (int u = 0; u < z->nu; u++) {
        size_t span = (size_t)z->W * z->c[u];
        float *stage = z->stage[t];
        int rc = gather_shard(z, t, u, stage, sent, remote);
        if (rc != FL_OK)
            return rc;
        size_t first = (size_t)t * span;
        for (size_t i = 0; i < span && first + i < z->n[u]; i++)
            params[z->at[u] + first + i] = stage[i];
    }
    return FL_OK;
}

static int leg(int t, void *ud)
{
    legs_t *l = ud;
    return l->grad != NULL ? reduce_column(l->z, t, l->grad, &l->sent[t], &l->remote[t])
                           : gather_column(l->z, t, l->params, &l->sent[t], &l->remote[t]);
}

/* One thread per column (each column's collectives on its own connection). */
static int legs(fl_wk_full_t *z, const float *grad, float *params)
{
    legs_t l = {.z = z, .grad = grad, .params = params};
    int rc = fl_fanout_once(z->L, leg, &l, "--shard full: the columns' exchanges");
    for (int t = 0; t < z->L; t++) {
        z->st.sent += l.sent[t];
        z->st.remote += l.remote[t];
    }
    return rc;
}

int fl_wk_full_reduce(fl_wk_full_t *z, const float *grad)
{
    return legs(z, grad, NULL);
}

int fl_wk_full_materialize(fl_wk_full_t *z, float *params)
{
    return legs(z, NULL, params);
}

int fl_wk_full_clip(fl_wk_full_t *z, double max_norm)
{
    double total = 0.0;
    for (int t = 0; t < z->L; t++) {
        double ss = 0.0;
        for (size_t i = 0; i < z->per_dev; i++)
            ss += (double)z->gpiece[t][i] * z->gpiece[t][i];
        int rc;
        if (z->cols != NULL &&
            (rc = fl_allreduce(z->cols[t], &ss, &ss, 1, FL_FLOAT64, FL_SUM)) != FL_OK)
            return rc;
        total += ss;
    }
    double f = fl_cmp_clip_factor(sqrt(total), max_norm);
    for (int t = 0; t < z->L && f != 1.0; t++)
        for (size_t i = 0; i < z->per_dev; i++)
            z->gpiece[t][i] *= (float)f;
    return FL_OK;
}

int fl_wk_full_step(fl_wk_full_t *z, double lr)
{
    /* All or nothing across every host: one column's allreduce reaches every rank. */
    double bad = 0.0;
    int where_t = 0;
    size_t where = 0;
    for (int t = 0; t < z->L && bad == 0.0; t++)
        for (size_t i = 0; i < z->per_dev && bad == 0.0; i++)
            if (!isfinite(z->gpiece[t][i])) {
                bad = 1.0;
                where_t = t;
                where = i;
            }
    int rc = fl_wk_shards_others_finite(z->cols != NULL ? z->cols[0] : NULL, bad != 0.0);
    if (rc != FL_OK)
        return rc;
    if (bad != 0.0)
        return fl_fail(FL_ENONFINITE,
                       "device %d's gradient piece %zu is %g: no parameter "
                       "updated",
                       where_t, where, (double)z->gpiece[where_t][where]);
    for (int t = 0; t < z->L && rc == FL_OK; t++)
        rc = fl_opt_step(z->opt[t], z->piece[t], z->gpiece[t], lr);
    return rc;
}

void fl_wk_full_memory(const fl_wk_full_t *z, size_t *params, size_t *state)
{
    *params = z->per_dev * sizeof(float) + z->peak;
    const float *b1;
    const float *b2;
    uint64_t steps;
    fl_opt_state(z->opt[0], &b1, &b2, &steps);
    *state = ((b1 != NULL) + (b2 != NULL)) * z->per_dev * sizeof(float);
}

int fl_wk_full_first_failed(const fl_wk_full_t *z)
{
    return z->first_failed;
}

fl_opt_t *fl_wk_full_opt(fl_wk_full_t *z, int t)
{
    return z->opt[t];
}

void fl_wk_full_stats(const fl_wk_full_t *z, fl_wk_full_stats_t *out)
{
    *out = z->st;
    out->peak_gathered = z->peak;
    out->pieces = z->per_dev;
}
