/* Child processes for the tests that run the real binaries: each started with the launcher
 * variables removed (and the test's own on top), stdout and stderr captured, every wait
 * bounded by a deadline, every child killed (SIGKILL, by PID) and reaped on every path. */
#ifndef FL_TESTPROC_H
#define FL_TESTPROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MAX_ARGS 32
#define MAX_ENV 8

/* One child process and what it printed. Output beyond 128 KiB drops the older half, so a
 * chatty child never blocks on a full pipe. */
typedef struct proc {
    pid_t pid;
    int fd[2]; /* read ends of stdout and stderr; -1 once closed */
    char *buf[2];
    size_t len[2];
    bool reaped;
    int status;
    int64_t end_ms;
} proc_t;

/* Starts path with argv (NULL-terminated) and env ("NAME=value", NULL-terminated, or NULL) on
 * top of this environment minus every launcher variable, plus FLODL_INSECURE=1 (plain text;
 * env may override it, e.g. "FLODL_INSECURE=0"). pid stays -1 when it cannot start. */
void proc_start(proc_t *p, const char *path, const char *const *argv, const char *const *env);

/* Reads what the children printed (waiting up to timeout_ms for something) and reaps those
 * that exited. */
void procs_pump(proc_t *ps, size_t n, int timeout_ms);

/* True when the child exited and closed its output (or never started). */
bool proc_done(const proc_t *p);

/* Waits until every child is done or the deadline. True when all are. */
bool procs_wait(proc_t *ps, size_t n, int64_t deadline);

/* Occurrences of needle in hay. */
int count_of(const char *hay, const char *needle);

/* Waits until stream k (0 stdout, 1 stderr) of ps[i] holds `times` copies of text, the child
 * ends, or the deadline. */
bool proc_wait_text(proc_t *ps, size_t n, size_t i, int k, const char *text, int times,
                    int64_t deadline);

/* Kills every child still running and reaps it; keeps the output. */
void procs_stop(proc_t *ps, size_t n);
void procs_free(proc_t *ps, size_t n);

/* Exit code, or 128 + signal, or -1 when the child was not reaped. */
int proc_code(const proc_t *p);

/* Runs one binary to completion (10 s at most). */
void run_sync(proc_t *p, const char *path, const char *const *argv, const char *const *env);

/* The pid of a process that has ended: a child that exited and was reaped. */
pid_t proc_dead_pid(void);

/* A TCP port on 127.0.0.1 that was free a moment ago. */
int free_port(void);

/* A per-test-process file name for flodl-ps's --endpoint-file. */
void epfile_path(char *out, size_t cap, int n);

/* Reads the endpoint flodl-ps wrote, waiting while it runs. */
bool read_epfile(proc_t *ps, const char *path, char *out, size_t cap, int64_t deadline);

/* Starts flodl-ps on an ephemeral port of 127.0.0.1 (world 0: no --world-size); fills ep.
 * extra: more flags (NULL-terminated, may be NULL). */
bool start_ps(proc_t *ps, int world, const char *const *extra, const char *const *env, char *ep,
              size_t cap, int n);

/* The exit codes and output of the children, for failure messages. */
void show(const proc_t *ps, size_t n, char *out, size_t cap);

/* A command line that must be refused. */
typedef struct bad_case {
    const char *argv[12]; /* after the program name */
    const char *env[3];
    const char *want[3]; /* substrings the one stderr line must hold */
} bad_case_t;

/* Runs each case: exit 2, nothing on stdout, exactly one line on stderr holding every want
 * (ck_abort()s naming the case otherwise). */
void check_bad(const char *bin, const bad_case_t *cases, size_t ncases);

#endif
