/* The health listener: /healthz alone, on a port of its own, served by one thread with poll()
 * and no HTTP library, so that no client can keep the probe from its answer. Each connection
 * lives at most DEADLINE_MS from its accept, however it trickles bytes, and when every slot is
 * taken the oldest connection is closed for the new one: idle or slow clients, from any
 * address (the probe's own included), cannot hold the listener. /metrics and its limits are
 * http.c's. */
#include "fl_obs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Connections held at once. Past this many the oldest is closed for each new one, so clients
 * that hold more shorten the time a new connection has to send its request: with 256, hundreds
 * of them still leave a probe tens of milliseconds, and a kubelet sends at once. */
#define SLOTS 256
#define DEADLINE_MS 2000 /* a connection's whole life: a probe needs milliseconds */
#define REQ_MAX 1024     /* request line and headers: a probe's take 100-200 bytes */
#define BACKLOG 1024     /* accepts queued while the thread works: a probe waits behind them */
/* Accepts per turn of the loop, half the slots: a connection whose request has not arrived at
 * its accept is still held at the next turn, whose reads come before its accepts. */
#define ACCEPTS_PER_TURN (SLOTS / 2)
#define PAUSE_MS 100 /* the listener rests after an accept fails for want of descriptors */

typedef struct conn {
    int fd; /* -1: a free slot */
    int64_t until_ms;
    uint64_t seq; /* accept order: the lowest is the oldest */
    size_t len;
    char req[REQ_MAX];
} conn_t;

struct fl_obs_healthz {
    int lfd;
    int wake[2]; /* a byte on wake[1] stops the thread */
    pthread_t th;
    fl_obs_health_fn health;
    void *ud;
    int port;
    uint64_t seq;
    int64_t pause_until_ms;
    conn_t c[SLOTS];
};

static void drop(conn_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->len = 0;
}

/* Closes a connection cut short (closed for a newer one, or past its deadline) with a reset:
 * no TIME_WAIT is left behind, which a client reconnecting from the same address and port
 * would run into (a probe from a busy address is refused there otherwise). */
static void cut(conn_t *c)
{
    struct linger abort_now = {.l_onoff = 1, .l_linger = 0};
    if (c->fd >= 0)
        (void)setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &abort_now, sizeof abort_now);
    drop(c);
}

/* True once the headers have ended (a blank line). */
static bool headers_done(const conn_t *c)
{
    for (size_t i = 1; i < c->len; i++)
        if (c->req[i] == '\n' &&
            (c->req[i - 1] == '\n' || (i >= 2 && c->req[i - 1] == '\r' && c->req[i - 2] == '\n')))
            return true;
    return false;
}

/* The status and body for the request line held in c. */
static unsigned route(fl_obs_healthz_t *h, const conn_t *c, bool *head, char *body, size_t cap)
{
    size_t end = strcspn(c->req, " \r\n");
    bool get = end == 3 && memcmp(c->req, "GET", 3) == 0;
    *head = end == 4 && memcmp(c->req, "HEAD", 4) == 0;
    if (!get && !*head) {
        snprintf(body, cap, "GET /healthz\n");
        return 405;
    }
    const char *path = c->req + end + (c->req[end] == ' ');
    size_t plen = strcspn(path, " ?\r\n");
    if (plen != 8 || memcmp(path, "/healthz", 8) != 0) {
        snprintf(body, cap, "not found: GET /healthz\n");
        return 404;
    }
    char why[512] = "";
    if (h->health == NULL || h->health(h->ud, why, sizeof why)) {
        snprintf(body, cap, "ok\n");
        return 200;
    }
    snprintf(body, cap, "%s\n", why[0] ? why : "unhealthy");
    return 503;
}

