/* core: the shared vocabulary of flodl components. Error detail text, logging with a rank
 * prefix, the monotonic clock and deadlines, the context (ZeroMQ context, limits, counters),
 * dtype conversions, launcher-environment resolution, flag parsing for the binaries and
 * safetensors checkpoints. It knows nothing of messages, sockets or collectives. */
#ifndef FL_CORE_H
#define FL_CORE_H

#include "fl_math.h"
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <flodl/flodl.h>

#include "fl_launch_env.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define FL_PRINTF(a, b)
#endif

/* ---- errors (error.c) ---- */

/* Sets the calling thread's detail text and returns code unchanged. */
int fl_fail(int code, const char *fmt, ...) FL_PRINTF(2, 3);

/* Prefixes the calling thread's current detail text ("allreduce #3: " + old) and returns code.
 * Used by callers that add context to a failure they pass up. */
int fl_fail_ctx(int code, const char *fmt, ...) FL_PRINTF(2, 3);

/* Clears the calling thread's detail text. */
void fl_error_clear(void);

/* Cleanup keeps the error that caused it: between begin and end (they nest), failures on this
 * thread set and read a text of their own, and the detail text stays what it was. Destroy
 * functions and the cleanup after a failure run inside, so their callers report the first
 * failure without saving its text first. */
void fl_error_keep_begin(void);
void fl_error_keep_end(void);

/* ---- clock (clock.c) ---- */

/* Monotonic time. */
int64_t fl_now_ns(void);
int64_t fl_now_ms(void);

/* Absolute monotonic deadline timeout_ms from now; timeout_ms < 0 means none (INT64_MAX). */
int64_t fl_deadline_in(int timeout_ms);

/* Milliseconds left until deadline, clamped to [0, INT32_MAX]. */
int fl_deadline_left_ms(int64_t deadline_ms);

/* ---- context and logging (ctx.c, log.c) ---- */

/* Counters kept per context. Transport and components add to them; tests and metrics read. */
typedef enum fl_stat {
    FL_STAT_MSGS_SENT,
    FL_STAT_MSGS_RECV,
    FL_STAT_BYTES_SENT,
    FL_STAT_BYTES_RECV,
    FL_STAT_BAD_HEADER,   /* garbage or truncated header frame */
    FL_STAT_BAD_MAGIC,    /* wrong magic number */
    FL_STAT_BAD_VERSION,  /* other protocol version */
    FL_STAT_BAD_JOB,      /* other job id or generation */
    FL_STAT_BAD_FRAMES,   /* frames differ from what the header declares */
    FL_STAT_OVERSIZED,    /* over the size limit */
    FL_STAT_UNEXPECTED,   /* well-formed but out of place (wrong sender, step, duplicate) */
    FL_STAT_ERRORS_SENT,  /* error replies sent to peers */
    FL_STAT_AUTH_REFUSED, /* connections refused by CURVE: an unknown key, or plain text */
    FL_STAT_CONN_DROPPED, /* connections closed in their handshake: over the caps on those */
    FL_STAT_CONN_CUT,     /* connections reset for a burst of malformed messages, or for the
                           * memory their incomplete messages held past the process bound */
    FL_STAT_COUNT
} fl_stat_t;

typedef struct fl_ctx fl_ctx_t;

typedef struct fl_ctx_opts {
    fl_log_level_t log_level; /* default FL_LOG_WARN */
    const char *log_name;     /* prefix of every log line, e.g. "ps" or "rank 3"; default "flodl" */
    int io_threads;           /* ZeroMQ I/O threads (default 1) */
    size_t max_msg_bytes;     /* largest accepted payload frame (default 256 MiB) */
    size_t max_frames;        /* most payload frames per message (default 16) */
    /* Most bytes of messages not yet complete that the process's guarded sockets may hold for
     * their connections together (default FL_CTX_HELD_MAX; SIZE_MAX: none). Past it the
     * connections holding most are closed first (transport/tp_guard.c). */
    size_t held_max_bytes;
} fl_ctx_opts_t;

#define FL_CTX_HELD_MAX ((size_t)256 << 20)

void fl_ctx_opts_init(fl_ctx_opts_t *opts);

/* Creates a context with its own ZeroMQ context. FL_OK, FL_EINVAL, FL_ENOMEM, FL_EIO. */
int fl_ctx_create(const fl_ctx_opts_t *opts, fl_ctx_t **out);

/* Terminates the ZeroMQ context (all sockets must be closed) and frees. NULL-safe. */
void fl_ctx_destroy(fl_ctx_t **ctx);

