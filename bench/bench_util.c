/* Benchmark plumbing: sizes, repetitions, medians, test data, child processes, jobs of ranks
 * and their RESULT lines. The flags are bench_flags.c's. */
#include "bench_util.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <flodl/coordinator.h>

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

void bench_fmt_count(size_t n, char *out, size_t cap)
{
    if (n >= ((size_t)1 << 30) && n % ((size_t)1 << 30) == 0)
        snprintf(out, cap, "%zuG", n >> 30);
    else if (n >= ((size_t)1 << 20) && n % ((size_t)1 << 20) == 0)
        snprintf(out, cap, "%zuM", n >> 20);
    else if (n >= 1024 && n % 1024 == 0)
        snprintf(out, cap, "%zuK", n >> 10);
    else
        snprintf(out, cap, "%zu", n);
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void bench_fill_gauss(float *x, size_t n, uint64_t seed)
{
    const double two_pi = 6.283185307179586;
    uint64_t st = seed * 0x2545f4914f6cdd1dULL + 1;
    for (size_t i = 0; i < n; i += 2) {
        uint64_t r = splitmix64(&st);
        /* Two 32-bit uniforms in (0, 1): u1 never 0, so the log is finite. */
        double u1 = ((double)(r >> 32) + 0.5) / 4294967296.0;
        double u2 = ((double)(r & 0xffffffffu) + 0.5) / 4294967296.0;
        double rad = sqrt(-2.0 * log(u1));
        x[i] = (float)(rad * cos(two_pi * u2));
        if (i + 1 < n)
            x[i + 1] = (float)(rad * sin(two_pi * u2));
    }
}

void bench_read_tagged(int fd, bench_result_fn fn, void *ud)
{
    FILE *f = fdopen(fd, "r");
    if (f == NULL) {
        close(fd);
        return;
    }
    char line[1024];
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "RESULT ", 7) == 0)
            fn(line + 7, ud);
        else
            fputs(line, stderr);
    }
    fclose(f);
}

int bench_run_ranks(const char *coordinator, const char *subcommand, char *const extra[],
                    int nextra, int ranks, bool bind, bench_result_fn fn, void *ud)
{
    enum { MAX_RANKS = 256, FIXED_ARGS = 12 };
    if (ranks < 1 || ranks > MAX_RANKS || nextra < 0 || nextra > 64) {
        fprintf(stderr, "flodl-bench: %d ranks (1..%d), %d extra flags\n", ranks, MAX_RANKS,
                nextra);
        return 1;
    }
    char self[1024];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        snprintf(self, sizeof self, "flodl-bench");
    else
        self[len] = '\0';

    pid_t pids[MAX_RANKS];
    int started = 0;
    int fd0 = -1;
    int status = 0;
    char world_s[16];
    snprintf(world_s, sizeof world_s, "%d", ranks);
    for (int r = 0; r < ranks; r++) {
        char rank_s[16];
        char *argv[FIXED_ARGS + 64 + 1];
        int a = 0;
        snprintf(rank_s, sizeof rank_s, "%d", r);
        argv[a++] = self;
        argv[a++] = (char *)subcommand;
        argv[a++] = "--report";
        argv[a++] = "--rank";
        argv[a++] = rank_s;
        argv[a++] = "--world-size";
        argv[a++] = world_s;
        argv[a++] = "--coordinator";
        argv[a++] = (char *)coordinator;
        argv[a++] = "--host";
        argv[a++] = "127.0.0.1";
        for (int i = 0; i < nextra; i++)
            argv[a++] = extra[i];
        argv[a] = NULL;
        int fd;
        pids[r] = bench_spawn_on(self, argv, &fd, bind ? r : -1);
        if (pids[r] < 0) {
            fprintf(stderr, "flodl-bench: cannot start rank %d\n", r);
            status = 1;
            break;
        }
        started++;
        if (r == 0)
            fd0 = fd;
        else
            close(fd); /* the other ranks print nothing on stdout in report mode */
    }
    if (fd0 >= 0)
        bench_read_tagged(fd0, fn, ud);
    for (int r = 0; r < started; r++)
        if (bench_wait(pids[r], 600000) != 0)
            status = 1;
    return status;
}

int bench_run_job(const char *subcommand, char *const extra[], int nextra, int ranks, bool bind,
                  bench_result_fn fn, void *ud)
{
    fl_coord_opts_t co;
    fl_coord_opts_init(&co);
    co.bind = "tcp://127.0.0.1:0";
    co.world_size = ranks;
    co.log_level = FL_LOG_WARN;
    fl_coord_t *coord = NULL;
    if (ranks < 1 || fl_coord_create(&co, &coord) != FL_OK || fl_coord_start(coord) != FL_OK) {
        fprintf(stderr, "flodl-bench: coordinator: %s\n", fl_last_error());
        if (coord != NULL) {
            fl_coord_stop(coord);
            fl_coord_destroy(&coord);
        }
        return 1;
    }
    int status =
        bench_run_ranks(fl_coord_endpoint(coord), subcommand, extra, nextra, ranks, bind, fn, ud);
    fl_coord_wait(coord, 5000);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
    return status;
}

pid_t bench_spawn_group(const char *path, char *const argv[], int *out_fd)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        /* Only async-signal-safe calls between fork and exec: the parent may have threads. */
        setpgid(0, 0);
        dup2(fds[1], STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
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
    /* Also here, so that the group exists before any kill(-pid) whichever side runs first. */
    setpgid(pid, pid);
    *out_fd = fds[0];
    return pid;
}

int bench_read_lines(int fd, int64_t deadline, bench_line_fn fn, void *ud)
{
    char buf[1025];
    size_t len = 0;
    int rc = -1;
    while (fl_deadline_left_ms(deadline) > 0) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = poll(&p, 1, fl_deadline_left_ms(deadline));
        if (n < 0 && errno != EINTR)
            break;
        if (n <= 0)
            continue;
        ssize_t r = read(fd, buf + len, sizeof buf - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r == 0 ? 0 : -1;
            break;
        }
        len += (size_t)r;
        size_t start = 0;
        for (size_t i = 0; i < len; i++) {
            if (buf[i] == '\n') {
                buf[i] = '\0';
                fn(buf + start, ud);
                start = i + 1;
            }
        }
        if (start == 0 && len == sizeof buf - 1) {
            buf[len] = '\0';
            fn(buf, ud);
            len = 0;
        } else {
            memmove(buf, buf + start, len - start);
            len -= start;
        }
    }
    if (len > 0) {
        buf[len] = '\0';
        fn(buf, ud);
    }
    close(fd);
    return rc;
}

int bench_wait_group(pid_t pid, int64_t deadline, int grace_ms)
{
    int signalled = 0; /* 0: none yet, 1: SIGTERM went out, 2: SIGKILL went out */
    for (;;) {
        siginfo_t si;
        memset(&si, 0, sizeof si);
        /* WNOWAIT leaves the leader a zombie, which keeps its pid, and so the group id, from
         * being reused while we signal the group below. */
        int r = waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (si.si_pid == pid)
            break;
        if (fl_deadline_left_ms(deadline) == 0) {
            if (signalled == 2)
                return -1; /* it survived SIGKILL for seconds: stop waiting */
            kill(-pid, signalled == 0 ? SIGTERM : SIGKILL);
            deadline = fl_deadline_in(signalled == 0 ? grace_ms : 5000);
            signalled++;
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    /* Whatever the leader left behind in its group would otherwise outlive the run. */
    kill(-pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR)
            return -1;
    }
    if (signalled > 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
