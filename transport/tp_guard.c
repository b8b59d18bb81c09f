/* The guard of a socket that accepts connections (a ROUTER bound on TCP): a thread reading the
 * socket's monitor (tp_watch.c) that
 *   - closes connections still in their handshake beyond a cap per source address and in all
 *     (the oldest one that has sent nothing for a second first, else the newcomer),
 *     so that idle or half-open connections from anyone cannot use up the descriptors the
 *     ranks need (ZMQ_HANDSHAKE_IVL ends each of them later anyway);
 *   - closes a connection that makes the process hold more than a bound of message bytes not
 *     yet taken (tp_guard_hold.c): ZeroMQ assembles a whole multipart message before the
 *     owner sees its first frame;
 *   - counts (conn_dropped, oversized, auth_refused) and logs, at most every 10 s per kind,
 *     what it closed, the plain-text clients CURVE refused, and a process near its limit on
 *     open files.
 * libzmq 4.3 gives no descriptor with HANDSHAKE_SUCCEEDED: a connection counts as in its
 * handshake until it has been open for the handshake interval, until no handshake is left
 * unresolved by the events' count, or until a success is matched to it by the bytes it sent.
 * A failed handshake's DISCONNECTED follows its failure event (tested with one I/O thread),
 * which names the address of a refused plain-text client. A connection is closed by
 * connect(AF_UNSPEC) on ZeroMQ's descriptor (a reset: the kernel drops what it queued, ZeroMQ
 * reads an error and closes the descriptor itself); the descriptor is checked to still be one
 * of this listener's connections first. */
#include "tp_guard_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

chunk_t *fl_tp_guard_chunk(fl_tp_guard_t *g, int fd)
{
    if (fd < 0 || (size_t)fd >= g->nchunks * CHUNK)
        return NULL;
    _Atomic(chunk_t *) *slot = &g->chunks[(size_t)fd / CHUNK];
    chunk_t *c = atomic_load_explicit(slot, memory_order_acquire);
    if (c != NULL)
        return c;
    /* The owner may get here first (a message read before the guard saw the connection). */
    chunk_t *fresh = calloc(1, sizeof *fresh);
    if (fresh == NULL)
        return NULL;
    chunk_t *expected = NULL;
    if (atomic_compare_exchange_strong_explicit(slot, &expected, fresh, memory_order_acq_rel,
                                                memory_order_acquire))
        return fresh;
    free(fresh);
    return expected;
}

void fl_tp_guard_taken(fl_tp_guard_t *g, int fd, uint64_t bytes, uint64_t frames)
{
    chunk_t *c = fl_tp_guard_chunk(g, fd);
    if (c == NULL)
        return;
    atomic_fetch_add_explicit(&c->bytes[fd % CHUNK], bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->frames[fd % CHUNK], frames, memory_order_relaxed);
}

void fl_tp_guard_addr(const conn_t *c, char *out, size_t cap)
{
    if (c->family == AF_INET || c->family == AF_INET6) {
        char ip[INET6_ADDRSTRLEN];
        inet_ntop(c->family, c->addr, ip, sizeof ip);
        snprintf(out, cap, "%s", ip);
    } else {
        snprintf(out, cap, "an unknown address");
    }
}

static bool same_addr(const conn_t *a, const conn_t *b)
{
    return a->family == b->family && memcmp(a->addr, b->addr, sizeof a->addr) == 0;
}

/* Reads the peer of fd into c; false when fd is no longer a connection of this listener. */
static bool read_peer(fl_tp_guard_t *g, int fd, conn_t *c)
{
    struct sockaddr_storage peer;
    struct sockaddr_storage self;
    socklen_t plen = sizeof peer;
    socklen_t slen = sizeof self;
    if (getpeername(fd, (struct sockaddr *)&peer, &plen) != 0 ||
        getsockname(fd, (struct sockaddr *)&self, &slen) != 0)
        return false;
    memset(c->addr, 0, sizeof c->addr);
    c->family = peer.ss_family;
    uint16_t lport = 0;
    if (peer.ss_family == AF_INET) {
        const struct sockaddr_in *p = (const struct sockaddr_in *)&peer;
        memcpy(c->addr, &p->sin_addr, 4);
        c->port = ntohs(p->sin_port);
        lport = ntohs(((const struct sockaddr_in *)&self)->sin_port);
    } else if (peer.ss_family == AF_INET6) {
        const struct sockaddr_in6 *p = (const struct sockaddr_in6 *)&peer;
        memcpy(c->addr, &p->sin6_addr, 16);
        c->port = ntohs(p->sin6_port);
        lport = ntohs(((const struct sockaddr_in6 *)&self)->sin6_port);
    } else {
        return false;
    }
    for (int i = 0; i < g->nlisteners; i++)
        if (g->lport[i] == lport)
            return true;
    return g->nlisteners == 0;
}

