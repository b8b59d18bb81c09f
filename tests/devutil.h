/* Helpers shared by the device conformance suites (test_dev_*.c), each built for cpu and sim
 * (always) and, with DEV_TEST_CUDA, for cuda: the backends under test, a device with a stream,
 * copies in and out, random inputs, and the bit-for-bit comparison with the host loops. */
#ifndef FL_DEVUTIL_H
#define FL_DEVUTIL_H

#include "fl_dev.h"
#include "testutil.h"

#ifdef DEV_TEST_CUDA
static const fl_dev_kind_t kinds[] = {FL_DEV_CUDA};
#else
static const fl_dev_kind_t kinds[] = {FL_DEV_CPU, FL_DEV_SIM};
#endif
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

typedef struct bench {
    fl_dev_t *d;
    fl_stream_t *s;
} bench_t;

bench_t open_kind(fl_dev_kind_t k, int jitter_us);

void close_bench(bench_t *b);

#define OK(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        ck_assert_msg(rc_ == FL_OK, "%s: %s: %s", #call, fl_strerror(rc_), fl_last_error());       \
    } while (0)

/* A device buffer holding host data. */
fl_dptr_t up(bench_t *b, const void *h, size_t bytes);

void down(bench_t *b, void *h, fl_dptr_t p, size_t bytes);

float *randv(size_t n, uint64_t seed, double scale);

void expect_bits(const char *what, const float *got, const float *want, size_t n);

/* A suite's main: makes the suite with make() and runs it; for cuda (DEV_TEST_CUDA) only after
 * fl_test_gpu_probe found a usable device, returning its status (77: skip) when it did not. */
int dev_test_main(Suite *(*make)(void));

#endif
