/* The two-level exchange's insides, shared by its files (include/flodl/hier.h). */
#ifndef FL_HIER_INT_H
#define FL_HIER_INT_H

#include <flodl/compress.h>
#include <flodl/hier.h>

#include "fl_core.h"

/* One bucket: its layout, this rank's part of it under hybrid, and its top-k state. */
typedef struct hier_bucket {
    char name[128];
    size_t len;
    fl_dtype_t type;
    size_t shard_off, shard_len; /* this rank's shard inside its host; all of it when flat */
    fl_cmp_ef_t *ef;             /* top-k only */
    fl_cmp_topk_opts_t topk;
    size_t k;
    uint32_t *idx;
    float *val;
    float *out; /* the sparse sum of shard_len floats */
} hier_bucket_t;

struct fl_hier {
    fl_comm_t *comm;  /* borrowed */
    fl_comm_t *local; /* hybrid: the host's ranks */
    fl_comm_t *cross; /* hybrid: the ranks holding the same shard on other hosts */
    fl_hier_topo_t topo;
    int hybrid;
    int failed; /* the first failure's code; later calls return FL_ECLOSED */
    char why[512];
    char name[64];
    double density;
    fl_dtype_t values;
    double max_norm;
    fl_cmp_ws_t *ws;
    fl_sparse_opts_t sparse;
    size_t nbuckets;
    hier_bucket_t *b;
    fl_hier_stats_t stats;
};

/* Refuses options that differ between ranks, naming the rank, its host and both values.
 * o == NULL: this rank's own options were bad, and its peers are refused too. */
int fl_hier_agree(fl_comm_t *comm, const fl_hier_opts_t *o);

/* The top-k state of every bucket, sized to this rank's part of it. */
int fl_hier_topk_setup(fl_hier_t *h);

#endif