/* The ZeroMQ context (void * so that core's header does not need zmq.h). */
void *fl_ctx_zmq(const fl_ctx_t *ctx);

/* A slot for the transport's security state (CURVE keys and the ZAP handler): set once, before
 * any socket is made; fl_ctx_destroy calls free_fn on it before ending the ZeroMQ context. */
void *fl_ctx_security(const fl_ctx_t *ctx);
void fl_ctx_set_security(fl_ctx_t *ctx, void *security, void (*free_fn)(void *));

size_t fl_ctx_max_msg_bytes(const fl_ctx_t *ctx);
size_t fl_ctx_max_frames(const fl_ctx_t *ctx);

/* The process bound on bytes held for incomplete messages (0: none), and the bytes held now by
 * all guarded sockets of the context: fl_ctx_held_add adds delta (a guard's change since its
 * last report) and returns the new total. Thread-safe. */
uint64_t fl_ctx_held_max(const fl_ctx_t *ctx);
uint64_t fl_ctx_held_add(fl_ctx_t *ctx, int64_t delta);
/* Replaces the bound (bytes as held_max_bytes: SIZE_MAX none, else at least 1 MiB), for an
 * owner whose context a component made (the coordinator's); the guards apply it at their next
 * look. FL_OK or FL_EINVAL. Thread-safe. */
int fl_ctx_set_held_max(fl_ctx_t *ctx, size_t bytes);

/* Replaces the log prefix ("rank 3 host-a"); thread-safe with respect to logging. */
void fl_ctx_set_log_name(fl_ctx_t *ctx, const char *name);
void fl_ctx_set_log_level(fl_ctx_t *ctx, fl_log_level_t level);
fl_log_level_t fl_ctx_log_level(const fl_ctx_t *ctx);

/* Counters: thread-safe (atomic). */
void fl_ctx_count(fl_ctx_t *ctx, fl_stat_t stat, uint64_t n);
uint64_t fl_ctx_stat(const fl_ctx_t *ctx, fl_stat_t stat);
const char *fl_stat_name(fl_stat_t stat);

/* Writes one line "[prefix] LEVEL: message" to stderr when level >= the context's level.
 * ctx may be NULL (prefix "flodl", level WARN). Thread-safe: one write per line. */
void fl_log(const fl_ctx_t *ctx, fl_log_level_t level, const char *fmt, ...) FL_PRINTF(3, 4);
void fl_vlog(const fl_ctx_t *ctx, fl_log_level_t level, const char *fmt, va_list ap);

#define FL_DEBUG(ctx, ...) fl_log((ctx), FL_LOG_DEBUG, __VA_ARGS__)
#define FL_INFO(ctx, ...) fl_log((ctx), FL_LOG_INFO, __VA_ARGS__)
#define FL_WARN(ctx, ...) fl_log((ctx), FL_LOG_WARN, __VA_ARGS__)
#define FL_ERROR(ctx, ...) fl_log((ctx), FL_LOG_ERROR, __VA_ARGS__)

/* Parses "debug|info|warn|error|off" (case-insensitive). FL_OK or FL_EINVAL. */
int fl_log_level_parse(const char *s, fl_log_level_t *out);
const char *fl_log_level_name(fl_log_level_t level);

/* ---- untrusted text (text.c) ---- */

/* Wire text (every protobuf string flodl sends or takes) is well-formed UTF-8 (no overlong
 * form, surrogate or code point past U+10FFFF) with no NUL and no control character (U+0000..
 * U+001F, U+007F, U+0080..U+009F). Returns the offset of the first byte of text[0..len) that
 * breaks the rule, or len when none does; *why (may be NULL) then names the problem ("a NUL
 * byte", "a control character", "bytes that are not UTF-8") or is NULL. Thread-safe. */
size_t fl_text_scan(const void *text, size_t len, const char **why);

/* Renders untrusted text (from a peer, a file, a flag) for one log line or message text: whole
 * well-formed characters other than controls as they are; \n, \r and \t as those two-character
 * escapes; other control characters and bytes that are not UTF-8 as \xNN. The result obeys
 * the wire rule, is cut at a character boundary to fit cap bytes with its terminator, and
 * text that already obeys the rule comes out unchanged (when it fits). Not reversible (a
 * backslash stays as it is). Returns out, for use as a format argument. Thread-safe. */
const char *fl_text_escape(const char *text, char *out, size_t cap);

/* The length of text cut to at most max bytes without splitting a UTF-8 character. */
size_t fl_text_cut(const char *text, size_t max);

