/* Sub-communicators (fl_comm_split): groups by color ordered by key, several members per rank
 * each driven by its own thread (the two-level exchange's columns, and the flat ring of every
 * device), refusals, the parent's failure events reaching a member's collective, and members
 * on one host exchanging over ipc:// (with CURVE too; not with ipc off). */
#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <flodl/comm.h>
#include <flodl/coordinator.h>

#include "fl_core.h"
#include "testutil.h"

#define TEST_EBAD (-1000)

static int bad(char *err, size_t cap, const char *fmt, ...) FL_PRINTF(3, 4);
static int bad(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return fl_fail(TEST_EBAD, "%s", err);
}

/* Element i of parent rank r's member t. */
static float val(int r, int t, size_t i)
{
    return (float)((r * 7 + t * 3 + (int)(i % 13)) % 16) / 4.0f;
}

/* ---- one member per rank: MPI's split ---- */

static int split_one_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    char err[256];
    int r = fl_comm_rank(comm);
    int world = fl_comm_size(comm);
    int color = r % 2;
    int key = -r; /* reversed order inside each group */
    fl_comm_t *sub = NULL;
    int rc = fl_comm_split(comm, 1, &color, &key, &sub);
    if (rc != FL_OK)
        return rc;
    int size = (world + 1 - color) / 2;
    int want_rank = size - 1 - r / 2;
    if (fl_comm_size(sub) != size || fl_comm_rank(sub) != want_rank)
        rc = bad(err, sizeof err,
                 "rank %d: group %d of size %d, rank %d; expected size %d, "
                 "rank %d",
                 r, color, fl_comm_size(sub), fl_comm_rank(sub), size, want_rank);
    enum { N = 70001 };
    float *buf = malloc(N * sizeof *buf);
    for (size_t i = 0; i < N; i++)
        buf[i] = val(r, 0, i);
    if (rc == FL_OK)
        rc = fl_allreduce(sub, buf, buf, N, FL_FLOAT32, FL_SUM);
    for (size_t i = 0; rc == FL_OK && i < N; i++) {
        float want = 0.0f;
        for (int q = color; q < world; q += 2)
            want += val(q, 0, i);
        if (buf[i] != want)
            rc = bad(err, sizeof err, "rank %d: element %zu is %g, the group's sum is %g", r, i,
                     buf[i], want);
    }
    /* The parent still works, alongside. */
    float one = 1.0f;
    if (rc == FL_OK && (rc = fl_allreduce(comm, &one, &one, 1, FL_FLOAT32, FL_SUM)) == FL_OK &&
        one != (float)world)
        rc = bad(err, sizeof err, "rank %d: parent sum %g", r, one);
    free(buf);
    fl_comm_destroy(&sub);
    return rc;
}

