/* flodl-worker's flags, one row each (worker_args.h): its name, how its value is read and
 * checked, the field it sets, and what --help says. The rows also make getopt's options and
 * --help itself (worker_help.c). What the flags mean together, the environment and the run
 * stay in worker_main.c. */
#include <assert.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker_args.h"

/* A field of wargs_t: its offset and size. TEXT_AT and REAL_AT refuse, at compile time, a
 * field that is not a string or a double. */
#define AT(f) .off = offsetof(wargs_t, f), .size = sizeof(((wargs_t *)0)->f)
#define TEXT_AT(f)                                                                                 \
    .off = _Generic(((wargs_t *)0)->f, const char *: offsetof(wargs_t, f)),                    \
    .size = sizeof(const char *)
#define REAL_AT(f)                                                                                 \
    .off = _Generic(((wargs_t *)0)->f, double : offsetof(wargs_t, f)), .size = sizeof(double)

static const wflag_word_t mode_words[] = {
    {"local", FL_WK_MODE_LOCAL},
    {"ring", FL_WK_MODE_RING},
    {"ps", FL_WK_MODE_PS},
    {"drill", FL_WK_MODE_DRILL},
    {NULL, 0},
};
static const wflag_word_t hier_words[] = {
    {"hybrid", FL_WK_HIER_HYBRID},
    {"flat", FL_WK_HIER_FLAT},
    {NULL, 0},
};
static const wflag_word_t ps_client_words[] = {{"device", false}, {"host", true}, {NULL, 0}};
static const wflag_word_t leg_words[] = {
    {"auto", FL_WK_LEG_AUTO},
    {"devices", FL_WK_LEG_DEVICES},
    {"host", FL_WK_LEG_HOST},
    {NULL, 0},
};
/* The refusal lists them in this order; --help in the order of how much is sharded. */
static const wflag_word_t shard_words[] = {
    {"none", FL_WK_SHARD_NONE},
    {"grad", FL_WK_SHARD_GRAD},
    {"full", FL_WK_SHARD_FULL},
    {"hybrid", FL_WK_SHARD_HYBRID},
    {NULL, 0},
};
static const wflag_word_t policy_words[] = {
    {"sync", FL_WK_POLICY_SYNC},
    {"cadence", FL_WK_POLICY_CADENCE},
    {"async", FL_WK_POLICY_ASYNC},
    {NULL, 0},
};
static const wflag_word_t topk_value_words[] = {
    {"float32", FL_FLOAT32},
    {"float16", FL_FLOAT16},
    {"bfloat16", FL_BFLOAT16},
    {NULL, 0},
};
static const wflag_word_t drill_dtype_words[] = {
    {"float32", FL_FLOAT32},
    {"float16", FL_FLOAT16},
    {"bfloat16", FL_BFLOAT16},
    {"float64", FL_FLOAT64},
    {NULL, 0},
};
static const wflag_word_t op_words[] = {{"sum", FL_SUM}, {"avg", FL_AVG}, {NULL, 0}};

/* strtod's number in [lo, hi]. Kept apart from fl_cli_double, which is stricter (no leading
 * space, "missing value"), so that these flags take what they always took. */
static int num(const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end = NULL;
    double x = strtod(v, &end);
    if (end == v || *end != '\0' || !(x >= lo && x <= hi))
        return fl_fail(FL_EINVAL, "%s: '%s' is not a number in [%g, %g]", flag, v, lo, hi);
    *out = x;
    return FL_OK;
}

/* DEVICE:RATIO (--speed-hint, --throttle) into table[DEVICE]. */
static int device_ratio(const char *flag, const char *v, double *table)
{
    char *end = NULL;
    long dev = strtol(v, &end, 10);
    if (end == v || *end != ':' || dev < 0 || dev > 63)
        return fl_fail(FL_EINVAL, "%s: '%s' is not DEVICE:RATIO with DEVICE in 0..63", flag, v);
    return num(flag, end + 1, 0.01, 1000.0, &table[dev]);
}

static int set_layers(wargs_t *a, const char *v)
{
    return fl_mlp_parse(v, &a->to.shape);
}

static int set_replicas(wargs_t *a, const char *v)
{
    long n;
    int rc = fl_cli_long("--cpu-replicas", v, 1, FL_DEV_MAX_DEVICES, &n);
    if (rc == FL_OK) {
        a->to.replicas = (int)n;
        a->replicas_given = true;
    }
    return rc;
}