/* ---- element types (dtype.c) ---- */

/* IEEE binary16 and bfloat16 conversions, round to nearest even, NaN preserved. */
uint16_t fl_f32_to_f16(float f);
float fl_f16_to_f32(uint16_t h);
uint16_t fl_f32_to_bf16(float f);
float fl_bf16_to_f32(uint16_t h);

/* Parses "float32|f32|float16|f16|half|bfloat16|bf16|float64|f64|int32|int64|uint8". */
int fl_dtype_parse(const char *s, fl_dtype_t *out);
bool fl_dtype_is_valid(int dtype);

/* ---- buffers (buf.c) ---- */

/* A payload and the hook that releases it. release may be NULL for borrowed memory that the
 * receiver must copy before the call returns. */
typedef struct fl_buf {
    void *data;
    size_t len;
    void *hint;
    void (*release)(void *data, void *hint); /* called once, by whoever holds it last */
} fl_buf_t;

/* Calls the release hook (if any) and clears the buffer. NULL-safe. */
void fl_buf_release(fl_buf_t *buf);

/* ---- GPUs (gpu.c without CUDA, gpu_cuda.cu with it) ---- */

/* True when this build has CUDA and at least one device is usable. Never fails. */
bool fl_gpu_available(void);

/* Number of usable CUDA devices (0 without CUDA). */
int fl_gpu_count(void);

/* One line describing the devices or why there are none ("CUDA not built in", the CUDA error
 * text, "2 x NVIDIA H100 80GB HBM3"). */
void fl_gpu_describe(char *out, size_t cap);

/* True when p points into CUDA device (or managed) memory. False for host memory, NULL, and
 * always without CUDA. Thread-safe. */
bool fl_gpu_is_device_ptr(const void *p);

/* Copies bytes between any two of host and device memory (synchronous). FL_OK, or FL_EGPU with
 * the CUDA error text (and always without CUDA). */
int fl_gpu_memcpy(void *dst, const void *src, size_t bytes);

/* Device memory on the current device: FL_OK or FL_EGPU. fl_gpu_free is NULL-safe. */
int fl_gpu_alloc(void **out, size_t bytes);
void fl_gpu_free(void *p);

/* ---- optimizers and learning-rate schedules (optim.c, lr_sched.c) ---- */

/* The same update rules as PyTorch's torch.optim.SGD, Adam and AdamW, so a worker and the
 * parameter server compute identical parameters from identical gradients. */
typedef enum fl_opt_kind {
    FL_OPT_SGD = 0,
    FL_OPT_ADAM = 1,
    FL_OPT_ADAMW = 2,
} fl_opt_kind_t;

typedef struct fl_opt_opts {
    fl_opt_kind_t kind;  /* default SGD */
    double momentum;     /* SGD: 0 (default) for plain SGD */
    double dampening;    /* SGD: default 0 */
    bool nesterov;       /* SGD: needs momentum > 0 and dampening 0 */
    double weight_decay; /* SGD and Adam: L2 added to the gradient; AdamW: decoupled */
    double beta1;        /* Adam(W): default 0.9 */
    double beta2;        /* Adam(W): default 0.999 */
    double eps;          /* Adam(W): default 1e-8 */
} fl_opt_opts_t;

void fl_opt_opts_init(fl_opt_opts_t *opts);

/* Parses "sgd|adam|adamw". FL_OK or FL_EINVAL. */
int fl_opt_kind_parse(const char *s, fl_opt_kind_t *out);
const char *fl_opt_kind_name(fl_opt_kind_t kind);

/* Optimizer state for n parameters (momentum buffer, or Adam's first and second moments, and
 * the step count). */
typedef struct fl_opt fl_opt_t;

/* FL_OK, FL_EINVAL naming the field (negative rates, betas outside [0, 1), nesterov without
 * momentum, n = 0), FL_ENOMEM. */
int fl_opt_create(const fl_opt_opts_t *opts, size_t n, fl_opt_t **out);

/* The checks fl_opt_create makes, without making anything (the device optimizer uses them). */
int fl_opt_check(const fl_opt_opts_t *opts, size_t n);
void fl_opt_destroy(fl_opt_t **opt);

/* One step with learning rate lr: params[i] updated from grad[i] (both n entries).
 * FL_OK, or FL_ENONFINITE naming the first bad gradient index (nothing updated). One thread at
 * a time per optimizer. */
int fl_opt_step(fl_opt_t *opt, float *params, const float *grad, double lr);

