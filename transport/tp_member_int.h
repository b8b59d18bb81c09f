/* Private to transport/: a member's layout, shared by the join (tp_join.c) and the control
 * thread (tp_member.c). */
#ifndef FL_TP_MEMBER_INT_H
#define FL_TP_MEMBER_INT_H

#include <pthread.h>

#include "tp_int.h"

struct fl_tp_member {
    fl_ctx_t *ctx;
    char coordinator[FL_ENDPOINT_MAX];
    char job_id[FL_JOB_MAX];
    char name[96];
    int32_t sender;
    int rendezvous_timeout_ms;
    int reconnect_timeout_ms;

    fl_msg_hdr_t reg; /* the registration, kept for reconnects */
    bool have_reg;

    /* From the latest welcome. */
    uint64_t generation;
    int hb_ms;
    int hb_timeout_ms;

    fl_tp_sock_t *coord; /* DEALER; owned by the control thread once it runs */
    fl_tp_sock_t *ev_tx, *ev_rx;
    fl_tp_sock_t *cmd_tx, *cmd_rx;
    pthread_mutex_t cmd_lock; /* cmd_tx is used by cancel (any thread) and stop */
    pthread_t thread;
    bool started;

    /* Taps: more event pipes (sub-communicators, one per thread) that hear the fatal events.
     * The control thread sends on them under tap_lock; the owners read their own rx end. */
    pthread_mutex_t tap_lock;
    fl_tp_sock_t *tap_tx[FL_TP_MEMBER_MAX_TAPS];
    fl_tp_sock_t *tap_rx[FL_TP_MEMBER_MAX_TAPS];
    fl_msg_hdr_t fatal; /* the first fatal event posted, replayed to later taps */
    bool have_fatal;
    unsigned tap_serial;

    fl_tp_status_t status;
};

/* Sends a heartbeat with the owner's status; a full queue drops it. */
void fl_tp_member__heartbeat(fl_tp_member_t *m);

/* Registers and waits for the welcome until deadline. With cmd set, a stop command ends the
 * wait (FL_ECLOSED). Returns FL_OK with *welcome filled, or the refusal / timeout. */
int fl_tp_member__join_loop(fl_tp_member_t *m, int64_t deadline, int timeout_ms, fl_tp_sock_t *cmd,
                            fl_msg_hdr_t *welcome);

#endif