/* Resets a connection of this listener. False when the descriptor is no longer the one seen
 * (closed and reused meanwhile): nothing is done to it then. */
bool fl_tp_guard_reset(fl_tp_guard_t *g, int fd, const conn_t *c)
{
    conn_t now;
    if (!read_peer(g, fd, &now) || !same_addr(&now, c) || now.port != c->port)
        return false;
    struct sockaddr unspec;
    memset(&unspec, 0, sizeof unspec);
    unspec.sa_family = AF_UNSPEC;
    if (connect(fd, &unspec, sizeof unspec) != 0)
        shutdown(fd, SHUT_RDWR);
    return true;
}

static void live_add(fl_tp_guard_t *g, int fd, conn_t *c)
{
    if (g->nlive == g->live_cap) {
        size_t cap = g->live_cap ? g->live_cap * 2 : 256;
        int *l = realloc(g->live, cap * sizeof *l);
        if (l == NULL)
            return; /* untracked: it only escapes the caps */
        g->live = l;
        g->live_cap = cap;
    }
    c->live = (uint32_t)g->nlive;
    g->live[g->nlive++] = fd;
}

conn_t *fl_tp_guard_conn(fl_tp_guard_t *g, int fd)
{
    chunk_t *k = fl_tp_guard_chunk(g, fd);
    return k != NULL ? &k->conn[fd % CHUNK] : NULL;
}

static void forget(fl_tp_guard_t *g, int fd, conn_t *c)
{
    if (c->state == PENDING)
        g->npending--;
    if (c->state != FREE && c->live < g->nlive && g->live[c->live] == fd) {
        int last = g->live[--g->nlive];
        if (last != fd) {
            conn_t *m = fl_tp_guard_conn(g, last);
            if (m != NULL)
                m->live = c->live;
            g->live[c->live] = last;
        }
    }
    c->state = FREE;
    c->held_too_much = false;
}

static void settle(fl_tp_guard_t *g, conn_t *c)
{
    if (c->state == PENDING) {
        c->state = OPEN;
        g->npending--;
    }
}

static void settle_all(fl_tp_guard_t *g)
{
    for (size_t i = 0; i < g->nlive && g->npending > 0; i++)
        settle(g, fl_tp_guard_conn(g, g->live[i]));
    g->unresolved = 0;
}

/* Less cannot be a whole CURVE or NULL handshake. */
static uint64_t handshake_bytes(const fl_tp_guard_t *g)
{
    return g->curve ? 400 : 64;
}

/* A handshake succeeded, on a descriptor ZeroMQ does not name: the connection in its handshake
 * that has sent the most is taken (one that sent nothing, idle, cannot have completed it). */
static void settle_one(fl_tp_guard_t *g)
{
    uint64_t best = handshake_bytes(g);
    conn_t *pick = NULL;
    for (size_t i = 0; i < g->nlive && g->npending > 0; i++) {
        conn_t *c = fl_tp_guard_conn(g, g->live[i]);
        if (c->state != PENDING)
            continue;
        uint64_t got = fl_tp_hold_received(g->live[i]);
        if (got >= best) {
            best = got;
            pick = c;
        }
    }
    if (pick != NULL)
        settle(g, pick);
}

