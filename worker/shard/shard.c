/* Sharded optimizer state (--shard). none: one optimizer over every parameter (DDP). hybrid:
 * device j of a host owns shard j of the parameters (1/L) and its optimizer state, replicated
 * across hosts (FSDP's HYBRID_SHARD). grad: device j of host k owns piece k of shard j, 1/(W L)
 * of the state (ZeRO-2): gradients are reduce-scattered on device j's column across hosts
 * instead of all-reduced, each device steps its piece, and the updated pieces are all-gathered
 * on the column; inside the host, shared memory is the all-gather. The optimizer is elementwise,
 * so every mode computes the same parameters. */
#include "wk_shard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fl_wk_shards {
    fl_wk_shard_t mode;
    int n;                          /* owned ranges (devices) */
    size_t off[FL_DEV_MAX_DEVICES]; /* range t: [off, off + len) of the flat parameters */
    size_t len[FL_DEV_MAX_DEVICES];
    /* grad: device t's shard, which its column reduces and gathers */
    size_t shard_off[FL_DEV_MAX_DEVICES];
    size_t shard_len[FL_DEV_MAX_DEVICES];
    fl_opt_t *opt[FL_DEV_MAX_DEVICES];
    fl_comm_t **cols; /* grad: device t's column across hosts (NULL: one host) */
    uint64_t sent;
    uint64_t remote;
};

int fl_wk_shards_create(const fl_wk_train_opts_t *o, size_t np, int rank, int world,
                        fl_comm_t **cols, fl_wk_shards_t **out)
{
    *out = NULL;
    fl_wk_shards_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return fl_fail(FL_ENOMEM, "out of memory for the optimizer's shards");
    s->mode = o->shard;
    s->cols = cols;
    int L = o->shard == FL_WK_SHARD_NONE ? 1 : o->replicas;
    s->n = L;
    int pieces = o->shard == FL_WK_SHARD_GRAD && cols != NULL ? world : 1;
    int rc = FL_OK;
    for (int t = 0; t < L && rc == FL_OK; t++) {
        s->shard_off[t] = fl_shard_offset(np, L, t);
        s->shard_len[t] = fl_shard_count(np, L, t);
        fl_wk_shards_layout(o, np, cols != NULL ? world : 1, rank, t, &s->off[t], &s->len[t]);
        if (s->len[t] == 0)
            rc = fl_fail(FL_EINVAL,
                         "--shard %s: %zu parameters do not give each of %d x %d "
                         "devices a piece",
                         fl_wk_shard_name(o->shard), np, pieces, L);
        else
            rc = fl_opt_create(&o->opt, s->len[t], &s->opt[t]);
    }
    if (rc != FL_OK) {
        fl_wk_shards_destroy(&s);
        return rc;
    }
    *out = s;
    return FL_OK;
}

static void wk_shards_destroy(fl_wk_shards_t **ps)
{
    if (ps == NULL || *ps == NULL)
        return;
    for (int t = 0; t < (*ps)->n; t++)
        fl_opt_destroy(&(*ps)->opt[t]);
    free(*ps);
    *ps = NULL;
}

void fl_wk_shards_destroy(fl_wk_shards_t **ps)
{
    fl_error_keep_begin();
    wk_shards_destroy(ps);
    fl_error_keep_end();
}

const char *fl_wk_shard_name(fl_wk_shard_t m)
{
    return m == FL_WK_SHARD_HYBRID ? "hybrid"
           : m == FL_WK_SHARD_GRAD ? "grad"
           : m == FL_WK_SHARD_FULL ? "full"
                                   : "none";
}

size_t fl_wk_shards_state_bytes(const fl_wk_shards_t *s)
{
    size_t most = 0;
    for (int t = 0; t < s->n; t++) {
        const float *b1;
        const float *b2;
        uint64_t steps;
        fl_opt_state(s->opt[t], &b1, &b2, &steps);
        size_t bytes = ((b1 != NULL) + (b2 != NULL)) * s->len[t] * sizeof(float);
        most = bytes > most ? bytes : most;
    }
    return most;
}

bool fl_wk_shards_across_hosts(const fl_wk_shards_t *s)
{
    return s->mode == FL_WK_SHARD_GRAD && s->cols != NULL;
}

/* ---- the column legs of --shard grad, one thread per device ---- */

typedef struct legs {
    fl_wk_shards_t *s;
    float *buf;
    bool gather;
    uint64_t sent[FL_DEV_MAX_DEVICES];
    uint64_t remote[FL_DEV_MAX_DEVICES];
} legs_t;

static int leg(int t, void *ud)
{
    legs_t *l = ud;
    fl_wk_shards_t *s = l->s;
    fl_comm_t *c = s->cols[t];
    fl_comm_stats_t s0;
    fl_comm_stats_t s1;
    fl_comm_get_stats(c, &s0);
    float *shard = l->buf + s->shard_off[t];
    float *mine = l->buf + s->off[t];
    int rc = l->gather ? fl_allgather(c, mine, shard, s->shard_len[t], FL_FLOAT32)
                       : fl_reduce_scatter(c, shard, mine, s->shard_len[t], FL_FLOAT32, FL_AVG);
    fl_comm_get_stats(c, &s1);
    l->sent[t] = s1.bytes_sent - s0.bytes_sent;
    l->remote[t] = s1.bytes_sent_remote - s0.bytes_sent_remote;
    return rc;
}

