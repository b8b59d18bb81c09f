/* Benchmark plumbing shared by the flodl-bench subcommands: size lists, the timing protocol
 * (the same for flodl and for the MPI peer), child processes with captured output, and the
 * "RESULT" lines they report through. */
#ifndef FL_BENCH_UTIL_H
#define FL_BENCH_UTIL_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#define BENCH_MAX_SIZES 32

typedef struct bench_sizes {
    size_t n;
    size_t bytes[BENCH_MAX_SIZES];
} bench_sizes_t;

/* Powers of four from lo to hi (both included when they are powers of four from lo). */
void bench_sizes_range(bench_sizes_t *s, size_t lo, size_t hi);

/* Back-to-back operations per timed repetition, and repetitions, for a buffer size: enough
 * work per repetition to see past the clock, few enough repetitions to finish. Identical for
 * every implementation measured. */
int bench_iters_for(size_t bytes);
int bench_reps_for(size_t bytes);

/* Median of n values (sorts them). */
double bench_median(double *v, int n);

/* Runs argv as a child with stdout to a pipe (returned in *out_fd) and stderr inherited.
 * Returns the pid or -1. */
pid_t bench_spawn(char *const argv[], int *out_fd, char *const envp[]);

/* Like bench_spawn for an absolute path, with the child bound to the k-th CPU this process
 * may run on (k taken modulo their number); cpu_index < 0 leaves it unbound. */
pid_t bench_spawn_on(const char *path, char *const argv[], int *out_fd, int cpu_index);

/* Waits for pid up to timeout_ms, killing it (SIGKILL) after that. Returns its exit status,
 * or -1 when it was killed or failed. */
int bench_wait(pid_t pid, int timeout_ms);

/* Reads "RESULT <bytes> <us_per_op>" lines from fd until EOF; results[i] gets the time of
 * sizes->bytes[i] (or -1 when missing). Other lines are echoed to stderr. */
void bench_read_results(int fd, const bench_sizes_t *sizes, double *us);

/* The directory of the running executable, for finding its sibling binaries. */
void bench_self_dir(char *out, size_t cap);

#endif