static int set_speed_hint(wargs_t *a, const char *v)
{
    return device_ratio("--speed-hint", v, a->to.speed_hint);
}

static int set_throttle(wargs_t *a, const char *v)
{
    return device_ratio("--throttle", v, a->to.throttle);
}

static int set_bucket(wargs_t *a, const char *v)
{
    double x = 0.0;
    int rc = num("--bucket-mb", v, 0.0, 4096.0, &x);
    if (rc == FL_OK)
        a->to.bucket_bytes = (size_t)(x * 1048576.0);
    return rc;
}

static int set_quiet(wargs_t *a, const char *v)
{
    (void)v;
    a->to.quiet = true;
    a->d.quiet = true;
    return FL_OK;
}

/* In --help's order: a section's rows are listed as they come here. */
static const wflag_t flags[] = {
    {"rank", WF_COMM, .meta = "K", .sec = WF_SEC_USAGE, .optional = true},
    {"world-size", WF_COMM, .meta = "N", .sec = WF_SEC_USAGE, .optional = true},
    {"coordinator", WF_COMM, .meta = "tcp://HOST:PORT", .sec = WF_SEC_USAGE, .optional = true},
    {"mode", WF_WORDS, AT(mode), .words = mode_words,
     .help = "(default: ring with a coordinator, else local)", .sec = WF_SEC_MODE},

    {"train-images", WF_TEXT, TEXT_AT(train_images), .meta = "F", .sec = WF_SEC_DATA},
    {"train-labels", WF_TEXT, TEXT_AT(train_labels), .meta = "F", .sec = WF_SEC_DATA},
    {"test-images", WF_TEXT, TEXT_AT(test_images), .meta = "F", .sec = WF_SEC_DATA,
     .optional = true},
    {"test-labels", WF_TEXT, TEXT_AT(test_labels), .meta = "F", .help = "IDX (.gz ok)",
     .sec = WF_SEC_DATA, .optional = true},
    {"train-csv", WF_TEXT, TEXT_AT(train_csv), .meta = "F", .sec = WF_SEC_DATA},
    {"test-csv", WF_TEXT, TEXT_AT(test_csv), .meta = "F", .help = "CSV, label first",
     .sec = WF_SEC_DATA, .optional = true},
    {"data-seed", WF_INT, AT(data_seed), 0, 0x7fffffff, .meta = "S",
     .help = "seed of the built-in dataset (default 1)", .sec = WF_SEC_DATA},

    {"layers", WF_CALL, .set = set_layers, .meta = "64,256,128,10", .sec = WF_SEC_TRAIN},
    {"batch-size", WF_INT, AT(to.batch), 1, 1 << 20, .meta = "64", .sec = WF_SEC_TRAIN},
    {"epochs", WF_INT, AT(to.epochs), 0, 1000000, .meta = "10", .sec = WF_SEC_TRAIN},
    {"seed", WF_INT, AT(to.seed), 0, 0x7fffffff, .meta = "1", .sec = WF_SEC_TRAIN},
    {"no-shuffle", WF_OFF, AT(to.shuffle), .sec = WF_SEC_TRAIN},
    {"optimizer", WF_OPTIM, .meta = "sgd|adam|adamw", .sec = WF_SEC_TRAIN},
    {"lr", WF_OPTIM, .meta = "0.05", .sec = WF_SEC_TRAIN},
    {"momentum", WF_OPTIM, .meta = "0.9", .sec = WF_SEC_TRAIN},
    {"nesterov", WF_OPTIM, .sec = WF_SEC_TRAIN},
    {"dampening", WF_OPTIM, .meta = "0", .sec = WF_SEC_TRAIN},
    {"weight-decay", WF_OPTIM, .meta = "0", .sec = WF_SEC_TRAIN},
    {"beta1", WF_OPTIM, .meta = "0.9", .sec = WF_SEC_TRAIN},
    {"beta2", WF_OPTIM, .meta = "0.999", .sec = WF_SEC_TRAIN},
    {"eps", WF_OPTIM, .meta = "1e-8", .sec = WF_SEC_TRAIN},
    {"lr-schedule", WF_OPTIM, .meta = "constant|step|cosine", .sec = WF_SEC_TRAIN},
    {"warmup-steps", WF_OPTIM, .meta = "0", .sec = WF_SEC_TRAIN},
    {"lr-step-size", WF_OPTIM, .meta = "N", .sec = WF_SEC_TRAIN},
    {"lr-gamma", WF_OPTIM, .meta = "0.1", .sec = WF_SEC_TRAIN},
    {"total-steps", WF_OPTIM, .meta = "N", .sec = WF_SEC_TRAIN},
    {"min-lr", WF_OPTIM, .meta = "0",
     .help = "(in --mode ps the optimizer runs on flodl-ps: set it there)", .sec = WF_SEC_TRAIN},
    {"scale-lr", WF_ON, AT(to.scale_lr), .help = "(linear scaling rule)", .sec = WF_SEC_TRAIN},
    {"max-grad-norm", WF_REAL, REAL_AT(to.max_norm), 0.0, 1e12, .meta = "X", .sec = WF_SEC_TRAIN},
    {"device", WF_TEXT, TEXT_AT(device), .meta = "auto|cpu|sim|cuda",
     .help = "(auto: cuda when a GPU is usable, else cpu; sim: a simulated GPU for machines "
             "without one)",
     .sec = WF_SEC_TRAIN},
    {"gpus", WF_TEXT, TEXT_AT(gpus), .meta = "0,1,...",
     .help = "(the local GPUs, one device each; a repeated id gives two devices on one GPU)",
     .sec = WF_SEC_TRAIN},
    {"cpu-replicas", WF_CALL, .set = set_replicas, .meta = "L", .help = "(devices on the CPU)",
     .sec = WF_SEC_TRAIN},
    {"hierarchy", WF_WORDS, AT(to.hierarchy), .words = hier_words,
     .help = "(several devices per host, --mode ring: two-level exchange, the default, or "
             "every device its own ring member)",
     .sec = WF_SEC_TRAIN},
    {"ps-clients", WF_WORDS, AT(to.ps_host_client), .words = ps_client_words,
     .help = "(several devices per host, --mode ps: each device pushes and pulls its own "
             "shards on its own connections, the default, or the host's mean goes out over "
             "one client)",
     .sec = WF_SEC_TRAIN},
    {"overlap", WF_ON, AT(to.overlap),
     .help = "(two levels: reduce and exchange bucket by bucket during the backward pass "
             "instead of after it; the same parameters)",
     .sec = WF_SEC_TRAIN},
    {"first-leg", WF_WORDS, AT(to.first_leg), .words = leg_words,
     .help = "(several GPUs or sim devices: reduce inside the host on the devices, NCCL or "
             "device copies, or in host memory; auto: devices on sim, host memory on cuda "
             "until the NCCL leg has run on a GPU)",
     .sec = WF_SEC_TRAIN},
    {"shard", WF_WORDS, AT(to.shard), .words = shard_words, .meta = "none|grad|hybrid|full",
     .help = "(optimizer state: on every device; 1/(hosts x devices) each, gradients "
             "reduce-scattered and parameters all-gathered across hosts; 1/devices each, "
             "replicated across hosts; full: parameters too, each layer gathered only while it "
             "computes, the next one's gather overlapping it)",
     .sec = WF_SEC_TRAIN},
    {"policy", WF_WORDS, AT(to.policy), .words = policy_words,
     .help = "(gradients averaged every step; or local SGD: each device trains its own copy "
             "and parameters are averaged every --max-anchor batches of the slowest; async: "
             "the devices go on while a round is averaged, at most --run-ahead N rounds "
             "(default 1) beyond the last completed averaging)",
     .sec = WF_SEC_TRAIN},
    /* Described by --policy's text. */
    {"run-ahead", WF_INT, AT(to.run_ahead), 0, 16, .meta = "N", .sec = WF_SEC_NONE},
    {"checkpoint", WF_TEXT, TEXT_AT(to.checkpoint_dir), .meta = "DIR",
     .help = "(training state after every epoch: a file per shard and a manifest; --mode ps: "
             "the worker's top-k residual, the server checkpoints the rest)",
     .sec = WF_SEC_TRAIN},
    {"resume", WF_TEXT, TEXT_AT(to.resume_dir), .meta = "DIR",
     .help = "(from such a checkpoint, into any hosts, devices and --shard)", .sec = WF_SEC_TRAIN},
    {"resume-if-any", WF_TEXT, TEXT_AT(resume_if_any), .meta = "DIR",
     .help = "(--resume DIR when DIR holds a checkpoint, else a fresh start: a restarted "
             "container or pod picks up where the job left off)",
     .sec = WF_SEC_TRAIN},
    {"max-anchor", WF_INT, AT(to.max_anchor), 0, 4096, .meta = "N",
     .help = "(El Che: faster devices do more batches between syncs, the slowest up to N; 0, "
             "the default: one batch each)",
     .sec = WF_SEC_TRAIN},
    {"overhead-target", WF_REAL, REAL_AT(to.overhead_target), 1e-4, 100.0, .meta = "0.1",
     .help = "(exchange / compute)", .sec = WF_SEC_TRAIN},
    {"speed-hint", WF_CALL, .set = set_speed_hint, .meta = "DEVICE:RATIO",
     .help = "(relative speed seeding El Che)", .sec = WF_SEC_TRAIN},
    {"throttle", WF_CALL, .set = set_throttle, .meta = "DEVICE:FACTOR",
     .help = "(testing: the device takes FACTOR times its compute time per batch)",
     .sec = WF_SEC_TRAIN},
    {"topk", WF_REAL, REAL_AT(to.topk), 0.0, 1.0, .meta = "DENSITY",
     .help = "(top-k with error feedback; 0: dense)", .sec = WF_SEC_TRAIN},
    {"topk-warmup", WF_INT, AT(to.topk_warmup), 0, 1000, .meta = "EPOCHS", .sec = WF_SEC_TRAIN},
    {"topk-values", WF_DTYPE, AT(to.topk_values), .words = topk_value_words, .sec = WF_SEC_TRAIN},
    {"bucket-mb", WF_CALL, .set = set_bucket, .meta = "1", .sec = WF_SEC_TRAIN},
    {"init", WF_TEXT, TEXT_AT(to.init_path), .meta = "FILE.safetensors", .sec = WF_SEC_TRAIN},
    {"save", WF_TEXT, TEXT_AT(to.save_path), .meta = "FILE.safetensors", .sec = WF_SEC_TRAIN},
    {"save-every", WF_INT, AT(to.save_every), 1, 1L << 40, .meta = "STEPS", .sec = WF_SEC_TRAIN},
    {"metrics", WF_TEXT, TEXT_AT(to.metrics_path), .meta = "FILE", .help = "(JSON lines)",
     .sec = WF_SEC_TRAIN},
    {"progress", WF_REAL, REAL_AT(to.progress_s), 0.0, 86400.0, .meta = "SECONDS",
     .sec = WF_SEC_TRAIN},
    {"quiet", WF_CALL, .set = set_quiet, .sec = WF_SEC_TRAIN},
    {"metrics-port", WF_INT, AT(metrics_port), 0, 65535, .meta = "N",
     .help = "(Prometheus /metrics and /healthz; 0: any free port, printed)", .sec = WF_SEC_TRAIN},
    {"health-port", WF_INT, AT(health_port), 0, 65535, .meta = "N",
     .help = "(/healthz alone, a listener idle or slow clients cannot starve: for probes)",
     .sec = WF_SEC_TRAIN},
    {"metrics-bind", WF_TEXT, TEXT_AT(metrics_bind), .meta = "ADDR",
     .help = "(both ports; default 0.0.0.0)", .sec = WF_SEC_TRAIN},
    {"timeline", WF_TEXT, TEXT_AT(timeline_path), .meta = "FILE",
     .help = "(Chrome trace of every phase)", .sec = WF_SEC_TRAIN},

    {"curve-dir", WF_TEXT, TEXT_AT(co.curve_dir), .meta = "DIR",
     .help = "(CurveZMQ keys from flodl-keygen: every connection authenticated and encrypted; "
             "or FLODL_CURVE_DIR)",
     .sec = WF_SEC_SECURITY},
    {"insecure", WF_ON, AT(insecure), .help = "(plain text; or FLODL_INSECURE=1)",
     .sec = WF_SEC_SECURITY},

    {"host", WF_COMM, .meta = "ADDR", .sec = WF_SEC_COMM},
    {"bind", WF_COMM, .meta = "ENDPOINT", .sec = WF_SEC_COMM},
    {"job-id", WF_COMM, .meta = "ID", .sec = WF_SEC_COMM},
    {"timeout", WF_COMM, .meta = "MS", .sec = WF_SEC_COMM},
    {"rendezvous-timeout", WF_COMM, .meta = "MS", .sec = WF_SEC_COMM},
    {"stripes", WF_COMM, .meta = "K", .sec = WF_SEC_COMM},
    {"segment", WF_COMM, .meta = "BYTES", .sec = WF_SEC_COMM},
    {"small", WF_COMM, .meta = "BYTES", .sec = WF_SEC_COMM},
    {"algo", WF_COMM, .meta = "auto|ring|rd|direct", .sec = WF_SEC_COMM},
    {"log-level", WF_COMM, .meta = "debug|info|warn|error", .help = "(default warn, or FLODL_LOG)",
     .sec = WF_SEC_COMM},
    {"ipc", WF_COMM, .meta = "0|1",
     .help = "(peers on this host over ipc:// sockets; default 1, or FLODL_IPC)",
     .sec = WF_SEC_COMM},

    {"lz4", WF_ON, AT(lz4), .only = WF_PS_ONLY,
     .help = "(compress dense pushes and pulls when it pays)", .sec = WF_SEC_PS},
    {"reconnect-timeout", WF_INT, AT(reconnect_ms), 0, 86400000, .only = WF_PS_ONLY, .meta = "MS",
     .help = "(wait this long for a restarted flodl-ps; default 600000)", .sec = WF_SEC_PS},

    {"size", WF_BYTES, AT(d.bytes), 0, (double)((size_t)16 << 30), .only = WF_DRILL_ONLY,
     .meta = "BYTES", .sec = WF_SEC_DRILL},
    {"steps", WF_INT, AT(d.steps), 0, 100000000, .only = WF_DRILL_ONLY, .meta = "N",
     .sec = WF_SEC_DRILL},
    {"dtype", WF_DTYPE, AT(d.dtype), .words = drill_dtype_words, .only = WF_DRILL_ONLY,
     .meta = "TYPE", .sec = WF_SEC_DRILL},
    {"op", WF_WORDS, AT(d.op), .words = op_words, .only = WF_DRILL_ONLY, .sec = WF_SEC_DRILL},

    {"help", WF_HELP, .sec = WF_SEC_NONE},
    {"version", WF_VERSION, .sec = WF_SEC_NONE},
};

