/* What a communicator and a PS client both say of themselves when they join a job (rank, world
 * size, coordinator, job id, host, settings): checked once, the same way, before anything binds. */
#ifndef FL_MEMBER_OPTS_H
#define FL_MEMBER_OPTS_H

/* FL_OK, or FL_EINVAL with a message that starts with who ("comm", "ps client") and names the
 * rank. host and settings may be NULL. */
int fl_member_opts_check(const char *who, int rank, int world_size, const char *coordinator,
                         const char *job_id, const char *host, const char *settings);

#endif