/* The same step in pieces, for a caller that assembles the gradient block by block (the
 * parameter server fuses the average of the pushed gradients with the update): begin once
 * (FL_OK, or FL_EINVAL for a negative or non-finite lr; the step count advances), then
 * fl_opt_step_range over every index exactly once, params and grad pointing at parameter
 * `off` (the caller has checked the gradient is finite). Same bits as fl_opt_step. */
int fl_opt_step_begin(fl_opt_t *opt, double lr);

/* The per-step scalars of options o at step count `steps` (1 on the first step) and rate lr,
 * for the per-element bodies of fl_math.h (the device optimizer uses them too). Pure. */
void fl_opt_scalars(const fl_opt_opts_t *o, uint64_t steps, double lr, fl_opt_scalars_t *s);

/* One step over n entries with scalars s (fl_math.h's bodies in the host's vectorised loops):
 * buf1 is the momentum buffer or Adam's m (NULL for plain SGD), buf2 Adam's v. The cpu and sim
 * devices run their optimizer through it. */
void fl_opt_apply(const fl_opt_scalars_t *s, float *p, const float *g, float *buf1, float *buf2,
                  size_t n);
void fl_opt_step_range(fl_opt_t *opt, float *params, const float *grad, size_t off, size_t len);

/* Parameters the optimizer was made for. */
size_t fl_opt_size(const fl_opt_t *opt);

/* Steps taken so far. */
uint64_t fl_opt_steps(const fl_opt_t *opt);

/* State for checkpoints: the buffers (NULL when the kind has none: plain SGD has none, SGD
 * with momentum one, Adam two) of n floats each, and the step count. */
void fl_opt_state(const fl_opt_t *opt, const float **buf1, const float **buf2, uint64_t *steps);

/* Restores a saved state; buf1/buf2 as fl_opt_state returns them (NULL: zeros).
 * FL_OK, FL_EINVAL (n mismatch: give n), FL_ENONFINITE. */
int fl_opt_restore(fl_opt_t *opt, const float *buf1, const float *buf2, size_t n, uint64_t steps);

typedef enum fl_lr_kind {
    FL_LR_CONSTANT = 0,
    FL_LR_STEP = 1,   /* lr * gamma^(floor((step - warmup) / step_size)) */
    FL_LR_COSINE = 2, /* min_lr + (lr - min_lr) * (1 + cos(pi * t / T)) / 2 after warm-up */
} fl_lr_kind_t;

typedef struct fl_lr_sched {
    double lr;         /* peak learning rate (after warm-up) */
    fl_lr_kind_t kind; /* default constant */
    long warmup_steps; /* linear warm-up from lr / warmup_steps... to lr (default 0) */
    long total_steps;  /* COSINE: length of the decay after warm-up */
    long step_size;    /* STEP: steps between decays */
    double gamma;      /* STEP: factor (default 0.1) */
    double min_lr;     /* COSINE: floor (default 0) */
} fl_lr_sched_t;

void fl_lr_sched_init(fl_lr_sched_t *s, double lr);

/* Parses "constant|step|cosine". FL_OK or FL_EINVAL. */
int fl_lr_kind_parse(const char *s, fl_lr_kind_t *out);

/* Learning rate for a 0-based global step: warm-up lr * (step + 1) / warmup_steps for step <
 * warmup_steps, then the schedule. */
double fl_lr_at(const fl_lr_sched_t *s, long step);

/* Linear scaling rule (Goyal et al.): base_lr * global_batch / base_batch. */
double fl_lr_scaled(double base_lr, long global_batch, long base_batch);

/* ---- hosts (host.c) ---- */

/* This machine's host name into out (always terminated). */
void fl_hostname(char *out, size_t cap);

/* Keeps glibc from returning ZeroMQ's receive buffers (up to 32 MiB) to the kernel after every
 * message (M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 512 MiB): without it large transfers page
 * fault on every message. Process-wide; the communicator and the parameter-server client and
 * server call it unless their options say not to. */
void fl_malloc_tune(void);

/* This process's anonymous resident memory in bytes (RssAnon of /proc/self/status: heap,
 * stacks, libraries' data, not the mapped files), 0 when unreadable. */
uint64_t fl_rss_anon(void);

/* ---- open files (fdlimit.c) ---- */

typedef struct fl_fdlimit {
    uint64_t before; /* the soft limit found */
    uint64_t soft;   /* the soft limit now */
    uint64_t hard;
} fl_fdlimit_t;

