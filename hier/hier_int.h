/* The two-level exchange's insides, shared by its files (include/flodl/hier.h). */
#ifndef FL_HIER_INT_H
#define FL_HIER_INT_H

#include <flodl/compress.h>
#include <flodl/hier.h>

#include "fl_core.h"
#include "fl_dev.h"

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
    size_t res_off; /* on a device: where its residual starts in the residuals' buffer */
} hier_bucket_t;

/* Top-k on a device (hier_dev.c): every bucket's residual in one buffer there. */
typedef struct hier_dev {
    fl_dev_t *dev;
    fl_stream_t *s;
    fl_event_t *done;
    fl_dev_topk_t *topk;
    fl_dptr_t grad; /* the part being selected, staged */
    fl_dptr_t residual;
    fl_dptr_t idx, val, out;
    int64_t *hout;
    int wire;
} hier_dev_t;

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
    fl_hier_mem_t memory;
    hier_dev_t *dev; /* top-k on a device, or NULL */
};

/* Refuses options that differ between ranks, naming the rank, its host and both values.
 * o == NULL: this rank's own options were bad, and its peers are refused too. */
int fl_hier_agree(fl_comm_t *comm, const fl_hier_opts_t *o);

/* The top-k state of every bucket, sized to this rank's part of it. */
int fl_hier_topk_setup(fl_hier_t *h);

/* Top-k on a device: its residuals, workspace and stream; freed by fl_hier_dev_destroy. */
int fl_hier_dev_setup(fl_hier_t *h, fl_dev_kind_t kind, int id);
void fl_hier_dev_destroy(hier_dev_t **d);
/* Error feedback and top-k of part (bucket b's shard_len floats, host memory) on the device:
 * b->k pairs into b->idx and b->val. */
int fl_hier_dev_topk(fl_hier_t *h, hier_bucket_t *b, const float *part, size_t *k);
/* Copies bucket b's residual out (out != NULL) or in. */
int fl_hier_dev_residual(fl_hier_t *h, size_t b, float *out, const float *in);

#endif
