/* The two-level exchange engine: its options, creation over a communicator, the host and
 * cross-host sub-communicators, and what it keeps between steps. */
#include "hier_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fl_hier_opts_init(fl_hier_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->hierarchy = FL_HIER_AUTO;
    o->values = FL_FLOAT32;
    o->name = "gradient";
}

static int is_wire(fl_dtype_t t)
{
    return t == FL_FLOAT32 || t == FL_FLOAT16 || t == FL_BFLOAT16;
}

static int check_buckets(const fl_hier_opts_t *o)
{
    if (o->nbuckets == 0 || o->bucket_len == NULL)
        return fl_fail(FL_EINVAL, "hier: no buckets (nbuckets %zu, bucket_len %s)", o->nbuckets,
                       o->bucket_len == NULL ? "NULL" : "set");
    for (size_t b = 0; b < o->nbuckets; b++) {
        fl_dtype_t t = o->bucket_type != NULL ? o->bucket_type[b] : FL_FLOAT32;
        if (o->bucket_len[b] == 0 || o->bucket_len[b] > UINT32_MAX)
            return fl_fail(FL_EINVAL, "hier: bucket %zu has %zu elements (1..2^32-1)", b,
                           o->bucket_len[b]);
        if (!is_wire(t))
            return fl_fail(FL_EINVAL, "hier: bucket %zu is %s (float32, float16, bfloat16)", b,
                           fl_dtype_name(t));
        if (o->density > 0 && t != FL_FLOAT32)
            return fl_fail(FL_EINVAL, "hier: bucket %zu is %s; top-k takes float32 buckets", b,
                           fl_dtype_name(t));
    }
    return FL_OK;
}

static int check_opts(const fl_comm_t *comm, const fl_hier_opts_t *o)
{
    if (o == NULL || comm == NULL)
        return fl_fail(FL_EINVAL, "hier: NULL %s", o == NULL ? "options" : "communicator");
    if (o->struct_size != sizeof *o)
        return fl_fail(FL_EINVAL,
                       "hier: fl_hier_opts_t.struct_size is %zu, this libflodl %s expects %zu: "
                       "call fl_hier_opts_init and build against this version's header",
                       o->struct_size, FL_VERSION_STRING, sizeof *o);
    if (o->hierarchy < FL_HIER_AUTO || o->hierarchy > FL_HIER_HYBRID)
        return fl_fail(FL_EINVAL, "hier: hierarchy %d is not auto, flat or hybrid",
                       (int)o->hierarchy);
    if (!(o->density >= 0.0 && o->density <= 1.0))
        return fl_fail(FL_EINVAL, "hier: top-k density %g is outside [0, 1]", o->density);
    if (!is_wire(o->values))
        return fl_fail(FL_EINVAL, "hier: top-k values %s (float32, float16, bfloat16)",
                       fl_dtype_name(o->values));
    if (o->memory != FL_HIER_MEM_HOST && o->memory != FL_HIER_MEM_SIM)
        return fl_fail(FL_EINVAL, "hier: memory %d is not host or sim", (int)o->memory);
    if (!(o->max_norm >= 0.0) || isinf(o->max_norm))
        return fl_fail(FL_EINVAL, "hier: max_norm %g must be finite and >= 0", o->max_norm);
    return check_buckets(o);
}

/* Hybrid needs hosts of one size: a shard index must mean the same range on every host. */
static int pick_mode(fl_hier_t *h, fl_hier_mode_t want)
{
    const fl_hier_topo_t *t = &h->topo;
    if (want == FL_HIER_HYBRID && !t->uniform)
        return fl_fail(FL_EINVAL,
                       "hier: hierarchy=hybrid needs the same number of ranks on every host; "
                       "rank %d's host %s has %d of the job's %d ranks on %d hosts",
                       fl_comm_rank(h->comm), fl_comm_peer_host(h->comm, fl_comm_rank(h->comm)),
                       t->local_size, fl_comm_size(h->comm), t->cross_size);
    if (want == FL_HIER_AUTO)
        h->hybrid = t->uniform && t->cross_size > 1 && t->local_size > 1;
    else
        h->hybrid = want == FL_HIER_HYBRID;
    return FL_OK;
}

