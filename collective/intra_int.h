/* Private to the intra-host collectives: the handle every implementation shares and the table
 * each fills. intra.c checks arguments, keeps the per-device events that fl_intra_wait polls and
 * the error a handle keeps; intra_copy.c, intra_host.c and intra_nccl.c queue the work. */
#ifndef FL_INTRA_INT_H
#define FL_INTRA_INT_H

#include "fl_intra.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum intra_op {
    INTRA_RS = 0, /* reduce-scatter */
    INTRA_AG,     /* all-gather */
    INTRA_BCAST,  /* broadcast */
} intra_op_t;

const char *fl_intra_op_name(intra_op_t op);

typedef struct intra_backend {
    const char *name;
    /* Sets x->impl (may leave it NULL). FL_OK or the reason these devices cannot be served. */
    int (*open)(fl_intra_t *x);
    void (*close)(fl_intra_t *x);
    /* Queue the operation: S the shard's elements (RS, AG), count the elements (BCAST). */
    int (*reduce_scatter)(fl_intra_t *x, const fl_dptr_t *bufs, size_t S, fl_op_t op,
                          fl_stream_t *const *st);
    int (*allgather)(fl_intra_t *x, const fl_dptr_t *bufs, size_t S, fl_stream_t *const *st);
    int (*broadcast)(fl_intra_t *x, const fl_dptr_t *bufs, size_t count, int root,
                     fl_stream_t *const *st);
    /* While fl_intra_wait polls (NULL: nothing to poll): FL_OK, or an asynchronous failure. */
    int (*poll)(fl_intra_t *x);
    /* The deadline passed: stop what is blocked on the devices (NULL: nothing to stop). */
    void (*abort)(fl_intra_t *x);
} intra_backend_t;

struct fl_intra {
    const intra_backend_t *be;
    fl_intra_impl_t kind;
    int L;
    fl_dev_t *devs[FL_INTRA_MAX_DEVICES];
    int timeout_ms;
    char host[128];
    fl_event_t *fin[FL_INTRA_MAX_DEVICES]; /* recorded after each call: what wait polls */
    intra_op_t last;                       /* the last call's operation */
    bool queued;                           /* a call since the last wait */
    int rc;                                /* sticky: a handle whose communicator was aborted */
    char err[512];
    void *impl;
};

extern const intra_backend_t fl_intra_copy_backend;
extern const intra_backend_t fl_intra_host_backend;
extern const intra_backend_t fl_intra_nccl_backend; /* intra_nccl.c, or intra_nonccl.c */

/* Marks the handle failed for good and returns rc (the thread's detail text is kept). */
int fl_intra_set_failed(fl_intra_t *x, int rc);

#ifdef __cplusplus
}
#endif

#endif
