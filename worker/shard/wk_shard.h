/* worker/shard: the optimizer state as --shard splits it (shard.c) and the parameters sharded
 * too, ZeRO-3 (shard_full.c). Below the devices, which take --shard full's layers from here. */
#ifndef FL_WK_SHARD_H
#define FL_WK_SHARD_H

#include "fl_wk.h"

/* ---- the optimizer state as --shard splits it (shard.c) ---- */

typedef struct fl_wk_shards fl_wk_shards_t;

/* o->shard over np parameters for rank of world; cols: device t's column communicator across
 * hosts (o->replicas of them; NULL on one host), borrowed until destroy. FL_OK, FL_EINVAL (a
 * device would own nothing), FL_ENOMEM. */
int fl_wk_shards_create(const fl_wk_train_opts_t *o, size_t np, int rank, int world,
                        fl_comm_t **cols, fl_wk_shards_t **out);
void fl_wk_shards_destroy(fl_wk_shards_t **s);
const char *fl_wk_shard_name(fl_wk_shard_t m);

/* True when gradients and parameters travel as pieces across hosts (--shard grad). */
bool fl_wk_shards_across_hosts(const fl_wk_shards_t *s);

/* --shard grad: each column reduce-scatters its device's shard of grad (averaged) in place,
 * so this host holds its pieces; nothing otherwise. Collective errors. */
int fl_wk_shards_reduce(fl_wk_shards_t *s, float *grad);

/* Clips the averaged gradient by its global norm, computed from the owned pieces. */
int fl_wk_shards_clip(fl_wk_shards_t *s, float *grad, double max_norm);

/* Whether every owned piece of grad is finite, agreed across hosts when pieces travel (one
 * allreduce): FL_OK, or FL_ENONFINITE naming the index (or another rank's piece). */
int fl_wk_shards_check(fl_wk_shards_t *s, const float *grad);

/* All or nothing across hosts: bad (this rank's gradient piece is not finite) told to every
 * rank through col, one column whose allreduce reaches every rank (NULL: one host). FL_OK when
 * no other rank's piece is bad (this rank's own is the caller's to report), FL_ENONFINITE when
 * one is, or the allreduce's error. */
int fl_wk_shards_others_finite(fl_comm_t *col, bool bad);

/* The optimizer step on every owned piece (all or nothing: FL_ENONFINITE naming the index). */
int fl_wk_shards_step(fl_wk_shards_t *s, float *params, const float *grad, double lr);

/* --shard grad: each column all-gathers its device's shard of params from the pieces. */
int fl_wk_shards_gather(fl_wk_shards_t *s, float *params);

/* Optimizer-state bytes of the device that holds the most. */
size_t fl_wk_shards_state_bytes(const fl_wk_shards_t *s);

/* Bytes the column legs sent, and of them to other hosts. */
void fl_wk_shards_bytes(const fl_wk_shards_t *s, uint64_t *sent, uint64_t *remote);

/* The owned ranges: how many, range t's [off, off + len), its optimizer. */
int fl_wk_shards_count(const fl_wk_shards_t *s);
void fl_wk_shards_range(const fl_wk_shards_t *s, int t, size_t *off, size_t *len);
/* Device t's shard [off, off + len): the column it reduces and gathers across hosts (--shard
 * grad), the range it owns otherwise. */
void fl_wk_shards_column(const fl_wk_shards_t *s, int t, size_t *off, size_t *len);
fl_opt_t *fl_wk_shards_opt(fl_wk_shards_t *s, int t);

/* Range t of rank (of world ranks exchanging pieces; 1 on one host) under o->shard: a pure
 * function, so rank 0 can name every rank's ranges. */
void fl_wk_shards_layout(const fl_wk_train_opts_t *o, size_t np, int world, int rank, int t,
                         size_t *off, size_t *len);

/* ---- --shard full (shard_full.c): parameters sharded too (ZeRO-3) ---- */

typedef struct fl_wk_full fl_wk_full_t;

typedef struct fl_wk_full_stats {
    uint64_t sent, remote; /* bytes of the gathers and reduce-scatters, and to other hosts */
    uint64_t gets;         /* layers the devices asked for */
    uint64_t ready;        /* of which the gather had finished before (the prefetch hid it) */
    double wait_s;         /* devices' time waiting for gathers, summed */
    size_t peak_gathered;  /* most bytes of gathered layers alive at once */
    size_t pieces;         /* parameters a device owns (its pieces, padding included) */
} fl_wk_full_stats_t;

/* Layer `unit`'s elements and the piece each of world x replicas devices owns (padded up). */
void fl_wk_full_layout(const fl_mlp_shape_t *m, int world, int replicas, int unit, size_t *count,
                       size_t *piece);

/* o->replicas devices of rank (of world hosts) own their pieces of params (the same on every
 * rank); cols: device t's column across hosts (NULL on one host), borrowed until destroy. */
int fl_wk_full_create(const fl_wk_train_opts_t *o, int rank, int world, fl_comm_t **cols,
                      const float *params, fl_wk_full_t **out);
void fl_wk_full_destroy(fl_wk_full_t **z);

/* Replaces the pieces with params' (a resumed or loaded model). */
void fl_wk_full_scatter(fl_wk_full_t *z, const float *params);

/* Device t's layers for fl_mlp_grad_src during a step. */
const fl_mlp_src_t *fl_wk_full_src(fl_wk_full_t *z, int t);

/* A step: begin starts the gathers (a thread per column, at most one layer ahead of what every
 * device put back); each device calls device_done when its pass ended, failed or not; end waits
 * for the gathers and returns the first error (FL_ECLOSED when the devices stopped early). */
int fl_wk_full_begin(fl_wk_full_t *z);
void fl_wk_full_device_done(fl_wk_full_t *z, int t);
/* The device whose early end stopped the step, or -1 (after fl_wk_full_end). */
int fl_wk_full_first_failed(const fl_wk_full_t *z);
int fl_wk_full_end(fl_wk_full_t *z);

/* grad (the host's mean gradient, flat): each column reduce-scatters its shard of every layer
 * across hosts (averaged) into its device's gradient pieces. */
int fl_wk_full_reduce(fl_wk_full_t *z, const float *grad);

/* Clips the pieces by the global norm of the averaged gradient. */
int fl_wk_full_clip(fl_wk_full_t *z, double max_norm);

/* Every device steps its pieces (all or nothing across hosts, as fl_wk_shards_step). */
int fl_wk_full_step(fl_wk_full_t *z, double lr);

/* Every layer gathered into the flat params (evaluation, saving): every rank calls it. */
int fl_wk_full_materialize(fl_wk_full_t *z, float *params);

/* Per device: parameter bytes (its pieces plus the most gathered at once), optimizer state. */
void fl_wk_full_memory(const fl_wk_full_t *z, size_t *params, size_t *state);
void fl_wk_full_stats(const fl_wk_full_t *z, fl_wk_full_stats_t *out);

/* Device t's optimizer under --shard full (over its pieces, padding included). */
fl_opt_t *fl_wk_full_opt(fl_wk_full_t *z, int t);

#endif