/* Raises this process's soft limit on open files to its hard limit (a server holds one per
 * connection). FL_OK with *out filled, or FL_EIO. Process-wide: for the binaries' start. */
int fl_fdlimit_raise(fl_fdlimit_t *out);

/* The soft limit on open files now (UINT64_MAX when unlimited or unknown). */
uint64_t fl_fdlimit_soft(void);

/* fl_fdlimit_raise, then one line on stderr "prog: open files: soft limit A raised to the hard
 * limit B" (or both limits when nothing changed) when level is info or below; a limit below
 * 4096 is said at warn level too, with how to raise it. */
void fl_fdlimit_start(const char *prog, fl_log_level_t level);

/* ---- rate-limited warnings (ratelimit.c) ----
 * The first `burst` lines of each window pass; later ones are held back and counted, and the
 * count is handed back once the window is over, for one summary line. */
typedef struct fl_ratelimit {
    int burst;
    int window_ms;
    int64_t start_ms; /* the window's start, 0: none open */
    uint64_t passed;  /* lines let through in the window */
    uint64_t held;    /* lines held back in the window */
} fl_ratelimit_t;

void fl_ratelimit_init(fl_ratelimit_t *r, int burst, int window_ms);

/* True when a line may be logged now. *held: lines held back in a window that has ended (log a
 * summary when non-zero), 0 otherwise. */
bool fl_ratelimit_allow(fl_ratelimit_t *r, int64_t now_ms, uint64_t *held);

/* For a periodic tick: the lines held back in a window that has ended (and closes it), so the
 * summary is written even when nothing more comes; 0 when there is none to write. */
uint64_t fl_ratelimit_flush(fl_ratelimit_t *r, int64_t now_ms);

/* A line said at most once per period; those held back in between are counted and named by
 * the next line said. All zero is ready for use (the first line is said). */
typedef struct fl_ratelog {
    int64_t next_ms; /* no line before this time */
    uint64_t quiet;  /* lines held back since the last one said */
} fl_ratelog_t;

/* True when a line may be said at now_ms (then none for every_ms); more (cap bytes) then holds
 * its suffix: "; N more since the last report", or "" when none was held back. False: the line
 * is held back and counted, more is left alone. One thread at a time per fl_ratelog_t. */
bool fl_ratelog_say(fl_ratelog_t *r, int64_t now_ms, int every_ms, char *more, size_t cap);

/* ---- fan-out over threads (fanout.c) ----
 * n jobs run at once, job j always on thread j, each run: a device's thread per device. A job
 * returns FL_OK or a code with its text set (fl_fail); a run hands back the lowest failed job's
 * code with that text. Every wait of a run is bounded by the jobs' own deadlines. One thread
 * at a time per handle (the caller's); the jobs run on their own threads. */
typedef int (*fl_fanout_fn)(int j, void *ud);
typedef struct fl_fanout fl_fanout_t;

/* Starts a thread for each job in [first, n) (first 0 or 1: with 1, job 0 is the caller's, run
 * on its own thread by fl_fanout_run); they wait for runs. what names the jobs in its errors
 * ("rank 2: the devices"). FL_OK, FL_ENOMEM, or FL_EIO naming the job whose thread did not
 * start (none is left then). */
int fl_fanout_create(int n, int first, fl_fanout_fn fn, void *ud, const char *what,
                     fl_fanout_t **out);
/* Stops the threads, after the run in progress if one is; NULL-safe, sets *f = NULL. */
void fl_fanout_destroy(fl_fanout_t **f);

/* A run: every job once. run: begin, job 0 on the calling thread when it is the caller's,
 * end; the lowest failed job's code of all n. Or in steps, the caller working meanwhile: begin
 * (the threads' jobs start), poll (true once they all finished; timeout_ms 0: at once, < 0:
 * until they have), end (waits for them; the lowest failed code of the threads' jobs). */
int fl_fanout_run(fl_fanout_t *f);
void fl_fanout_begin(fl_fanout_t *f);
bool fl_fanout_poll(fl_fanout_t *f, int timeout_ms);
int fl_fanout_end(fl_fanout_t *f);

/* One run of n jobs, each on a thread made for it: create, run, destroy. */
int fl_fanout_once(int n, fl_fanout_fn fn, void *ud, const char *what);

/* ---- service threads (service.c) ----
 * A component's background thread and how it ended: started, it reports once that it is past
 * its setup (ready) and once its outcome (finish); callers wait for that outcome with a
 * deadline, then stop the thread: the component wakes it its own way (a stop pipe, a cancel),
 * and fl_service_stop joins it. The struct lives in the component (init/deinit). start and stop
 * are called by the component's owner, one thread at a time; the rest is thread-safe. */

