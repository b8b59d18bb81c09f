/* Helpers of the suites that scrape a metrics endpoint (see obsutil.h). */
#include "obsutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int64_t fl_test_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int fl_test_http_get(int port, const char *path, char **body)
{
    *body = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap)
            buf = realloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    int code = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1)
        code = -1;
    char *sep = strstr(buf, "\r\n\r\n");
    *body = strdup(sep ? sep + 4 : "");
    free(buf);
    return code;
}

static bool name_char(char c, bool first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
           (!first && c >= '0' && c <= '9');
}

bool fl_test_exposition_valid(const char *text, char *err, size_t cap)
{
    char typed[256][128];
    bool histo[256];
    int ntyped = 0;
    int lineno = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        if (nl == NULL) {
            snprintf(err, cap, "the text does not end with a newline");
            return false;
        }
        char line[1024];
        size_t l = (size_t)(nl - p) < sizeof line - 1 ? (size_t)(nl - p) : sizeof line - 1;
        memcpy(line, p, l);
        line[l] = '\0';
        p = nl + 1;
        lineno++;
        if (strncmp(line, "# HELP ", 7) == 0)
            continue;
        if (strncmp(line, "# TYPE ", 7) == 0) {
            char name[128], kind[32];
            if (sscanf(line + 7, "%127s %31s", name, kind) != 2 ||
                (strcmp(kind, "counter") && strcmp(kind, "gauge") && strcmp(kind, "histogram"))) {
                snprintf(err, cap, "line %d: bad TYPE: %s", lineno, line);
                return false;
            }
            if (ntyped < 256) {
                histo[ntyped] = strcmp(kind, "histogram") == 0;
                snprintf(typed[ntyped++], sizeof typed[0], "%s", name);
            }
            continue;
        }
        const char *c = line;
        if (!name_char(*c, true)) {
            snprintf(err, cap, "line %d: not a series: %s", lineno, line);
            return false;
        }
        while (name_char(*c, false))
            c++;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(c - line), line);
        if (*c == '{') {
            const char *close = strchr(c, '}');
            if (close == NULL) {
                snprintf(err, cap, "line %d: unclosed labels: %s", lineno, line);
                return false;
            }
            c = close + 1;
        }
        if (*c != ' ') {
            snprintf(err, cap, "line %d: no value: %s", lineno, line);
            return false;
        }
        char *end = NULL;
        strtod(c + 1, &end);
        if (end == c + 1 || *end != '\0') {
            snprintf(err, cap, "line %d: bad value: %s", lineno, line);
            return false;
        }
        bool ok = false;
        for (int i = 0; i < ntyped && !ok; i++) {
            size_t tl = strlen(typed[i]);
            /* A histogram's series are its name with _bucket (and an le label), _sum, _count. */
            ok = histo[i]
                     ? strncmp(name, typed[i], tl) == 0 &&
                           (strcmp(name + tl, "_sum") == 0 || strcmp(name + tl, "_count") == 0 ||
                            (strcmp(name + tl, "_bucket") == 0 && strstr(line, "le=\"")))
                     : strcmp(typed[i], name) == 0;
        }
        if (!ok) {
            snprintf(err, cap, "line %d: %s has no # TYPE before it", lineno, name);
            return false;
        }
    }
    return true;
}

double fl_test_metric_value(const char *text, const char *series)
{
    size_t sl = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, series, sl) == 0 && p[sl] == ' ')
            return strtod(p + sl + 1, NULL);
    }
    return NAN;
}

int count_lines(const char *text, const char *prefix)
{
    int n = 0;
    size_t pl = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        n += strncmp(p, prefix, pl) == 0;
    return n;
}

