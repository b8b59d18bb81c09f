/* ZeroMQ's own one-way latency, the floor under flodl's per-message cost: two processes, each
 * with a PULL socket bound on loopback TCP (or ipc://, as flodl's same-host ranks use) and a PUSH
 * socket to the other (the socket types flodl's data plane uses), bound to the CPUs ranks 0 and 1
 * use, ping-pong one message of each size; the floor is half the round trip, under the timing
 * protocol of the allreduce figures (warm-up, repetitions of back-to-back operations, median). Then
 * the exchange: both send one message of the size at once and take the other's, which is what 2
 * ranks' allreduce must do at the least (each CPU copies the message out and the other's in). The
 * peers are this executable
 * ("flodl-bench zmq-floor echo|ping"); flodl-bench allreduce starts them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "bench_util.h"
#include "fl_core.h"

static int open_pair(void *ctx, const char *scheme, void **pull, void **push, char *ep, size_t cap)
{
    int hwm = 0;
    *pull = zmq_socket(ctx, ZMQ_PULL);
    *push = zmq_socket(ctx, ZMQ_PUSH);
    if (*pull == NULL || *push == NULL)
        return -1;
    zmq_setsockopt(*pull, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(*push, ZMQ_SNDHWM, &hwm, sizeof hwm);
    /* ipc with a wildcard path: a socket in a fresh directory of ZeroMQ's, removed when the
     * socket closes. */
    if (zmq_bind(*pull, strcmp(scheme, "ipc") == 0 ? "ipc://*" : "tcp://127.0.0.1:*") != 0)
        return -1;
    return zmq_getsockopt(*pull, ZMQ_LAST_ENDPOINT, ep, &cap);
}

/* The exchange sweep, run by both peers in step: each iteration both send one message of the
 * size and then take the other's, as two ranks of an allreduce do. Returns 0 when it ran;
 * us (the pinger's) gets the median time per exchange. */
static int exchange(void *push, void *pull, char *buf, const bench_sizes_t *sizes, double *us)
{
    for (size_t s = 0; s < sizes->n; s++) {
        size_t bytes = sizes->bytes[s];
        int iters = bench_iters_for(bytes);
        int reps = bench_reps_for(bytes);
        double t[16];
        for (int rep = -1; rep < reps; rep++) {
            int64_t t0 = fl_now_ns();
            for (int it = 0; it < iters; it++) {
                if (zmq_send(push, buf, bytes, 0) != (int)bytes ||
                    zmq_recv(pull, buf, bytes, 0) != (int)bytes)
                    return 1;
            }
            if (rep >= 0)
                t[rep] = (double)(fl_now_ns() - t0) / 1e3 / iters;
        }
        if (us != NULL)
            us[s] = bench_median(t, reps);
    }
    return 0;
}

/* echo: prints its endpoint, takes the pinger's endpoint as the first message, then sends back
 * every message until an empty one; then the exchange sweep. */
static int run_echo(void *ctx, const char *scheme, size_t min, size_t max)
{
    void *pull;
    void *push;
    char ep[256];
    if (open_pair(ctx, scheme, &pull, &push, ep, sizeof ep) != 0)
        return 1;
    printf("EP %s\n", ep);
    fflush(stdout);
    char *buf = malloc(max > 256 ? max : 256);
    int timeout = 60000;
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    int n = zmq_recv(pull, buf, 255, 0);
    if (buf == NULL || n <= 0)
        return 1;
    buf[n] = '\0';
    if (zmq_connect(push, buf) != 0)
        return 1;
    for (;;) {
        n = zmq_recv(pull, buf, max, 0);
        if (n <= 0)
            break;
        if (zmq_send(push, buf, (size_t)n, 0) != n)
            break;
    }
    bench_sizes_t sizes;
    bench_sizes_range(&sizes, min, max);
    if (n == 0)
        n = exchange(push, pull, buf, &sizes, NULL) == 0 ? 0 : -1;
    free(buf);
    zmq_close(pull);
    zmq_close(push);
    return n == 0 ? 0 : 1;
}

