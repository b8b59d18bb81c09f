/* GPU suite (CTest label "gpu"): top-k on CUDA device buffers (topk_cuda.cu). The exact mode
 * must select what fl_cmp_topk selects on the host, bit for bit, up to 64M entries with ties
 * and equal values; the sampled mode stays within its bounds; NaN/Inf are refused naming the
 * first bad index; the throughput at 64M is printed. Without a usable CUDA device the whole
 * suite is skipped (exit 77) and says why. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fl_cmp.h"
#include "testutil.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))
#define BIG ((size_t)1 << 26) /* 64M entries, 256 MiB of gradient */

enum { D_UNIFORM, D_TIES, D_ALLEQ, D_ZEROS, D_COUNT };

static uint32_t key_of(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u & 0x7fffffffu;
}

static void fill(float *x, size_t n, int dist, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ULL + (uint64_t)dist;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = fl_test_rand(&s);
        float sign = (r & 1) ? -1.0f : 1.0f;
        switch (dist) {
        case D_TIES: /* -3..3 */ x[i] = (float)(int)((r >> 8) % 7) - 3.0f; break;
        case D_ALLEQ: x[i] = sign * 0.75f; break;
        case D_ZEROS: /* mostly +0.0 and -0.0 */
            x[i] = (r >> 8) % 10 == 0 ? (float)fl_test_uniform(&s) : sign * 0.0f;
            break;
        default: x[i] = (float)fl_test_uniform(&s); break;
        }
    }
}

/* Device buffers for one input of up to cap entries. */
typedef struct dev {
    float *x;
    uint32_t *idx;
    float *val;
} dbufs_t;

static void dev_alloc(dbufs_t *d, size_t cap)
{
    void *p[3] = {NULL, NULL, NULL};
    ck_assert_int_eq(fl_gpu_alloc(&p[0], cap * sizeof(float)), FL_OK);
    ck_assert_int_eq(fl_gpu_alloc(&p[1], cap * sizeof(uint32_t)), FL_OK);
    ck_assert_int_eq(fl_gpu_alloc(&p[2], cap * sizeof(float)), FL_OK);
    d->x = p[0];
    d->idx = p[1];
    d->val = p[2];
}

static void dev_free(dbufs_t *d)
{
    fl_gpu_free(d->x);
    fl_gpu_free(d->idx);
    fl_gpu_free(d->val);
}

/* Runs fl_cmp_topk_device on d->x (already holding n entries) and copies the pairs back. */
static int run_device(dbufs_t *d, size_t n, const fl_cmp_topk_opts_t *o, uint32_t *idx, float *val,
                      size_t *k_out)
{
    int rc = fl_cmp_topk_device(d->x, n, o, d->idx, d->val, k_out);
    if (rc != FL_OK || *k_out == 0)
        return rc;
    if ((rc = fl_gpu_memcpy(idx, d->idx, *k_out * sizeof *idx)) != FL_OK)
        return rc;
    return fl_gpu_memcpy(val, d->val, *k_out * sizeof *val);
}

typedef struct host {
    float *x;
    uint32_t *idx;
    float *val;
    uint32_t *didx;
    float *dval;
} host_t;

static void host_alloc(host_t *h, size_t n, size_t kmax)
{
    h->x = malloc(n * sizeof *h->x);
    h->idx = malloc(kmax * sizeof *h->idx);
    h->val = malloc(kmax * sizeof *h->val);
    h->didx = malloc(kmax * sizeof *h->didx);
    h->dval = malloc(kmax * sizeof *h->dval);
    ck_assert(h->x && h->idx && h->val && h->didx && h->dval);
}

static void host_free(host_t *h)
{
    free(h->x);
    free(h->idx);
    free(h->val);
    free(h->didx);
    free(h->dval);
}

