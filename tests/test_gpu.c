/* GPU suite (CTest label "gpu"): collectives on CUDA device buffers (staged through host
 * memory), device pointer detection and copies. Without a usable CUDA device the whole suite
 * is skipped (exit 77, which CTest reports as skipped) and says why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define N 100003

static int dev_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    float *host = malloc(N * sizeof *host);
    void *dev = NULL;
    int rc = fl_gpu_alloc(&dev, N * sizeof(float));
    if (rc != FL_OK || host == NULL)
        return rc != FL_OK ? rc : FL_ENOMEM;
    for (size_t i = 0; i < N; i++)
        host[i] = (float)(r + 1) + (float)(i % 7);
    if ((rc = fl_gpu_memcpy(dev, host, N * sizeof(float))) != FL_OK)
        goto out;
    if ((rc = fl_allreduce(comm, dev, dev, N, FL_FLOAT32, FL_SUM)) != FL_OK)
        goto out;
    if ((rc = fl_gpu_memcpy(host, dev, N * sizeof(float))) != FL_OK)
        goto out;
    for (size_t i = 0; i < N; i++) {
        float want = (float)(n * (n + 1) / 2) + (float)n * (float)(i % 7);
        if (host[i] != want) {
            rc = fl_fail(FL_EPROTO, "rank %d: device allreduce element %zu = %g, want %g", r, i,
                         host[i], want);
            goto out;
        }
    }
    /* Broadcast from the last rank into device memory. */
    for (size_t i = 0; i < N; i++)
        host[i] = r == n - 1 ? (float)i : -1.0f;
    if ((rc = fl_gpu_memcpy(dev, host, N * sizeof(float))) != FL_OK ||
        (rc = fl_broadcast(comm, dev, N, FL_FLOAT32, n - 1)) != FL_OK ||
        (rc = fl_gpu_memcpy(host, dev, N * sizeof(float))) != FL_OK)
        goto out;
    for (size_t i = 0; i < N; i++) {
        if (host[i] != (float)i) {
            rc = fl_fail(FL_EPROTO, "rank %d: device broadcast element %zu = %g", r, i, host[i]);
            goto out;
        }
    }
out:
    fl_gpu_free(dev);
    free(host);
    return rc;
}

START_TEST(test_device_collectives)
{
    char err[1024] = "";
    for (int world = 1; world <= 3; world++) {
        int rc = fl_test_run_ranks(world, NULL, dev_rank, NULL, err, sizeof err);
        ck_assert_msg(rc == FL_OK, "%d ranks: %s", world, err);
    }
}
END_TEST

START_TEST(test_pointer_kinds)
{
    void *dev = NULL;
    ck_assert_int_eq(fl_gpu_alloc(&dev, 4096), FL_OK);
    char host[64];
    ck_assert(fl_gpu_is_device_ptr(dev));
    ck_assert(!fl_gpu_is_device_ptr(host));
    ck_assert(!fl_gpu_is_device_ptr(NULL));
    memset(host, 7, sizeof host);
    ck_assert_int_eq(fl_gpu_memcpy(dev, host, sizeof host), FL_OK);
    memset(host, 0, sizeof host);
    ck_assert_int_eq(fl_gpu_memcpy(host, dev, sizeof host), FL_OK);
    ck_assert_int_eq(host[0], 7);
    ck_assert_int_eq(host[63], 7);
    fl_gpu_free(dev);
}
END_TEST

Suite *gpu_suite(void);
Suite *gpu_suite(void)
{
    Suite *s = suite_create("gpu");
    TCase *t = tcase_create("device");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_pointer_kinds);
    tcase_add_test(t, test_device_collectives);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    int probe = fl_test_gpu_probe("gpu suite");
    if (probe != 0)
        return probe;
    return fl_test_run(gpu_suite());
}
