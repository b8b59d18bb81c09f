/* Benchmark plumbing: sizes, repetitions, medians, child processes and their RESULT lines. */
#include "bench_util.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fl_core.h"

extern char **environ;

void bench_sizes_range(bench_sizes_t *s, size_t lo, size_t hi)
{
    s->n = 0;
    for (size_t b = lo; b <= hi && s->n < BENCH_MAX_SIZES; b *= 4)
        s->bytes[s->n++] = b;
}

int bench_iters_for(size_t bytes)
{
    size_t it = ((size_t)16 << 20) / (bytes ? bytes : 1);
    if (it < 1)
        it = 1;
    if (it > 200)
        it = 200;
    return (int)it;
}

int bench_reps_for(size_t bytes)
{
    if (bytes >= ((size_t)256 << 20))
        return 3;
    if (bytes >= ((size_t)64 << 20))
        return 5;
    return 9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a;
    double y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n)
{
    if (n <= 0)
        return -1;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

pid_t bench_spawn(char *const argv[], int *out_fd, char *const envp[])
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, envp ? envp : environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        return -1;
    }
    *out_fd = fds[0];
    return pid;
}

pid_t bench_spawn_on(const char *path, char *const argv[], int *out_fd, int cpu_index)
{
    cpu_set_t allowed;
    cpu_set_t one;
    CPU_ZERO(&one);
    if (cpu_index >= 0 && sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
        int n = CPU_COUNT(&allowed);
        int want = n > 0 ? cpu_index % n : 0;
        for (int c = 0, seen = 0; c < CPU_SETSIZE; c++) {
            if (CPU_ISSET(c, &allowed) && seen++ == want) {
                CPU_SET(c, &one);
                break;
            }
        }
    }
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        /* Only async-signal-safe calls between fork and exec: the parent has threads. */
        if (CPU_COUNT(&one) > 0)
            sched_setaffinity(0, sizeof one, &one);
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execv(path, argv);
        _exit(127);
    }
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        return -1;
    }
    *out_fd = fds[0];
    return pid;
}

int bench_wait(pid_t pid, int timeout_ms)
{
    int64_t deadline = fl_deadline_in(timeout_ms);
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (r < 0 && errno != EINTR)
            return -1;
        if (fl_deadline_left_ms(deadline) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

void bench_read_results(int fd, const bench_sizes_t *sizes, double *us)
{
    for (size_t i = 0; i < sizes->n; i++)
        us[i] = -1;
    FILE *f = fdopen(fd, "r");
    if (f == NULL)
        return;
    char line[512];
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned long long bytes;
        double t;
        if (sscanf(line, "RESULT %llu %lf", &bytes, &t) == 2) {
            for (size_t i = 0; i < sizes->n; i++)
                if (sizes->bytes[i] == (size_t)bytes)
                    us[i] = t;
        } else {
            fputs(line, stderr);
        }
    }
    fclose(f);
}

void bench_self_dir(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    if (n <= 0) {
        snprintf(out, cap, ".");
        return;
    }
    out[n] = '\0';
    char *slash = strrchr(out, '/');
    if (slash != NULL)
        *slash = '\0';
}