static void answer(fl_obs_healthz_t *h, conn_t *c)
{
    c->req[c->len < REQ_MAX ? c->len : REQ_MAX - 1] = '\0';
    bool head = false;
    char body[600];
    unsigned code = headers_done(c) ? route(h, c, &head, body, sizeof body) : 431;
    if (code == 431)
        snprintf(body, sizeof body, "request headers over %d bytes\n", REQ_MAX);
    const char *reason = code == 200   ? "OK"
                         : code == 503 ? "Service Unavailable"
                         : code == 404 ? "Not Found"
                         : code == 405 ? "Method Not Allowed"
                                       : "Request Header Fields Too Large";
    char out[800];
    int n = snprintf(out, sizeof out,
                     "HTTP/1.1 %u %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     code, reason, strlen(body), head ? "" : body);
    /* A fresh socket's send buffer holds far more than this: one write, never a wait. */
    if (n > 0)
        (void)send(c->fd, out, (size_t)n < sizeof out ? (size_t)n : sizeof out - 1,
                   MSG_NOSIGNAL | MSG_DONTWAIT);
    drop(c);
}

/* Reads what c has sent; answers once its headers are in (or too long), drops it at EOF. */
static void on_readable(fl_obs_healthz_t *h, conn_t *c)
{
    for (;;) {
        ssize_t r = recv(c->fd, c->req + c->len, REQ_MAX - 1 - c->len, 0);
        if (r > 0) {
            c->len += (size_t)r;
            if (headers_done(c) || c->len == REQ_MAX - 1) {
                answer(h, c);
                return;
            }
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            drop(c);
        return;
    }
}

/* A slot for a new connection: a free one, or the oldest's, after a last read (a probe whose
 * request came in since the last poll is answered, not dropped). */
static conn_t *slot_for_new(fl_obs_healthz_t *h)
{
    conn_t *old = NULL;
    for (int i = 0; i < SLOTS; i++) {
        if (h->c[i].fd < 0)
            return &h->c[i];
        if (old == NULL || h->c[i].seq < old->seq)
            old = &h->c[i];
    }
    on_readable(h, old);
    cut(old);
    return old;
}

/* Takes the connections queued, reading each at once: a probe's request is usually there. */
static void accept_some(fl_obs_healthz_t *h)
{
    for (int k = 0; k < ACCEPTS_PER_TURN; k++) {
        int fd = accept4(h->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                h->pause_until_ms = fl_now_ms() + PAUSE_MS; /* out of descriptors: no spin */
            return;
        }
        conn_t *c = slot_for_new(h);
        c->fd = fd;
        c->len = 0;
        c->seq = ++h->seq;
        c->until_ms = fl_now_ms() + DEADLINE_MS;
        on_readable(h, c);
    }
}

/* Closes the connections past their deadline; the time to the next one (ms, at most 1000). */
static int expire(fl_obs_healthz_t *h)
{
    int64_t now = fl_now_ms();
    int64_t wait = 1000;
    for (int i = 0; i < SLOTS; i++) {
        conn_t *c = &h->c[i];
        if (c->fd < 0)
            continue;
        if (c->until_ms <= now)
            cut(c);
        else if (c->until_ms - now < wait)
            wait = c->until_ms - now;
    }
    if (h->pause_until_ms > now && h->pause_until_ms - now < wait)
        wait = h->pause_until_ms - now;
    return (int)wait;
}

static void *serve(void *arg)
{
    fl_obs_healthz_t *h = arg;
    struct pollfd p[SLOTS + 2];
    int at[SLOTS + 2];
    for (;;) {
        int wait = expire(h);
        int n = 0;
        p[n++] = (struct pollfd){.fd = h->wake[0], .events = POLLIN};
        bool listening = fl_now_ms() >= h->pause_until_ms;
        p[n++] = (struct pollfd){.fd = listening ? h->lfd : -1, .events = POLLIN};
        for (int i = 0; i < SLOTS; i++) {
            if (h->c[i].fd < 0)
                continue;
            at[n] = i;
            p[n++] = (struct pollfd){.fd = h->c[i].fd, .events = POLLIN};
        }
        if (poll(p, (nfds_t)n, wait) < 0 && errno != EINTR)
            break;
        if (p[0].revents != 0)
            break;
        /* The connections held first, then new ones: a new one may close the oldest. */
        for (int k = 2; k < n; k++)
            if (p[k].revents != 0 && h->c[at[k]].fd == p[k].fd)
                on_readable(h, &h->c[at[k]]);
        if (p[1].revents != 0)
            accept_some(h);
    }
    return NULL;
}

static int listen_on(const char *addr, int port, int *out)
{
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        return fl_fail(FL_EINVAL, "health: '%s' is not an IPv4 address", addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    /* The kernel hands over a connection once its first bytes are in (or after a second):
     * a probe is accepted with its request, read and answered at once, before any newer
     * connection could take its slot, and idle clients wait outside the slots. */
    int defer_s = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer_s, sizeof defer_s) != 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, BACKLOG) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return fl_fail(FL_EIO, "health: cannot serve /healthz on %s:%d: %s (port taken?)", addr,
                       port, strerror(e));
    }
    *out = fd;
    return FL_OK;
}

int fl_obs_healthz_start(const char *bind_addr, int port, fl_obs_health_fn health, void *ud,
                         fl_obs_healthz_t **out)
{
    *out = NULL;
    if (port < 0 || port > 65535)
        return fl_fail(FL_EINVAL, "--health-port: %d is not a port", port);
    fl_obs_healthz_t *h = calloc(1, sizeof *h);
    if (h == NULL)
        return fl_fail(FL_ENOMEM, "health: out of memory");
    h->health = health;
    h->ud = ud;
    h->wake[0] = h->wake[1] = -1;
    for (int i = 0; i < SLOTS; i++)
        h->c[i].fd = -1;
    int rc = listen_on(bind_addr ? bind_addr : "0.0.0.0", port, &h->lfd);
    if (rc != FL_OK) {
        free(h);
        return rc;
    }
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    h->port = getsockname(h->lfd, (struct sockaddr *)&sa, &sl) == 0 ? ntohs(sa.sin_port) : port;
    if (pipe2(h->wake, O_CLOEXEC) != 0 || pthread_create(&h->th, NULL, serve, h) != 0) {
        if (h->wake[0] >= 0) {
            close(h->wake[0]);
            close(h->wake[1]);
        }
        close(h->lfd);
        free(h);
        return fl_fail(FL_EIO, "health: cannot start its thread");
    }
    *out = h;
    return FL_OK;
}

int fl_obs_healthz_port(const fl_obs_healthz_t *h)
{
    return h->port;
}

void fl_obs_healthz_stop(fl_obs_healthz_t **ph)
{
    if (ph == NULL || *ph == NULL)
        return;
    fl_obs_healthz_t *h = *ph;
    char b = 1;
    while (write(h->wake[1], &b, 1) < 0 && errno == EINTR)
        ;
    pthread_join(h->th, NULL);
    for (int i = 0; i < SLOTS; i++)
        drop(&h->c[i]);
    close(h->lfd);
    close(h->wake[0]);
    close(h->wake[1]);
    free(h);
    *ph = NULL;
}