/* Exact mode: the device selects the same pairs as the host. */
static void compare_exact(fl_cmp_ws_t *ws, dbufs_t *d, host_t *h, size_t n, int dist,
                          const fl_cmp_topk_opts_t *o)
{
    size_t k_host = 0;
    size_t k_dev = 0;
    int rc = fl_cmp_topk(ws, h->x, n, o, h->idx, h->val, &k_host);
    ck_assert_msg(rc == FL_OK, "host n %zu: %s", n, fl_last_error());
    rc = run_device(d, n, o, h->didx, h->dval, &k_dev);
    if (rc != FL_OK)
        ck_abort_msg("device n %zu dist %d k %zu: rc %d: %s", n, dist, o->k, rc, fl_last_error());
    if (k_dev != k_host)
        ck_abort_msg("n %zu dist %d: device %zu pairs, host %zu", n, dist, k_dev, k_host);
    for (size_t j = 0; j < k_host; j++)
        if (h->didx[j] != h->idx[j] || memcmp(&h->dval[j], &h->val[j], sizeof(float)) != 0)
            ck_abort_msg("n %zu dist %d k %zu: pair %zu device (%u, %a) host (%u, %a)", n, dist,
                         k_host, j, h->didx[j], (double)h->dval[j], h->idx[j], (double)h->val[j]);
}

START_TEST(test_exact_matches_host)
{
    static const size_t sizes[] = {1, 7, 1000, 65537, 1000003, BIG};
    const int dist = _i;
    host_t h;
    host_alloc(&h, BIG, 1000003);
    dbufs_t d;
    dev_alloc(&d, BIG);
    fl_cmp_ws_t *ws = NULL;
    ck_assert_int_eq(fl_cmp_ws_create(&ws), FL_OK);
    for (size_t si = 0; si < NELEM(sizes); si++) {
        size_t n = sizes[si];
        fill(h.x, n, dist, si + 1);
        ck_assert_int_eq(fl_gpu_memcpy(d.x, h.x, n * sizeof *h.x), FL_OK);
        const double dens[] = {1e-3, 1e-2, 0.1};
        for (size_t c = 0; c < NELEM(dens) + 2; c++) {
            fl_cmp_topk_opts_t o;
            fl_cmp_topk_opts_init(&o);
            if (c < NELEM(dens))
                o.density = dens[c];
            else
                o.k = c == NELEM(dens) ? 1 : n; /* k = n only where it fits the buffers */
            if (o.k > 1000003 || (n == BIG && o.density > 0.01))
                continue;
            compare_exact(ws, &d, &h, n, dist, &o);
        }
    }
    fl_cmp_ws_destroy(&ws);
    dev_free(&d);
    host_free(&h);
}
END_TEST

/* Sampled mode: at most k pairs, indices ascending, values those of x, nothing left out larger
 * than what was selected. */
START_TEST(test_sampled)
{
    static const size_t sizes[] = {1000, 1000003, (size_t)1 << 24};
    const size_t maxn = (size_t)1 << 24;
    host_t h;
    host_alloc(&h, maxn, maxn / 10 + 1);
    dbufs_t d;
    dev_alloc(&d, maxn);
    uint8_t *mark = malloc(maxn);
    ck_assert_ptr_nonnull(mark);
    for (size_t si = 0; si < NELEM(sizes); si++) {
        size_t n = sizes[si];
        for (int dist = 0; dist < D_COUNT; dist++) {
            fill(h.x, n, dist, 40 + si);
            ck_assert_int_eq(fl_gpu_memcpy(d.x, h.x, n * sizeof *h.x), FL_OK);
            fl_cmp_topk_opts_t o;
            fl_cmp_topk_opts_init(&o);
            o.mode = FL_CMP_SAMPLED;
            o.density = 0.01;
            size_t k = 0;
            size_t k_out = 0;
            ck_assert_int_eq(fl_cmp_topk_count(n, &o, &k), FL_OK);
            int rc = run_device(&d, n, &o, h.didx, h.dval, &k_out);
            if (rc != FL_OK || k_out > k)
                ck_abort_msg("n %zu dist %d: rc %d, %zu of %zu: %s", n, dist, rc, k_out, k,
                             fl_last_error());
            memset(mark, 0, n);
            uint32_t min_sel = UINT32_MAX;
            for (size_t j = 0; j < k_out; j++) {
                uint32_t i = h.didx[j];
                if (i >= n || (j > 0 && i <= h.didx[j - 1]) ||
                    memcmp(&h.dval[j], &h.x[i], sizeof(float)) != 0)
                    ck_abort_msg("n %zu dist %d: pair %zu (%u, %g) out of order or wrong", n, dist,
                                 j, i, (double)h.dval[j]);
                mark[i] = 1;
                min_sel = key_of(h.x[i]) < min_sel ? key_of(h.x[i]) : min_sel;
            }
            for (size_t i = 0; i < n && k_out > 0; i++)
                if (!mark[i] && key_of(h.x[i]) > min_sel)
                    ck_abort_msg("n %zu dist %d: x[%zu] = %g left out", n, dist, i, (double)h.x[i]);
            if (dist == D_UNIFORM && n > 1000 && k_out < k / 2)
                ck_abort_msg("n %zu: only %zu of %zu pairs", n, k_out, k);
        }
    }
    free(mark);
    dev_free(&d);
    host_free(&h);
}
END_TEST

