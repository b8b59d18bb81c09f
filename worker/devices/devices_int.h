/* Private to the devices*.c files: the devices of a worker process, each a replica with its
 * device (replica_dev.c), its sampler and its share of the step in progress, and the pool of
 * threads that drive them. */
#ifndef FL_WK_DEVICES_INT_H
#define FL_WK_DEVICES_INT_H

#include <pthread.h>

#include "wk_devices.h"

typedef struct replica {
    fl_wk_devices_t *d;
    fl_sampler_t smp;
    fl_wk_rdev_t *rd;
    uint32_t *idx;
    uint32_t *next_idx; /* the batch after, staged while this one computes */
    float *grad;        /* device 0's gradient lands straight in the caller's */
    double loss;
    size_t correct;
    int rc;
    char err[512];
    int j;
    double throttle;
    /* El Che: this sync's batches, their first index in the host's sequence, the gradient of
     * one batch before it is added (NULL until needed), mean seconds per batch */
    int count;
    size_t first;
    float *one;
    double batch_s;
    fl_wk_bclock_t clock; /* its batch_s, from events on its compute stream */
    /* --policy cadence (local SGD): the device's own parameters (during a round; its delta from
     * the round's start after) and optimizer */
    float *own;
    fl_opt_t *opt;
    bool registered; /* grad is page-locked for the device */
    /* the device made current on its thread (once on its own, each run on the caller's for
     * device 0): the outcome, and its text when it failed */
    bool bound;
    int brc;
    char berr[512]; /* as err */
} replica_t;

struct fl_wk_devices {
    const fl_mlp_shape_t *m;
    const fl_dataset_t *train;
    size_t batch;
    int n;
    int rank;
    size_t np;
    fl_wk_local_t local;
    double max_norm;
    fl_obs_timeline_t *tl;
    /* El Che: the host's share of each epoch, in one sequence the devices take batches from */
    fl_sampler_t host;
    bool have_host;
    bool cadence; /* the step in progress is a cadence step */
    /* the local round in progress */
    bool local_sgd;
    const float *round_start;
    const fl_lr_sched_t *sched;
    double step0;
    /* FL_WK_LOCAL_SHARDS: a barrier once every gradient is there (abortable, for a step whose
     * threads did not all start) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    bool aborted;
    bool have_barrier;
    /* the first leg overlapped with the backward pass (devices_overlap.c): devices that
     * finished each layer this step (under mu), whether this step's exchange reduces */
    bool overlap;
    int layer_told[FL_MLP_MAX_LAYERS];
    bool reducing;
    replica_t rep[FL_DEV_MAX_DEVICES];
    /* The two-level exchange on sim and cuda devices: the reduce-scatter of the gradients
     * that stay on the devices (fl_intra.h), on a stream of its own per device behind the
     * compute stream's end (NULL: cpu replicas, reduced in host memory by reduce_shard) */
    fl_intra_t *intra;
    fl_stream_t *xs[FL_DEV_MAX_DEVICES];
    fl_event_t *computed[FL_DEV_MAX_DEVICES];
    fl_event_t *updated[FL_DEV_MAX_DEVICES];  /* device j's update has run (its compute stream) */
    fl_event_t *gathered[FL_DEV_MAX_DEVICES]; /* resident ranges all-gathered on the devices */
    bool keep_shards; /* the reduced shards stay on the devices (top-k there) */
    /* ... device j's part of the mean is done (keep_shards) */
    fl_event_t *reduced[FL_DEV_MAX_DEVICES];
    /* ... overlapped with the backward pass (devices_overlap.c): bucket l is
     * [leg_edge[l], leg_edge[l + 1]), queued once every device finished layer l; leg_next: the
     * layers below it are not queued yet this step; landed[l][j] is recorded on xs[j] after
     * device j's piece of bucket l reached the host; the first error queueing them. leg_mu
     * guards these and makes one thread at a time use intra. */
    pthread_mutex_t leg_mu;
    bool have_leg_mu;
    size_t leg_edge[FL_MLP_MAX_LAYERS + 1];
    int leg_next;
    fl_event_t *landed[FL_MLP_MAX_LAYERS][FL_DEV_MAX_DEVICES];
    int leg_rc;
    char leg_err[512];
    fl_wk_full_t *full; /* --shard full: layers gathered from their shards (NULL: params) */
    /* the step in progress */
    const float *params;
    size_t cur_batch;
    fl_wk_ready_fn ready;
    void *ud;
    long epoch;
    /* resident parameters (fl_wk_devices_keep) */
    bool resident;
    bool keep_grad;
    bool shared; /* cpu: the devices' parameters are one host buffer, device 0 steps it */
    /* the update in progress */
    bool updating;
    const float *upd_grad;
    double upd_norm;
    double upd_lr;
    /* the device threads: device j's job on thread j for the run, device 0's on the caller's */
    fl_fanout_t *pool;
};

/* Overlap (devices_overlap.c): d's steps leave the first leg to the exchange; a device's pass
 * tells layers through layer_told (ud: its replica). */
bool fl_wk_devices_overlapped(const fl_wk_devices_t *d);
void fl_wk_devices_layer_told(int layer, void *ud);
/* The intra-host leg of an overlapped step: before the devices run (the last step's queued
 * reduce-scatters done, nothing queued yet), after (the first error queueing a bucket), and
 * its buckets' events and lock freed (before the intra handle). */
int fl_wk_devices_leg_begin(fl_wk_devices_t *d);
int fl_wk_devices_leg_end(const fl_wk_devices_t *d);
void fl_wk_devices_leg_destroy(fl_wk_devices_t *d);

/* --throttle: device r takes `throttle` times its compute time since t0 (a sleep). */
void fl_wk_devices_throttle(const replica_t *r, int64_t t0);

/* El Che (devices_cadence.c): device r's batches of the host's sequence in a cadence step. */
void fl_wk_devices_cadence_batches(fl_wk_devices_t *d, replica_t *r);

/* Every device runs the run's work once (a step, or the update when d->updating); returns when
 * all have. Device 0 runs on the calling thread. */
void fl_wk_devices_run_all(fl_wk_devices_t *d);

#endif
