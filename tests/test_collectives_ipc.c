/* Collectives over ipc:// data endpoints: asked for, chosen by the communicator for same-host
 * peers, refused for a socket directory others could reach, stale sockets swept, and one rank
 * with ipc turned off. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "collutil.h"

/* ---- ipc:// data endpoints ---- */

static int ipc_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    static const size_t counts[] = {100, 50001};
    for (size_t k = 0; k < 2; k++) {
        size_t c = counts[k];
        float *buf = malloc(c * sizeof *buf);
        if (buf == NULL)
            return bad("out of memory");
        for (size_t i = 0; i < c; i++)
            buf[i] = (float)(r + (int)(i % 7));
        int rc = fl_allreduce(comm, buf, buf, c, FL_FLOAT32, FL_SUM);
        for (size_t i = 0; rc == FL_OK && i < c; i++)
            if (buf[i] != (float)(n * (n - 1) / 2 + n * (int)(i % 7)))
                rc = bad("rank %d: ipc allreduce of %zu: element %zu is %g", r, c, i, buf[i]);
        if (rc == FL_OK)
            rc = fl_broadcast(comm, buf, c, FL_FLOAT32, n - 1);
        if (rc == FL_OK && buf[c - 1] != (float)(n * (n - 1) / 2 + n * (int)((c - 1) % 7)))
            rc = bad("rank %d: ipc broadcast of %zu differs", r, c);
        free(buf);
        if (rc != FL_OK)
            return rc;
    }
    fl_comm_stats_t st;
    fl_comm_get_stats(comm, &st);
    if (n > 1 && st.last_algo != FL_ALGO_RING)
        return bad("rank %d: the 200 KB allreduce did not run the ring", r);
    return fl_barrier(comm);
}

START_TEST(test_ipc_endpoints)
{
    fl_comm_opts_t o;
    opts_base(&o);
    o.segment_bytes = 16384;
    o.stripes = _i == 0 ? 1 : 2;
    char tag[16];
    snprintf(tag, sizeof tag, "%d", _i);
    run_world_at(_i == 0 ? 3 : 2, &o, tag, ipc_rank, NULL);
}
END_TEST

/* ---- same-host peers over ipc:// chosen by the communicator ---- */

#define AUTO_SIZES 3
static const size_t auto_counts[AUTO_SIZES] = {1000, 20000, 300001}; /* direct, rd, ring */

typedef struct auto_arg {
    bool ipc;                          /* what the ranks should use */
    float *out[MAX_WORLD][AUTO_SIZES]; /* each rank's results */
    char dir[MAX_WORLD][128];          /* each rank's socket directory */
} auto_arg_t;

static int auto_rank(fl_comm_t *comm, void *arg)
{
    auto_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    const char *dir = fl_comm_ipc_dir(comm);
    snprintf(a->dir[r], sizeof a->dir[r], "%s", dir);
    if (a->ipc) {
        struct stat st;
        if (dir[0] == '\0' || lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
            (st.st_mode & 0777) != 0700 || st.st_uid != geteuid())
            return bad("rank %d: ipc socket directory '%s' is missing or not private", r, dir);
    } else if (dir[0] != '\0') {
        return bad("rank %d: ipc turned off, yet a socket directory '%s'", r, dir);
    }
    for (int k = 0; k < AUTO_SIZES; k++) {
        size_t c = auto_counts[k];
        float *buf = a->out[r][k];
        /* Magnitudes spread over many binades: any change in the order of the additions
         * would show in the bits. */
        uint64_t x = 0x9E3779B97F4A7C15ULL * (uint64_t)(r + 1) + (uint64_t)k;
        for (size_t i = 0; i < c; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[i] = ldexpf((float)(x % 2001) - 1000.0f, (int)((x >> 20) % 40) - 20);
        }
        int rc = fl_allreduce(comm, buf, buf, c, FL_FLOAT32, FL_SUM);
        if (rc != FL_OK)
            return rc;
        /* The one-shot exchange has opened every peer's socket by now. */
        for (int p = 0; k == 0 && p < n; p++)
            if (p != r && fl_comm_peer_is_ipc(comm, p) != a->ipc)
                return bad("rank %d: data to rank %d over %s, want %s", r, p,
                           a->ipc ? "tcp" : "ipc", a->ipc ? "ipc" : "tcp");
    }
    return fl_barrier(comm);
}

