/* The benchmarks' flags: each benchmark's table (bench_util.h) turned into getopt_long's
 * options, each value checked against its row and set, the flag list of --help; and the
 * comma-separated lists of element counts and of densities. What the values mean is each
 * benchmark's. */
#include "bench_util.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "fl_core.h"

/* Calls fn(flag, token, ud) for each comma-separated token of s; stops at the first failure. */
static int each_token(const char *flag, const char *s,
                      int (*fn)(const char *, const char *, void *), void *ud)
{
    char buf[512];
    if (strlen(s) >= sizeof buf) {
        fprintf(stderr, "flodl-bench: %s: list too long\n", flag);
        return -1;
    }
    strcpy(buf, s);
    char *save = NULL;
    int seen = 0;
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        if (fn(flag, t, ud) != 0)
            return -1;
        seen++;
    }
    if (seen == 0) {
        fprintf(stderr, "flodl-bench: %s: empty list\n", flag);
        return -1;
    }
    return 0;
}

typedef struct count_list {
    size_t lo;
    size_t hi;
    size_t *out;
    int *n;
} count_list_t;

static int add_count(const char *flag, const char *tok, void *ud)
{
    count_list_t *l = ud;
    size_t v;
    if (*l->n >= BENCH_MAX_LIST) {
        fprintf(stderr, "flodl-bench: %s: more than %d values\n", flag, BENCH_MAX_LIST);
        return -1;
    }
    if (fl_cli_size(flag, tok, l->lo, l->hi, &v) != FL_OK) {
        fprintf(stderr, "flodl-bench: %s\n", fl_last_error());
        return -1;
    }
    l->out[(*l->n)++] = v;
    return 0;
}

int bench_parse_counts(const char *flag, const char *s, size_t lo, size_t hi, size_t *out, int *n)
{
    count_list_t l = {lo, hi, out, n};
    *n = 0;
    return each_token(flag, s, add_count, &l);
}

typedef struct density_list {
    double *out;
    int *n;
} density_list_t;

static int add_density(const char *flag, const char *tok, void *ud)
{
    density_list_t *l = ud;
    char *end = NULL;
    double d = strtod(tok, &end);
    if (end == tok || *end != '\0' || !(d > 0.0 && d <= 1.0)) {
        fprintf(stderr, "flodl-bench: %s: '%s' is not a density in (0, 1]\n", flag, tok);
        return -1;
    }
    if (*l->n >= BENCH_MAX_LIST) {
        fprintf(stderr, "flodl-bench: %s: more than %d values\n", flag, BENCH_MAX_LIST);
        return -1;
    }
    l->out[(*l->n)++] = d;
    return 0;
}

int bench_parse_densities(const char *flag, const char *s, double *out, int *n)
{
    density_list_t l = {out, n};
    *n = 0;
    return each_token(flag, s, add_density, &l);
}

/* Room for a table and the communicator's flags beside it. */
#define MAX_FLAGS 64
/* getopt_long's codes: the table's rows from here, the other names from MORE_CODE. */
#define FLAG_CODE 1000
#define MORE_CODE 2000
#define HELP_CODE 3000

static void *field(void *b, size_t at)
{
    return (char *)b + at - 1;
}

/* Which of the '|'-separated words v is: 0, 1, ...; -1 when none. */
static int word_index(const char *words, const char *v)
{
    size_t n = strlen(v);
    int i = 0;
    for (const char *w = words; *w != '\0'; i++) {
        size_t len = strcspn(w, "|");
        if (len == n && strncmp(w, v, n) == 0)
            return i;
        w += len;
        if (*w == '|')
            w++;
    }
    return -1;
}

