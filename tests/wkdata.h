/* Helpers of the worker suites: a small dataset and the comparison of saved parameters. */
#ifndef FL_TEST_WKDATA_H
#define FL_TEST_WKDATA_H

#include "fl_wk.h"

/* Three noisy clusters in 6 dimensions, the label the nearest centre: n samples from seed. */
void fl_test_clusters(fl_wk_dataset_t *d, size_t n, uint64_t seed);

/* The largest relative difference between the parameters of model `layers` saved at a and b
 * (relative to 1e-3 + |a|). ck_assert()s that both load. */
double fl_test_params_diff(const char *layers, const char *a, const char *b);

/* Fails the test when they differ by 1e-4 or more, saying what was compared. */
void fl_test_params_close(const char *layers, const char *a, const char *b, const char *what);

#endif
