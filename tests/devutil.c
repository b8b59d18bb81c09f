/* Helpers shared by the device conformance suites: benches, copies, inputs, comparisons. */
#include "devutil.h"

#include <stdlib.h>
#include <string.h>

bench_t open_kind(fl_dev_kind_t k, int jitter_us)
{
    fl_dev_opts_t o;
    fl_dev_opts_init(&o);
    o.kind = k;
    o.sim_jitter_us = jitter_us;
    bench_t b = {0};
    int rc = fl_dev_create(&o, &b.d);
    ck_assert_msg(rc == FL_OK, "%s: %s", fl_dev_kind_name(k), fl_last_error());
    rc = fl_stream_create(b.d, &b.s);
    ck_assert_msg(rc == FL_OK, "stream: %s", fl_last_error());
    return b;
}

void close_bench(bench_t *b)
{
    fl_stream_destroy(&b->s);
    fl_dev_destroy(&b->d);
}

fl_dptr_t up(bench_t *b, const void *h, size_t bytes)
{
    fl_dptr_t p;
    OK(fl_dev_alloc(b->d, bytes, &p));
    OK(fl_dev_h2d(b->s, p, h, bytes));
    return p;
}

void down(bench_t *b, void *h, fl_dptr_t p, size_t bytes)
{
    OK(fl_dev_d2h(b->s, h, p, bytes));
    OK(fl_stream_sync(b->s, 10000));
}

float *randv(size_t n, uint64_t seed, double scale)
{
    float *v = malloc(n * sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(fl_test_uniform(&seed) * scale);
    return v;
}

void expect_bits(const char *what, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            ck_abort_msg("%s[%zu] = %a, the host loop gives %a", what, i, (double)got[i],
                         (double)want[i]);
}

int dev_test_main(Suite *(*make)(void))
{
#ifdef DEV_TEST_CUDA
    int probe = fl_test_gpu_probe("device conformance (cuda)");
    if (probe != 0)
        return probe;
#endif
    return fl_test_run(make());
}
