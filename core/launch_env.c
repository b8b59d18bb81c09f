/* Rank, world size and coordinator from the variables that launchers set: flodl's own,
 * torchrun's, Open MPI's and Kubernetes'. Pure: the caller supplies the lookup, so only the
 * binaries' entry points (and fl_comm_opts_from_env, on the user's request) touch the real
 * environment. */
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

int fl_launch_from_env(fl_env_get_fn get, void *ud, fl_launch_info_t *out)
{
    static const char *const rank_vars[] = {"FLODL_RANK", "RANK", "OMPI_COMM_WORLD_RANK",
                                            "JOB_COMPLETION_INDEX", NULL};
    static const char *const world_vars[] = {"FLODL_WORLD_SIZE", "WORLD_SIZE",
                                             "OMPI_COMM_WORLD_SIZE", NULL};
    int rc;
    const char *which;
    const char *v;

    memset(out, 0, sizeof *out);
    out->rank = -1;
    out->world_size = -1;
    out->log_level = -1;
    out->ipc = -1;

    v = first_set(get, ud, rank_vars, &which);
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

    v = get("FLODL_COORDINATOR", ud);
    if (v != NULL && v[0] != '\0') {
        if (strlen(v) >= sizeof out->coordinator)
            return fl_fail(FL_EINVAL, "environment FLODL_COORDINATOR is longer than %zu bytes",
                           sizeof out->coordinator - 1);
        snprintf(out->coordinator, sizeof out->coordinator, "%s", v);
        const char *colon = strrchr(v, ':');
        if (colon != NULL && colon[1] >= '1' && colon[1] <= '9')
            (void)parse_int("FLODL_COORDINATOR's port", colon + 1, 1, 65535, &out->port);
    } else {
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
    }

    v = get("FLODL_HOST", ud);
    if (v != NULL && v[0] != '\0') {
        if (strlen(v) >= sizeof out->host)
            return fl_fail(FL_EINVAL, "environment FLODL_HOST is too long");
        snprintf(out->host, sizeof out->host, "%s", v);
    }
    v = get("FLODL_JOB_ID", ud);
    if (v != NULL && v[0] != '\0') {
        if (strlen(v) >= sizeof out->job_id)
            return fl_fail(FL_EINVAL, "environment FLODL_JOB_ID is longer than %zu bytes",
                           sizeof out->job_id - 1);
        snprintf(out->job_id, sizeof out->job_id, "%s", v);
    }
    v = get("FLODL_LOG", ud);
    if (v != NULL && v[0] != '\0') {
        fl_log_level_t level;
        if (fl_log_level_parse(v, &level) != FL_OK)
            return fl_fail(FL_EINVAL,
                           "environment FLODL_LOG='%s' is not one of "
                           "debug|info|warn|error|off",
                           v);
        out->log_level = (int)level;
    }
    v = get("FLODL_CURVE_DIR", ud);
    if (v != NULL && v[0] != '\0') {
        if (strlen(v) >= sizeof out->curve_dir)
            return fl_fail(FL_EINVAL, "environment FLODL_CURVE_DIR is too long");
        snprintf(out->curve_dir, sizeof out->curve_dir, "%s", v);
    }
    v = get("FLODL_INSECURE", ud);
    if (v != NULL && v[0] != '\0') {
        if (strcmp(v, "1") != 0 && strcmp(v, "0") != 0)
            return fl_fail(FL_EINVAL, "environment FLODL_INSECURE='%s' is not 1 or 0", v);
        out->insecure = v[0] == '1';
    }
    v = get("FLODL_IPC", ud);
    if (v != NULL && v[0] != '\0') {
        if (strcmp(v, "1") != 0 && strcmp(v, "0") != 0)
            return fl_fail(FL_EINVAL, "environment FLODL_IPC='%s' is not 1 or 0", v);
        out->ipc = v[0] == '1';
    }
    return FL_OK;
}
