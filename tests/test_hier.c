/* The two-level exchange (flodl/hier.h) with ranks as threads on two loopback "hosts": where
 * each rank sits, hybrid against flat (the same average, fewer bytes across hosts), top-k on
 * the shards, and the refusals of ranks that disagree. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flodl/hier.h>

#include "collutil.h"

static const char *const two_by_two[] = {"127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"};

/* Element i of rank r's gradient: varied signs and magnitudes, exact in float32. */
static float grad_of(int r, int step, size_t i)
{
    return (float)((int)((i * 2654435761u + (unsigned)(r * 977 + step * 131)) % 2001) - 1000) /
           300.0f;
}

static void fill(float *x, size_t n, int r, int step)
{
    for (size_t i = 0; i < n; i++)
        x[i] = grad_of(r, step, i);
}

/* ---- topology ---- */

typedef struct topo_case {
    int local_rank[MAX_WORLD], local_size[MAX_WORLD], cross_rank[MAX_WORLD];
    int cross_size, uniform;
} topo_case_t;

static int topo_rank(fl_comm_t *comm, void *arg)
{
    const topo_case_t *want = arg;
    int r = fl_comm_rank(comm);
    fl_hier_topo_t t;
    EXPECT_OK(fl_hier_topology(comm, &t));
    if (t.local_rank != want->local_rank[r] || t.local_size != want->local_size[r] ||
        t.cross_rank != want->cross_rank[r] || t.cross_size != want->cross_size ||
        t.uniform != want->uniform)
        return bad("rank %d: local %d/%d cross %d/%d uniform %d; expected %d/%d %d/%d %d", r,
                   t.local_rank, t.local_size, t.cross_rank, t.cross_size, t.uniform,
                   want->local_rank[r], want->local_size[r], want->cross_rank[r], want->cross_size,
                   want->uniform);
    return FL_OK;
}

START_TEST(test_topology_from_hosts)
{
    fl_comm_opts_t o;
    opts_base(&o);
    rank_hosts = two_by_two;
    topo_case_t even = {{0, 1, 0, 1}, {2, 2, 2, 2}, {0, 0, 1, 1}, 2, 1};
    run_world(4, &o, topo_rank, &even);
    /* Hosts numbered by their lowest rank, ranks of one host need not be contiguous. */
    static const char *const mixed[] = {"127.0.0.2", "127.0.0.1", "127.0.0.2"};
    rank_hosts = mixed;
    topo_case_t uneven = {{0, 0, 1}, {2, 1, 2}, {0, 1, 0}, 2, 0};
    run_world(3, &o, topo_rank, &uneven);
}
END_TEST

/* ---- hybrid against flat ---- */

enum { NB = 3 };
static const size_t lens[NB] = {200003, 3, 65536};

typedef struct run_case {
    fl_hier_mode_t mode;
    fl_hier_mem_t memory;
    float *residual[MAX_WORLD][NB]; /* top-k: the last step's, when asked for */
    double density;
    int steps;
    fl_hier_stats_t stats[MAX_WORLD];
    float *out[MAX_WORLD][NB]; /* the last step's result */
} run_case_t;

static int engine(fl_comm_t *comm, const run_case_t *c, fl_hier_t **h)
{
    fl_hier_opts_t o;
    fl_hier_opts_init(&o);
    o.hierarchy = c->mode;
    o.nbuckets = NB;
    o.bucket_len = lens;
    o.density = c->density;
    o.memory = c->memory;
    return fl_hier_create(comm, &o, h);
}

