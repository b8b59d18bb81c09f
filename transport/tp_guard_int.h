/* The guard's state, shared by tp_guard.c (the monitor's events, the handshake caps) and
 * tp_guard_hold.c (the memory bounds). Internal to transport/. */
#ifndef FL_TP_GUARD_INT_H
#define FL_TP_GUARD_INT_H

#include "tp_int.h"

#include <netinet/in.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define CHUNK 1024        /* descriptors per table chunk */
#define MAX_FDS (1 << 22) /* descriptors beyond are not tracked */
#define MAX_LISTENERS 4
#define DEFAULT_IVL_MS 10000
#define DEFAULT_PER_ADDR 32
#define IDLE_GRACE_MS 1000             /* a connection this old that sent nothing is idle */
#define HOLD_LIMIT ((uint64_t)4 << 30) /* above, the default hold bound is none */
#define TICK_MS 20                     /* with a hold bound: how often the memory is looked at */
#define IDLE_TICK_MS 500
/* With no connection at all and nothing to give back, the guard sleeps until its monitor wakes
 * it (a connection accepted) or this long. */
#define IDLE_WAIT_MS 10000
#define SCAN_EVERY_MS 1000 /* every connection's bytes at least this often */
#define EVENTS_PER_ROUND 4096

enum { FREE = 0, PENDING, OPEN, CLOSING };
enum { BLAME_NONE = 0, BLAME_SECURITY };

typedef struct conn {
    uint8_t state;
    bool held_too_much; /* closed by the hold bound: memory to give back after */
    uint8_t addr[16];   /* IPv4 in the first four bytes */
    sa_family_t family;
    uint16_t port;
    int64_t since_ms;
    uint32_t live; /* index in g->live */
    fl_tp_hold_t hold;
} conn_t;

typedef struct chunk {
    conn_t conn[CHUNK];            /* the guard thread's */
    _Atomic uint64_t bytes[CHUNK]; /* taken by the owner, per descriptor, ever */
    _Atomic uint64_t frames[CHUNK];
} chunk_t;

struct fl_tp_guard {
    fl_ctx_t *ctx;
    char name[64];
    void *mon;
    void *stop_rx, *stop_tx;
    pthread_t thread;
    bool running;

    int ivl_ms;
    int pending_max;
    bool pending_auto; /* pending_max follows the limit on open files */
    int64_t limit_ms;  /* when the limit was read */
    int per_addr;
    uint64_t hold_max; /* 0: none */
    uint64_t fd_limit;
    bool curve;

    uint16_t lport[MAX_LISTENERS];
    int nlisteners;

    size_t nchunks;
    _Atomic(chunk_t *) *chunks;
    int *live; /* descriptors with a connection */
    size_t nlive, live_cap;
    int npending;
    int64_t unresolved; /* accepted minus handshakes that succeeded or failed */
    int blame;

    int statm;
    uint64_t held; /* this guard's share of the context's bytes held (fl_ctx_held_add) */
    uint64_t scan_rss;
    int64_t scan_ms;
    int64_t trim_ms; /* give memory back at this time (0: no) */
    int trims;

    fl_ratelog_t log_drop, log_security, log_near, log_accept, log_hold, log_process;
};

/* Helpers of tp_guard.c that the memory checks use. */
chunk_t *fl_tp_guard_chunk(fl_tp_guard_t *g, int fd);
conn_t *fl_tp_guard_conn(fl_tp_guard_t *g, int fd);
void fl_tp_guard_addr(const conn_t *c, char *out, size_t cap);
bool fl_tp_guard_reset(fl_tp_guard_t *g, int fd, const conn_t *c);

/* True when a bound applies to this guard's connections: its own for one connection, or the
 * process's (fl_ctx_held_max) over the guards of its context. A socket whose messages may be
 * as large as a shard has no bound of one connection, and still counts towards the process's. */
bool fl_tp_guard_holds(const fl_tp_guard_t *g);

/* Reads every connection's bytes held when due and closes those over the bounds. */
void fl_tp_guard_hold_check(fl_tp_guard_t *g, int64_t now);

#endif
