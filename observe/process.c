/* The process's own figures for /metrics, read when the endpoint renders: CPU time
 * (getrusage), resident memory (/proc/self/statm), open descriptors (/proc/self/fd) and their
 * limit, and the start time (/proc/self/stat's start in ticks after /proc/stat's boot time). */
#include "obs_int.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static double rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f == NULL)
        return 0.0;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
        rss = 0;
    fclose(f);
    return (double)rss * (double)sysconf(_SC_PAGESIZE);
}

static double open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return 0.0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return (double)(n - 1); /* not the one reading the directory */
}

static double start_time(void)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (f == NULL)
        return 0.0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* Field 22 (starttime), counted after the command's closing parenthesis (field 2). */
    const char *p = strrchr(buf, ')');
    unsigned long long ticks = 0;
    for (int field = 2; p != NULL && *p && field < 22; p++)
        if (*p == ' ' && ++field == 22)
            ticks = strtoull(p + 1, NULL, 10);
    double btime = 0.0;
    if ((f = fopen("/proc/stat", "r")) != NULL) {
        char line[256];
        while (fgets(line, sizeof line, f) != NULL)
            if (sscanf(line, "btime %lf", &btime) == 1)
                break;
        fclose(f);
    }
    return btime + (double)ticks / (double)sysconf(_SC_CLK_TCK);
}

void fl_obs_process_refresh(fl_obs_t *o, const int ids[5])
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        fl_obs_set(o, ids[0],
                   (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
                       (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
    fl_obs_set(o, ids[1], rss_bytes());
    fl_obs_set(o, ids[2], open_fds());
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        fl_obs_set(o, ids[3], rl.rlim_cur == RLIM_INFINITY ? -1.0 : (double)rl.rlim_cur);
    if (fl_obs_get(o, ids[4]) == 0.0)
        fl_obs_set(o, ids[4], start_time());
}