static int run_rank(fl_comm_t *comm, void *arg)
{
    run_case_t *c = arg;
    int r = fl_comm_rank(comm);
    fl_hier_t *h = NULL;
    EXPECT_OK(engine(comm, c, &h));
    int rc = FL_OK;
    for (int s = 0; rc == FL_OK && s < c->steps; s++)
        for (size_t b = 0; rc == FL_OK && b < NB; b++) {
            float *x = c->out[r][b];
            fill(x, lens[b], r, s * NB + (int)b);
            rc = fl_hier_allreduce(h, b, x);
        }
    fl_hier_get_stats(h, &c->stats[r]);
    for (size_t b = 0; rc == FL_OK && b < NB && c->residual[r][b] != NULL; b++)
        rc = fl_hier_residual_get(h, b, c->residual[r][b], fl_hier_residual_len(h, b));
    if (rc != FL_OK)
        rc = bad("rank %d: %s: %s", r, fl_strerror(rc), fl_last_error());
    fl_hier_destroy(&h);
    return rc;
}

static void run_on(run_case_t *c, fl_hier_mode_t mode, fl_hier_mem_t memory, double density,
                   int steps)
{
    memset(c, 0, sizeof *c);
    c->mode = mode;
    c->memory = memory;
    c->density = density;
    c->steps = steps;
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < NB; b++) {
            c->out[r][b] = malloc(lens[b] * sizeof(float));
            if (density > 0)
                c->residual[r][b] = calloc(lens[b], sizeof(float));
        }
    fl_comm_opts_t o;
    opts_base(&o);
    rank_hosts = two_by_two;
    run_world(4, &o, run_rank, c);
}

static void run_case(run_case_t *c, fl_hier_mode_t mode, double density, int steps)
{
    run_on(c, mode, FL_HIER_MEM_HOST, density, steps);
}

static void free_case(run_case_t *c)
{
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < NB; b++) {
            free(c->out[r][b]);
            free(c->residual[r][b]);
        }
}

static uint64_t remote_sum(const run_case_t *c)
{
    uint64_t s = 0;
    for (int r = 0; r < 4; r++)
        s += c->stats[r].bytes_sent_remote;
    return s;
}

/* Every rank holds the same bytes, within rel of the exact average of the last step. */
static void expect_average(const run_case_t *c, double rel, const char *what)
{
    for (int b = 0; b < NB; b++)
        for (size_t i = 0; i < lens[b]; i++) {
            double want = 0;
            for (int r = 0; r < 4; r++)
                want += grad_of(r, (c->steps - 1) * NB + b, i);
            want /= 4;
            float got = c->out[0][b][i];
            ck_assert_msg(fabs(got - want) <= rel * fmax(fabs(want), 1.0),
                          "%s: bucket %d element %zu is %.9g, the average %.9g", what, b, i, got,
                          want);
            for (int r = 1; r < 4; r++)
                ck_assert_msg(memcmp(&c->out[r][b][i], &got, sizeof got) == 0,
                              "%s: rank %d differs from rank 0 at bucket %d element %zu", what, r,
                              b, i);
        }
}

START_TEST(test_hybrid_dense_is_the_average_with_fewer_bytes_across_hosts)
{
    run_case_t flat, hyb, aut;
    run_case(&flat, FL_HIER_FLAT, 0, 2);
    run_case(&hyb, FL_HIER_HYBRID, 0, 2);
    run_case(&aut, FL_HIER_AUTO, 0, 1);
    expect_average(&flat, 1e-6, "flat");
    expect_average(&hyb, 1e-6, "hybrid");
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(flat.stats[r].hybrid, 0);
        ck_assert_int_eq(hyb.stats[r].hybrid, 1);
        ck_assert_int_eq(aut.stats[r].hybrid, 1); /* two hosts of two: auto is hybrid */
        ck_assert_int_eq(hyb.stats[r].ops, 2 * NB);
    }
    uint64_t fb = remote_sum(&flat), hb = remote_sum(&hyb);
    printf("hier: bytes across hosts, 2 hosts x 2 ranks, 2 steps of %zu floats: flat %.2f MiB, "
           "hybrid dense %.2f MiB (%.3f of flat)\n",
           lens[0] + lens[1] + lens[2], fb / 1048576.0, hb / 1048576.0, (double)hb / fb);
    ck_assert_msg(fb > 0 && hb * 3 <= fb * 2 + 4096,
                  "hybrid sent %llu bytes across hosts, flat %llu: more than 2/3",
                  (unsigned long long)hb, (unsigned long long)fb);
    free_case(&flat);
    free_case(&hyb);
    free_case(&aut);
}
END_TEST