static int split(fl_hier_t *h)
{
    int me = fl_comm_rank(h->comm);
    int rc = fl_comm_split(h->comm, 1, &h->topo.cross_rank, &me, &h->local);
    if (rc == FL_OK)
        rc = fl_comm_split(h->comm, 1, &h->topo.local_rank, &me, &h->cross);
    return rc;
}

static int make_buckets(fl_hier_t *h, const fl_hier_opts_t *o)
{
    h->b = calloc(o->nbuckets, sizeof *h->b);
    if (h->b == NULL)
        return fl_fail(FL_ENOMEM, "hier: out of memory for %zu buckets", o->nbuckets);
    h->nbuckets = o->nbuckets;
    int parts = h->hybrid ? h->topo.local_size : 1;
    int part = h->hybrid ? h->topo.local_rank : 0;
    for (size_t i = 0; i < o->nbuckets; i++) {
        hier_bucket_t *b = &h->b[i];
        if (o->bucket_name != NULL && o->bucket_name[i] != NULL)
            snprintf(b->name, sizeof b->name, "%s", o->bucket_name[i]);
        else
            snprintf(b->name, sizeof b->name, "%s bucket %zu", h->name, i);
        b->len = o->bucket_len[i];
        b->type = o->bucket_type != NULL ? o->bucket_type[i] : FL_FLOAT32;
        b->shard_off = fl_shard_offset(b->len, parts, part);
        b->shard_len = fl_shard_count(b->len, parts, part);
    }
    return FL_OK;
}

static int setup(fl_hier_t *h, const fl_hier_opts_t *o)
{
    int rc = fl_hier_topology(h->comm, &h->topo);
    if (rc == FL_OK)
        rc = pick_mode(h, o->hierarchy);
    if (rc == FL_OK && h->hybrid)
        rc = split(h);
    if (rc == FL_OK)
        rc = make_buckets(h, o);
    if (rc == FL_OK && h->density > 0)
        rc = fl_hier_topk_setup(h);
    if (rc == FL_OK && h->density > 0 && h->memory == FL_HIER_MEM_SIM)
        rc = fl_hier_dev_setup(h, FL_DEV_SIM, fl_comm_rank(h->comm));
    h->stats.hybrid = h->hybrid;
    h->stats.topo = h->topo;
    return rc;
}

int fl_hier_create(fl_comm_t *comm, const fl_hier_opts_t *o, fl_hier_t **out)
{
    *out = NULL;
    int rc = check_opts(comm, o);
    if (rc != FL_OK) {
        /* It still takes part in the agreement, so its peers are refused at once instead of
         * waiting for it until their deadline. */
        char why[512];
        snprintf(why, sizeof why, "%s", fl_last_error());
        if (comm != NULL)
            fl_hier_agree(comm, NULL);
        return fl_fail(rc, "%s", why);
    }
    rc = fl_hier_agree(comm, o);
    if (rc != FL_OK)
        return rc;
    fl_hier_t *h = calloc(1, sizeof *h);
    if (h == NULL)
        return fl_fail(FL_ENOMEM, "hier: out of memory");
    h->comm = comm;
    snprintf(h->name, sizeof h->name, "%s", o->name != NULL ? o->name : "gradient");
    h->density = o->density;
    h->values = o->values;
    h->max_norm = o->max_norm;
    h->memory = o->memory;
    rc = setup(h, o);
    if (rc != FL_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", fl_last_error());
        fl_hier_destroy(&h);
        return fl_fail(rc, "%s", why);
    }
    *out = h;
    return FL_OK;
}

void fl_hier_destroy(fl_hier_t **hp)
{
    fl_hier_t *h = hp != NULL ? *hp : NULL;
    if (h == NULL)
        return;
    for (size_t i = 0; h->b != NULL && i < h->nbuckets; i++) {
        fl_cmp_ef_destroy(&h->b[i].ef);
        free(h->b[i].idx);
        free(h->b[i].val);
    }
    free(h->b);
    fl_hier_dev_destroy(&h->dev);
    fl_cmp_ws_destroy(&h->ws);
    fl_comm_destroy(&h->cross);
    fl_comm_destroy(&h->local);
    free(h);
    *hp = NULL;
}

void fl_hier_get_stats(const fl_hier_t *h, fl_hier_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (h != NULL)
        *out = h->stats;
}
