/* Helpers shared by the fault suites (test_faults_*.c): a job of rank children forked before
 * the parent makes any ZeroMQ context, each running a scenario's body and reporting through
 * pipes (events, then a report), and the parent's side that reads, waits for and stops them. */
#ifndef FL_FAULTUTIL_H
#define FL_FAULTUTIL_H

#include <unistd.h>

#include "coord_int.h"
#include "fl_wk.h"
#include "testutil.h"

#define MAX_RANKS 4
#define HB_TIMEOUT_MS 1000

/* What a rank child sends back, after the event bytes 'J' (joined) and 'P' (progress). */
typedef struct rank_report {
    int rank;
    int rc;          /* the collective that failed, or FL_OK */
    int64_t fail_ms; /* monotonic clock when it returned */
    int64_t call_ms; /* how long that call took */
    int steps;       /* allreduces completed and verified */
    int mismatches;  /* elements that differed from the exact sum */
    int rc_next;     /* the call after the failure */
    int64_t next_ms;
    int64_t destroy_ms;
    uint64_t bad_msgs;
    char err[1024];
    char err_next[1024];
} rank_report_t;

struct scenario;
typedef void (*body_fn)(fl_comm_t *comm, const struct scenario *sc, rank_report_t *rep, int res_fd);

typedef struct scenario {
    int world;
    size_t count;   /* float32 elements per allreduce */
    int timeout_ms; /* fl_comm_opts_t.timeout_ms */
    fl_algo_t algo;
    size_t segment;  /* segment_bytes */
    int special;     /* the rank killed, stalled or attacked; -1: none */
    int progress_at; /* steps after which rank `progress_rank` sends 'P' */
    int progress_rank;
    int expect_bad; /* garbage: messages the attacked rank must count */
    body_fn body;
} scenario_t;

/* One rank child, as the parent sees it. */
typedef struct child {
    pid_t pid;
    int cmd_fd; /* parent writes the coordinator endpoint */
    int res_fd; /* parent reads events and the report */
    uint8_t buf[sizeof(rank_report_t) + 64];
    size_t len;
    bool reaped;
    bool stopped; /* still running at cleanup, killed there */
    int status;
} child_t;

typedef struct job {
    int n;
    child_t ch[MAX_RANKS];
    char ipc[128]; /* data endpoint of the special rank, when it binds ipc */
} job_t;

void send_event(int fd, char ev);

/* One verified allreduce of step s; records a failure in rep. */
int step_allreduce(fl_comm_t *comm, float *buf, size_t count, int s, rank_report_t *rep);

void sleep_ms(int ms);

/* Forks sc->world rank children. No ZeroMQ context may exist in this process yet. False
 * when a pipe or fork failed (job->n then counts the children started). */
bool job_fork(job_t *job, const scenario_t *sc, bool ipc_special);

void job_send_endpoint(job_t *job, const char *ep);

/* Waits until rank r sent event ev (or ended), or the deadline. */
bool job_wait_event(job_t *job, int r, char ev, int64_t deadline);

/* Waits until every rank in mask reported (or ended), or the deadline. */
bool job_wait_reports(job_t *job, unsigned mask, int64_t deadline);

/* Kills (SIGKILL, by PID) every child still running, reaps all, closes the pipes. */
void job_stop(job_t *job);

/* How child r ended, for messages. */
const char *child_end(const child_t *c, char *buf, size_t cap);

/* One line per rank: joined, reported, how it ended; for failure messages. */
const char *job_status(const job_t *job, char *buf, size_t cap);

/* Report of rank r, or a failed assertion saying why there is none. */
rank_report_t get_report(const job_t *job, int r);

fl_coord_t *make_coord(int world);

#endif