/* Top-k with every entry sent is the dense average; 1% sends at most half of flat dense's
 * bytes across hosts. */
START_TEST(test_hybrid_topk_on_the_shards)
{
    run_case_t all, one, flat;
    run_case(&all, FL_HIER_HYBRID, 1.0, 1);
    expect_average(&all, 1e-6, "hybrid top-k at density 1");
    run_case(&one, FL_HIER_HYBRID, 0.01, 3);
    run_case(&flat, FL_HIER_FLAT, 0, 3);
    for (int b = 0; b < NB; b++) {
        size_t nz = 0;
        for (size_t i = 0; i < lens[b]; i++)
            nz += one.out[0][b][i] != 0.0f;
        /* Each of 2 shards gets at most 2 hosts' k pairs. */
        size_t k = (size_t)ceil(0.01 * (double)((lens[b] + 1) / 2));
        ck_assert_msg(nz <= 2 * 2 * (k + 1), "bucket %d: %zu non-zeros, k %zu", b, nz, k);
        for (int r = 1; r < 4; r++)
            ck_assert_msg(memcmp(one.out[r][b], one.out[0][b], lens[b] * sizeof(float)) == 0,
                          "top-k: rank %d's bucket %d differs from rank 0's", r, b);
    }
    uint64_t fb = remote_sum(&flat), tb = remote_sum(&one);
    printf("hier: bytes across hosts, 3 steps: flat dense %.2f MiB, hybrid top-k 1%% %.3f MiB "
           "(%.4f of flat)\n",
           fb / 1048576.0, tb / 1048576.0, (double)tb / fb);
    ck_assert_msg(tb * 2 <= fb, "top-k sent %llu bytes across hosts, flat dense %llu",
                  (unsigned long long)tb, (unsigned long long)fb);
    free_case(&all);
    free_case(&one);
    free_case(&flat);
}
END_TEST

/* ---- refusals ---- */

typedef struct refuse_case {
    int odd;                /* the rank whose options differ */
    fl_hier_mode_t mode;    /* its hierarchy */
    size_t len0;            /* its first bucket's length */
    double density;         /* its density */
    fl_hier_mem_t memory;   /* where its top-k runs */
    const char *odd_says;   /* in its own error */
    const char *others_say; /* in every other rank's error */
} refuse_case_t;

static const refuse_case_t refusals[] = {
    {2, FL_HIER_FLAT, 1000, 0.01, FL_HIER_MEM_HOST,
     "rank 2 (host 127.0.0.2) has hierarchy=flat, rank 0 (host "
     "127.0.0.1) has hierarchy=auto",
     NULL},
    {3, FL_HIER_AUTO, 999, 0.01, FL_HIER_MEM_HOST,
     "rank 3 (host 127.0.0.2) has a bucket layout of 2 buckets, "
     "1063 elements",
     NULL},
    {1, FL_HIER_AUTO, 1000, 0.5, FL_HIER_MEM_HOST,
     "rank 1 (host 127.0.0.1) has top-k density 0.5, rank 0 (host "
     "127.0.0.1) has top-k density 0.01",
     NULL},
    {2, FL_HIER_AUTO, 1000, 0.01, FL_HIER_MEM_SIM,
     "rank 2 (host 127.0.0.2) has top-k on the sim device, rank 0 (host 127.0.0.1) has top-k "
     "on the host",
     NULL},
    {1, FL_HIER_AUTO, 1000, 2.0, FL_HIER_MEM_HOST, "top-k density 2 is outside [0, 1]",
     "rank 1 (host 127.0.0.1) has hierarchy=none: options it refused itself"},
};