static void drop(fl_tp_guard_t *g, int fd, conn_t *c, int from_addr, int64_t now)
{
    if (!fl_tp_guard_reset(g, fd, c))
        return;
    if (c->state == PENDING)
        g->npending--;
    c->state = CLOSING;
    fl_ctx_count(g->ctx, FL_STAT_CONN_DROPPED, 1);
    char more[64];
    if (fl_ratelog_say(&g->log_drop, now, FL_TP_LOG_EVERY_MS, more, sizeof more)) {
        char ip[INET6_ADDRSTRLEN + 32];
        fl_tp_guard_addr(c, ip, sizeof ip);
        FL_WARN(g->ctx,
                "%s socket: closed a connection from %s in its handshake: %d from that address "
                "and %d in all are in theirs (at most %d and %d; a handshake must end within "
                "%d ms)%s",
                g->name, ip, from_addr, g->npending, g->per_addr, g->pending_max, g->ivl_ms, more);
    }
}

static void near_limit(fl_tp_guard_t *g, int fd, int64_t now)
{
    char more[64];
    if (g->fd_limit == UINT64_MAX || (uint64_t)fd + 1 < g->fd_limit - g->fd_limit / 10 ||
        !fl_ratelog_say(&g->log_near, now, FL_TP_LOG_EVERY_MS, more, sizeof more))
        return;
    FL_WARN(g->ctx,
            "%s socket: at least %d of this process's %llu descriptors are open: near "
            "its limit on open files (raise it: ulimit -n, LimitNOFILE)",
            g->name, fd + 1, (unsigned long long)g->fd_limit);
}

/* The oldest connection in its handshake (from c's address when same_only) that has been open
 * IDLE_GRACE_MS and has not sent even the 10-byte ZMTP signature, which every client sends at
 * once: -1 when there is none. */
static int idle_victim(fl_tp_guard_t *g, const conn_t *c, bool same_only, int64_t now)
{
    int oldest = -1;
    int64_t since = now - IDLE_GRACE_MS;
    for (size_t i = 0; i < g->nlive; i++) {
        const conn_t *o = fl_tp_guard_conn(g, g->live[i]);
        if (o != c && o->state == PENDING && o->since_ms <= since &&
            (!same_only || same_addr(o, c))) {
            oldest = g->live[i];
            since = o->since_ms;
        }
    }
    return oldest >= 0 && fl_tp_hold_received(oldest) < 10 ? oldest : -1;
}

static void on_accepted(fl_tp_guard_t *g, int fd, int64_t now)
{
    g->unresolved++;
    near_limit(g, fd, now);
    conn_t *c = fl_tp_guard_conn(g, fd);
    if (c == NULL)
        return;
    if (c->state != FREE) /* its DISCONNECTED was not seen: the descriptor is a new one now */
        forget(g, fd, c);
    if (!read_peer(g, fd, c))
        return; /* gone already, and its number maybe reused by another socket */
    chunk_t *k = fl_tp_guard_chunk(g, fd);
    fl_tp_hold_init(&c->hold, atomic_load_explicit(&k->bytes[fd % CHUNK], memory_order_relaxed),
                    atomic_load_explicit(&k->frames[fd % CHUNK], memory_order_relaxed), now);
    c->since_ms = now;
    c->held_too_much = false;
    int from_addr = 0;
    for (size_t i = 0; i < g->nlive; i++) {
        const conn_t *o = fl_tp_guard_conn(g, g->live[i]);
        if (o->state == PENDING && same_addr(o, c))
            from_addr++;
    }
    c->state = PENDING;
    g->npending++;
    live_add(g, fd, c);
    if (from_addr < g->per_addr && g->npending <= g->pending_max)
        return;
    /* The event may be late: the descriptor can already hold a newer connection that finished
     * its handshake (the one seen was closed, its number reused), a rank that registered. */
    if (fl_tp_hold_received(fd) >= handshake_bytes(g)) {
        settle(g, c);
        return;
    }
    /* Over a cap: an idle connection makes room rather than the newcomer, so that a flood of
     * idle connections from the ranks' own address cannot keep them out. */
    int victim = idle_victim(g, c, from_addr >= g->per_addr, now);
    if (victim >= 0)
        drop(g, victim, fl_tp_guard_conn(g, victim), from_addr, now);
    else
        drop(g, fd, c, from_addr, now);
}

