/* Benchmark plumbing shared by the flodl-bench subcommands: size lists, the timing protocol
 * (the same for flodl and for the MPI peer), flag lists, test data, child processes (and
 * whole jobs of ranks) with captured output, and the "RESULT" lines they report through. */
#ifndef FL_BENCH_UTIL_H
#define FL_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define BENCH_MAX_SIZES 32
#define BENCH_MAX_LIST 16

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

/* Parses a comma-separated list of element counts ("1M,10M,50M"; K/M/G are powers of 1024,
 * as fl_cli_size) into out[0..*n), each in [lo, hi], at most BENCH_MAX_LIST. 0, or -1 after
 * printing what is wrong. */
int bench_parse_counts(const char *flag, const char *s, size_t lo, size_t hi, size_t *out,
                       int *n);

/* Parses a comma-separated list of densities, each in (0, 1]. 0, or -1 after printing. */
int bench_parse_densities(const char *flag, const char *s, double *out, int *n);

/* Formats an element count for tables: "50M", "1536K", "1000". */
void bench_fmt_count(size_t n, char *out, size_t cap);

/* Fills x[0..n) with standard normal samples (Box-Muller over splitmix64): the same values
 * for the same seed, different ones for different seeds. */
void bench_fill_gauss(float *x, size_t n, uint64_t seed);

/* Receives the text after "RESULT " of each result line. */
typedef void (*bench_result_fn)(const char *rest, void *ud);

/* Reads lines from fd until EOF (and closes it): "RESULT ..." lines go to fn, other lines are
 * echoed to stderr. */
void bench_read_tagged(int fd, bench_result_fn fn, void *ud);

/* Runs a job of `ranks` copies of this executable on this machine, with an in-process
 * coordinator: rank r runs "SUBCOMMAND --report --rank r --world-size N --coordinator EP
 * --host 127.0.0.1 EXTRA...", bound to CPU r mod ncpus when bind is set. Rank 0's RESULT
 * lines go to fn; the other ranks' stdout is dropped. Returns 0 when every rank exited 0. */
int bench_run_job(const char *subcommand, char *const extra[], int nextra, int ranks, bool bind,
                  bench_result_fn fn, void *ud);

/* The same ranks against a coordinator the caller runs (one with a parameter server, say). */
int bench_run_ranks(const char *coordinator, const char *subcommand, char *const extra[],
                    int nextra, int ranks, bool bind, bench_result_fn fn, void *ud);

/* Runs path with argv as a child that leads a process group of its own (so that whatever it
 * starts can be stopped with it), with its stdout and stderr both going to a pipe, returned in
 * *out_fd. Returns the pid, which is also the group's id, or -1. */
pid_t bench_spawn_group(const char *path, char *const argv[], int *out_fd);

/* Receives each line (without its newline) that bench_read_lines reads. */
typedef void (*bench_line_fn)(const char *line, void *ud);

/* Reads lines from fd until EOF or until the deadline (fl_deadline_in's clock) passes, and
 * closes fd. Lines longer than 1 KiB arrive in pieces. Returns 0 at EOF, -1 at the deadline or
 * on a read error. */
int bench_read_lines(int fd, int64_t deadline, bench_line_fn fn, void *ud);

/* Waits for a child from bench_spawn_group until the deadline; past it, sends SIGTERM to its
 * group, and SIGKILL grace_ms later. Whatever is left in the group once the leader has exited
 * is killed before the leader is reaped (while its zombie still holds the group's id). Returns
 * the leader's exit status, or -1 when it was signalled, had to be stopped, or cannot be
 * waited for. */
int bench_wait_group(pid_t pid, int64_t deadline, int grace_ms);

/* ZeroMQ's own one-way latency per size (bench_floor.c): two processes of this executable on
 * the CPUs of ranks 0 and 1 (when bind is set) ping-pong over PUSH/PULL on loopback TCP, or
 * over ipc:// (ipc, what flodl's ranks on one host use by default); us[i] gets
 * half the median round trip of sizes->bytes[i], xchg[i] the median time of an exchange (both
 * send one message of the size, then take the other's); -1 where missing. 0 when it ran. */
int bench_floor_run(size_t min, size_t max, bool bind, bool ipc, const bench_sizes_t *sizes,
                    double *us, double *xchg);

#endif
