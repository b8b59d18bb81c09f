/* observe: what flodl-ps and flodl-worker show of themselves. A registry of metrics (counters
 * and gauges, updated lock-free from any thread) rendered in Prometheus' text exposition
 * format; an HTTP endpoint (libmicrohttpd, its own thread) serving /metrics and /healthz; and a
 * timeline of phases written as a Chrome trace (chrome://tracing, Perfetto). The binaries use
 * it; libflodl does not. */
#ifndef FL_OBS_H
#define FL_OBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fl_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the registry (metrics.c) ---- */

typedef struct fl_obs fl_obs_t;

typedef enum fl_obs_kind {
    FL_OBS_COUNTER = 0,   /* only goes up (totals) */
    FL_OBS_GAUGE = 1,     /* any value (rates, timestamps, states) */
    FL_OBS_HISTOGRAM = 2, /* observations counted into buckets (fl_obs_add_histogram) */
} fl_obs_kind_t;

#define FL_OBS_MAX_SERIES 4096
#define FL_OBS_MAX_BUCKETS 16

int fl_obs_create(fl_obs_t **out);
void fl_obs_destroy(fl_obs_t **o);

/* Registers one series: name ([a-zA-Z_:][a-zA-Z0-9_:]*), help text, kind, and labels as they
 * appear between the braces (`rank="0",kind="bad_magic"`; NULL or "" for none; values must not
 * hold '"', '\\' or a newline). Series of one name share its help and kind. Returns the
 * series id (>= 0), or FL_EINVAL naming the problem (bad name or labels, a name registered
 * with another kind, more than FL_OBS_MAX_SERIES). Registering the same name and labels again
 * returns the same id. Thread-safe. */
int fl_obs_add(fl_obs_t *o, const char *name, const char *help, fl_obs_kind_t kind,
               const char *labels);

/* Registers a histogram series: as fl_obs_add, with the buckets' upper bounds (ascending,
 * 1..FL_OBS_MAX_BUCKETS of them; +Inf is implied). Rendered as name_bucket{...,le="b"}
 * (cumulative), name_sum and name_count. The id, or FL_EINVAL. */
int fl_obs_add_histogram(fl_obs_t *o, const char *name, const char *help, const char *labels,
                         const double *bounds, int nbounds);

/* Updates (any thread, lock-free). A negative id (a failed registration) is ignored. */
void fl_obs_set(fl_obs_t *o, int id, double v);
void fl_obs_inc(fl_obs_t *o, int id, double by);
double fl_obs_get(const fl_obs_t *o, int id); /* a histogram: its count */

/* One observation into a histogram series (any thread, lock-free). */
void fl_obs_observe(fl_obs_t *o, int id, double v);

/* The process's own series, refreshed at every render: process_cpu_seconds_total,
 * process_resident_memory_bytes, process_open_fds, process_max_fds,
 * process_start_time_seconds (the names Prometheus' client libraries use), and
 * flodl_build_info{version,features} 1. FL_OK or FL_EINVAL. */
int fl_obs_add_process(fl_obs_t *o);

/* Called before every render, from the rendering thread: refreshes gauges pulled from
 * elsewhere (a server's counters). One callback; NULL removes it. */
typedef void (*fl_obs_refresh_fn)(fl_obs_t *o, void *ud);
void fl_obs_on_render(fl_obs_t *o, fl_obs_refresh_fn fn, void *ud);

/* The exposition text (# HELP, # TYPE, then one line per series), NUL-terminated, malloc'd:
 * the caller frees it. NULL when out of memory. */
char *fl_obs_render(fl_obs_t *o, size_t *len);

/* ---- the HTTP endpoint (http.c) ---- */

typedef struct fl_obs_http fl_obs_http_t;

/* Health for /healthz: true for 200, false for 503 with why (a line) in the reply. */
typedef bool (*fl_obs_health_fn)(void *ud, char *why, size_t cap);

/* Serves GET /metrics (o's exposition) and /healthz (health; NULL: always healthy) on
 * bind_addr (an IPv4 literal; NULL: 0.0.0.0) and port (0: an ephemeral one, see fl_obs_port):
 * at most 64 connections, 8 from one address, each closed after 5 s without traffic.
 * o and ud are borrowed until fl_obs_http_stop. FL_OK, FL_EINVAL (bad address), FL_EIO (the
 * port is taken: the detail names it). */
int fl_obs_http_start(fl_obs_t *o, const char *bind_addr, int port, fl_obs_health_fn health,
                      void *ud, fl_obs_http_t **out);
int fl_obs_http_port(const fl_obs_http_t *h);
void fl_obs_http_stop(fl_obs_http_t **h);

/* ---- the health listener (healthz.c) ---- */

typedef struct fl_obs_healthz fl_obs_healthz_t;

/* Serves GET /healthz alone (health; NULL: always healthy) on bind_addr (NULL: 0.0.0.0) and
 * port (0: an ephemeral one), from a thread of its own that no client can starve: each
 * connection lives at most 2 s from its accept, and past 256 at once the oldest is closed for
 * the new one. health is called from that thread, possibly while the metrics endpoint calls
 * it too: it must be thread-safe. ud is borrowed until fl_obs_healthz_stop. FL_OK, FL_EINVAL
 * (bad address or port), FL_EIO (the port is taken: the detail names it). */
int fl_obs_healthz_start(const char *bind_addr, int port, fl_obs_health_fn health, void *ud,
                         fl_obs_healthz_t **out);
int fl_obs_healthz_port(const fl_obs_healthz_t *h);
void fl_obs_healthz_stop(fl_obs_healthz_t **h); /* NULL-safe */

/* ---- the timeline (timeline.c) ---- */

typedef struct fl_obs_timeline fl_obs_timeline_t;

/* Opens path for a Chrome trace (a JSON array of events; times in Unix-epoch microseconds, so
 * every rank's file shares one origin; pid: the rank, named "rank <pid>"). FL_OK or FL_EIO
 * naming the path. */
int fl_obs_timeline_open(const char *path, int pid, fl_obs_timeline_t **out);

/* Names a track (tid) of the trace: "device 0", "exchange 1". Thread-safe. */
void fl_obs_timeline_track(fl_obs_timeline_t *t, int tid, const char *name);

/* One phase on track tid from start_ns to end_ns (fl_now_ns clock): name ("compute",
 * "exchange", "wait", "optimizer") and category. NULL t: nothing. Thread-safe. */
void fl_obs_timeline_span(fl_obs_timeline_t *t, int tid, const char *name, const char *cat,
                          int64_t start_ns, int64_t end_ns);

/* Ends the array and closes the file. FL_OK, or FL_EIO when a write failed. NULL-safe. */
int fl_obs_timeline_close(fl_obs_timeline_t **t);

/* Merges the traces in[0..n) (each a JSON array of trace events, as the timeline writes them)
 * into one array at out, written atomically: every event of every file, a file whose pid is
 * another file's moved to a free pid (and its process renamed "... (file k)") so ranks stay
 * apart. FL_OK; FL_EINVAL naming a file that is not a trace; FL_EIO. (trace_merge.c) */
int fl_obs_trace_merge(const char *out, const char *const *in, size_t n);

#ifdef __cplusplus
}
#endif

#endif