static void on_disconnected(fl_tp_guard_t *g, int fd, int64_t now)
{
    conn_t *c = fl_tp_guard_conn(g, fd);
    int blame = g->blame;
    g->blame = BLAME_NONE;
    bool known = c != NULL && c->state != FREE;
    char more[64];
    if (blame == BLAME_SECURITY &&
        fl_ratelog_say(&g->log_security, now, FL_TP_LOG_EVERY_MS, more, sizeof more)) {
        char ip[INET6_ADDRSTRLEN + 32];
        if (known) /* a quick refusal can be over before its address is read */
            fl_tp_guard_addr(c, ip, sizeof ip);
        else
            snprintf(ip, sizeof ip, "an address gone before it was read");
        FL_WARN(g->ctx, "%s socket: refused a connection from %s: it speaks %s, this socket %s%s",
                g->name, ip, g->curve ? "plain text" : "CURVE",
                g->curve ? "CURVE (only allowed keys get in)" : "plain text", more);
    }
    if (!known)
        return;
    if (c->held_too_much) {
        g->trim_ms = now + 2 * TICK_MS; /* ZeroMQ frees the message as it closes */
        g->trims = 2;
    } /* ZeroMQ frees the message when it closes */
    forget(g, fd, c);
}

static void on_failed(fl_tp_guard_t *g, const fl_tp_event_t *ev)
{
    g->unresolved--;
    if (ev->type == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
        ev->value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
        /* An unknown key is counted by the ZAP handler; a client in the other security never
         * reaches it. */
        fl_ctx_count(g->ctx, FL_STAT_AUTH_REFUSED, 1);
        g->blame = BLAME_SECURITY;
    }
}

static void on_listening(fl_tp_guard_t *g, int fd)
{
    struct sockaddr_storage self;
    socklen_t slen = sizeof self;
    if (g->nlisteners == MAX_LISTENERS || getsockname(fd, (struct sockaddr *)&self, &slen) != 0)
        return;
    if (self.ss_family == AF_INET)
        g->lport[g->nlisteners++] = ntohs(((const struct sockaddr_in *)&self)->sin_port);
    else if (self.ss_family == AF_INET6)
        g->lport[g->nlisteners++] = ntohs(((const struct sockaddr_in6 *)&self)->sin6_port);
}

static void on_event(fl_tp_guard_t *g, const fl_tp_event_t *ev, int64_t now)
{
    char more[64];
    switch (ev->type) {
    case ZMQ_EVENT_LISTENING: on_listening(g, (int)ev->value); break;
    case ZMQ_EVENT_ACCEPTED: on_accepted(g, (int)ev->value, now); break;
    case ZMQ_EVENT_DISCONNECTED: on_disconnected(g, (int)ev->value, now); break;
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        g->unresolved--;
        settle_one(g);
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: on_failed(g, ev); break;
    case ZMQ_EVENT_ACCEPT_FAILED:
        if ((ev->value == EMFILE || ev->value == ENFILE) &&
            fl_ratelog_say(&g->log_accept, now, FL_TP_LOG_EVERY_MS, more, sizeof more))
            FL_WARN(g->ctx,
                    "%s socket: cannot accept connections: out of descriptors (limit on "
                    "open files %llu; raise it: ulimit -n, LimitNOFILE)",
                    g->name, (unsigned long long)g->fd_limit);
        break;
    default: break;
    }
    if (g->unresolved <= 0 && g->npending > 0)
        settle_all(g);
}

/* A connection open for longer than the handshake interval has completed its handshake:
 * ZeroMQ closes it otherwise. */
static void expire(fl_tp_guard_t *g, int64_t now)
{
    for (size_t i = 0; i < g->nlive && g->npending > 0; i++) {
        conn_t *c = fl_tp_guard_conn(g, g->live[i]);
        if (c->state == PENDING && now - c->since_ms > (int64_t)g->ivl_ms + 1000)
            settle(g, c);
    }
}

/* Reads the limit on open files (the binaries raise it once their sockets exist) and the cap
 * that follows it. */
