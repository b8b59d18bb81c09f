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

/* ---- flags (bench_flags.c) ---- */

/* Parses a comma-separated list of element counts ("1M,10M,50M"; K/M/G are powers of 1024,
 * as fl_cli_size) into out[0..*n), each in [lo, hi], at most BENCH_MAX_LIST. 0, or -1 after
 * printing what is wrong. */
int bench_parse_counts(const char *flag, const char *s, size_t lo, size_t hi, size_t *out, int *n);

/* Parses a comma-separated list of densities, each in (0, 1]. 0, or -1 after printing. */
int bench_parse_densities(const char *flag, const char *s, double *out, int *n);

/* What a flag takes, and so the type of the field it sets. */
typedef enum bench_kind {
    BENCH_SWITCH,    /* no value: a bool, set true */
    BENCH_INT,       /* an int in [lo, hi] (fl_cli_long's checks and words) */
    BENCH_LONG,      /* a long in [lo, hi] */
    BENCH_SIZE,      /* a size_t in [lo, hi], K/M/G as powers of 1024 (fl_cli_size) */
    BENCH_DOUBLE,    /* a double in [lo, hi] (fl_cli_double) */
    BENCH_TEXT,      /* a const char *: the value as given, unchecked */
    BENCH_WORD,      /* a const char *: one of the words ("cpu|cuda|sim") */
    BENCH_YESNO,     /* a bool: true for the first of the two words ("core|none"), else false */
    BENCH_COUNTS,    /* size_t[BENCH_MAX_LIST] in [lo, hi] (bench_parse_counts), with count */
    BENCH_DENSITIES, /* double[BENCH_MAX_LIST] in (0, 1] (bench_parse_densities), with count */
    BENCH_CALL,      /* set() checks the value and sets whatever it needs */
} bench_kind_t;

/* Where a field of the benchmark's struct is: its offset plus one, so that 0 means none. */
#define BENCH_AT(type, field) (offsetof(type, field) + 1)

/* One row of a benchmark's flag table, which gives the long options, the parsing, the range
 * checks and the flag list of --help. The table ends with a row whose name is NULL. */
typedef struct bench_flag {
    const char *name; /* without the dashes */
    bench_kind_t kind;
    size_t at;        /* BENCH_AT of the field set (every kind but CALL) */
    double lo, hi;    /* INT, LONG, SIZE, DOUBLE and COUNTS: the range, both ends allowed */
    const char *arg;  /* the value's name in --help ("N"); WORD and YESNO show their words */
    const char *help; /* --help's line; NULL: a flag the launcher gives its ranks, not listed */
    const char *def;  /* --help's default where the field's starting value does not say it */
    const char *words;
    size_t count; /* COUNTS, DENSITIES: BENCH_AT of the int that gets the list's length */
    size_t given; /* BENCH_AT of a const char * that keeps the value as written, or 0 */
    int (*set)(void *b, const char *value); /* CALL: FL_OK, or the fl_fail code */
} bench_flag_t;

/* The rows every multi-process benchmark shares, for a struct T with the fields they name:
 * --bind (bool bind) and --report (bool report); and the ones a spawned rank is given
 * (int rank, int world, const char *coordinator, const char *host). Laid out by hand: clang-format
 * takes a macro's rows for one expression. */
/* clang-format off */
#define BENCH_ROWS_RUN(T)                                                                         \
    {.name = "bind", .kind = BENCH_YESNO, .at = BENCH_AT(T, bind), .words = "core|none",          \
     .help = "rank k on CPU k mod ncpus, or unbound"},                                            \
    {.name = "report", .kind = BENCH_SWITCH, .at = BENCH_AT(T, report)}
#define BENCH_ROWS_RANK(T)                                                                        \
    {.name = "rank", .kind = BENCH_INT, .at = BENCH_AT(T, rank), .lo = 0, .hi = 255},             \
    {.name = "world-size", .kind = BENCH_INT, .at = BENCH_AT(T, world), .lo = 1, .hi = 256},      \
    {.name = "coordinator", .kind = BENCH_TEXT, .at = BENCH_AT(T, coordinator)},                  \
    {.name = "host", .kind = BENCH_TEXT, .at = BENCH_AT(T, host)}
/* clang-format on */

/* Flags that some other table names (the communicator's fl_comm_opt_names), each taking a
 * value, offered to getopt before the benchmark's own. set() gets the name without the dashes,
 * the value and the one or two arguments that carried them (to pass on to the ranks); it
 * returns FL_OK or the fl_fail code. */
typedef struct bench_more {
    const char *const *names; /* NULL-terminated */
    int (*set)(void *b, const char *name, const char *value, char *const *words, int nwords);
} bench_more_t;

/* Parses argv[1..argc) (argv[0]: the subcommand) into b by the table (and more, or NULL):
 * "--name value", "--name=value", or an unambiguous prefix of the name (getopt_long), in any
 * order, the last of a flag given twice winning. Returns -1 when every flag was taken; 0 after
 * printing usage and the table's flag list for --help or -h; 2 after printing what is wrong
 * (one line to stderr naming the flag). */
int bench_flags_parse(int argc, char **argv, const bench_flag_t *flags, const bench_more_t *more,
                      const char *usage, void *b);

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
