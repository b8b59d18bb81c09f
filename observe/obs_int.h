/* Private to observe/: what metrics.c needs of process.c. */
#ifndef FL_OBS_INT_H
#define FL_OBS_INT_H

#include "fl_obs.h"

/* Sets the process series ids (cpu, rss, fds, max fds, start time) from /proc and getrusage. */
void fl_obs_process_refresh(fl_obs_t *o, const int ids[5]);

#endif
