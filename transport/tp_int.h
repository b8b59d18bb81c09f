/* Private layout of a transport socket, shared by tp_sock.c and tp_msg.c. */
#ifndef FL_TP_INT_H
#define FL_TP_INT_H

#include "fl_tp.h"

struct fl_tp_sock {
    fl_ctx_t *ctx;
    void *zs;
    fl_tp_kind_t kind;
    char name[64];
    size_t max_msg_bytes;
    /* stamp applied to outgoing headers, once set */
    bool stamped;
    char job_id[FL_JOB_MAX];
    uint64_t generation;
    int32_t sender;
    /* filter applied to incoming headers */
    bool expect_set;
    char expect_job[FL_JOB_MAX];
    uint64_t expect_gen;
};

/* Sets a ZeroMQ socket up as a CURVE server (before bind) or client (before connect) when
 * ctx has keys and the endpoint is not inproc (tp_curve.c). FL_OK or FL_EIO. */
int fl_tp_curve_server(void *zs, const fl_ctx_t *ctx, const char *endpoint);
int fl_tp_curve_client(void *zs, const fl_ctx_t *ctx, const char *endpoint);

#endif