START_TEST(test_split_by_color_and_key)
{
    char err[1024] = "";
    int rc = fl_test_run_ranks(5, NULL, split_one_rank, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s: %s", fl_strerror(rc), err);
}
END_TEST

/* ---- several members per rank, each on its own thread ---- */

enum { L = 2, COUNT = 50003 };

typedef struct member_job {
    fl_comm_t *sub;
    int parent_rank;
    int t;
    bool flat; /* one group of every member; else one group per t (columns) */
    int world;
    int rc;
    char err[512];
} member_job_t;

static void *member_main(void *p)
{
    member_job_t *j = p;
    int n = j->flat ? j->world * L : j->world;
    int want_rank = j->flat ? j->parent_rank * L + j->t : j->parent_rank;
    if (fl_comm_size(j->sub) != n || fl_comm_rank(j->sub) != want_rank) {
        j->rc = bad(j->err, sizeof j->err,
                    "member %d of rank %d: size %d rank %d, expected %d "
                    "and %d",
                    j->t, j->parent_rank, fl_comm_size(j->sub), fl_comm_rank(j->sub), n, want_rank);
        return NULL;
    }
    float *buf = malloc(COUNT * sizeof *buf);
    for (size_t i = 0; i < COUNT; i++)
        buf[i] = val(j->parent_rank, j->t, i);
    for (int round = 0; round < 3 && j->rc == FL_OK; round++) {
        if (round > 0)
            for (size_t i = 0; i < COUNT; i++)
                buf[i] = val(j->parent_rank, j->t, i);
        j->rc = fl_allreduce(j->sub, buf, buf, COUNT, FL_FLOAT32, FL_SUM);
        if (j->rc != FL_OK) {
            snprintf(j->err, sizeof j->err, "%s", fl_last_error());
            break;
        }
        for (size_t i = 0; i < COUNT; i++) {
            float want = 0.0f;
            for (int r = 0; r < j->world; r++)
                for (int t = 0; t < L; t++)
                    if (j->flat || t == j->t)
                        want += val(r, t, i);
            if (buf[i] != want) {
                j->rc = bad(j->err, sizeof j->err,
                            "member %d of rank %d: element %zu is %g, "
                            "expected %g",
                            j->t, j->parent_rank, i, buf[i], want);
                break;
            }
        }
    }
    free(buf);
    return NULL;
}

static int members_rank(fl_comm_t *comm, void *arg)
{
    bool flat = *(bool *)arg;
    int r = fl_comm_rank(comm);
    int world = fl_comm_size(comm);
    int colors[L];
    int keys[L];
    for (int t = 0; t < L; t++) {
        colors[t] = flat ? 0 : t;
        keys[t] = flat ? r * L + t : r;
    }
    fl_comm_t *subs[L];
    int rc = fl_comm_split(comm, L, colors, keys, subs);
    if (rc != FL_OK)
        return rc;
    member_job_t jobs[L];
    pthread_t th[L];
    for (int t = 0; t < L; t++) {
        jobs[t] =
            (member_job_t){.sub = subs[t], .parent_rank = r, .t = t, .flat = flat, .world = world};
        ck_assert(pthread_create(&th[t], NULL, member_main, &jobs[t]) == 0);
    }
    for (int t = 0; t < L; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < L; t++) {
        if (rc == FL_OK && jobs[t].rc != FL_OK)
            rc = fl_fail(jobs[t].rc, "%s", jobs[t].err);
        fl_comm_destroy(&subs[t]);
    }
    return rc;
}

START_TEST(test_members_as_columns)
{
    bool flat = false;
    char err[1024] = "";
    int rc = fl_test_run_ranks(3, NULL, members_rank, &flat, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s: %s", fl_strerror(rc), err);
}
END_TEST

START_TEST(test_members_in_one_flat_ring)
{
    bool flat = true;
    char err[1024] = "";
    int rc = fl_test_run_ranks(3, NULL, members_rank, &flat, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s: %s", fl_strerror(rc), err);
}
END_TEST

/* ---- refusals ---- */

static int mismatch_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    int r = fl_comm_rank(comm);
    int colors[2] = {0, 0};
    fl_comm_t *subs[2] = {NULL, NULL};
    int rc = fl_comm_split(comm, r == 1 ? 2 : 1, colors, NULL, subs);
    if (rc == FL_OK) {
        fl_comm_destroy(&subs[0]);
        fl_comm_destroy(&subs[1]);
        char err[128];
        return bad(err, sizeof err, "rank %d: a split with different member counts worked", r);
    }
    if (rc != FL_EINVAL || strstr(fl_last_error(), "asks for") == NULL) {
        char err[1200];
        return bad(err, sizeof err, "rank %d: %s: %s", r, fl_strerror(rc), fl_last_error());
    }
    if (subs[0] != NULL)
        return bad((char[64]){0}, 64, "rank %d: a member handed out after a failure", r);
    return FL_OK;
}

START_TEST(test_ranks_asking_for_different_counts_are_refused)
{
    char err[1024] = "";
    int rc = fl_test_run_ranks(3, NULL, mismatch_rank, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s: %s", fl_strerror(rc), err);
}
END_TEST

static int count_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    int colors[1] = {0};
    fl_comm_t *sub = NULL;
    int rc = fl_comm_split(comm, 0, colors, NULL, &sub);
    if (rc != FL_EINVAL || strstr(fl_last_error(), "0 members") == NULL)
        return bad((char[256]){0}, 256, "n = 0: %s %s", fl_strerror(rc), fl_last_error());
    return FL_OK;
}

START_TEST(test_zero_members_refused)
{
    char err[1024] = "";
    int rc = fl_test_run_ranks(2, NULL, count_rank, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s: %s", fl_strerror(rc), err);
}
END_TEST

/* ---- the parent's failure events reach a member's collective ---- */

typedef struct fail_rank {
    fl_coord_t *coord;
    int rank;
    int world;
    volatile int *split_done;
    pthread_mutex_t *mu;
    int rc;
    int64_t waited_ms;
    char err[1024];
} fail_rank_t;

static void *fail_main(void *p)
{
    fail_rank_t *a = p;
    fl_comm_opts_t o;
    fl_test_comm_opts(&o, a->coord, a->rank, a->world);
    o.timeout_ms = 20000;
    fl_comm_t *comm = NULL;
    a->rc = fl_comm_init(&o, &comm);
    fl_comm_t *sub = NULL;
    int color = 0;
    int key = -a->rank; /* reversed: error texts must still name the job's ranks */
    if (a->rc == FL_OK)
        a->rc = fl_comm_split(comm, 1, &color, &key, &sub);
    pthread_mutex_lock(a->mu);
    (*a->split_done)++;
    pthread_mutex_unlock(a->mu);
    if (a->rc == FL_OK && a->rank == 0) {
        /* Rank 1 never joins this allreduce: only the failure event can end it early. */
        float x = 1.0f;
        int64_t t0 = fl_now_ms();
        a->rc = fl_allreduce(sub, &x, &x, 1, FL_FLOAT32, FL_SUM);
        a->waited_ms = fl_now_ms() - t0;
    } else if (a->rc == FL_OK) {
        usleep(3000 * 1000); /* stays alive, silent in the sub-communicator */
    }
    if (a->rc != FL_OK)
        snprintf(a->err, sizeof a->err, "%s", fl_last_error());
    fl_comm_destroy(&sub);
    fl_comm_destroy(&comm);
    return NULL;
}

START_TEST(test_member_hears_the_parents_failure)
{
    fl_coord_t *coord = fl_test_coord(2, 0);
    volatile int done = 0;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    fail_rank_t ranks[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        ranks[r] =
            (fail_rank_t){.coord = coord, .rank = r, .world = 2, .split_done = &done, .mu = &mu};
        ck_assert(pthread_create(&th[r], NULL, fail_main, &ranks[r]) == 0);
    }
    for (int i = 0; i < 1000; i++) {
        pthread_mutex_lock(&mu);
        int d = done;
        pthread_mutex_unlock(&mu);
        if (d == 2)
            break;
        usleep(10000);
    }
    usleep(300 * 1000); /* rank 0 is waiting in its allreduce */
    fl_coord_stop(coord);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    fl_coord_destroy(&coord);
    ck_assert_msg(ranks[0].rc == FL_EPEER, "rank 0: %s: %s", fl_strerror(ranks[0].rc),
                  ranks[0].err);
    ck_assert_msg(strstr(ranks[0].err, "coordinator") != NULL, "%s", ranks[0].err);
    ck_assert_msg(strstr(ranks[0].err, "rank 0 (127.0.0.1; rank 1 of 2 of a sub-communicator)") !=
                      NULL,
                  "%s", ranks[0].err);
    ck_assert_msg(strstr(ranks[0].err,
                         "waiting for rank 1 (127.0.0.1; rank 0 of a sub-communicator)") != NULL,
                  "%s", ranks[0].err);
    /* Well before the member's own 20 s deadline. */
    ck_assert_msg(ranks[0].waited_ms < 10000, "waited %lld ms", (long long)ranks[0].waited_ms);
}
END_TEST

/* ---- members over same-host ipc:// ---- */

/* How the ranks of an ipc run are set up, and what they found. */
typedef struct ipc_world {
    int world;
    int stripes;
    bool two_hosts; /* the upper half of the ranks on "host" 127.0.0.2 */
    bool ipc;
    int off_rank; /* a rank with ipc turned off, when > 0 */
    const char *curve_dir;
    char dir[128]; /* rank 0's socket directory */
} ipc_world_t;

static bool ipc_of(const ipc_world_t *w, int r)
{
    return w->ipc && (w->off_rank <= 0 || r != w->off_rank);
}

static const char *host_of(const ipc_world_t *w, int r)
{
    return w->two_hosts && r >= w->world / 2 ? "127.0.0.2" : "127.0.0.1";
}

/* Member sockets (named "...-m<n>.<k>") in the job's directory; 0 when there is none. */
static int member_sockets(const char *dir)
{
    DIR *d = dir[0] != '\0' ? opendir(dir) : NULL;
    int n = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL)
        n += strstr(e->d_name, "-m") != NULL;
    if (d != NULL)
        closedir(d);
    return n;
}

/* Member t of rank r in a ring (algo ring: data only to the next member) sent to another host
 * exactly when its next member lives there; all of it over ipc when ipc is on (loopback). */
static int check_link(const ipc_world_t *w, fl_comm_t *sub, int r, int next_r, char *err,
                      size_t cap)
{
    int me = fl_comm_rank(sub);
    int next = (me + 1) % fl_comm_size(sub);
    bool ipc = ipc_of(w, r) && ipc_of(w, next_r);
    if (fl_comm_peer_is_ipc(sub, next) != ipc)
        return bad(err, cap, "rank %d: member %d sends to member %d over %s", r, me, next,
                   ipc ? "tcp, not ipc" : "ipc with ipc off on one side");
    fl_comm_stats_t st;
    fl_comm_get_stats(sub, &st);
    bool remote = strcmp(host_of(w, r), host_of(w, next_r)) != 0;
    if (st.bytes_sent == 0 || st.bytes_sent_remote != (remote ? st.bytes_sent : 0))
        return bad(err, cap, "rank %d: member %d sent %llu bytes, %llu counted remote; want %s", r,
                   me, (unsigned long long)st.bytes_sent, (unsigned long long)st.bytes_sent_remote,
                   remote ? "all" : "none");
    return FL_OK;
}

/* Two splits alive at once (one flat ring of every member, and columns), L members per rank,
 * all on their own threads: right sums, each member's sockets in the job's directory while it
 * lives and gone after, its links over ipc and counted remote across "hosts". */
static int ipc_members_rank(fl_comm_t *comm, void *arg)
{
    ipc_world_t *w = arg;
    char err[512];
    int r = fl_comm_rank(comm);
    const char *dir = fl_comm_ipc_dir(comm);
    if (r == 0)
        snprintf(w->dir, sizeof w->dir, "%s", dir);
    int colors[2][L], keys[2][L];
    for (int t = 0; t < L; t++) {
        colors[0][t] = 0;
        keys[0][t] = r * L + t;
        colors[1][t] = t;
        keys[1][t] = r;
    }
    fl_comm_t *subs[2][L] = {{NULL}};
    int rc = fl_comm_split(comm, L, colors[0], keys[0], subs[0]);
    if (rc == FL_OK)
        rc = fl_comm_split(comm, L, colors[1], keys[1], subs[1]);
    int want = ipc_of(w, r) ? (w->world - (w->off_rank > 0)) * L * 2 * w->stripes : 0;
    int have = member_sockets(dir);
    if (rc == FL_OK && have != want)
        rc = bad(err, sizeof err, "rank %d: %d member sockets in '%s' with both splits up, want %d",
                 r, have, dir, want);
    for (int s = 0; rc == FL_OK && s < 2; s++)
        if (ipc_of(w, r) != (fl_comm_ipc_dir(subs[s][0])[0] != '\0'))
            rc = bad(err, sizeof err, "rank %d: member socket directory '%s' with ipc %d", r,
                     fl_comm_ipc_dir(subs[s][0]), ipc_of(w, r));
    member_job_t jobs[2][L];
    pthread_t th[2][L];
    for (int s = 0; rc == FL_OK && s < 2; s++)
        for (int t = 0; t < L; t++) {
            jobs[s][t] = (member_job_t){
                .sub = subs[s][t], .parent_rank = r, .t = t, .flat = s == 0, .world = w->world};
            ck_assert(pthread_create(&th[s][t], NULL, member_main, &jobs[s][t]) == 0);
        }
    for (int s = 0; rc == FL_OK && s < 2; s++)
        for (int t = 0; t < L; t++)
            pthread_join(th[s][t], NULL);
    for (int s = 0; rc == FL_OK && s < 2; s++)
        for (int t = 0; rc == FL_OK && t < L; t++) {
            if (jobs[s][t].rc != FL_OK)
                rc = fl_fail(jobs[s][t].rc, "%s", jobs[s][t].err);
            else
                rc = check_link(w, subs[s][t], r, s == 0 && t < L - 1 ? r : (r + 1) % w->world, err,
                                sizeof err);
        }
    int brc = fl_barrier(comm); /* every rank counted before any member goes */
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < L; t++)
            fl_comm_destroy(&subs[s][t]);
    if (rc == FL_OK)
        rc = brc;
    if (rc == FL_OK)
        rc = fl_barrier(comm);
    if (rc == FL_OK && (have = member_sockets(dir)) != 0)
        rc = bad(err, sizeof err, "rank %d: %d member sockets left in %s", r, have, dir);
    return rc;
}

typedef struct ipc_slot {
    fl_comm_opts_t o;
    ipc_world_t *w;
    int rc;
    char err[1024];
} ipc_slot_t;

static void *ipc_slot_main(void *p)
{
    ipc_slot_t *s = p;
    fl_comm_t *comm = NULL;
    s->rc = fl_comm_init(&s->o, &comm);
    if (s->rc == FL_OK)
        s->rc = ipc_members_rank(comm, s->w);
    if (s->rc != FL_OK)
        snprintf(s->err, sizeof s->err, "%s", fl_last_error());
    fl_comm_destroy(&comm);
    return NULL;
}

static void run_ipc_world(ipc_world_t *w)
{
    fl_coord_opts_t co;
    fl_coord_opts_init(&co);
    co.bind = "tcp://127.0.0.1:0";
    co.world_size = w->world;
    co.heartbeat_timeout_ms = 5000;
    co.rendezvous_timeout_ms = 30000;
    co.curve_dir = w->curve_dir;
    co.log_level = FL_LOG_WARN;
    fl_coord_t *coord = NULL;
    ck_assert_msg(fl_coord_create(&co, &coord) == FL_OK, "%s", fl_last_error());
    ck_assert(fl_coord_start(coord) == FL_OK);
    ipc_slot_t slots[4];
    pthread_t th[4];
    ck_assert(w->world <= 4);
    for (int r = 0; r < w->world; r++) {
        slots[r] = (ipc_slot_t){.w = w};
        fl_test_comm_opts(&slots[r].o, coord, r, w->world);
        slots[r].o.host = host_of(w, r);
        slots[r].o.ipc = ipc_of(w, r);
        slots[r].o.stripes = w->stripes;
        slots[r].o.algo = FL_ALGO_RING;
        slots[r].o.curve_dir = w->curve_dir;
        ck_assert(pthread_create(&th[r], NULL, ipc_slot_main, &slots[r]) == 0);
    }
    for (int r = 0; r < w->world; r++)
        pthread_join(th[r], NULL);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
    for (int r = 0; r < w->world; r++)
        ck_assert_msg(slots[r].rc == FL_OK, "rank %d: %s: %s", r, fl_strerror(slots[r].rc),
                      slots[r].err);
    struct stat st;
    ck_assert_msg(w->dir[0] == '\0' || lstat(w->dir, &st) != 0, "%s is left", w->dir);
}

/* One host of 3 ranks, one stripe; two loopback "hosts" of 2 ranks, two stripes. */
START_TEST(test_members_over_ipc)
{
    ipc_world_t w = {.world = _i == 0 ? 3 : 4,
                     .stripes = 1 + _i,
                     .two_hosts = _i == 1,
                     .ipc = true};
    run_ipc_world(&w);
    ck_assert_msg(w.dir[0] != '\0', "rank 0 has no socket directory");
}
END_TEST

/* ipc off everywhere: members on TCP; off on rank 1 only: its members' links go over TCP both
 * ways, the others' over ipc. */
START_TEST(test_members_ipc_off)
{
    ipc_world_t w = {.world = 2 + _i, .stripes = 1, .ipc = _i == 1, .off_rank = _i};
    run_ipc_world(&w);
}
END_TEST

/* With CURVE (one client key every rank holds), members' ipc sockets are CURVE servers too. */
START_TEST(test_members_over_ipc_with_curve)
{
    char root[] = "/tmp/flodl-splitkey-XXXXXX";
    ck_assert(mkdtemp(root) != NULL);
    char path[256], cmd[512];
    snprintf(path, sizeof path, "%s/authorized", root);
    ck_assert(mkdir(path, 0700) == 0);
    snprintf(path, sizeof path, "%s/server", root);
    ck_assert(fl_tp_curve_keygen(path, "job server", FL_TP_KEY_ANY) == FL_OK);
    snprintf(path, sizeof path, "%s/client", root);
    ck_assert(fl_tp_curve_keygen(path, "ranks", FL_TP_KEY_ANY) == FL_OK);
    snprintf(cmd, sizeof cmd, "cp %s/client.pub %s/authorized/", root, root);
    ck_assert_int_eq(system(cmd), 0);
    ipc_world_t w = {.world = 2, .stripes = 1, .two_hosts = true, .ipc = true, .curve_dir = root};
    run_ipc_world(&w);
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("comm_split");
    TCase *t = tcase_create("split");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_split_by_color_and_key);
    tcase_add_test(t, test_members_as_columns);
    tcase_add_test(t, test_members_in_one_flat_ring);
    tcase_add_test(t, test_ranks_asking_for_different_counts_are_refused);
    tcase_add_test(t, test_zero_members_refused);
    tcase_add_test(t, test_member_hears_the_parents_failure);
    tcase_add_loop_test(t, test_members_over_ipc, 0, 2);
    tcase_add_loop_test(t, test_members_ipc_off, 0, 2);
    tcase_add_test(t, test_members_over_ipc_with_curve);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