#define NFLAGS (sizeof flags / sizeof flags[0])

const wflag_t *fl_wk_flags(size_t *n)
{
    *n = NFLAGS;
    return flags;
}

bool fl_wk_flag_takes_value(const wflag_t *f)
{
    return f->meta != NULL || f->words != NULL;
}

void fl_wk_args_init(wargs_t *a)
{
    memset(a, 0, sizeof *a);
    a->mode = -1;
    a->data_seed = 1;
    a->metrics_port = -1;
    a->health_port = -1;
    a->reconnect_ms = 600000;
    fl_comm_opts_init(&a->co);
    fl_wk_train_opts_init(&a->to);
    fl_wk_drill_opts_init(&a->d);
}

/* An integer into a field of the row's size: bool, int (and enums), or 64 bits. */
static void store_int(void *field, size_t size, long v)
{
    if (size == sizeof(bool)) {
        bool b = v != 0;
        memcpy(field, &b, sizeof b);
    } else if (size == sizeof(int)) {
        int i = (int)v;
        memcpy(field, &i, sizeof i);
    } else {
        assert(size == sizeof(int64_t)); /* a row pointing at a field of another width */
        int64_t l = v;
        memcpy(field, &l, sizeof l);
    }
}

void fl_wk_flag_words(const wflag_word_t *w, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; w[i].word != NULL && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%s", i > 0 ? "|" : "", w[i].word);
}