int fl_test_http_probe(int port, const char *path, int timeout_ms, double *ms)
{
    *ms = -1;
    int64_t t0 = fl_test_now_us();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* bounds connect() too */
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char buf[2048];
    int n = snprintf(buf, sizeof buf,
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
    size_t len = 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && write(fd, buf, (size_t)n) == n) {
        ssize_t r;
        while (len < sizeof buf - 1 && (fl_test_now_us() - t0) / 1000 < timeout_ms &&
               (r = read(fd, buf + len, sizeof buf - 1 - len)) > 0)
            len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    int code = -1;
    double took = (double)(fl_test_now_us() - t0) / 1e3;
    if (took <= timeout_ms && sscanf(buf, "HTTP/1.%*d %d", &code) != 1)
        code = -1;
    *ms = took;
    return took <= timeout_ms ? code : -1;
}

#define HOLD_MAX 1024

struct fl_test_hold {
    pthread_t th;
    atomic_bool stop;
    atomic_int open;
    long opened, closed;
    int n, port;
    struct in_addr src;
    int fd[HOLD_MAX];
    bool up[HOLD_MAX];
    int64_t again_us[HOLD_MAX];
    size_t sent[HOLD_MAX];
    struct pollfd p[HOLD_MAX];
    int at[HOLD_MAX];
};

static void hold_open(fl_test_hold_t *h, int i)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr = h->src};
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)h->port)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&me, sizeof me) != 0 ||
        (connect(fd, (struct sockaddr *)&to, sizeof to) != 0 && errno != EINPROGRESS)) {
        if (fd >= 0)
            close(fd);
        h->again_us[i] = fl_test_now_us() + 100000;
        return;
    }
    h->fd[i] = fd;
    h->up[i] = false;
    h->sent[i] = 0;
    h->opened++;
}

static void hold_closed(fl_test_hold_t *h, int i)
{
    close(h->fd[i]);
    if (h->up[i])
        atomic_fetch_sub(&h->open, 1);
    h->fd[i] = -1;
    h->up[i] = false;
    h->closed++;
    h->again_us[i] = fl_test_now_us() + 100000;
}

/* One turn for connection i after poll said something (revents). */
static void hold_event(fl_test_hold_t *h, int i, short revents)
{
    if (!h->up[i]) {
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(h->fd[i], SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
            hold_closed(h, i);
            return;
        }
        h->up[i] = true;
        atomic_fetch_add(&h->open, 1);
        return;
    }
    if (revents & (POLLIN | POLLHUP | POLLERR)) {
        char b[512];
        ssize_t r = recv(h->fd[i], b, sizeof b, 0);
        if (r == 0 || (r < 0 && errno != EAGAIN))
            hold_closed(h, i);
    }
}

/* The slow half: the next byte of "GET / HTTP/1.1\r\nX-Slow: aaaa..." every 500 ms. */
static void hold_trickle(fl_test_hold_t *h, int64_t now, int64_t *next)
{
    if (now < *next)
        return;
    *next = now + 500000;
    static const char line[] = "GET /healthz HTTP/1.1\r\nX-Slow: ";
    for (int i = h->n / 2; i < h->n; i++) {
        if (h->fd[i] < 0 || !h->up[i])
            continue;
        char c = h->sent[i] < sizeof line - 1 ? line[h->sent[i]] : 'a';
        if (send(h->fd[i], &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1)
            h->sent[i]++;
    }
}

static void *hold_run(void *arg)
{
    fl_test_hold_t *h = arg;
    struct pollfd *p = h->p;
    int *at = h->at;
    int64_t next = 0;
    while (!atomic_load(&h->stop)) {
        int64_t now = fl_test_now_us();
        int k = 0;
        for (int i = 0; i < h->n; i++) {
            if (h->fd[i] < 0 && now >= h->again_us[i])
                hold_open(h, i);
            if (h->fd[i] < 0)
                continue;
            at[k] = i;
            p[k++] = (struct pollfd){.fd = h->fd[i], .events = h->up[i] ? POLLIN : POLLOUT};
        }
        hold_trickle(h, now, &next);
        if (poll(p, (nfds_t)k, 20) <= 0)
            continue;
        for (int j = 0; j < k; j++)
            if (p[j].revents != 0)
                hold_event(h, at[j], p[j].revents);
    }
    return NULL;
}

fl_test_hold_t *fl_test_hold_start(const char *src, int port, int n)
{
    fl_test_hold_t *h = calloc(1, sizeof *h);
    if (h == NULL || n > HOLD_MAX || inet_pton(AF_INET, src, &h->src) != 1) {
        free(h);
        return NULL;
    }
    h->n = n;
    h->port = port;
    for (int i = 0; i < n; i++)
        h->fd[i] = -1;
    if (pthread_create(&h->th, NULL, hold_run, h) != 0) {
        free(h);
        return NULL;
    }
    return h;
}

int fl_test_hold_open(fl_test_hold_t *h)
{
    return atomic_load(&h->open);
}

void fl_test_hold_stop(fl_test_hold_t *h, long *opened, long *closed)
{
    if (h == NULL)
        return;
    atomic_store(&h->stop, true);
    pthread_join(h->th, NULL);
    for (int i = 0; i < h->n; i++)
        if (h->fd[i] >= 0)
            close(h->fd[i]);
    if (opened != NULL)
        *opened = h->opened;
    if (closed != NULL)
        *closed = h->closed;
    free(h);
}