static int run_ping(void *ctx, const char *scheme, const char *peer, size_t min, size_t max)
{
    void *pull;
    void *push;
    char ep[256];
    if (open_pair(ctx, scheme, &pull, &push, ep, sizeof ep) != 0 || zmq_connect(push, peer) != 0)
        return 1;
    int timeout = 60000;
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    if (zmq_send(push, ep, strlen(ep), 0) < 0)
        return 1;
    char *buf = calloc(1, max);
    if (buf == NULL)
        return 1;
    bench_sizes_t sizes;
    bench_sizes_range(&sizes, min, max);
    int rc = 0;
    for (size_t s = 0; s < sizes.n && rc == 0; s++) {
        size_t bytes = sizes.bytes[s];
        int iters = bench_iters_for(bytes);
        int reps = bench_reps_for(bytes);
        double t[16];
        for (int rep = -1; rep < reps && rc == 0; rep++) { /* rep -1 warms up */
            int64_t t0 = fl_now_ns();
            for (int it = 0; it < iters && rc == 0; it++) {
                if (zmq_send(push, buf, bytes, 0) != (int)bytes ||
                    zmq_recv(pull, buf, bytes, 0) != (int)bytes)
                    rc = 1;
            }
            if (rep >= 0)
                t[rep] = (double)(fl_now_ns() - t0) / 1e3 / iters / 2;
        }
        if (rc == 0) {
            printf("RESULT %zu %.3f\n", bytes, bench_median(t, reps));
            fflush(stdout);
        }
    }
    zmq_send(push, "", 0, 0);
    double xus[BENCH_MAX_SIZES];
    if (rc == 0 && (rc = exchange(push, pull, buf, &sizes, xus)) == 0) {
        for (size_t s = 0; s < sizes.n; s++)
            printf("XCHG %zu %.3f\n", sizes.bytes[s], xus[s]);
        fflush(stdout);
    }
    free(buf);
    int linger = 1000;
    zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(pull);
    zmq_close(push);
    return rc;
}

int bench_floor_main(int argc, char **argv);
int bench_floor_main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: flodl-bench zmq-floor echo tcp|ipc MIN MAX | ping tcp|ipc EP MIN "
                        "MAX\n");
        return 2;
    }
    void *ctx = zmq_ctx_new();
    int rc = 2;
    if (strcmp(argv[1], "echo") == 0 && argc == 5)
        rc = run_echo(ctx, argv[2], strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10));
    else if (strcmp(argv[1], "ping") == 0 && argc == 6)
        rc = run_ping(ctx, argv[2], argv[3], strtoull(argv[4], NULL, 10),
                      strtoull(argv[5], NULL, 10));
    zmq_ctx_term(ctx);
    return rc;
}

typedef struct floor_out {
    const bench_sizes_t *sizes;
    double *oneway;
    double *xchg;
} floor_out_t;

static void floor_line(const char *line, void *ud)
{
    floor_out_t *o = ud;
    unsigned long long bytes;
    double t;
    double *to = NULL;
    if (sscanf(line, "RESULT %llu %lf", &bytes, &t) == 2)
        to = o->oneway;
    else if (sscanf(line, "XCHG %llu %lf", &bytes, &t) == 2)
        to = o->xchg;
    else
        fputs(line, stderr);
    for (size_t i = 0; to != NULL && i < o->sizes->n; i++)
        if (o->sizes->bytes[i] == (size_t)bytes)
            to[i] = t;
}

static void read_floor(int fd, floor_out_t *o)
{
    FILE *f = fdopen(fd, "r");
    if (f == NULL)
        return;
    char line[512];
    while (fgets(line, sizeof line, f) != NULL)
        floor_line(line, o);
    fclose(f);
}

int bench_floor_run(size_t min, size_t max, bool bind, bool ipc, const bench_sizes_t *sizes,
                    double *us, double *xchg)
{
    char *scheme = ipc ? "ipc" : "tcp";
    for (size_t i = 0; i < sizes->n; i++)
        us[i] = xchg[i] = -1;
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return 1;
    self[n] = '\0';
    char min_s[32];
    char max_s[32];
    snprintf(min_s, sizeof min_s, "%zu", min);
    snprintf(max_s, sizeof max_s, "%zu", max);
    char *eargv[] = {self, "zmq-floor", "echo", scheme, min_s, max_s, NULL};
    int efd;
    pid_t echo = bench_spawn_on(self, eargv, &efd, bind ? 1 : -1);
    if (echo < 0)
        return 1;
    FILE *ef = fdopen(efd, "r");
    char line[512] = "";
    char ep[300] = "";
    if (ef == NULL || fgets(line, sizeof line, ef) == NULL || sscanf(line, "EP %299s", ep) != 1) {
        if (ef != NULL)
            fclose(ef);
        bench_wait(echo, 5000);
        return 1;
    }
    char *pargv[] = {self, "zmq-floor", "ping", scheme, ep, min_s, max_s, NULL};
    int pfd;
    pid_t ping = bench_spawn_on(self, pargv, &pfd, bind ? 0 : -1);
    int status = 1;
    if (ping >= 0) {
        floor_out_t o = {sizes, us, xchg};
        read_floor(pfd, &o);
        status = bench_wait(ping, 600000) == 0 ? 0 : 1;
    }
    fclose(ef);
    if (bench_wait(echo, ping >= 0 ? 10000 : 1000) != 0)
        status = 1;
    return status;
}
