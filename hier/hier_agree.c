/* The ranks of one engine must exchange the same buckets the same way: a rank whose options
 * differ is refused at creation, on every rank, before any bucket would mismatch in flight. */
#include "hier_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { F_MODE, F_NBUCKETS, F_ELEMS, F_LAYOUT, F_DENSITY, F_VALUES, F_NORM, F_MEMORY, NF };

static const char *mode_name(int64_t m)
{
    if (m < 0)
        return "none: options it refused itself";
    return m == FL_HIER_FLAT ? "flat" : m == FL_HIER_HYBRID ? "hybrid" : "auto";
}

static int64_t bits_of(double d)
{
    int64_t v;
    memcpy(&v, &d, sizeof v);
    return v;
}

static double double_of(int64_t v)
{
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}

/* FNV-1a over every bucket's length and type: equal layouts, equal hashes. */
static int64_t layout_hash(const fl_hier_opts_t *o)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t b = 0; b < o->nbuckets; b++) {
        uint64_t words[2] = {o->bucket_len[b],
                             o->bucket_type != NULL ? (uint64_t)o->bucket_type[b] : FL_FLOAT32};
        const unsigned char *p = (const unsigned char *)words;
        for (size_t i = 0; i < sizeof words; i++)
            h = (h ^ p[i]) * 1099511628211ULL;
    }
    return (int64_t)h;
}

/* o == NULL: the rank's options were bad; its peers see a hierarchy no one asks for. */
static void record(const fl_hier_opts_t *o, int64_t *rec)
{
    if (o == NULL) {
        memset(rec, 0, NF * sizeof *rec);
        rec[F_MODE] = -1;
        return;
    }
    int64_t elems = 0;
    for (size_t b = 0; b < o->nbuckets; b++)
        elems += (int64_t)o->bucket_len[b];
    rec[F_MODE] = o->hierarchy;
    rec[F_NBUCKETS] = (int64_t)o->nbuckets;
    rec[F_ELEMS] = elems;
    rec[F_LAYOUT] = layout_hash(o);
    rec[F_DENSITY] = bits_of(o->density);
    rec[F_VALUES] = o->values;
    rec[F_NORM] = bits_of(o->max_norm);
    rec[F_MEMORY] = o->memory;
}

/* "hierarchy=hybrid" for field f of a record. */
static void describe(const int64_t *rec, int f, char *out, size_t cap)
{
    switch (f) {
    case F_MODE: snprintf(out, cap, "hierarchy=%s", mode_name(rec[f])); break;
    case F_DENSITY: snprintf(out, cap, "top-k density %g", double_of(rec[f])); break;
    case F_VALUES: snprintf(out, cap, "top-k values %s", fl_dtype_name((fl_dtype_t)rec[f])); break;
    case F_NORM: snprintf(out, cap, "max_norm %g", double_of(rec[f])); break;
    case F_MEMORY:
        snprintf(out, cap, "top-k on %s",
                 rec[f] == FL_HIER_MEM_SIM ? "the sim device" : "the host");
        break;
    default:
        snprintf(out, cap, "a bucket layout of %lld buckets, %lld elements (hash %016llx)",
                 (long long)rec[F_NBUCKETS], (long long)rec[F_ELEMS],
                 (unsigned long long)rec[F_LAYOUT]);
    }
}

static const char *host_of(const fl_comm_t *comm, int r)
{
    const char *h = fl_comm_peer_host(comm, r);
    return h != NULL ? h : "?";
}

static int refuse(fl_comm_t *comm, const int64_t *all, int r, int f)
{
    char mine[160], ref[160];
    describe(all + (size_t)r * NF, f, mine, sizeof mine);
    describe(all, f, ref, sizeof ref);
    return fl_fail(FL_EINVAL,
                   "hier: the ranks disagree: rank %d (host %s) has %s, rank 0 (host %s) has %s; "
                   "every rank must give the same hierarchy, buckets and compression",
                   r, host_of(comm, r), mine, host_of(comm, 0), ref);
}

int fl_hier_agree(fl_comm_t *comm, const fl_hier_opts_t *o)
{
    int size = fl_comm_size(comm);
    int64_t *all = calloc((size_t)size * NF, sizeof *all);
    if (all == NULL)
        return fl_fail(FL_ENOMEM, "hier: out of memory for %d ranks' options", size);
    int64_t *mine = all + (size_t)fl_comm_rank(comm) * NF;
    record(o, mine);
    int rc = fl_allgather(comm, mine, all, (size_t)size * NF, FL_INT64);
    for (int r = 1; rc == FL_OK && r < size; r++)
        for (int f = 0; rc == FL_OK && f < NF; f++)
            if (all[(size_t)r * NF + f] != all[f])
                rc = refuse(comm, all, r, f);
    free(all);
    return rc;
}
