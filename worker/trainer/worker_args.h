/* flodl-worker's command line: what its flags set (wargs_t) and the table they are read from
 * (worker_flags.c), which also gives getopt its options and --help its text (worker_help.c).
 * Private to the flodl-worker program (with worker_main.c) and its tests. */
#ifndef FL_WK_WORKER_ARGS_H
#define FL_WK_WORKER_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fl_coll.h"
#include "fl_core.h"
#include "fl_wk.h"

typedef struct wargs {
    fl_comm_opts_t co;
    fl_wk_train_opts_t to;
    fl_wk_drill_opts_t d;
    fl_launch_info_t env;   /* the launcher's variables; co's strings may point into it */
    int mode;               /* an fl_wk_mode_t, or -1 until --mode or a drill flag decides */
    const char *drill_flag; /* a drill-only flag that was given (the last), if any */
    const char *optim_flag; /* an optimizer flag that was given (the first), if any */
    const char *ps_flag;    /* a parameter-server flag that was given (the first), if any */
    bool lz4;
    int reconnect_ms;
    const char *train_images, *train_labels, *test_images, *test_labels;
    const char *train_csv, *test_csv;
    uint64_t data_seed;
    int metrics_port; /* -1: off */
    int health_port;  /* -1: off */
    const char *metrics_bind;
    const char *resume_if_any; /* --resume-if-any: resume_dir when it holds a manifest */
    bool insecure;             /* --insecure */
    const char *timeline_path;
    const char *device;             /* --device (NULL: auto) */
    const char *gpus;               /* --gpus */
    bool replicas_given;            /* --cpu-replicas */
    bool momentum_given;            /* --momentum (the default 0.9 is SGD's alone) */
    char settings[FL_SETTINGS_MAX]; /* what every rank must share, checked at rendezvous */
} wargs_t;

/* How a flag's value is read. */
typedef enum wflag_kind {
    WF_INT,     /* an integer in [lo, hi] into an integer field (bool, int, enum, long, size_t,
                   uint64_t) */
    WF_BYTES,   /* a size in [lo, hi] bytes, K/M/G allowed, into a size_t */
    WF_REAL,    /* a number in [lo, hi] into a double */
    WF_ON,      /* no value: the field becomes true (1) */
    WF_OFF,     /* no value: the field becomes false (0) */
    WF_TEXT,    /* the value itself into a const char * (argv outlives the run) */
    WF_WORDS,   /* one of words, exactly, into an int-sized field (its enum value) */
    WF_DTYPE,   /* a dtype as fl_dtype_parse reads it, one of words, into an fl_dtype_t */
    WF_CALL,    /* the row's own setter */
    WF_COMM,    /* a communicator option: fl_comm_opts_set, by the same name */
    WF_OPTIM,   /* an optimizer flag: fl_cli_optim_flag, by the same name */
    WF_HELP,    /* no value: print --help and start nothing */
    WF_VERSION, /* no value: print the version and start nothing */
} wflag_kind_t;

/* Where --help shows a flag, in this order. */
typedef enum wflag_sec {
    WF_SEC_NONE,  /* not listed on its own: --help, --version, and a flag another's text names */
    WF_SEC_USAGE, /* the usage line */
    WF_SEC_MODE,  /* right under it, before the first titled section */
    WF_SEC_DATA,
    WF_SEC_TRAIN,
    WF_SEC_SECURITY,
    WF_SEC_COMM,
    WF_SEC_PS,
    WF_SEC_DRILL,
    WF_SEC_COUNT,
} wflag_sec_t;

/* The mode a flag belongs to: given with another mode, it is refused naming it. */
typedef enum wflag_only {
    WF_ANY_MODE,
    WF_PS_ONLY,
    WF_DRILL_ONLY, /* and it selects the drill when no --mode is given */
} wflag_only_t;

typedef struct wflag_word {
    const char *word;
    int value;
} wflag_word_t;

/* One flag: everything flodl-worker knows about it. */
typedef struct wflag {
    const char *name; /* the long option, without "--" */
    wflag_kind_t kind;
    size_t off;                /* WF_INT .. WF_DTYPE: the field in wargs_t it sets */
    size_t size;               /* ... and its size */
    double lo, hi;             /* WF_INT, WF_BYTES, WF_REAL: the range */
    const wflag_word_t *words; /* WF_WORDS, WF_DTYPE: the values taken, NULL-terminated, in
                                  the order the refusal lists them */
    int (*set)(wargs_t *a, const char *value); /* WF_CALL */
    wflag_only_t only;
    const char *meta; /* the value as --help shows it ("N", "DIR"); NULL for a flag that takes
                         none (a WF_WORDS row without one shows its words) */
    const char *help; /* what --help says after it, or NULL */
    wflag_sec_t sec;
    bool optional; /* --help shows it in brackets: optional beside the flags before it */
} wflag_t;

/* The table, in --help's order; *n gets its length. */
const wflag_t *fl_wk_flags(size_t *n);

/* True when the row's flag takes a value. */
bool fl_wk_flag_takes_value(const wflag_t *f);

/* The values of a: every field at its default. */
void fl_wk_args_init(wargs_t *a);

/* What the command line asks for. */
typedef enum wargs_what {
    WARGS_RUN,
    WARGS_HELP,
    WARGS_VERSION,
} wargs_what_t;

/* Reads argv into a, flag by flag, until --help or --version (*what says which) or the end.
 * FL_OK, or FL_EINVAL with one line naming the flag and what it takes, an unknown or
 * incomplete flag, or a stray argument. Uses getopt: one call per process. */
int fl_wk_args_parse(wargs_t *a, int argc, char **argv, wargs_what_t *what);

/* Writes --help, generated from the table. */
void fl_wk_args_help(FILE *out);

/* A row's words as "a|b|c", as its refusal and --help list them. */
void fl_wk_flag_words(const wflag_word_t *words, char *out, size_t cap);

#endif
