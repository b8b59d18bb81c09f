/* worker: flodl-worker, what runs on each GPU host. Until training lands (#5) its job is the
 * gradient-exchange drill: allreduce a gradient-sized buffer every step, check every element
 * against the exact expected sum, and report timings. */
#ifndef FL_WK_H
#define FL_WK_H

#include <stdbool.h>
#include <stddef.h>

#include <flodl/comm.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_wk_drill_opts {
    size_t bytes;     /* buffer size (default 64 MiB) */
    int steps;        /* allreduces to run (default 20) */
    fl_dtype_t dtype; /* default float32 */
    fl_op_t op;       /* default FL_AVG */
    bool quiet;       /* summary only */
} fl_wk_drill_opts_t;

void fl_wk_drill_opts_init(fl_wk_drill_opts_t *opts);

/* Fills a rank's step-s contribution: values k/8 with |k| < 32, so that sums over up to 2^16
 * ranks are exact in float32 whatever the order, and the check needs no tolerance. */
void fl_wk_drill_fill(void *buf, size_t count, fl_dtype_t dtype, int rank, int step);

/* Element i of the exact reduction over nranks, in float64. */
double fl_wk_drill_expected(size_t i, int nranks, int step, fl_op_t op);

/* Runs the drill on comm, printing per-step lines (rank 0, unless quiet) and a summary line.
 * Returns FL_OK, a collective's error, or FL_EPROTO when a result differs (the detail names
 * the step, element, got and expected). */
int fl_wk_drill_run(fl_comm_t *comm, const fl_wk_drill_opts_t *opts);

#ifdef __cplusplus
}
#endif

#endif