static void read_limit(fl_tp_guard_t *g, int64_t now)
{
    g->fd_limit = fl_fdlimit_soft();
    g->limit_ms = now;
    if (!g->pending_auto)
        return;
    uint64_t quarter = g->fd_limit == UINT64_MAX ? 4096 : g->fd_limit / 4;
    g->pending_max = quarter < 64 ? 64 : quarter > 4096 ? 4096 : (int)quarter;
}

/* How long the guard may sleep: its memory checks and handshakes need a look every tick while
 * there is a connection. With none, and its share of the process's bytes held given back (the
 * next scan after the last one closed), nothing can be held or be in its handshake until the
 * monitor says a connection was accepted, which wakes the poll. */
static int next_wait(const fl_tp_guard_t *g, int64_t now)
{
    int wait = g->nlive == 0 && g->held == 0 ? IDLE_WAIT_MS
               : fl_tp_guard_holds(g)        ? TICK_MS
                                             : IDLE_TICK_MS;
    if (g->trim_ms != 0 && g->trim_ms - now < wait)
        wait = g->trim_ms > now ? (int)(g->trim_ms - now) : 0;
    return wait;
}

static void *guard_main(void *arg)
{
    fl_tp_guard_t *g = arg;
    for (;;) {
        zmq_pollitem_t items[2] = {{g->mon, 0, ZMQ_POLLIN, 0}, {g->stop_rx, 0, ZMQ_POLLIN, 0}};
        int rc = zmq_poll(items, 2, next_wait(g, fl_now_ms()));
        if (rc < 0 && zmq_errno() != EINTR)
            break;
        if (rc > 0 && (items[1].revents & ZMQ_POLLIN))
            break;
        int64_t now = fl_now_ms();
        if (now - g->limit_ms >= 1000)
            read_limit(g, now);
        for (int n = 0; n < EVENTS_PER_ROUND; n++) {
            fl_tp_event_t ev;
            if (fl_tp_monitor_read(g->mon, &ev) != 1)
                break;
            on_event(g, &ev, now);
        }
        expire(g, now);
        if (fl_tp_guard_holds(g))
            fl_tp_guard_hold_check(g, now);
        if (g->trim_ms != 0 && now >= g->trim_ms) {
            /* A process tuned to keep freed memory (fl_malloc_tune) would hold it for good.
             * Once more a second later, for what ZeroMQ's I/O thread freed late. */
            malloc_trim(0);
            g->trim_ms = --g->trims > 0 ? now + 1000 : 0;
        }
    }
    zmq_close(g->mon);
    g->mon = NULL;
    return NULL;
}

static void guard_free(fl_tp_guard_t *g)
{
    fl_ctx_held_add(g->ctx, -(int64_t)g->held);
    if (g->stop_tx != NULL)
        zmq_close(g->stop_tx);
    if (g->stop_rx != NULL)
        zmq_close(g->stop_rx);
    if (g->chunks != NULL)
        for (size_t i = 0; i < g->nchunks; i++)
            free(atomic_load(&g->chunks[i]));
    free((void *)g->chunks);
    free(g->live);
    if (g->statm >= 0)
        close(g->statm);
    free(g);
}

static void settings(fl_tp_guard_t *g, const fl_tp_sock_t *s)
{
    g->ivl_ms = s->handshake_ivl_ms > 0 ? s->handshake_ivl_ms : DEFAULT_IVL_MS;
    g->per_addr = s->pending_per_addr > 0 ? s->pending_per_addr : DEFAULT_PER_ADDR;
    g->pending_auto = s->pending_max == 0;
    g->pending_max = s->pending_max;
    read_limit(g, fl_now_ms());
    uint64_t frames = fl_ctx_max_frames(s->ctx) + 1;
    if (s->hold_max_bytes == SIZE_MAX)
        g->hold_max = 0;
    else if (s->hold_max_bytes > 0)
        g->hold_max = s->hold_max_bytes;
    else if (s->max_msg_bytes <= HOLD_LIMIT / frames)
        g->hold_max = frames * s->max_msg_bytes;
    /* Sized for the hard limit: the soft one may be raised later. */
    struct rlimit r;
    uint64_t fds =
        getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_max == RLIM_INFINITY || r.rlim_max > MAX_FDS
            ? MAX_FDS
            : (uint64_t)r.rlim_max;
    g->nchunks = (size_t)(fds + CHUNK - 1) / CHUNK;
    g->curve = fl_tp_curve_on(s->ctx);
}

