/* Flag values for the binaries: strict parsing with a detail text that names the flag, so the
 * entry points can print one line and exit 2. */
#include "fl_core.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fl_cli_long(const char *flag, const char *val, long lo, long hi, long *out)
{
    if (val == NULL || val[0] == '\0')
        return fl_fail(FL_EINVAL, "%s: missing value", flag);
    char *end = NULL;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno != 0 || end == val || *end != '\0' || isspace((unsigned char)val[0]) || val[0] == '+')
        return fl_fail(FL_EINVAL, "%s: '%s' is not an integer", flag, val);
    if (v < lo || v > hi)
        return fl_fail(FL_EINVAL, "%s: %ld is out of range %ld..%ld", flag, v, lo, hi);
    *out = v;
    return FL_OK;
}

int fl_cli_size(const char *flag, const char *val, size_t lo, size_t hi, size_t *out)
{
    if (val == NULL || val[0] == '\0')
        return fl_fail(FL_EINVAL, "%s: missing value", flag);
    if (val[0] == '-')
        return fl_fail(FL_EINVAL, "%s: '%s' is negative", flag, val);
    if (!isdigit((unsigned char)val[0]))
        return fl_fail(FL_EINVAL, "%s: '%s' is not a size", flag, val);
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (errno != 0 || end == val)
        return fl_fail(FL_EINVAL, "%s: '%s' is not a size", flag, val);
    unsigned shift = 0;
    if (*end != '\0') {
        switch (toupper((unsigned char)*end)) {
        case 'K': shift = 10; break;
        case 'M': shift = 20; break;
        case 'G': shift = 30; break;
        default: return fl_fail(FL_EINVAL, "%s: '%s' has an unknown suffix (K, M or G)", flag, val);
        }
        end++;
        if (toupper((unsigned char)*end) == 'I')
            end++;
        if (toupper((unsigned char)*end) == 'B')
            end++;
        if (*end != '\0')
            return fl_fail(FL_EINVAL, "%s: '%s' is not a size", flag, val);
    }
    if (shift != 0 && v > (SIZE_MAX >> shift))
        return fl_fail(FL_EINVAL, "%s: '%s' is too large", flag, val);
    size_t s = (size_t)v << shift;
    if (s < lo || s > hi)
        return fl_fail(FL_EINVAL, "%s: %zu bytes is out of range %zu..%zu", flag, s, lo, hi);
    *out = s;
    return FL_OK;
}

void fl_fmt_bytes(size_t bytes, char *out, size_t cap)
{
    if (bytes >= ((size_t)1 << 30) && bytes % ((size_t)1 << 30) == 0)
        snprintf(out, cap, "%zu GiB", bytes >> 30);
    else if (bytes >= ((size_t)1 << 20) && bytes % ((size_t)1 << 20) == 0)
        snprintf(out, cap, "%zu MiB", bytes >> 20);
    else if (bytes >= 1024 && bytes % 1024 == 0)
        snprintf(out, cap, "%zu KiB", bytes >> 10);
    else
        snprintf(out, cap, "%zu B", bytes);
}

int fl_cli_double(const char *flag, const char *val, double lo, double hi, double *out)
{
    if (val == NULL || val[0] == '\0')
        return fl_fail(FL_EINVAL, "%s: missing value", flag);
    char *end = NULL;
    errno = 0;
    double x = strtod(val, &end);
    if (errno != 0 || end == val || *end != '\0' || isspace((unsigned char)val[0]) ||
        !(x >= lo && x <= hi))
        return fl_fail(FL_EINVAL, "%s: '%s' is not a number in [%g, %g]", flag, val, lo, hi);
    *out = x;
    return FL_OK;
}

/* The optimizer flags both binaries take (the worker for its own optimizer, flodl-ps for the
 * server's), by long name. */
const char *const fl_cli_optim_names[] = {
    "optimizer",    "lr",       "momentum", "dampening",   "nesterov",     "weight-decay",
    "beta1",        "beta2",    "eps",      "lr-schedule", "warmup-steps", "total-steps",
    "lr-step-size", "lr-gamma", "min-lr",   NULL,
};

bool fl_cli_is_optim_flag(const char *name)
{
    for (size_t i = 0; fl_cli_optim_names[i] != NULL; i++)
        if (strcmp(name, fl_cli_optim_names[i]) == 0)
            return true;
    return false;
}