static int not_one_of(const char *flag, const char *v, const wflag_word_t *w)
{
    char list[160];
    fl_wk_flag_words(w, list, sizeof list);
    return fl_fail(FL_EINVAL, "%s: '%s' is not one of %s", flag, v, list);
}

static int set_word(const wflag_t *f, const char *flag, const char *v, void *field)
{
    for (size_t i = 0; f->words[i].word != NULL; i++) {
        if (strcmp(v, f->words[i].word) == 0) {
            store_int(field, f->size, f->words[i].value);
            return FL_OK;
        }
    }
    return not_one_of(flag, v, f->words);
}

/* fl_dtype_parse's names and aliases, of the types the row allows. */
static int set_dtype(const wflag_t *f, const char *flag, const char *v, void *field)
{
    fl_dtype_t d;
    if (fl_dtype_parse(v, &d) == FL_OK) {
        for (size_t i = 0; f->words[i].word != NULL; i++) {
            if ((int)d == f->words[i].value) {
                store_int(field, f->size, (long)d);
                return FL_OK;
            }
        }
    }
    return not_one_of(flag, v, f->words);
}

static int set_number(const wflag_t *f, const char *flag, const char *v, void *field)
{
    long n;
    size_t z;
    int rc;
    if (f->kind == WF_REAL)
        return num(flag, v, f->lo, f->hi, field);
    if (f->kind == WF_BYTES) {
        if ((rc = fl_cli_size(flag, v, (size_t)f->lo, (size_t)f->hi, &z)) == FL_OK)
            memcpy(field, &z, sizeof z);
        return rc;
    }
    if ((rc = fl_cli_long(flag, v, (long)f->lo, (long)f->hi, &n)) == FL_OK)
        store_int(field, f->size, n);
    return rc;
}