static int legs(fl_wk_shards_t *s, float *buf, bool gather)
{
    if (!fl_wk_shards_across_hosts(s))
        return FL_OK;
    legs_t l = {.s = s, .buf = buf, .gather = gather};
    int rc = fl_fanout_once(s->n, leg, &l, "the exchange of the shards");
    for (int t = 0; t < s->n; t++) {
        s->sent += l.sent[t];
        s->remote += l.remote[t];
    }
    return rc;
}

int fl_wk_shards_reduce(fl_wk_shards_t *s, float *grad)
{
    return legs(s, grad, false);
}

int fl_wk_shards_gather(fl_wk_shards_t *s, float *params)
{
    return legs(s, params, true);
}

int fl_wk_shards_clip(fl_wk_shards_t *s, float *grad, double max_norm)
{
    /* The norm of the whole averaged gradient from the pieces this host owns: each column
     * sums its pieces across hosts. */
    double ss[FL_DEV_MAX_DEVICES];
    double total = 0.0;
    for (int t = 0; t < s->n; t++) {
        ss[t] = 0.0;
        for (size_t i = 0; i < s->len[t]; i++)
            ss[t] += (double)grad[s->off[t] + i] * grad[s->off[t] + i];
        int rc;
        if (fl_wk_shards_across_hosts(s) &&
            (rc = fl_allreduce(s->cols[t], &ss[t], &ss[t], 1, FL_FLOAT64, FL_SUM)) != FL_OK)
            return rc;
        total += ss[t];
    }
    double f = fl_cmp_clip_factor(sqrt(total), max_norm);
    for (int t = 0; t < s->n && f != 1.0; t++)
        for (size_t i = 0; i < s->len[t]; i++)
            grad[s->off[t] + i] *= (float)f;
    return FL_OK;
}

int fl_wk_shards_check(fl_wk_shards_t *s, const float *grad)
{
    /* All or nothing: a non-finite gradient anywhere leaves every piece as it was. With pieces
     * across hosts, every host must hear it (or the others would wait in the all-gather): one
     * column's allreduce reaches every rank. */
    double bad = 0.0;
    size_t where = 0;
    for (int t = 0; t < s->n && bad == 0.0; t++)
        for (size_t i = 0; i < s->len[t] && bad == 0.0; i++)
            if (!isfinite(grad[s->off[t] + i])) {
                bad = 1.0;
                where = s->off[t] + i;
            }
    int rc =
        fl_wk_shards_others_finite(fl_wk_shards_across_hosts(s) ? s->cols[0] : NULL, bad != 0.0);
    if (rc != FL_OK)
        return rc;
    if (bad != 0.0)
        return fl_fail(FL_ENONFINITE, "gradient %zu is %g: no parameter updated", where,
                       (double)grad[where]);
    return FL_OK;
}

int fl_wk_shards_others_finite(fl_comm_t *col, bool bad)
{
    if (col == NULL)
        return FL_OK;
    double any = bad ? 1.0 : 0.0;
    int rc = fl_allreduce(col, &any, &any, 1, FL_FLOAT64, FL_MAX);
    if (rc != FL_OK)
        return rc;
    if (any != 0.0 && !bad)
        return fl_fail(FL_ENONFINITE, "another rank's gradient piece is not finite: no "
                                      "parameter updated");
    return FL_OK;
}

int fl_wk_shards_step(fl_wk_shards_t *s, float *params, const float *grad, double lr)
{
    int rc = fl_wk_shards_check(s, grad);
    if (rc != FL_OK)
        return rc;
    for (int t = 0; t < s->n && rc == FL_OK; t++)
        rc = fl_opt_step(s->opt[t], params + s->off[t], grad + s->off[t], lr);
    return rc;
}

void fl_wk_shards_bytes(const fl_wk_shards_t *s, uint64_t *sent, uint64_t *remote)
{
    *sent = s->sent;
    *remote = s->remote;
}

int fl_wk_shards_count(const fl_wk_shards_t *s)
{
    return s->n;
}

void fl_wk_shards_range(const fl_wk_shards_t *s, int t, size_t *off, size_t *len)
{
    *off = s->off[t];
    *len = s->len[t];
}

void fl_wk_shards_column(const fl_wk_shards_t *s, int t, size_t *off, size_t *len)
{
    bool across = fl_wk_shards_across_hosts(s);
    *off = across ? s->shard_off[t] : s->off[t];
    *len = across ? s->shard_len[t] : s->len[t];
}

fl_opt_t *fl_wk_shards_opt(fl_wk_shards_t *s, int t)
{
    return s->opt[t];
}

void fl_wk_shards_layout(const fl_wk_train_opts_t *o, size_t np, int world, int rank, int t,
                         size_t *off, size_t *len)
{
    int L = o->shard == FL_WK_SHARD_NONE ? 1 : o->replicas;
    int pieces = o->shard == FL_WK_SHARD_GRAD && world > 1 ? world : 1;
    size_t so = fl_shard_offset(np, L, t);
    size_t sl = fl_shard_count(np, L, t);
    *off = so + fl_shard_offset(sl, pieces, pieces > 1 ? rank : 0);
    *len = fl_shard_count(sl, pieces, pieces > 1 ? rank : 0);
}
