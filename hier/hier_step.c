/* One bucket's exchange: flat (one ring over all ranks) or two-level (reduce-scatter in the
 * host, the shard across hosts, all-gather in the host), dense or top-k with error feedback. */
#include "hier_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fl_hier_topk_setup(fl_hier_t *h)
{
    int rc = fl_cmp_ws_create(&h->ws);
    fl_sparse_opts_init(&h->sparse);
    h->sparse.values = h->values;
    for (size_t i = 0; rc == FL_OK && i < h->nbuckets; i++) {
        hier_bucket_t *b = &h->b[i];
        if (b->shard_len == 0)
            continue; /* a bucket shorter than the host's ranks: some shards are empty */
        fl_cmp_ef_opts_t eo;
        fl_cmp_ef_opts_init(&eo);
        eo.n = b->shard_len;
        eo.name = b->name;
        eo.wire = h->values;
        eo.max_norm = h->max_norm;
        if (h->memory == FL_HIER_MEM_HOST)
            rc = fl_cmp_ef_create(&eo, &b->ef);
        fl_cmp_topk_opts_init(&b->topk);
        b->topk.density = h->density;
        b->topk.name = b->name;
        if (rc == FL_OK)
            rc = fl_cmp_topk_count(b->shard_len, &b->topk, &b->k);
        if (rc == FL_OK) {
            b->idx = malloc((b->k + 1) * sizeof *b->idx);
            b->val = malloc((b->k + 1) * sizeof *b->val);
            if (b->idx == NULL || b->val == NULL)
                rc = fl_fail(FL_ENOMEM, "hier: top-k pairs of bucket %zu: out of memory", i);
        }
    }
    return rc;
}

/* Top-k of part (n floats, this rank's gradient or its host's shard) summed over comm into
 * part itself. Every rank of comm has the same n and so the same k: no round for the k's. */
static int topk(fl_hier_t *h, hier_bucket_t *b, fl_comm_t *comm, float *part)
{
    size_t k = 0;
    bool skipped = false;
    int rc = h->dev != NULL
                 ? fl_hier_dev_topk(h, b, part, &k)
                 : fl_cmp_ef_step(b->ef, h->ws, part, &b->topk, b->idx, b->val, &k, &skipped);
    if (rc != FL_OK)
        return rc;
    fl_sparse_opts_t so = h->sparse;
    so.k_max = b->k;
    return fl_sparse_allreduce(comm, b->idx, b->val, k, part, b->shard_len, FL_AVG, &so, NULL);
}

static int flat(fl_hier_t *h, hier_bucket_t *b, void *buf)
{
    if (h->density > 0)
        return topk(h, b, h->comm, buf);
    return fl_allreduce(h->comm, buf, buf, b->len, b->type, FL_AVG);
}

/* The host's average is reduce-scattered, the shard averaged over the hosts, and gathered:
 * an average of the hosts' averages, which is the job's average as every host has as many
 * ranks. */
static int hybrid(fl_hier_t *h, hier_bucket_t *b, void *buf)
{
    char *shard = (char *)buf + b->shard_off * fl_dtype_size(b->type);
    int rc = fl_reduce_scatter(h->local, buf, shard, b->len, b->type, FL_AVG);
    if (rc == FL_OK && b->shard_len > 0) {
        if (h->density > 0)
            rc = topk(h, b, h->cross, (float *)shard);
        else
            rc = fl_allreduce(h->cross, shard, shard, b->shard_len, b->type, FL_AVG);
    }
    if (rc == FL_OK)
        rc = fl_allgather(h->local, shard, buf, b->len, b->type);
    return rc;
}

/* The bytes the engine's communicators have sent so far, added to acc. */
static void add_sent(const fl_hier_t *h, fl_hier_stats_t *acc)
{
    fl_comm_t *comms[2] = {h->hybrid ? h->local : h->comm, h->hybrid ? h->cross : NULL};
    for (int i = 0; i < 2; i++) {
        if (comms[i] == NULL)
            continue;
        fl_comm_stats_t s;
        fl_comm_get_stats(comms[i], &s);
        acc->bytes_sent += s.bytes_sent;
        acc->bytes_sent_remote += s.bytes_sent_remote;
    }
}

int fl_hier_allreduce(fl_hier_t *h, size_t b, void *buf)
{
    if (h == NULL || buf == NULL)
        return fl_fail(FL_EINVAL, "hier: allreduce with a NULL %s",
                       h == NULL ? "engine" : "buffer");
    if (b >= h->nbuckets)
        return fl_fail(FL_EINVAL, "hier: bucket %zu of %zu", b, h->nbuckets);
    if (h->failed != FL_OK)
        return fl_fail(FL_ECLOSED, "hier: the exchange failed earlier: %s", h->why);
    fl_hier_stats_t before = {0};
    add_sent(h, &before);
    hier_bucket_t *bk = &h->b[b];
    int rc = h->hybrid ? hybrid(h, bk, buf) : flat(h, bk, buf);
    fl_hier_stats_t after = {0};
    add_sent(h, &after);
    h->stats.ops++;
    h->stats.bytes_sent += after.bytes_sent - before.bytes_sent;
    h->stats.bytes_sent_remote += after.bytes_sent_remote - before.bytes_sent_remote;
    if (rc != FL_OK) {
        h->failed = rc;
        snprintf(h->why, sizeof h->why, "%s", fl_last_error());
    }
    return rc;
}

size_t fl_hier_residual_len(const fl_hier_t *h, size_t b)
{
    if (h == NULL || b >= h->nbuckets || h->density <= 0)
        return 0;
    return h->b[b].shard_len;
}

static int residual_check(const fl_hier_t *h, size_t b, const void *p, size_t n)
{
    if (h == NULL || p == NULL || b >= (h != NULL ? h->nbuckets : 0))
        return fl_fail(FL_EINVAL, "hier: residual of bucket %zu: bad engine, bucket or buffer", b);
    if (n != fl_hier_residual_len(h, b))
        return fl_fail(FL_EINVAL, "hier: residual of bucket %zu has %zu floats here, not %zu", b,
                       fl_hier_residual_len(h, b), n);
    return FL_OK;
}

int fl_hier_residual_get(const fl_hier_t *h, size_t b, float *out, size_t n)
{
    int rc = residual_check(h, b, out, n);
    if (rc != FL_OK || n == 0)
        return rc;
    if (h->dev != NULL)
        return fl_hier_dev_residual((fl_hier_t *)h, b, out, NULL);
    const float *r = NULL, *v = NULL;
    size_t len = 0;
    fl_cmp_ef_state(h->b[b].ef, &r, &v, &len);
    memcpy(out, r, n * sizeof *out);
    return FL_OK;
}

int fl_hier_residual_put(fl_hier_t *h, size_t b, const float *in, size_t n)
{
    int rc = residual_check(h, b, in, n);
    if (rc != FL_OK || n == 0)
        return rc;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(in[i]))
            return fl_fail(FL_ENONFINITE, "hier: residual of %s: entry %zu is not finite",
                           h->b[b].name, i);
    if (h->dev != NULL)
        return fl_hier_dev_residual(h, b, NULL, in);
    return fl_cmp_ef_restore(h->b[b].ef, in, NULL, n);
}