static int refuse_rank(fl_comm_t *comm, void *arg)
{
    const refuse_case_t *c = arg;
    int r = fl_comm_rank(comm);
    size_t len[2] = {r == c->odd ? c->len0 : 1000, 64};
    fl_hier_opts_t o;
    fl_hier_opts_init(&o);
    o.hierarchy = r == c->odd ? c->mode : FL_HIER_AUTO;
    o.nbuckets = 2;
    o.bucket_len = len;
    o.density = r == c->odd ? c->density : 0.01;
    o.memory = r == c->odd ? c->memory : FL_HIER_MEM_HOST;
    fl_hier_t *h = NULL;
    int rc = fl_hier_create(comm, &o, &h);
    const char *want = r == c->odd || c->others_say == NULL ? c->odd_says : c->others_say;
    if (rc != FL_EINVAL || strstr(fl_last_error(), want) == NULL) {
        fl_hier_destroy(&h);
        return bad("rank %d: %s (%s); expected invalid: ...%s...", r, fl_strerror(rc),
                   rc == FL_OK ? "" : fl_last_error(), want);
    }
    return FL_OK;
}

START_TEST(test_ranks_that_disagree_are_refused_on_every_rank)
{
    fl_comm_opts_t o;
    opts_base(&o);
    rank_hosts = two_by_two;
    run_world(4, &o, refuse_rank, (void *)&refusals[_i]);
}
END_TEST

static int uneven_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    size_t len = 100;
    fl_hier_opts_t o;
    fl_hier_opts_init(&o);
    o.nbuckets = 1;
    o.bucket_len = &len;
    o.hierarchy = FL_HIER_HYBRID;
    fl_hier_t *h = NULL;
    int rc = fl_hier_create(comm, &o, &h);
    if (rc != FL_EINVAL || strstr(fl_last_error(), "same number of ranks on every host") == NULL)
        return bad("rank %d: hybrid on hosts of 2 and 1: %s %s", fl_comm_rank(comm),
                   fl_strerror(rc), fl_last_error());
    o.hierarchy = FL_HIER_AUTO;
    EXPECT_OK(fl_hier_create(comm, &o, &h));
    fl_hier_stats_t st;
    fl_hier_get_stats(h, &st);
    float x[100];
    fill(x, 100, fl_comm_rank(comm), 0);
    rc = fl_hier_allreduce(h, 0, x);
    fl_hier_destroy(&h);
    EXPECT_OK(rc);
    if (st.hybrid)
        return bad("rank %d: auto chose hybrid on hosts of 2 and 1", fl_comm_rank(comm));
    if (fl_hier_allreduce(NULL, 0, x) != FL_EINVAL)
        return bad("a NULL engine was not refused");
    return FL_OK;
}

START_TEST(test_uneven_hosts_run_flat)
{
    fl_comm_opts_t o;
    opts_base(&o);
    static const char *const mixed[] = {"127.0.0.1", "127.0.0.1", "127.0.0.2"};
    rank_hosts = mixed;
    run_world(3, &o, uneven_rank, NULL);
}
END_TEST

/* ---- top-k on the simulated device ---- */

/* The device's error feedback and top-k are compression/ef.c's arithmetic (fl_math.h), and
 * the exchange around them is the same: the results and residuals are the host's bits. */
START_TEST(test_sim_device_gives_the_host_bits)
{
    fl_hier_mode_t mode = _i == 0 ? FL_HIER_HYBRID : FL_HIER_FLAT;
    run_case_t host, sim;
    run_on(&host, mode, FL_HIER_MEM_HOST, 0.01, 3);
    run_on(&sim, mode, FL_HIER_MEM_SIM, 0.01, 3);
    for (int r = 0; r < 4; r++)
        for (int b = 0; b < NB; b++) {
            ck_assert_msg(memcmp(host.out[r][b], sim.out[r][b], lens[b] * sizeof(float)) == 0,
                          "%s: rank %d bucket %d: sim's result differs from the host's",
                          mode == FL_HIER_HYBRID ? "hybrid" : "flat", r, b);
            ck_assert_msg(memcmp(host.residual[r][b], sim.residual[r][b],
                                 lens[b] * sizeof(float)) == 0,
                          "%s: rank %d bucket %d: sim's residual differs from the host's",
                          mode == FL_HIER_HYBRID ? "hybrid" : "flat", r, b);
        }
    float norm = 0;
    for (size_t i = 0; i < lens[0]; i++)
        norm += fabsf(sim.residual[0][0][i]);
    ck_assert_msg(norm > 0, "no residual kept");
    free_case(&host);
    free_case(&sim);
}
END_TEST

