/* Bytes a connection makes this process hold: what ZeroMQ read from the kernel for it and the
 * owner has not taken yet. ZeroMQ delivers a multipart message only once its last frame has
 * arrived and bounds frames, not frames per message, so a peer can make it assemble a message
 * of any size; the kernel's counters and the owner's (fl_tp_guard_taken) are how the guard
 * sees it. Counters and the arithmetic here; the guard decides. */
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
        return 0;
    }
    int64_t allow = dt * PER_SECOND / 1000;
    h->base += held < allow ? held : allow;
    return (uint64_t)(unexplained - h->base);
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