int fl_tp_guard_start(fl_tp_sock_t *s, const char *endpoint)
{
    if (s->kind != FL_TP_ROUTER || strncmp(endpoint, "tcp://", 6) != 0 || s->guard != NULL)
        return FL_OK;
    fl_tp_guard_t *g = calloc(1, sizeof *g);
    if (g == NULL)
        return fl_fail(FL_ENOMEM, "%s socket: out of memory for its guard", s->name);
    g->ctx = s->ctx;
    g->statm = -1;
    snprintf(g->name, sizeof g->name, "%s", s->name);
    settings(g, s);
    g->chunks = calloc(g->nchunks, sizeof *g->chunks);
    if (g->chunks == NULL) {
        guard_free(g);
        return fl_fail(FL_ENOMEM, "%s socket: out of memory for its guard", s->name);
    }
    /* Always: the context's bound may be set after the socket is bound (fl_ctx_set_held_max). */
    g->statm = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    void *z = fl_ctx_zmq(s->ctx);
    char stop_ep[96];
    snprintf(stop_ep, sizeof stop_ep, "inproc://flodl-guard-stop-%p", (void *)g);
    int zero = 0;
    g->stop_rx = zmq_socket(z, ZMQ_PAIR);
    g->stop_tx = zmq_socket(z, ZMQ_PAIR);
    int rc = FL_OK;
    if (g->stop_rx == NULL || g->stop_tx == NULL ||
        zmq_setsockopt(g->stop_rx, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(g->stop_tx, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_bind(g->stop_rx, stop_ep) != 0 || zmq_connect(g->stop_tx, stop_ep) != 0 ||
        zmq_setsockopt(s->zs, ZMQ_HANDSHAKE_IVL, &g->ivl_ms, sizeof g->ivl_ms) != 0)
        rc = fl_fail(FL_EIO, "%s socket: guard: %s", s->name, zmq_strerror(zmq_errno()));
    /* With a hold bound, the bound decides about frames up to it (read, refused with an answer,
     * counted) rather than ZeroMQ, which drops the connection of a larger frame without a word:
     * its monitor reports that as a plain disconnect. */
    int64_t frame_max =
        (int64_t)(s->max_msg_bytes * 2 > g->hold_max ? s->max_msg_bytes * 2 : g->hold_max);
    if (rc == FL_OK && g->hold_max > 0 &&
        zmq_setsockopt(s->zs, ZMQ_MAXMSGSIZE, &frame_max, sizeof frame_max) != 0)
        rc = fl_fail(FL_EIO, "%s socket: set MAXMSGSIZE: %s", s->name, zmq_strerror(zmq_errno()));
    if (rc == FL_OK)
        rc = fl_tp_monitor_open(z, s->zs,
                                ZMQ_EVENT_LISTENING | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_ACCEPT_FAILED |
                                    ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                                    ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                    ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                    ZMQ_EVENT_HANDSHAKE_FAILED_AUTH,
                                &g->mon);
    if (rc == FL_OK && pthread_create(&g->thread, NULL, guard_main, g) != 0) {
        fl_tp_monitor_close(s->zs, &g->mon);
        rc = fl_fail(FL_EIO, "%s socket: cannot start its guard thread", s->name);
    }
    if (rc != FL_OK) {
        guard_free(g);
        return rc;
    }
    g->running = true;
    s->guard = g;
    return FL_OK;
}

void fl_tp_guard_stop(fl_tp_sock_t *s)
{
    fl_tp_guard_t *g = s->guard;
    if (g == NULL)
        return;
    /* The monitor first, from the socket's thread: ZeroMQ blocks sending an event to a pipe
     * nobody reads. */
    fl_tp_monitor_stop(s->zs);
    zmq_send(g->stop_tx, "", 0, 0);
    pthread_join(g->thread, NULL);
    guard_free(g);
    s->guard = NULL;
}