#define FL_SERVICE_TEXT_MAX 1024

typedef struct fl_service {
    pthread_t thread;
    bool started;
    pthread_mutex_t lock; /* guards the fields below */
    pthread_cond_t cond;  /* signalled when finished */
    bool ready;
    bool finished;
    int result;
    char text[FL_SERVICE_TEXT_MAX];
} fl_service_t;

void fl_service_init(fl_service_t *s);
void fl_service_deinit(fl_service_t *s);

/* Starts main_fn(arg) on its own thread; FL_OK when already started. FL_OK, or FL_EIO naming
 * the component (what: "coordinator"). */
int fl_service_start(fl_service_t *s, void *(*main_fn)(void *), void *arg, const char *what);

/* The thread is past its setup. */
void fl_service_set_ready(fl_service_t *s);

/* True while the thread has neither reported ready nor finished. */
bool fl_service_is_setting_up(fl_service_t *s);

/* Records the outcome (rc and its text) and wakes every waiter; only the first call counts. */
void fl_service_finish(fl_service_t *s, int rc, const char *text);

bool fl_service_is_finished(fl_service_t *s);

/* Copies the outcome's text into out ("" before the end). */
void fl_service_text(fl_service_t *s, char *out, size_t cap);

/* Waits up to timeout_ms (< 0: no deadline) for the outcome and returns its code, its text set
 * as the error detail; FL_ETIMEDOUT with pending as the detail when the deadline passed first. */
int fl_service_wait(fl_service_t *s, int timeout_ms, const char *pending);

/* When started: wake(arg), which must make the thread return soon, then joins it. */
void fl_service_stop(fl_service_t *s, void (*wake)(void *arg), void *arg);

/* ---- settings every rank must share (settings.c) ----
 * "name=value" pairs separated by ';' (names: a-z 0-9 _ - .; values: printable ASCII), sent
 * at registration; the coordinator refuses a job whose ranks disagree, naming the setting and
 * both values. */

#define FL_SETTINGS_MAX 2048 /* bytes of a list, terminator included */

/* Appends name=value to the list in buf (cap bytes, terminated); a ';' or control character in
 * the value becomes ',' or a space. FL_OK, or FL_EINVAL when it does not fit (buf unchanged). */
int fl_settings_add(char *buf, size_t cap, const char *name, const char *fmt, ...) FL_PRINTF(4, 5);

/* FL_OK when s is a well-formed list shorter than max bytes; FL_EINVAL saying where not. */
int fl_settings_check(const char *s, size_t max);

/* False when lists a and b give every name the same value. True otherwise, with the first name
 * that differs (a's order first, then names only b has) and its value in each, "(not set)"
 * where one list lacks it. */
bool fl_settings_differ(const char *a, const char *b, char *name, size_t ncap, char *va, char *vb,
                        size_t vcap);

/* ---- scans (dtype.c) ---- */

/* The largest |x| of n float32 (at any alignment) as its bit pattern: at or above 0x7f800000
 * when one of them is NaN or Inf. One vectorised pass. */
uint32_t fl_f32_max_abs_bits(const void *x, size_t n);

/* ---- version (version.c) ---- */

/* Prints the --version line of a binary ("flodl-worker 0.1.0 (libflodl 0.1.0; built with
 * cuda)") to stdout; returns the exit code (0). */
int fl_cli_version(const char *prog);

/* ---- flag values for the binaries (cli.c) ---- */

/* The binaries' choice between CurveZMQ keys and plain text. Flags (--curve-dir, --insecure)
 * win over the environment (FLODL_CURVE_DIR, FLODL_INSECURE); within either, exactly one of the
 * two. *dir gets the key directory, or NULL for plain text. FL_OK, or FL_EINVAL saying what to
 * give. fl_cli_security_notice prints, once, that the job runs in plain text. */
int fl_cli_security(const char *flag_dir, bool flag_insecure, const char *env_dir,
                    bool env_insecure, const char **dir);
void fl_cli_security_notice(const char *prog);

/* Parses a decimal integer in [lo, hi]; FL_EINVAL with "FLAG: ..." detail otherwise. */
int fl_cli_long(const char *flag, const char *val, long lo, long hi, long *out);

/* Parses a byte size with optional K/M/G suffix (powers of 1024): "4K", "64M", "1073741824". */
int fl_cli_size(const char *flag, const char *val, size_t lo, size_t hi, size_t *out);

