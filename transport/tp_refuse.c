/* A sender of refused messages, cut off: a bound socket counts the malformed messages each
 * connection sends (bad header, magic or frames, over a size limit) and resets the connection
 * past a burst, so that one connection cannot keep the owner's loop busy refusing. A peer of
 * another job or version is not counted here: it is answered instead. The guard (tp_guard.c)
 * sees the reset as a plain disconnect. */
#include "tp_int.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define SLOTS 64 /* connections tracked at once; the oldest window is reused */

typedef struct slot {
    int fd; /* -1: free */
    uint32_t n;
    int64_t since_ms;
} slot_t;

struct fl_tp_refusals {
    slot_t slot[SLOTS];
    fl_ratelog_t log;
};

/* The connection's slot, or the one whose window is oldest (taken over, counted afresh). */
static slot_t *slot_of(fl_tp_refusals_t *r, int fd, int64_t now)
{
    slot_t *old = &r->slot[0];
    for (int i = 0; i < SLOTS; i++) {
        slot_t *s = &r->slot[i];
        if (s->fd == fd)
            return s;
        if (s->fd < 0 || s->since_ms < old->since_ms)
            old = s;
    }
    old->fd = fd;
    old->n = 0;
    old->since_ms = now;
    return old;
}

/* True when fd is still a TCP connection from addr (the address ZeroMQ gave with the message):
 * a descriptor closed and reused meanwhile is left alone. */
static bool still_from(int fd, const char *addr)
{
    struct sockaddr_storage peer;
    socklen_t len = sizeof peer;
    char text[INET6_ADDRSTRLEN];
    if (addr == NULL || getpeername(fd, (struct sockaddr *)&peer, &len) != 0)
        return false;
    const void *in =
        peer.ss_family == AF_INET    ? (const void *)&((struct sockaddr_in *)&peer)->sin_addr
        : peer.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&peer)->sin6_addr
                                     : NULL;
    return in != NULL && inet_ntop(peer.ss_family, in, text, sizeof text) != NULL &&
           strcmp(text, addr) == 0;
}

static void cut(fl_tp_sock_t *s, int fd, const char *addr, uint32_t n, int64_t now)
{
    fl_tp_refusals_t *r = s->refusals;
    if (!still_from(fd, addr))
        return;
    /* A reset, as the guard closes: the kernel drops what it queued, ZeroMQ reads an error and
     * closes the descriptor itself. */
    struct sockaddr unspec;
    memset(&unspec, 0, sizeof unspec);
    unspec.sa_family = AF_UNSPEC;
    if (connect(fd, &unspec, sizeof unspec) != 0)
        shutdown(fd, SHUT_RDWR);
    fl_ctx_count(s->ctx, FL_STAT_CONN_CUT, 1);
    char more[64];
    if (!fl_ratelog_say(&r->log, now, FL_TP_LOG_EVERY_MS, more, sizeof more))
        return;
    FL_WARN(s->ctx,
            "%s socket: closed the connection from %s: %u malformed messages within %d ms "
            "(at most %d; the last: %s)%s",
            s->name, addr, n, FL_TP_REFUSE_WINDOW_MS, FL_TP_REFUSE_BURST, fl_last_error(), more);
}

void fl_tp_refuse_note(fl_tp_sock_t *s, int fd, const char *addr, fl_stat_t why)
{
    if (fd < 0 || (why != FL_STAT_BAD_HEADER && why != FL_STAT_BAD_MAGIC &&
                   why != FL_STAT_BAD_FRAMES && why != FL_STAT_OVERSIZED))
        return;
    if (s->refusals == NULL) {
        if ((s->refusals = calloc(1, sizeof *s->refusals)) == NULL)
            return;
        for (int i = 0; i < SLOTS; i++)
            s->refusals->slot[i].fd = -1;
    }
    int64_t now = fl_now_ms();
    slot_t *k = slot_of(s->refusals, fd, now);
    if (now - k->since_ms > FL_TP_REFUSE_WINDOW_MS) {
        k->n = 0;
        k->since_ms = now;
    }
    if (++k->n <= FL_TP_REFUSE_BURST)
        return;
    cut(s, fd, addr, k->n, now);
    k->fd = -1;
}

void fl_tp_refuse_forget(fl_tp_sock_t *s)
{
    free(s->refusals);
    s->refusals = NULL;
}
