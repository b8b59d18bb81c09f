/* fl_comm_opts_from_env: the one library function that reads the process environment, and only
 * when the user calls it (as torch.distributed's env:// init does). It translates through the
 * same resolver the binaries use. */
#include "comm_int.h"

#include <stdlib.h>

static const char *real_getenv(const char *name, void *ud)
{
    (void)ud;
    return getenv(name);
}

int fl_comm_opts_from_env(fl_comm_opts_t *o)
{
    /* Static storage: the strings must outlive this call and the options point at them. One
     * environment per process, so one copy suffices (documented as not thread-safe). */
    static fl_launch_info_t info;
    int rc = fl_launch_from_env(real_getenv, NULL, &info);
    if (rc != FL_OK)
        return rc;
    if (info.rank >= 0)
        o->rank = info.rank;
    if (info.world_size >= 0)
        o->world_size = info.world_size;
    if (info.coordinator[0] != '\0')
        o->coordinator = info.coordinator;
    if (info.host[0] != '\0')
        o->host = info.host;
    if (info.job_id[0] != '\0')
        o->job_id = info.job_id;
    if (info.log_level >= 0)
        o->log_level = (fl_log_level_t)info.log_level;
    if (info.ipc >= 0)
        o->ipc = info.ipc;
    return FL_OK;
}