/* The optimizer's flags; the default momentum is SGD's alone, so it remembers one given. */
static int set_optim(wargs_t *a, const char *name, const char *v)
{
    a->momentum_given = a->momentum_given || strcmp(name, "momentum") == 0;
    return fl_cli_optim_flag(name, v, &a->to.opt, &a->to.lr);
}

/* Checks the row's value v and sets its field: FL_OK, or FL_EINVAL naming the flag. */
static int apply(wargs_t *a, const wflag_t *f, const char *v)
{
    char flag[64];
    snprintf(flag, sizeof flag, "--%s", f->name);
    void *field = (char *)a + f->off;
    switch (f->kind) {
    case WF_INT:
    case WF_BYTES:
    case WF_REAL: return set_number(f, flag, v, field);
    case WF_ON: store_int(field, f->size, 1); return FL_OK;
    case WF_OFF: store_int(field, f->size, 0); return FL_OK;
    case WF_TEXT: memcpy(field, &v, sizeof v); return FL_OK;
    case WF_WORDS: return set_word(f, flag, v, field);
    case WF_DTYPE: return set_dtype(f, flag, v, field);
    case WF_CALL: return f->set(a, v);
    case WF_COMM: return fl_comm_opts_set(&a->co, f->name, v);
    case WF_OPTIM: return set_optim(a, f->name, v);
    default: return fl_fail(FL_EINVAL, "%s: not a setting", flag);
    }
}