/* Checks v against row f and sets the field: FL_OK, or the fl_fail code. */
static int set_value(const bench_flag_t *f, const char *flag, const char *v, void *b)
{
    long n = 0;
    int rc = FL_OK;
    switch (f->kind) {
    case BENCH_SWITCH: *(bool *)field(b, f->at) = true; break;
    case BENCH_INT:
        if ((rc = fl_cli_long(flag, v, (long)f->lo, (long)f->hi, &n)) == FL_OK)
            *(int *)field(b, f->at) = (int)n;
        break;
    case BENCH_LONG: rc = fl_cli_long(flag, v, (long)f->lo, (long)f->hi, field(b, f->at)); break;
    case BENCH_SIZE:
        rc = fl_cli_size(flag, v, (size_t)f->lo, (size_t)f->hi, field(b, f->at));
        break;
    case BENCH_DOUBLE: rc = fl_cli_double(flag, v, f->lo, f->hi, field(b, f->at)); break;
    case BENCH_TEXT: *(const char **)field(b, f->at) = v; break;
    case BENCH_WORD:
    case BENCH_YESNO: {
        int w = word_index(f->words, v);
        if (f->kind == BENCH_WORD)
            *(const char **)field(b, f->at) = v;
        else
            *(bool *)field(b, f->at) = w == 0;
        if (w < 0)
            rc = fl_fail(FL_EINVAL, "%s: '%s' is not one of %s", flag, v, f->words);
        break;
    }
    case BENCH_CALL: rc = f->set(b, v); break;
    default: rc = fl_fail(FL_EINVAL, "%s: the table gives it no kind", flag);
    }
    return rc;
}

/* Takes one flag of the table. 0, or -1 after printing what is wrong. */
static int take(const bench_flag_t *f, const char *v, void *b)
{
    char flag[64];
    snprintf(flag, sizeof flag, "--%s", f->name);
    if (f->kind == BENCH_COUNTS || f->kind == BENCH_DENSITIES) {
        /* The list parsers say what is wrong themselves. */
        int rc = f->kind == BENCH_COUNTS
                     ? bench_parse_counts(flag, v, (size_t)f->lo, (size_t)f->hi, field(b, f->at),
                                          field(b, f->count))
                     : bench_parse_densities(flag, v, field(b, f->at), field(b, f->count));
        if (rc != 0)
            return -1;
    } else if (set_value(f, flag, v, b) != FL_OK) {
        fprintf(stderr, "flodl-bench: %s\n", fl_last_error());
        return -1;
    }
    if (f->given != 0)
        *(const char **)field(b, f->given) = v;
    return 0;
}

/* Hands a flag of the other table to its setter, with the arguments that carried it: the
 * flag and its value, or the one "--name=value". 0, or -1 after printing. */
static int take_more(const bench_more_t *more, int i, char **argv, void *b)
{
    char *const *words = optarg == argv[optind - 1] ? &argv[optind - 2] : &argv[optind - 1];
    int nwords = optarg == argv[optind - 1] ? 2 : 1;
    if (more->set(b, more->names[i], optarg, words, nwords) != FL_OK) {
        fprintf(stderr, "flodl-bench: %s\n", fl_last_error());
        return -1;
    }
    return 0;
}

/* The other table's names first: getopt_long gives a name both tables spell to the first. */
static int long_options(const bench_flag_t *flags, const bench_more_t *more, struct option *o)
{
    int n = 0;
    for (int i = 0; more != NULL && more->names[i] != NULL && n < MAX_FLAGS; i++)
        o[n++] = (struct option){more->names[i], required_argument, NULL, MORE_CODE + i};
    for (int i = 0; flags[i].name != NULL && n < MAX_FLAGS; i++)
        o[n++] = (struct option){flags[i].name,
                                 flags[i].kind == BENCH_SWITCH ? no_argument : required_argument,
                                 NULL, FLAG_CODE + i};
    if (n == MAX_FLAGS)
        return -1;
    o[n++] = (struct option){"help", no_argument, NULL, HELP_CODE};
    o[n] = (struct option){NULL, 0, NULL, 0};
    return 0;
}

/* The row's range as --help shows it ("" when the kind has none). */
static void fmt_range(const bench_flag_t *f, char *out, size_t cap)
{
    char lo[32];
    char hi[32];
    switch (f->kind) {
    case BENCH_INT:
    case BENCH_LONG: snprintf(out, cap, ", %ld..%ld", (long)f->lo, (long)f->hi); break;
    case BENCH_SIZE:
    case BENCH_COUNTS:
        bench_fmt_count((size_t)f->lo, lo, sizeof lo);
        bench_fmt_count((size_t)f->hi, hi, sizeof hi);
        snprintf(out, cap, ", %s%s..%s", f->kind == BENCH_COUNTS ? "each " : "", lo, hi);
        break;
    case BENCH_DOUBLE: snprintf(out, cap, ", %g..%g", f->lo, f->hi); break;
    case BENCH_DENSITIES: snprintf(out, cap, ", each in (0, 1]"); break;
    default: out[0] = '\0';
    }
}

/* Appends "v" to out, comma-separated from what is there. */
static void add_item(char *out, size_t cap, const char *v)
{
    size_t len = strlen(out);
    snprintf(out + len, cap - len, "%s%s", len > 0 ? "," : "", v);
}

