/* Communicator options by name, for the binaries' flags and configuration files: one table of
 * names, ranges and messages instead of one per program. */
#include "comm_int.h"

#include <stdio.h>
#include <string.h>

int fl_comm_opts_set(fl_comm_opts_t *o, const char *key, const char *value)
{
    char flag[64];
    snprintf(flag, sizeof flag, "--%s", key);
    long v;
    size_t z;
    int rc;
    if (strcmp(key, "rank") == 0) {
        if ((rc = fl_cli_long(flag, value, 0, FL_MSG_MAX_PEERS - 1, &v)) == FL_OK)
            o->rank = (int)v;
    } else if (strcmp(key, "world-size") == 0) {
        if ((rc = fl_cli_long(flag, value, 1, FL_MSG_MAX_PEERS, &v)) == FL_OK)
            o->world_size = (int)v;
    } else if (strcmp(key, "coordinator") == 0 || strcmp(key, "bind") == 0) {
        fl_tp_endpoint_t ep;
        if ((rc = fl_tp_endpoint_parse(value, &ep)) != FL_OK)
            return fl_fail_ctx(FL_EINVAL, "%s", flag);
        if (key[0] == 'c')
            o->coordinator = value;
        else
            o->bind = value;
    } else if (strcmp(key, "host") == 0) {
        if (value == NULL || value[0] == '\0' || strlen(value) >= FL_HOST_MAX)
            return fl_fail(FL_EINVAL, "%s: must be 1..%d bytes", flag, FL_HOST_MAX - 1);
        o->host = value;
        rc = FL_OK;
    } else if (strcmp(key, "job-id") == 0) {
        if (value == NULL || value[0] == '\0' || strlen(value) >= FL_JOB_MAX)
            return fl_fail(FL_EINVAL, "%s: must be 1..%d bytes", flag, FL_JOB_MAX - 1);
        o->job_id = value;
        rc = FL_OK;
    } else if (strcmp(key, "timeout") == 0) {
        if ((rc = fl_cli_long(flag, value, 1, 86400000, &v)) == FL_OK)
            o->timeout_ms = (int)v;
    } else if (strcmp(key, "rendezvous-timeout") == 0) {
        if ((rc = fl_cli_long(flag, value, 1, 86400000, &v)) == FL_OK)
            o->rendezvous_timeout_ms = (int)v;
    } else if (strcmp(key, "stripes") == 0) {
        if ((rc = fl_cli_long(flag, value, 1, FL_MSG_MAX_STRIPES, &v)) == FL_OK)
            o->stripes = (int)v;
    } else if (strcmp(key, "segment") == 0) {
        if ((rc = fl_cli_size(flag, value, 4096, (size_t)64 << 20, &z)) == FL_OK)
            o->segment_bytes = z;
    } else if (strcmp(key, "small") == 0) {
        if ((rc = fl_cli_size(flag, value, 0, (size_t)64 << 20, &z)) == FL_OK)
            o->small_bytes = z;
    } else if (strcmp(key, "algo") == 0) {
        rc = FL_OK;
        if (value != NULL && strcmp(value, "auto") == 0)
            o->algo = FL_ALGO_AUTO;
        else if (value != NULL && strcmp(value, "ring") == 0)
            o->algo = FL_ALGO_RING;
        else if (value != NULL && strcmp(value, "rd") == 0)
            o->algo = FL_ALGO_RD;
        else if (value != NULL && strcmp(value, "direct") == 0)
            o->algo = FL_ALGO_DIRECT;
        else
            rc = fl_fail(FL_EINVAL, "%s: '%s' is not one of auto|ring|rd|direct", flag,
                         value ? value : "");
    } else if (strcmp(key, "ipc") == 0) {
        if ((rc = fl_cli_long(flag, value, 0, 1, &v)) == FL_OK)
            o->ipc = (int)v;
    } else if (strcmp(key, "log-level") == 0) {
        if ((rc = fl_log_level_parse(value, &o->log_level)) != FL_OK)
            rc = fl_fail(FL_EINVAL, "%s: '%s' is not one of debug|info|warn|error|off", flag,
                         value ? value : "");
    } else {
        rc = fl_fail(FL_EINVAL, "unknown communicator option '%s'", key);
    }
    return rc;
}

const char *const fl_comm_opt_names[] = {
    "rank",   "world-size", "coordinator",        "bind",    "host",
    "job-id", "timeout",    "rendezvous-timeout", "stripes", "segment",
    "small",  "algo",       "log-level",          "ipc",     NULL,
};