/* Remembers a flag that belongs to one mode, for the refusal when another runs. */
static void note_mode(wargs_t *a, const wflag_t *f)
{
    if (f->only == WF_DRILL_ONLY)
        a->drill_flag = f->name;
    if (f->only == WF_PS_ONLY && a->ps_flag == NULL)
        a->ps_flag = f->name;
    if (f->kind == WF_OPTIM && a->optim_flag == NULL)
        a->optim_flag = f->name;
}

/* The optimizer's flags share one code: glibc's getopt_long then takes an abbreviation that
 * only they share (--beta) as the first of them, not as ambiguous. */
#define CODE_OPTIM 999
#define CODE_FIRST 1000

int fl_wk_args_parse(wargs_t *a, int argc, char **argv, wargs_what_t *what)
{
    struct option longopts[NFLAGS + 1];
    for (size_t i = 0; i < NFLAGS; i++)
        longopts[i] =
            (struct option){flags[i].name,
                            fl_wk_flag_takes_value(&flags[i]) ? required_argument : no_argument,
                            NULL, flags[i].kind == WF_OPTIM ? CODE_OPTIM : CODE_FIRST + (int)i};
    longopts[NFLAGS] = (struct option){NULL, 0, NULL, 0};
    *what = WARGS_RUN;
    int ch;
    int li = 0;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "h", longopts, &li)) != -1) {
        if (ch == '?' || ch == ':')
            return fl_fail(FL_EINVAL, "unknown or incomplete flag '%s' (see --help)",
                           argv[optind - 1]);
        const wflag_t *f = ch == 'h' ? NULL : &flags[li];
        if (f == NULL || f->kind == WF_HELP || f->kind == WF_VERSION) {
            *what = f != NULL && f->kind == WF_VERSION ? WARGS_VERSION : WARGS_HELP;
            return FL_OK;
        }
        int rc = apply(a, f, optarg);
        if (rc != FL_OK)
            return rc;
        note_mode(a, f);
    }
    if (optind < argc)
        return fl_fail(FL_EINVAL, "unexpected argument '%s' (see --help)", argv[optind]);
    return FL_OK;
}