/* True when msg says "index <i>" for exactly this i. */
static bool names_index(const char *msg, size_t i)
{
    char want[48];
    snprintf(want, sizeof want, "index %zu", i);
    size_t len = strlen(want);
    for (const char *p = strstr(msg, want); p != NULL; p = strstr(p + 1, want))
        if (p[len] < '0' || p[len] > '9')
            return true;
    return false;
}

/* NaN and Inf at the first, a middle and the last index, exact and sampled: refused naming
 * the tensor and that index. */
START_TEST(test_nonfinite)
{
    static const size_t sizes[] = {1000, 1000003};
    const float bad[] = {NAN, INFINITY, -INFINITY};
    host_t h;
    host_alloc(&h, 1000003, 1000003);
    dbufs_t d;
    dev_alloc(&d, 1000003);
    for (size_t si = 0; si < NELEM(sizes); si++) {
        size_t n = sizes[si];
        const size_t pos[] = {0, n / 2 + 1, n - 1};
        for (size_t pi = 0; pi < NELEM(pos); pi++) {
            for (size_t bi = 0; bi < NELEM(bad); bi++) {
                fill(h.x, n, D_UNIFORM, 60 + pi);
                h.x[pos[pi]] = bad[bi];
                if (pos[pi] != n - 1)
                    h.x[n - 1] = NAN; /* a later one is not the one named */
                ck_assert_int_eq(fl_gpu_memcpy(d.x, h.x, n * sizeof *h.x), FL_OK);
                for (int mode = 0; mode < 2; mode++) {
                    fl_cmp_topk_opts_t o;
                    fl_cmp_topk_opts_init(&o);
                    o.mode = mode ? FL_CMP_SAMPLED : FL_CMP_EXACT;
                    o.name = "dev.grad";
                    size_t k_out = 0;
                    int rc = fl_cmp_topk_device(d.x, n, &o, d.idx, d.val, &k_out);
                    const char *msg = fl_last_error();
                    if (rc != FL_ENONFINITE || !strstr(msg, "dev.grad") ||
                        !names_index(msg, pos[pi]))
                        ck_abort_msg("n %zu %g at %zu, mode %d: rc %d k_out %zu: %s", n,
                                     (double)bad[bi], pos[pi], mode, rc, k_out, msg);
                }
            }
        }
    }
    dev_free(&d);
    host_free(&h);
}
END_TEST

/* The device validates n, k and density as the host does. */
START_TEST(test_bad_counts)
{
    dbufs_t d;
    dev_alloc(&d, 64);
    fl_cmp_topk_opts_t o;
    fl_cmp_topk_opts_init(&o);
    size_t k_out = 0;
    ck_assert_int_eq(fl_cmp_topk_device(d.x, 0, &o, d.idx, d.val, &k_out), FL_EINVAL);
    o.k = 65;
    ck_assert_int_eq(fl_cmp_topk_device(d.x, 64, &o, d.idx, d.val, &k_out), FL_EINVAL);
    o.k = 0;
    o.density = 1.5;
    ck_assert_int_eq(fl_cmp_topk_device(d.x, 64, &o, d.idx, d.val, &k_out), FL_EINVAL);
    dev_free(&d);
}
END_TEST