int fl_cli_optim_flag(const char *name, const char *val, fl_opt_opts_t *o, fl_lr_sched_t *s)
{
    char flag[64];
    snprintf(flag, sizeof flag, "--%s", name);
    if (strcmp(name, "optimizer") == 0)
        return fl_opt_kind_parse(val, &o->kind) == FL_OK
                   ? FL_OK
                   : fl_fail(FL_EINVAL, "--optimizer: '%s' is not one of sgd|adam|adamw", val);
    if (strcmp(name, "lr") == 0)
        return fl_cli_double(flag, val, 0.0, 1e6, &s->lr);
    if (strcmp(name, "momentum") == 0)
        return fl_cli_double(flag, val, 0.0, 0.999999, &o->momentum);
    if (strcmp(name, "dampening") == 0)
        return fl_cli_double(flag, val, 0.0, 1.0, &o->dampening);
    if (strcmp(name, "nesterov") == 0) {
        o->nesterov = true;
        return FL_OK;
    }
    if (strcmp(name, "weight-decay") == 0)
        return fl_cli_double(flag, val, 0.0, 10.0, &o->weight_decay);
    if (strcmp(name, "beta1") == 0)
        return fl_cli_double(flag, val, 0.0, 0.999999, &o->beta1);
    if (strcmp(name, "beta2") == 0)
        return fl_cli_double(flag, val, 0.0, 0.999999999, &o->beta2);
    if (strcmp(name, "eps") == 0)
        return fl_cli_double(flag, val, 0.0, 1.0, &o->eps);
    if (strcmp(name, "lr-schedule") == 0)
        return fl_lr_kind_parse(val, &s->kind) == FL_OK
                   ? FL_OK
                   : fl_fail(FL_EINVAL,
                             "--lr-schedule: '%s' is not one of "
                             "constant|step|cosine",
                             val);
    if (strcmp(name, "warmup-steps") == 0)
        return fl_cli_long(flag, val, 0, 1L << 40, &s->warmup_steps);
    if (strcmp(name, "total-steps") == 0)
        return fl_cli_long(flag, val, 1, 1L << 40, &s->total_steps);
    if (strcmp(name, "lr-step-size") == 0)
        return fl_cli_long(flag, val, 1, 1L << 40, &s->step_size);
    if (strcmp(name, "lr-gamma") == 0)
        return fl_cli_double(flag, val, 0.0, 1.0, &s->gamma);
    if (strcmp(name, "min-lr") == 0)
        return fl_cli_double(flag, val, 0.0, 1e6, &s->min_lr);
    return fl_fail(FL_EINVAL, "--%s is not an optimizer flag", name);
}

int fl_cli_optim_check(const fl_opt_opts_t *o, const fl_lr_sched_t *s)
{
    if (s->kind == FL_LR_STEP && s->step_size < 1)
        return fl_fail(FL_EINVAL, "--lr-schedule step needs --lr-step-size");
    if (s->kind == FL_LR_COSINE && s->total_steps < 1)
        return fl_fail(FL_EINVAL, "--lr-schedule cosine needs --total-steps");
    if (o->nesterov && o->momentum == 0.0)
        return fl_fail(FL_EINVAL, "--nesterov needs --momentum > 0");
    if (o->kind != FL_OPT_SGD && (o->momentum != 0.0 || o->nesterov))
        return fl_fail(FL_EINVAL, "--momentum and --nesterov are SGD's; %s has beta1 and beta2",
                       fl_opt_kind_name(o->kind));
    return FL_OK;
}

int fl_cli_security(const char *flag_dir, bool flag_insecure, const char *env_dir,
                    bool env_insecure, const char **dir)
{
    *dir = NULL;
    if (flag_dir != NULL && flag_insecure)
        return fl_fail(FL_EINVAL, "--curve-dir and --insecure: choose one");
    if (flag_dir != NULL || flag_insecure) {
        *dir = flag_dir;
        return FL_OK;
    }
    if (env_dir != NULL && env_dir[0] != '\0' && env_insecure)
        return fl_fail(FL_EINVAL, "FLODL_CURVE_DIR and FLODL_INSECURE=1: choose one");
    if (env_dir != NULL && env_dir[0] != '\0') {
        *dir = env_dir;
        return FL_OK;
    }
    if (env_insecure)
        return FL_OK;
    return fl_fail(FL_EINVAL, "no --curve-dir (or FLODL_CURVE_DIR): give the job's CURVE keys "
                              "(flodl-keygen DIR makes them), or --insecure (FLODL_INSECURE=1) "
                              "to run in plain text");
}

void fl_cli_security_notice(const char *prog)
{
    fprintf(stderr,
            "%s: running in plain text (--insecure): anyone who reaches these ports can "
            "join or read the job\n",
            prog);
}
