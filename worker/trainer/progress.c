/* The pieces of rank 0's progress line that need arithmetic: how far the job is, when it will
 * end at this pace, and what the exchange sent, without "ratio 0.0x" when nothing was sent. */
#include "train_int.h"

#include <stdio.h>

void fl_wk_progress_eta(char *out, size_t cap, double done, double start, double elapsed_s)
{
    if (done < 0.0)
        done = 0.0;
    if (done > 1.0)
        done = 1.0;
    double run = done - start; /* this run's share (a resumed run started at `start`) */
    if (run <= 1e-9 || elapsed_s <= 0.0) {
        snprintf(out, cap, "%.0f%% ETA unknown", 100.0 * done);
        return;
    }
    double left = elapsed_s * (1.0 - done) / run;
    long s = (long)(left + 0.5);
    if (s >= 3600)
        snprintf(out, cap, "%.0f%% ETA %ldh%02ldm", 100.0 * done, s / 3600, s / 60 % 60);
    else if (s >= 60)
        snprintf(out, cap, "%.0f%% ETA %ldm%02lds", 100.0 * done, s / 60, s % 60);
    else
        snprintf(out, cap, "%.0f%% ETA %lds", 100.0 * done, s);
}

void fl_wk_progress_sent(char *out, size_t cap, uint64_t sent, uint64_t raw)
{
    if (sent == 0)
        snprintf(out, cap, "nothing exchanged");
    else
        snprintf(out, cap, "sent %.1f MiB (%.1fx less than dense)", (double)sent / 1048576.0,
                 (double)raw / (double)sent);
}
