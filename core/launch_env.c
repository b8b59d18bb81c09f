/* Rank, world size, local rank and size, and coordinator from the variables that launchers set:
 * flodl's own, torchrun's, Open MPI's and Kubernetes'. Pure: the caller supplies the lookup, so
 * only the binaries' entry points (and fl_comm_opts_from_env, on the user's request) touch the
 * real environment. */
#include "fl_core.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_int(const char *var, const char *val, int lo, int hi, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno != 0 || end == val || *end != '\0' || v < lo || v > hi)
        return fl_fail(FL_EINVAL, "environment %s='%s' is not an integer in %d..%d", var, val, lo,
                       hi);
    *out = (int)v;
    return FL_OK;
}

static const char *first_set(fl_env_get_fn get, void *ud, const char *const *vars,
                             const char **which)
{
    for (size_t i = 0; vars[i] != NULL; i++) {
        const char *v = get(vars[i], ud);
        if (v != NULL && v[0] != '\0') {
            *which = vars[i];
            return v;
        }
    }
    *which = NULL;
    return NULL;
}

/* Rank and world size: the first variable set of each list wins. */
static int read_rank_world(fl_env_get_fn get, void *ud, fl_launch_info_t *out)
{
    static const char *const rank_vars[] = {"FLODL_RANK", "RANK", "OMPI_COMM_WORLD_RANK",
                                            "JOB_COMPLETION_INDEX", NULL};
    static const char *const world_vars[] = {"FLODL_WORLD_SIZE", "WORLD_SIZE",
                                             "OMPI_COMM_WORLD_SIZE", NULL};
    int rc;
    const char *which;
    const char *v = first_set(get, ud, rank_vars, &which);
    if (v != NULL) {
        if ((rc = parse_int(which, v, 0, INT_MAX - 1, &out->rank)) != FL_OK)
            return rc;
        out->rank_var = which;
    }
    v = first_set(get, ud, world_vars, &which);
    if (v != NULL) {
        if ((rc = parse_int(which, v, 1, INT_MAX - 1, &out->world_size)) != FL_OK)
            return rc;
        out->world_var = which;
    }
    return FL_OK;
}

/* torchrun's names, which flodl-launch sets too. A local rank at or past the local size means
 * the launcher and the program disagree on the host's layout: refused rather than guessed. */
static int read_local(fl_env_get_fn get, void *ud, fl_launch_info_t *out)
{
    int rc;
    const char *rank = get("LOCAL_RANK", ud);
    const char *size = get("LOCAL_WORLD_SIZE", ud);
    if (rank != NULL && rank[0] != '\0' &&
        (rc = parse_int("LOCAL_RANK", rank, 0, INT_MAX - 1, &out->local_rank)) != FL_OK)
        return rc;
    if (size != NULL && size[0] != '\0' &&
        (rc = parse_int("LOCAL_WORLD_SIZE", size, 1, INT_MAX - 1, &out->local_size)) != FL_OK)
        return rc;
    if (out->local_rank >= 0 && out->local_size > 0 && out->local_rank >= out->local_size)
        return fl_fail(FL_EINVAL,
                       "environment LOCAL_RANK='%s' is not below LOCAL_WORLD_SIZE='%s': a host's "
                       "local ranks are 0..LOCAL_WORLD_SIZE-1",
                       rank, size);
    return FL_OK;
}

static int read_coordinator(fl_env_get_fn get, void *ud, fl_launch_info_t *out)
{
    int rc;
    const char *v = get("FLODL_COORDINATOR", ud);
    if (v != NULL && v[0] != '\0') {
        if (strlen(v) >= sizeof out->coordinator)
            return fl_fail(FL_EINVAL, "environment FLODL_COORDINATOR is longer than %zu bytes",
                           sizeof out->coordinator - 1);
        snprintf(out->coordinator, sizeof out->coordinator, "%s", v);
        const char *colon = strrchr(v, ':');
        if (colon != NULL && colon[1] >= '1' && colon[1] <= '9')
            (void)parse_int("FLODL_COORDINATOR's port", colon + 1, 1, 65535, &out->port);
        return FL_OK;
    }
    const char *addr = get("MASTER_ADDR", ud);
    const char *port = get("MASTER_PORT", ud);
    if (port != NULL && port[0] != '\0' &&
        (rc = parse_int("MASTER_PORT", port, 1, 65535, &out->port)) != FL_OK)
        return rc;
    if (addr != NULL && addr[0] != '\0') {
        int p = out->port > 0 ? out->port : 29500;
        int n = snprintf(out->coordinator, sizeof out->coordinator, "tcp://%s:%d", addr, p);
        if (n < 0 || (size_t)n >= sizeof out->coordinator)
            return fl_fail(FL_EINVAL, "environment MASTER_ADDR is too long");
    }
    return FL_OK;
}

/* A string variable into a fixed buffer; too long is refused, naming it. */
static int read_text(fl_env_get_fn get, void *ud, const char *var, char *dst, size_t cap)
{
    const char *v = get(var, ud);
    if (v == NULL || v[0] == '\0')
        return FL_OK;
    if (strlen(v) >= cap)
        return fl_fail(FL_EINVAL, "environment %s is longer than %zu bytes", var, cap - 1);
    snprintf(dst, cap, "%s", v);
    return FL_OK;
}

/* A 1-or-0 variable: *out stays as it is when unset. */
static int read_switch(fl_env_get_fn get, void *ud, const char *var, int *out)
{
    const char *v = get(var, ud);
    if (v == NULL || v[0] == '\0')
        return FL_OK;
    if (strcmp(v, "1") != 0 && strcmp(v, "0") != 0)
        return fl_fail(FL_EINVAL, "environment %s='%s' is not 1 or 0", var, v);
    *out = v[0] == '1';
    return FL_OK;
}

static int read_rest(fl_env_get_fn get, void *ud, fl_launch_info_t *out)
{
    int rc;
    if ((rc = read_text(get, ud, "FLODL_HOST", out->host, sizeof out->host)) != FL_OK ||
        (rc = read_text(get, ud, "FLODL_JOB_ID", out->job_id, sizeof out->job_id)) != FL_OK)
        return rc;
    const char *v = get("FLODL_LOG", ud);
    if (v != NULL && v[0] != '\0') {
        fl_log_level_t level;
        if (fl_log_level_parse(v, &level) != FL_OK)
            return fl_fail(FL_EINVAL,
                           "environment FLODL_LOG='%s' is not one of "
                           "debug|info|warn|error|off",
                           v);
        out->log_level = (int)level;
    }
    if ((rc = read_text(get, ud, "FLODL_CURVE_DIR", out->curve_dir, sizeof out->curve_dir)) !=
        FL_OK)
        return rc;
    int insecure = 0;
    if ((rc = read_switch(get, ud, "FLODL_INSECURE", &insecure)) != FL_OK)
        return rc;
    out->insecure = insecure == 1;
    return read_switch(get, ud, "FLODL_IPC", &out->ipc);
}

int fl_launch_from_env(fl_env_get_fn get, void *ud, fl_launch_info_t *out)
{
    memset(out, 0, sizeof *out);
    out->rank = -1;
    out->world_size = -1;
    out->log_level = -1;
    out->ipc = -1;
    out->local_rank = -1;
    out->local_size = -1;
    int rc;
    if ((rc = read_rank_world(get, ud, out)) != FL_OK || (rc = read_local(get, ud, out)) != FL_OK ||
        (rc = read_coordinator(get, ud, out)) != FL_OK)
        return rc;
    return read_rest(get, ud, out);
}
