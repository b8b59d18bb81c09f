/* Private to flodl-launch: its options from the command line (launch_flags.c), and a group of
 * child processes started and supervised by one thread (launch_proc.c: fork/exec, the output
 * relay, one prefixed line per write, reaping and the signals the launcher takes, through a
 * signalfd). launch_main.c owns the policy. */
#ifndef FL_LAUNCH_INT_H
#define FL_LAUNCH_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the command line asks of flodl-launch. */
typedef struct fl_launch_opts {
    long workers;            /* --workers; 0 when not given */
    long hosts;              /* --hosts: loopback host identities; 0 when not given */
    long nproc;              /* --nproc-per-host; 0 when not given */
    long nnodes;             /* --nnodes; 0 when not given */
    long node_rank;          /* --node-rank; -1 when not given */
    const char *coordinator; /* --coordinator tcp://ADDR:PORT, or NULL */
    /* The layout those flags make, set by fl_launch_opts_parse: */
    long nlocal;             /* processes this launcher starts */
    long per_host;           /* LOCAL_WORLD_SIZE */
    long first_rank;         /* the rank of the first of them: a host's ranks are contiguous */
    long world;              /* FLODL_WORLD_SIZE, and flodl-ps's --world-size */
    bool run_ps;             /* false on a node other than 0: its ranks dial node 0's flodl-ps */
    const char *ps_path;     /* --ps, or NULL */
    const char *worker_path; /* --worker, or NULL */
    const char *heartbeat;   /* --heartbeat-timeout, validated, or NULL */
    const char *job_id;      /* seen among the worker flags, or NULL */
    bool pin;
    bool help;
    bool version;          /* --version: print it and start nothing */
    bool insecure;         /* --insecure, or FLODL_INSECURE=1 */
    const char *curve_dir; /* --curve-dir or FLODL_CURVE_DIR; the throw-away keys in a job */
    const char **wargs;    /* the workers' own flags, in order */
    size_t nwargs;
    const char **pargs; /* --ps-flag values, in order */
    size_t npargs;
    char *const *prog; /* PROGRAM and its ARGS (NULL-terminated, from argv), or NULL */
} fl_launch_opts_t;

/* Reads argv (and FLODL_CURVE_DIR, FLODL_INSECURE, which the flags override) into o, every
 * field first at its default, and works out the layout; the strings are argv's or the
 * environment's. FL_OK, FL_EINVAL naming the flag (or the flags that conflict) in one line, or
 * FL_ENOMEM. fl_launch_opts_deinit frees o's lists, also after
 * a failure. */
int fl_launch_opts_parse(int argc, char **argv, fl_launch_opts_t *o);
void fl_launch_opts_deinit(fl_launch_opts_t *o);

/* Writes --help, its options from the same table the parsing reads. */
void fl_launch_opts_help(FILE *out);

typedef struct fl_launch_procs fl_launch_procs_t; /* body lives in launch_proc.c */

/* Creates an empty group for up to cap children. Blocks SIGINT, SIGTERM and SIGCHLD for the
 * calling thread (they arrive through fl_launch_procs_pump instead) and ignores SIGPIPE, so a
 * closed stdout never kills the launcher before it has stopped its children. Returns FL_OK,
 * FL_EINVAL (cap 0), FL_ENOMEM or FL_EIO. One thread at a time per group. */
int fl_launch_procs_create(size_t cap, fl_launch_procs_t **out);

/* SIGKILLs every child still running, reaps it (bounded), flushes partial lines and frees the
 * group. NULL-safe; sets *procs = NULL. */
void fl_launch_procs_destroy(fl_launch_procs_t **procs);

/* Starts path with argv (NULL-terminated, argv[0] included) as a child named name ("rank 3",
 * "flodl-ps"); its stdout and stderr lines are relayed to ours behind prefix ("[rank 3] ").
 * cpu >= 0 pins the child to that CPU. The child gets stdin from /dev/null, default signal
 * handling, and SIGTERM when the launcher dies. Returns FL_OK and the child's index, or
 * FL_ENOMEM / FL_EIO (group full, pipe or fork failed) with the detail set. */
int fl_launch_procs_spawn(fl_launch_procs_t *procs, const char *name, const char *prefix,
                          const char *path, char *const argv[], int cpu, size_t *index);

/* Waits up to timeout_ms for output, exits or a signal; relays complete lines and reaps the
 * children that exited. *signo gets SIGINT or SIGTERM if one arrived, else 0. */
void fl_launch_procs_pump(fl_launch_procs_t *procs, int timeout_ms, int *signo);

/* The next child reaped since the last call, in reaping order: true with its index and wait
 * status, or false when none is pending. */
bool fl_launch_procs_next_exit(fl_launch_procs_t *procs, size_t *index, int *status);

/* Sends sig to child index if it has not been reaped (by PID; never to anything else). */
void fl_launch_procs_kill(fl_launch_procs_t *procs, size_t index, int sig);

/* Children not reaped yet. */
size_t fl_launch_procs_running(const fl_launch_procs_t *procs);

/* The name given to fl_launch_procs_spawn; the string belongs to the group. */
const char *fl_launch_procs_name(const fl_launch_procs_t *procs, size_t index);

/* Relays what is left in the pipes until every child closed its output or the deadline (a
 * grandchild may keep a pipe open), then closes them and flushes partial lines. */
void fl_launch_procs_drain(fl_launch_procs_t *procs, int64_t deadline_ms);

/* "exited with status 2" or "was killed by signal 9 (Killed)", from a wait status. */
void fl_launch_status_describe(int status, char *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
