/* The identity a member gives when it joins a job, checked for the communicator and the PS
 * client alike (member_opts.h). */
#include "member_opts.h"

#include <string.h>

#include "fl_core.h"
#include "fl_msg.h"
#include "fl_tp.h"

int fl_member_opts_check(const char *who, int rank, int world_size, const char *coordinator,
                         const char *job_id, const char *host, const char *settings)
{
    fl_tp_endpoint_t ep;
    if (world_size < 1 || world_size > FL_MSG_MAX_PEERS)
        return fl_fail(FL_EINVAL, "%s: world_size %d out of range 1..%d", who, world_size,
                       FL_MSG_MAX_PEERS);
    if (rank < 0 || rank >= world_size)
        return fl_fail(FL_EINVAL, "%s: rank %d out of range 0..%d (world size %d)", who, rank,
                       world_size - 1, world_size);
    if (coordinator == NULL)
        return fl_fail(FL_EINVAL, "%s: rank %d: no coordinator endpoint given", who, rank);
    if (fl_tp_endpoint_parse(coordinator, &ep) != FL_OK)
        return fl_fail_ctx(FL_EINVAL, "%s: rank %d: coordinator", who, rank);
    if (job_id == NULL || job_id[0] == '\0' || strlen(job_id) >= FL_JOB_MAX)
        return fl_fail(FL_EINVAL, "%s: job_id must be 1..%d bytes", who, FL_JOB_MAX - 1);
    if (fl_text_scan(job_id, strlen(job_id), NULL) != strlen(job_id))
        return fl_fail(FL_EINVAL, "%s: job_id must be UTF-8 without control characters", who);
    if (host != NULL && (host[0] == '\0' || strlen(host) >= FL_HOST_MAX))
        return fl_fail(FL_EINVAL, "%s: host must be 1..%d bytes", who, FL_HOST_MAX - 1);
    if (settings != NULL && fl_settings_check(settings, FL_MSG_SETTINGS_MAX) != FL_OK)
        return fl_fail_ctx(FL_EINVAL, "%s: rank %d", who, rank);
    return FL_OK;
}
