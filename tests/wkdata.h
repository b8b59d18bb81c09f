/* Helpers of the worker suites: a small dataset and the comparison of saved parameters. */
#ifndef FL_TEST_WKDATA_H
#define FL_TEST_WKDATA_H

#include "fl_wk.h"

/* Three noisy clusters in 6 dimensions, the label the nearest centre: n samples from seed. */
void fl_test_clusters(fl_dataset_t *d, size_t n, uint64_t seed);

/* The largest relative difference between the parameters of model `layers` saved at a and b
 * (relative to 1e-3 + |a|). ck_assert()s that both load. */
double fl_test_params_diff(const char *layers, const char *a, const char *b);

/* Fails the test when they differ by 1e-4 or more, saying what was compared. */
void fl_test_params_close(const char *layers, const char *a, const char *b, const char *what);

/* Trains on W "hosts" (threads with their own communicators and host addresses 127.0.0.<r+1>,
 * an in-process coordinator) with the options o (replicas[r] devices on rank r when replicas
 * is not NULL); res[r] (may be NULL) gets each rank's result. Returns the first error, its
 * text in err. */
#define FL_TEST_MAX_HOSTS 4
int fl_test_run_hosts(int W, const fl_wk_train_opts_t *o, const int *replicas,
                      const fl_dataset_t *d, fl_wk_train_result_t *res, char *err, size_t cap);

#endif
