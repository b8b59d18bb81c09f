/* flodl-mpi-bench: the peer side of flodl-bench allreduce. MPI_Allreduce of float32 sums in
 * place with exactly the timing protocol of bench_allreduce.c (same sizes, back-to-back
 * iterations, repetitions, warm-up, slowest rank, median), printing RESULT lines. Built only
 * where an MPI compiler is found. Usage: flodl-mpi-bench MIN_BYTES MAX_BYTES */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    size_t min = argc > 1 ? strtoull(argv[1], NULL, 10) : 4096;
    size_t max = argc > 2 ? strtoull(argv[2], NULL, 10) : ((size_t)256 << 20);
    bench_sizes_t sizes;
    bench_sizes_range(&sizes, min, max);
    float *buf = NULL;
    if (posix_memalign((void **)&buf, 64, max) != 0)
        MPI_Abort(MPI_COMM_WORLD, 1);
    memset(buf, 0, max);
    for (size_t s = 0; s < sizes.n; s++) {
        int count = (int)(sizes.bytes[s] / sizeof(float));
        int iters = bench_iters_for(sizes.bytes[s]);
        int reps = bench_reps_for(sizes.bytes[s]);
        double t[16];
        for (int rep = -1; rep < reps; rep++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int it = 0; it < iters; it++)
                MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double us = (MPI_Wtime() - t0) * 1e6 / iters;
            MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (rep >= 0)
                t[rep] = us;
        }
        if (rank == 0) {
            printf("RESULT %zu %.3f\n", sizes.bytes[s], bench_median(t, reps));
            fflush(stdout);
        }
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
