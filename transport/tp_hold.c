/* Bytes a connection makes this process hold: what ZeroMQ read from the kernel for it and the
 * owner has not taken yet. ZeroMQ delivers a multipart message only once its last frame has
 * arrived and bounds frames, not frames per message, so a peer can make it assemble a message
 * of any size; the kernel's counters and the owner's (fl_tp_guard_taken) are how the guard
 * sees it. Counters and the arithmetic here; the guard decides. Many connections, each under
 * the bound of one, can still hold more than the process has: the guards of one context add
 * up what theirs hold (fl_ctx_held_add) against a bound for the process. */
#include "tp_int.h"

#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

/* Generous overheads: a frame costs at most 9 bytes of framing and, under CURVE, 33 of command
 * name, nonce, flags and MAC; heartbeats both ways a few dozen bytes a second; a handshake with
 * its metadata well under 4 KiB. */
#define PER_FRAME 64
#define PER_SECOND 512
#define HANDSHAKE 4096

void fl_tp_hold_init(fl_tp_hold_t *h, uint64_t bytes, uint64_t frames, int64_t now_ms)
{
    h->bytes0 = bytes;
    h->frames0 = frames;
    h->base = HANDSHAKE;
    h->last_ms = now_ms;
    h->held = 0;
}

uint64_t fl_tp_hold_update(fl_tp_hold_t *h, uint64_t pulled, uint64_t bytes, uint64_t frames,
                           int64_t now_ms)
{
    int64_t taken = (int64_t)(bytes - h->bytes0) + PER_FRAME * (int64_t)(frames - h->frames0);
    int64_t unexplained = (int64_t)pulled - taken;
    int64_t dt = now_ms > h->last_ms ? now_ms - h->last_ms : 0;
    h->last_ms = now_ms;
    /* The overhead allowed grows with time only as it is used: a slow leak of heartbeats is
     * forgiven, a burst of bytes that never became a message is not. A message taken in the
     * meantime lowers what is unexplained; the base follows it down. */
    int64_t held = unexplained - h->base;
    if (held < 0) {
        h->base = unexplained;
        h->held = 0;
        return 0;
    }
    int64_t allow = dt * PER_SECOND / 1000;
    h->base += held < allow ? held : allow;
    h->held = (uint64_t)(unexplained - h->base);
    return h->held;
}

int fl_tp_hold_pulled(int fd, uint64_t *out)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    int queued = 0;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received ||
        ioctl(fd, SIOCINQ, &queued) != 0)
        return FL_EIO;
    uint64_t got = ti.tcpi_bytes_received;
    *out = got > (uint64_t)queued ? got - (uint64_t)queued : 0;
    return FL_OK;
}

uint64_t fl_tp_hold_received(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
        return 0;
    return ti.tcpi_bytes_received;
}

uint64_t fl_tp_hold_rss(int statm_fd)
{
    char text[128];
    ssize_t n = statm_fd >= 0 ? pread(statm_fd, text, sizeof text - 1, 0) : -1;
    if (n <= 0)
        return 0;
    text[n] = '\0';
    unsigned long long size = 0;
    unsigned long long resident = 0;
    if (sscanf(text, "%llu %llu", &size, &resident) != 2)
        return 0;
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

bool fl_tp_hold_over(const fl_ctx_t *ctx, uint64_t total)
{
    uint64_t bound = fl_ctx_held_max(ctx);
    return bound > 0 && total > bound;
}

void fl_tp_hold_cut_said(fl_ctx_t *ctx, const char *sock, const char *ip, uint64_t held,
                         uint64_t total, int64_t now, fl_ratelog_t *log)
{
    fl_ctx_count(ctx, FL_STAT_CONN_CUT, 1);
    char more[64];
    if (!fl_ratelog_say(log, now, FL_TP_LOG_EVERY_MS, more, sizeof more))
        return;
    FL_WARN(ctx,
            "%s socket: closed the connection from %s: it held %llu MiB of a message not yet "
            "complete, the most while this process held %llu MiB of those, over its bound of "
            "%llu MiB%s",
            sock, ip, (unsigned long long)(held >> 20), (unsigned long long)(total >> 20),
            (unsigned long long)(fl_ctx_held_max(ctx) >> 20), more);
}