/* ... and the mode and the sampling fraction, as fl_cmp_topk does. */
START_TEST(test_bad_mode_and_fraction)
{
    dbufs_t d;
    dev_alloc(&d, 64);
    fl_cmp_topk_opts_t o;
    fl_cmp_topk_opts_init(&o);
    size_t k_out = 0;
    o.mode = (fl_cmp_select_t)7;
    int rc = fl_cmp_topk_device(d.x, 64, &o, d.idx, d.val, &k_out);
    ck_assert_msg(rc == FL_EINVAL, "mode 7: rc %d", rc);
    const double fractions[] = {0.0, 2.0, -0.5, NAN};
    for (size_t i = 0; i < NELEM(fractions); i++) {
        fl_cmp_topk_opts_init(&o);
        o.mode = FL_CMP_SAMPLED;
        o.sample_fraction = fractions[i];
        rc = fl_cmp_topk_device(d.x, 64, &o, d.idx, d.val, &k_out);
        ck_assert_msg(rc == FL_EINVAL, "sample_fraction %g: rc %d", fractions[i], rc);
    }
    dev_free(&d);
}
END_TEST

/* 64M entries at 1%: GB/s of gradient read, device and host (informational). */
START_TEST(test_throughput)
{
    const size_t n = BIG;
    host_t h;
    host_alloc(&h, n, n / 100 + 1);
    dbufs_t d;
    dev_alloc(&d, n);
    fl_cmp_ws_t *ws = NULL;
    ck_assert_int_eq(fl_cmp_ws_create(&ws), FL_OK);
    fill(h.x, n, D_UNIFORM, 77);
    ck_assert_int_eq(fl_gpu_memcpy(d.x, h.x, n * sizeof *h.x), FL_OK);
    for (int mode = 0; mode < 2; mode++) {
        fl_cmp_topk_opts_t o;
        fl_cmp_topk_opts_init(&o);
        o.density = 0.01;
        o.mode = mode ? FL_CMP_SAMPLED : FL_CMP_EXACT;
        size_t k_out = 0;
        ck_assert_int_eq(fl_cmp_topk_device(d.x, n, &o, d.idx, d.val, &k_out), FL_OK);
        const int reps = 5;
        int64_t t0 = fl_now_ns();
        for (int r = 0; r < reps; r++)
            ck_assert_int_eq(fl_cmp_topk_device(d.x, n, &o, d.idx, d.val, &k_out), FL_OK);
        /* a copy back waits for the last kernels */
        ck_assert_int_eq(fl_gpu_memcpy(h.dval, d.val, sizeof(float)), FL_OK);
        double dev_s = (double)(fl_now_ns() - t0) / 1e9 / reps;
        t0 = fl_now_ns();
        ck_assert_int_eq(fl_cmp_topk(ws, h.x, n, &o, h.idx, h.val, &k_out), FL_OK);
        double host_s = (double)(fl_now_ns() - t0) / 1e9;
        double gb = (double)n * sizeof(float) / 1e9;
        printf("gpu_topk %s 64M at 1%%: device %.2f ms (%.1f GB/s), host %.1f ms (%.2f GB/s)\n",
               mode ? "sampled" : "exact", dev_s * 1e3, gb / dev_s, host_s * 1e3, gb / host_s);
    }
    fl_cmp_ws_destroy(&ws);
    dev_free(&d);
    host_free(&h);
}
END_TEST

Suite *gpu_topk_suite(void);
Suite *gpu_topk_suite(void)
{
    Suite *s = suite_create("gpu_topk");
    TCase *t = tcase_create("device");
    tcase_set_timeout(t, 240);
    tcase_add_loop_test(t, test_exact_matches_host, 0, D_COUNT);
    tcase_add_test(t, test_sampled);
    tcase_add_test(t, test_nonfinite);
    tcase_add_test(t, test_bad_counts);
    tcase_add_test(t, test_bad_mode_and_fraction);
    tcase_add_test(t, test_throughput);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    int probe = fl_test_gpu_probe("gpu_topk suite");
    if (probe != 0)
        return probe;
    return fl_test_run(gpu_topk_suite());
}