static int sim_residual_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    size_t len[2] = {1000, 64};
    fl_hier_opts_t o;
    fl_hier_opts_init(&o);
    o.nbuckets = 2;
    o.bucket_len = len;
    o.density = 0.05;
    o.memory = FL_HIER_MEM_SIM;
    o.hierarchy = FL_HIER_HYBRID;
    fl_hier_t *h = NULL;
    EXPECT_OK(fl_hier_create(comm, &o, &h));
    size_t n = fl_hier_residual_len(h, 0);
    float in[1000], out[1000];
    for (size_t i = 0; i < n; i++)
        in[i] = (float)i / 7.0f;
    int rc = fl_hier_residual_put(h, 0, in, n);
    if (rc == FL_OK)
        rc = fl_hier_residual_get(h, 0, out, n);
    if (rc == FL_OK && (n != 500 || memcmp(in, out, n * sizeof *in) != 0))
        rc = bad("rank %d: residual of %zu floats did not come back", fl_comm_rank(comm), n);
    in[3] = NAN;
    if (rc == FL_OK && fl_hier_residual_put(h, 0, in, n) != FL_ENONFINITE)
        rc = bad("rank %d: a NaN residual was taken", fl_comm_rank(comm));
    if (rc == FL_OK && fl_hier_residual_put(h, 0, in, n - 1) != FL_EINVAL)
        rc = bad("rank %d: a residual of the wrong length was taken", fl_comm_rank(comm));
    /* A NaN in the gradient: refused before the residual is touched, naming the bucket. */
    float g[1000];
    fill(g, 1000, fl_comm_rank(comm), 0);
    g[fl_comm_rank(comm) % 2 == 0 ? 17 : 517] = INFINITY; /* in this rank's own shard */
    if (rc == FL_OK && (fl_hier_allreduce(h, 0, g) != FL_ENONFINITE ||
                        strstr(fl_last_error(), "gradient bucket 0") == NULL))
        rc = bad("rank %d: an Inf gradient: %s", fl_comm_rank(comm), fl_last_error());
    fl_hier_destroy(&h);
    return rc == TEST_EBAD ? rc
           : rc == FL_OK   ? FL_OK
                           : bad("rank %d: %s", fl_comm_rank(comm), fl_last_error());
}

START_TEST(test_sim_residuals_in_and_out)
{
    fl_comm_opts_t o;
    opts_base(&o);
    rank_hosts = two_by_two;
    run_world(4, &o, sim_residual_rank, NULL);
}
END_TEST

Suite *hier_suite(void);
Suite *hier_suite(void)
{
    Suite *s = suite_create("hier");
    TCase *tc = tcase_create("hier");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_topology_from_hosts);
    tcase_add_test(tc, test_hybrid_dense_is_the_average_with_fewer_bytes_across_hosts);
    tcase_add_test(tc, test_hybrid_topk_on_the_shards);
    tcase_add_loop_test(tc, test_ranks_that_disagree_are_refused_on_every_rank, 0,
                        (int)(sizeof refusals / sizeof refusals[0]));
    tcase_add_test(tc, test_uneven_hosts_run_flat);
    tcase_add_loop_test(tc, test_sim_device_gives_the_host_bits, 0, 2);
    tcase_add_test(tc, test_sim_residuals_in_and_out);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return fl_test_run(hier_suite());
}