/* Parses a finite number in [lo, hi]; FL_EINVAL with "FLAG: ..." otherwise. */
int fl_cli_double(const char *flag, const char *val, double lo, double hi, double *out);

/* The optimizer and learning-rate flags both binaries take, by long name without the dashes:
 * optimizer, lr, momentum, dampening, nesterov (no value), weight-decay, beta1, beta2, eps,
 * lr-schedule, warmup-steps, total-steps, lr-step-size, lr-gamma, min-lr. */
bool fl_cli_is_optim_flag(const char *name);

/* Their names, NULL-terminated; all take a value except "nesterov". */
extern const char *const fl_cli_optim_names[];

/* Applies one of them. FL_OK or FL_EINVAL naming the flag and the value. */
int fl_cli_optim_flag(const char *name, const char *val, fl_opt_opts_t *opt, fl_lr_sched_t *sched);

/* Checks combinations the single flags cannot (a step schedule without a step size, cosine
 * without a length, Nesterov without momentum, momentum given to Adam). */
int fl_cli_optim_check(const fl_opt_opts_t *opt, const fl_lr_sched_t *sched);

/* Formats a byte count for tables: "4 KiB", "64 MiB", "1000 B". */
void fl_fmt_bytes(size_t bytes, char *out, size_t cap);

/* ---- model shapes (model_shapes.c) ---- */

/* What the members of a job compare at the rendezvous: the tensors of the flat parameter
 * vector in order, an entry "name[d0,d1];" each ("layers.0.weight[256,64];layers.0.bias[256];";
 * a scalar is "name[];": wire text has no line breaks), and a 64-bit signature of that whole text.
 * The worker describes its model, the parameter server its --init file; the coordinator refuses a
 * mismatch naming the first tensor that differs, from the texts cut to FL_MODEL_SHAPES_MAX bytes.
 */
#define FL_MODEL_SHAPES_MAX 1024

typedef struct fl_model_shapes {
    char *text; /* NULL until the first tensor */
    size_t len;
    size_t cap;
    size_t ntensors;
} fl_model_shapes_t;

void fl_model_shapes_init(fl_model_shapes_t *s);
void fl_model_shapes_deinit(fl_model_shapes_t *s); /* NULL-safe */

/* Appends a tensor's entry. FL_OK or FL_ENOMEM. */
int fl_model_shapes_add(fl_model_shapes_t *s, const char *name, size_t ndim, const uint64_t *shape);

/* The text so far ("" before the first tensor); lives until the next add or deinit. */
const char *fl_model_shapes_text(const fl_model_shapes_t *s);

/* The signature of a text: FNV-1a 64 over a tag and the text, never 0. */
uint64_t fl_model_shapes_signature(const char *text);

/* Copies text into out (cap bytes): whole, or the whole entries that fit followed by an entry
 * "...;" when it is longer. */
void fl_model_shapes_cut(const char *text, char *out, size_t cap);

/* One line for people naming where texts a and b (as cut) first differ: "tensor
 * 'layers.0.weight' is [256,64] <who_a>, [64,256] <who_b>", or the tensor's position when the
 * names differ, or which text ends first; who_a and who_b read as "on rank 0 (host h)". */
void fl_model_shapes_diff(const char *a, const char *who_a, const char *b, const char *who_b,
                          char *out, size_t cap);

/* ---- safetensors checkpoints (st_write.c, st_read.c) ---- */

/* The Hugging Face safetensors format: an 8-byte little-endian header length N, N bytes of
 * JSON ({"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [2, 3],
 * "data_offsets": [begin, end]}}), then the data section, tensors stored contiguously in
 * offset order, little-endian. flodl adds the metadata "flodl.crc32" (8 hex digits, zlib's
 * CRC-32 of the data section) and "flodl.format" ("1"). */

#define FL_ST_MAX_DIMS 8
#define FL_ST_MAX_HEADER 100000000u /* largest accepted JSON header, as in safetensors itself */

typedef struct fl_st_tensor {
    const char *name;
    fl_dtype_t dtype;
    size_t ndim; /* 0 for a scalar */
    uint64_t shape[FL_ST_MAX_DIMS];
    const void *data; /* host memory, little-endian */
    size_t bytes;     /* product(shape) * fl_dtype_size(dtype) */
} fl_st_tensor_t;

typedef struct fl_st_meta {
    const char *key;
    const char *value;
} fl_st_meta_t;

/* The safetensors dtype name of a dtype ("F32", "F16", "BF16", "F64", "I32", "I64", "U8"), or
 * NULL for an invalid one. */