static void auto_run(int world, int stripes, bool ipc, auto_arg_t *a)
{
    fl_comm_opts_t o;
    opts_base(&o);
    o.stripes = stripes;
    o.segment_bytes = 65536;
    o.ipc = ipc ? 1 : 0;
    a->ipc = ipc;
    run_world(world, &o, auto_rank, a);
    for (int r = 0; r < world; r++) {
        struct stat st;
        if (a->dir[r][0] != '\0')
            ck_assert_msg(lstat(a->dir[r], &st) != 0, "rank %d's socket directory %s is left", r,
                          a->dir[r]);
    }
}

START_TEST(test_ipc_same_host)
{
    int world = _i == 0 ? 3 : 2;
    int stripes = _i == 0 ? 1 : 2;
    auto_arg_t *on = calloc(1, sizeof *on);
    auto_arg_t *off = calloc(1, sizeof *off);
    ck_assert(on != NULL && off != NULL);
    for (int r = 0; r < world; r++) {
        for (int k = 0; k < AUTO_SIZES; k++) {
            on->out[r][k] = malloc(auto_counts[k] * sizeof(float));
            off->out[r][k] = malloc(auto_counts[k] * sizeof(float));
            ck_assert(on->out[r][k] != NULL && off->out[r][k] != NULL);
        }
    }
    auto_run(world, stripes, true, on);
    auto_run(world, stripes, false, off);
    for (int r = 0; r < world; r++) {
        for (int k = 0; k < AUTO_SIZES; k++) {
            size_t bytes = auto_counts[k] * sizeof(float);
            ck_assert_msg(memcmp(on->out[r][k], on->out[0][k], bytes) == 0,
                          "ipc: rank %d's sum of %zu differs from rank 0's", r, auto_counts[k]);
            ck_assert_msg(memcmp(on->out[r][k], off->out[r][k], bytes) == 0,
                          "rank %d: the sum of %zu over ipc differs from tcp's", r, auto_counts[k]);
        }
    }
    for (int r = 0; r < world; r++) {
        for (int k = 0; k < AUTO_SIZES; k++) {
            free(on->out[r][k]);
            free(off->out[r][k]);
        }
    }
    free(on);
    free(off);
}
END_TEST

/* A socket directory that another user, or a loose mode, could reach is not used: the ranks go
 * over TCP, get the same bits, and leave the directory alone. */
static char open_dir[128];

static void make_open_dir(const char *coordinator, const char *job_id)
{
    fl_comm_ipc_dir_name(job_id, coordinator, open_dir, sizeof open_dir);
    ck_assert_msg(mkdir(open_dir, 0700) == 0 && chmod(open_dir, 0755) == 0, "mkdir %s", open_dir);
}

START_TEST(test_ipc_dir_not_private)
{
    auto_arg_t *a = calloc(1, sizeof *a);
    ck_assert(a != NULL);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < AUTO_SIZES; k++)
            ck_assert((a->out[r][k] = malloc(auto_counts[k] * sizeof(float))) != NULL);
    before_ranks = make_open_dir;
    fl_comm_opts_t o;
    opts_base(&o);
    o.segment_bytes = 65536;
    o.log_level = FL_LOG_OFF; /* the warning saying why is expected */
    a->ipc = false;           /* what the ranks must end up using */
    run_world(2, &o, auto_rank, a);
    before_ranks = NULL;
    struct stat st;
    bool left = lstat(open_dir, &st) == 0 && (st.st_mode & 0777) == 0755;
    rmdir(open_dir);
    ck_assert_msg(left, "%s was changed or removed by ranks that may not use it", open_dir);
    for (int k = 0; k < AUTO_SIZES; k++)
        ck_assert(memcmp(a->out[0][k], a->out[1][k], auto_counts[k] * sizeof(float)) == 0);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < AUTO_SIZES; k++)
            free(a->out[r][k]);
    free(a);
}
END_TEST

