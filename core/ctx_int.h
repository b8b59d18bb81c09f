/* Private layout of fl_ctx, shared by ctx.c and log.c only. */
#ifndef FL_CTX_INT_H
#define FL_CTX_INT_H

#include "fl_core.h"

#include <pthread.h>
#include <stdatomic.h>

#define LOG_NAME_MAX 128

struct fl_ctx {
    void *zmq;
    size_t max_msg_bytes;
    size_t max_frames;
    _Atomic uint64_t held_max; /* 0: none; the guards read it on each look */
    _Atomic uint64_t held;     /* bytes the guards hold for incomplete messages, together */
    _Atomic int log_level;
    pthread_mutex_t name_lock; /* guards log_name, which another thread may rename */
    char log_name[LOG_NAME_MAX];
    _Atomic uint64_t stats[FL_STAT_COUNT];
    void *security; /* transport's CURVE state, freed before the ZeroMQ context ends */
    void (*security_free)(void *);
};

#endif