const char *fl_st_dtype_name(fl_dtype_t dtype);

/* Parses a safetensors dtype name (exact, case-sensitive). FL_OK or FL_EINVAL. */
int fl_st_dtype_parse(const char *s, fl_dtype_t *out);

/* Writes nt tensors (t[i].data in host memory, borrowed for the call) and nmeta metadata
 * strings to path, atomically: everything goes to path + ".tmp.<pid>" in the same directory,
 * which is fsync'd, renamed over path, and the directory fsync'd. A reader sees the old file
 * or the new one, never a mix. Tensors are stored in the order given; the header is padded
 * with spaces so that the data section starts 8-byte aligned.
 * Names must be unique, non-empty, valid UTF-8 and not "__metadata__"; ndim <= 8, every
 * dimension < 2^53, bytes == product(shape) * dtype size. Metadata keys must be unique,
 * non-empty, valid UTF-8 and not the two that flodl adds.
 * Returns FL_OK; FL_EINVAL naming the tensor or key; FL_ENOMEM; FL_EIO with the path and
 * strerror (the temporary file is removed, path is untouched; except when only the final
 * directory fsync fails: path then holds the new file, not known to be durable).
 * Thread-safe for different paths; one writer at a time per path. */
int fl_st_write(const char *path, const fl_st_tensor_t *t, size_t nt, const fl_st_meta_t *meta,
                size_t nmeta);

/* Removes the temporary files of writers killed inside fl_st_write: the regular files of dir
 * named "<name>.tmp.<pid>" (pid in decimal, nothing after it) whose <name> mine(name, ud)
 * accepts, and whose pid is no running process or is this process's. A caller cleans names
 * that only it writes, before it writes any: a file with its own pid is then an earlier
 * process's that had the same pid (a restarted container), and a pid that runs (ours or
 * another user's) may be another writer of those names, so its file stays. *nfiles and
 * *nbytes (may be NULL) get what was removed. FL_OK (dir missing: nothing to do), or FL_EIO
 * naming dir when it cannot be read. Thread-safe. */
int fl_st_clean_tmp(const char *dir, bool (*mine)(const char *name, void *ud), void *ud,
                    size_t *nfiles, uint64_t *nbytes);

typedef struct fl_st_file fl_st_file_t; /* body lives in st_read.c */

/* Reads the whole file at path into memory (not mmap: a file replaced or truncated by
 * another process later cannot fault us, and the CRC reads every byte anyway) and checks it:
 * header length, JSON, every entry's dtype, shape and offsets, data contiguous,
 * non-overlapping and covering the data section exactly, "flodl.format" (when present) is
 * "1", and the CRC-32 when "flodl.crc32" is present. Files from other tools carry no CRC and
 * are accepted (fl_st_verified says false). max_bytes bounds the file size (0: no bound).
 * Returns FL_OK and *out; FL_EPROTO naming the path and what is wrong, for a corrupt,
 * truncated, lying, unsupported (dtype, more than 8 dimensions, format) or too large
 * (> max_bytes) file; FL_EIO with strerror for open/read failures; FL_ENOMEM.
 * Thread-safe; the returned file is read-only, so its accessors are thread-safe too. */
int fl_st_open(const char *path, size_t max_bytes, fl_st_file_t **out);

/* Number of tensors. */
size_t fl_st_count(const fl_st_file_t *f);

/* Tensor i (< fl_st_count) in file order: by data offset (ties, which only empty tensors
 * can have, in header order). For files fl_st_write made, the order they were written in.
 * data is aligned to the dtype's size (tensors the file stores misaligned are copied).
 * The tensor, its name and data belong to f and live until fl_st_close. */
const fl_st_tensor_t *fl_st_at(const fl_st_file_t *f, size_t i);

/* The tensor called name, or NULL if absent (binary search). Lifetime as fl_st_at. */
const fl_st_tensor_t *fl_st_find(const fl_st_file_t *f, const char *name);

/* A metadata value, or NULL if absent; includes "flodl.crc32" and "flodl.format". Lives
 * until fl_st_close. */
const char *fl_st_meta_get(const fl_st_file_t *f, const char *key);

/* True when the file carried a flodl CRC-32 and it matched the data. */
bool fl_st_verified(const fl_st_file_t *f);

/* Frees the file and everything it returned. NULL-safe; sets *f = NULL. */
void fl_st_close(fl_st_file_t **f);

#ifdef __cplusplus
}
#endif

#endif