/* What a rank killed before fl_comm_destroy leaves (a socket nobody listens on, in its job's
 * directory) is removed by the next communicator of the same user. */
START_TEST(test_ipc_stale_swept)
{
    char dir[128];
    char path[192];
    fl_comm_ipc_dir_name("killed-job", "tcp://127.0.0.1:1", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/r0-p%d.0", dir, (int)getpid());
    ck_assert(mkdir(dir, 0700) == 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    ck_assert(strlen(path) < sizeof a.sun_path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    close(fd); /* bound, never listened on: what a killed rank leaves */
    struct timeval old[2] = {{.tv_sec = time(NULL) - 60}, {.tv_sec = time(NULL) - 60}};
    ck_assert(utimes(path, old) == 0 && utimes(dir, old) == 0);
    auto_arg_t *aa = calloc(1, sizeof *aa);
    ck_assert(aa != NULL);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < AUTO_SIZES; k++)
            ck_assert((aa->out[r][k] = malloc(auto_counts[k] * sizeof(float))) != NULL);
    auto_run(2, 1, true, aa);
    struct stat st;
    bool gone = lstat(dir, &st) != 0;
    unlink(path);
    rmdir(dir);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < AUTO_SIZES; k++)
            free(aa->out[r][k]);
    free(aa);
    ck_assert_msg(gone, "%s, left by a killed rank, is still there", dir);
}
END_TEST

/* One rank with ipc off: its links go over TCP both ways, the others' over ipc. */
static int mixed_rank(fl_comm_t *comm, void *arg)
{
    float *out = arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    float buf[1000];
    for (int i = 0; i < 1000; i++)
        buf[i] = ldexpf((float)((r * 7919 + i * 104729) % 2001) - 1000.0f, (i * 13 + r) % 40 - 20);
    int rc = fl_allreduce(comm, buf, buf, 1000, FL_FLOAT32, FL_SUM);
    if (rc != FL_OK)
        return rc;
    memcpy(out + (size_t)r * 1000, buf, sizeof buf);
    for (int p = 0; p < n; p++) {
        bool want = r != ipc_off_rank && p != ipc_off_rank;
        if (p != r && fl_comm_peer_is_ipc(comm, p) != want)
            return bad("rank %d: data to rank %d over %s, want %s", r, p, want ? "tcp" : "ipc",
                       want ? "ipc" : "tcp");
    }
    return fl_barrier(comm);
}

START_TEST(test_ipc_one_rank_off)
{
    static float out[3 * 1000];
    fl_comm_opts_t o;
    opts_base(&o);
    ipc_off_rank = 1;
    run_world(3, &o, mixed_rank, out);
    ipc_off_rank = -1;
    for (int r = 1; r < 3; r++)
        ck_assert_msg(memcmp(out, out + r * 1000, 1000 * sizeof(float)) == 0,
                      "rank %d's sum differs from rank 0's", r);
}
END_TEST

Suite *collectives_ipc_suite(void);
Suite *collectives_ipc_suite(void)
{
    Suite *s = suite_create("collectives_ipc");
    TCase *t = tcase_create("ipc");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_ipc_endpoints, 0, 2);
    tcase_add_loop_test(t, test_ipc_same_host, 0, 2);
    tcase_add_test(t, test_ipc_dir_not_private);
    tcase_add_test(t, test_ipc_stale_swept);
    tcase_add_test(t, test_ipc_one_rank_off);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(collectives_ipc_suite());
}