/* The field's value as --help shows a default ("" when the row's kind cannot say). */
static void fmt_value(const bench_flag_t *f, void *b, char *out, size_t cap)
{
    char v[32];
    out[0] = '\0';
    switch (f->kind) {
    case BENCH_INT: snprintf(out, cap, "%d", *(int *)field(b, f->at)); break;
    case BENCH_LONG: snprintf(out, cap, "%ld", *(long *)field(b, f->at)); break;
    case BENCH_SIZE: bench_fmt_count(*(size_t *)field(b, f->at), out, cap); break;
    case BENCH_DOUBLE: snprintf(out, cap, "%g", *(double *)field(b, f->at)); break;
    case BENCH_TEXT:
    case BENCH_WORD: {
        const char *s = *(const char **)field(b, f->at);
        snprintf(out, cap, "%s", s != NULL ? s : "");
        break;
    }
    case BENCH_YESNO:
        snprintf(out, cap, "%.*s", (int)strcspn(f->words, "|"), f->words);
        if (!*(bool *)field(b, f->at))
            snprintf(out, cap, "%s", f->words + strcspn(f->words, "|") + 1);
        break;
    case BENCH_COUNTS:
    case BENCH_DENSITIES:
        for (int i = 0; i < *(int *)field(b, f->count); i++) {
            if (f->kind == BENCH_COUNTS)
                bench_fmt_count(((size_t *)field(b, f->at))[i], v, sizeof v);
            else
                snprintf(v, sizeof v, "%g", ((double *)field(b, f->at))[i]);
            add_item(out, cap, v);
        }
        break;
    default: break;
    }
}

/* What --help gives as each row's default: the row's def, else the field's value before any
 * flag (so the default is written once, where the benchmark sets it). */
static void fmt_defaults(const bench_flag_t *flags, void *b, char (*defs)[64])
{
    for (int i = 0; flags[i].name != NULL && i < MAX_FLAGS; i++) {
        if (flags[i].def != NULL)
            snprintf(defs[i], sizeof defs[i], "%s", flags[i].def);
        else
            fmt_value(&flags[i], b, defs[i], sizeof defs[i]);
    }
}

/* usage, then a line per listed row: the flag, what it takes, its help, its range and its
 * default. */
static void print_help(const char *usage, const bench_flag_t *flags, char (*defs)[64])
{
    fputs(usage, stdout);
    printf("flags:\n");
    for (int i = 0; flags[i].name != NULL; i++) {
        const bench_flag_t *f = &flags[i];
        if (f->help == NULL)
            continue;
        const char *arg = f->kind == BENCH_WORD || f->kind == BENCH_YESNO ? f->words : f->arg;
        char left[64];
        char range[96];
        snprintf(left, sizeof left, "--%s%s%s", f->name, arg != NULL ? " " : "",
                 arg != NULL ? arg : "");
        fmt_range(f, range, sizeof range);
        char def[80] = "";
        if (defs[i][0] != '\0')
            snprintf(def, sizeof def, " (default: %.63s)", defs[i]);
        if (strlen(left) > 24)
            printf("  %s\n  %-24s %s%s%s\n", left, "", f->help, range, def);
        else
            printf("  %-24s %s%s%s\n", left, f->help, range, def);
    }
}

int bench_flags_parse(int argc, char **argv, const bench_flag_t *flags, const bench_more_t *more,
                      const char *usage, void *b)
{
    struct option longopts[MAX_FLAGS + 2];
    if (long_options(flags, more, longopts) != 0) {
        fprintf(stderr, "flodl-bench: more than %d flags\n", MAX_FLAGS);
        return 2;
    }
    char defs[MAX_FLAGS][64];
    fmt_defaults(flags, b, defs);
    int ch;
    opterr = 0;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int rc;
        if (ch == 'h' || ch == HELP_CODE) {
            print_help(usage, flags, defs);
            return 0;
        } else if (ch >= MORE_CODE && ch < HELP_CODE) {
            rc = take_more(more, ch - MORE_CODE, argv, b);
        } else if (ch >= FLAG_CODE && ch < MORE_CODE) {
            rc = take(&flags[ch - FLAG_CODE], optarg, b);
        } else {
            fprintf(stderr, "flodl-bench: unknown or incomplete flag '%s'\n", argv[optind - 1]);
            rc = -1;
        }
        if (rc != 0)
            return 2;
    }
    return -1;
}
