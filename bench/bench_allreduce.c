/* flodl-bench allreduce: ring/recursive-doubling allreduce over N ranks on this machine (or
 * joined across hosts), float32 sum in place, sizes 4 KiB..256 MiB; time per operation, algbw
 * and busbw (NCCL-tests convention: busbw = algbw * 2(N-1)/N). Where Open MPI is installed
 * (and flodl-mpi-bench was built), MPI_Allreduce runs on the same sizes with the same timing
 * protocol in the same invocation, over TCP and over shared memory, and the ratios print
 * beside flodl's figures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "fl_coll.h"
#include "fl_core.h"

typedef struct ar_bench {
    int ranks;
    size_t min;
    size_t max;
    bool no_mpi;
    bool no_floor; /* skip ZeroMQ's one-way floor */
    bool algos;    /* time each algorithm forced, and print the switch points */
    bool bind;     /* bind rank k to CPU k mod ncpus (flodl and MPI alike) */
    bool report;   /* child of the launcher: only RESULT lines on stdout */
    fl_comm_opts_t comm;
    char *fwd[64]; /* communicator flags forwarded to the children */
    int nfwd;
} ar_bench_t;

static const char usage[] =
    "usage: flodl-bench allreduce [--ranks N] [--min BYTES] [--max BYTES] [--no-mpi] [--no-floor]\n"
    "                             [--algos]\n"
    "                             [--bind core|none]\n"
    "                             [communicator flags: --segment --stripes --small --algo --ipc]\n"
    "       flodl-bench allreduce --rank K --world-size N --coordinator EP [...]   (join)\n"
    "Float32 sum allreduce, in place. Launch mode starts a coordinator and N ranks here and,\n"
    "when mpirun and flodl-mpi-bench are present, MPI_Allreduce over TCP and shared memory.\n"
    "--bind core (default) places rank k on CPU k mod ncpus, for flodl and MPI alike.\n"
    "Beside them, ZeroMQ's own one-way latency per size (2 processes, PUSH/PULL, half the\n"
    "median round trip) and flodl's time over it (--no-floor skips it).\n"
    "--algos times each algorithm (direct, rd, ring) forced, with the fastest per size and\n"
    "the switch points AUTO uses.\n";

/* A communicator flag: set on the options, and passed on to the ranks (launch mode) unless it
 * says who a rank is or where it joins. */
static int set_comm(void *p, const char *name, const char *value, char *const *words, int nwords)
{
    ar_bench_t *b = p;
    int rc = fl_comm_opts_set(&b->comm, name, value);
    if (rc != FL_OK)
        return rc;
    if (strcmp(name, "rank") != 0 && strcmp(name, "world-size") != 0 &&
        strcmp(name, "coordinator") != 0 && strcmp(name, "host") != 0 && b->nfwd < 62) {
        for (int i = 0; i < nwords; i++)
            b->fwd[b->nfwd++] = words[i];
    }
    return FL_OK;
}

static const bench_more_t comm_flags = {fl_comm_opt_names, set_comm};

/* Where both tables spell a flag (--bind), getopt_long gives it to the communicator's, listed
 * first: an endpoint, not this table's core|none. */
#define AT(f) BENCH_AT(ar_bench_t, f)
static const bench_flag_t flags[] = {
    {.name = "ranks",
     .kind = BENCH_INT,
     .at = AT(ranks),
     .lo = 1,
     .hi = 256,
     .arg = "N",
     .help = "ranks on this machine"},
    {.name = "min",
     .kind = BENCH_SIZE,
     .at = AT(min),
     .lo = 4,
     .hi = 4294967296.0,
     .arg = "BYTES",
     .help = "smallest size"},
    {.name = "max",
     .kind = BENCH_SIZE,
     .at = AT(max),
     .lo = 4,
     .hi = 4294967296.0,
     .arg = "BYTES",
     .help = "largest size"},
    {.name = "no-mpi", .kind = BENCH_SWITCH, .at = AT(no_mpi), .help = "without Open MPI"},
    {.name = "no-floor",
     .kind = BENCH_SWITCH,
     .at = AT(no_floor),
     .help = "without ZeroMQ's one-way floor"},
    {.name = "algos",
     .kind = BENCH_SWITCH,
     .at = AT(algos),
     .help = "each algorithm forced, and the switch points"},
    BENCH_ROWS_RUN(ar_bench_t),
    {.name = NULL},
};
#undef AT

/* Runs the sweep as one rank; rank 0 prints one RESULT line per size. */
static int run_rank(ar_bench_t *b)
{
    fl_comm_t *comm;
    int rc = fl_comm_init(&b->comm, &comm);
    if (rc != FL_OK) {
        fprintf(stderr, "flodl-bench: %s\n", fl_last_error());
        return 1;
    }
    bench_sizes_t sizes;
    bench_sizes_range(&sizes, b->min, b->max);
    float *buf = NULL;
    if (posix_memalign((void **)&buf, 64, b->max) != 0) {
        fprintf(stderr, "flodl-bench: no memory for %zu bytes\n", b->max);
        fl_comm_destroy(&comm);
        return 1;
    }
    memset(buf, 0, b->max);
    int rank = fl_comm_rank(comm);
    for (size_t s = 0; s < sizes.n && rc == FL_OK; s++) {
        size_t count = sizes.bytes[s] / sizeof(float);
        int iters = bench_iters_for(sizes.bytes[s]);
        int reps = bench_reps_for(sizes.bytes[s]);
        double t[16];
        for (int rep = -1; rep < reps && rc == FL_OK; rep++) { /* rep -1 warms up */
            if ((rc = fl_barrier(comm)) != FL_OK)
                break;
            int64_t t0 = fl_now_ns();
            for (int it = 0; it < iters && rc == FL_OK; it++)
                rc = fl_allreduce(comm, buf, buf, count, FL_FLOAT32, FL_SUM);
            double us = (double)(fl_now_ns() - t0) / 1e3 / iters;
            /* The slowest rank's time is the operation's time. */
            if (rc == FL_OK)
                rc = fl_allreduce(comm, &us, &us, 1, FL_FLOAT64, FL_MAX);
            if (rep >= 0)
                t[rep] = us;
        }
        if (rc == FL_OK && rank == 0) {
            double med = bench_median(t, reps);
            if (b->report) {
                printf("RESULT %zu %.3f\n", sizes.bytes[s], med);
            } else {
                char sz[32];
                int n = fl_comm_size(comm);
                double algbw = (double)sizes.bytes[s] / (med * 1e3);
                fl_fmt_bytes(sizes.bytes[s], sz, sizeof sz);
                printf("%10s %12.1f us  algbw %7.3f GB/s  busbw %7.3f GB/s\n", sz, med, algbw,
                       n > 1 ? algbw * 2.0 * (n - 1) / n : 0.0);
            }
            fflush(stdout);
        }
    }
    if (rc != FL_OK)
        fprintf(stderr, "flodl-bench: %s\n", fl_last_error());
    free(buf);
    fl_comm_destroy(&comm);
    return rc == FL_OK ? 0 : 1;
}

static int spawn_flodl(ar_bench_t *b, const bench_sizes_t *sizes, double *us)
{
    fl_coord_opts_t co;
    fl_coord_opts_init(&co);
    co.bind = "tcp://127.0.0.1:0";
    co.world_size = b->ranks;
    co.log_level = FL_LOG_WARN;
    fl_coord_t *coord;
    if (fl_coord_create(&co, &coord) != FL_OK || fl_coord_start(coord) != FL_OK) {
        fprintf(stderr, "flodl-bench: coordinator: %s\n", fl_last_error());
        return 1;
    }
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        snprintf(self, sizeof self, "flodl-bench");
    else
        self[n] = '\0';

    pid_t pids[256];
    int fd0 = -1;
    int status = 0;
    char rank_s[16], world_s[16], min_s[32], max_s[32];
    snprintf(world_s, sizeof world_s, "%d", b->ranks);
    snprintf(min_s, sizeof min_s, "%zu", b->min);
    snprintf(max_s, sizeof max_s, "%zu", b->max);
    for (int r = 0; r < b->ranks; r++) {
        char *argv[96];
        int a = 0;
        snprintf(rank_s, sizeof rank_s, "%d", r);
        argv[a++] = self;
        argv[a++] = "allreduce";
        argv[a++] = "--report";
        argv[a++] = "--rank";
        argv[a++] = rank_s;
        argv[a++] = "--world-size";
        argv[a++] = world_s;
        argv[a++] = "--coordinator";
        argv[a++] = (char *)fl_coord_endpoint(coord);
        argv[a++] = "--host";
        argv[a++] = "127.0.0.1";
        argv[a++] = "--min";
        argv[a++] = min_s;
        argv[a++] = "--max";
        argv[a++] = max_s;
        for (int i = 0; i < b->nfwd; i++)
            argv[a++] = b->fwd[i];
        argv[a] = NULL;
        int fd;
        pids[r] = bench_spawn_on(self, argv, &fd, b->bind ? r : -1);
        if (pids[r] < 0) {
            fprintf(stderr, "flodl-bench: cannot start rank %d\n", r);
            status = 1;
            b->ranks = r;
            break;
        }
        if (r == 0)
            fd0 = fd;
        else
            close(fd);
    }
    if (fd0 >= 0)
        bench_read_results(fd0, sizes, us);
    for (int r = 0; r < b->ranks; r++)
        if (bench_wait(pids[r], 600000) != 0)
            status = 1;
    fl_coord_wait(coord, 5000);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
    return status;
}

/* Runs flodl-mpi-bench under mpirun with the given transport; 0 when it produced results. */
static int spawn_mpi(const ar_bench_t *b, const bench_sizes_t *sizes, const char *btl, double *us)
{
    for (size_t i = 0; i < sizes->n; i++)
        us[i] = -1;
    char dir[1024], prog[1100];
    bench_self_dir(dir, sizeof dir);
    snprintf(prog, sizeof prog, "%s/flodl-mpi-bench", dir);
    if (access(prog, X_OK) != 0)
        return 1;
    char np[16], min_s[32], max_s[32];
    snprintf(np, sizeof np, "%d", b->ranks);
    snprintf(min_s, sizeof min_s, "%zu", b->min);
    snprintf(max_s, sizeof max_s, "%zu", b->max);
    /* The same placement as flodl's ranks: map by core, rank k on core k mod ncpus. */
    char *argv[] = {"mpirun",
                    "--allow-run-as-root",
                    "--oversubscribe",
                    "-np",
                    np,
                    "--map-by",
                    "core",
                    "--bind-to",
                    b->bind ? "core:overload-allowed" : "none",
                    "--mca",
                    "btl",
                    (char *)btl,
                    "--mca",
                    "btl_tcp_if_include",
                    "lo",
                    prog,
                    min_s,
                    max_s,
                    NULL};
    int fd;
    pid_t pid = bench_spawn(argv, &fd, NULL);
    if (pid < 0)
        return 1;
    bench_read_results(fd, sizes, us);
    return bench_wait(pid, 600000) == 0 ? 0 : 1;
}

static const char *algo_name(fl_algo_t a)
{
    switch (a) {
    case FL_ALGO_RING: return "ring";
    case FL_ALGO_RD: return "rd";
    case FL_ALGO_DIRECT: return "direct";
    default: return "auto";
    }
}

/* What the ranks run at a size: the forced algorithm, or AUTO's pick. */
static fl_algo_t algo_at(const ar_bench_t *b, size_t bytes)
{
    if (b->comm.algo != FL_ALGO_AUTO)
        return b->comm.algo;
    return fl_allreduce_pick(b->ranks, bytes, b->comm.small_bytes);
}

static void fmt_size(size_t b, char *out, size_t cap)
{
    fl_fmt_bytes(b, out, cap);
}

static void print_table(const ar_bench_t *b, const bench_sizes_t *s, const double *fl,
                        const double *tcp, const double *shm, bool have_mpi, const double *floor,
                        const double *xchg, bool have_floor)
{
    double f = b->ranks > 1 ? 2.0 * (b->ranks - 1) / b->ranks : 0.0;
    printf("\nflodl-bench allreduce: %d ranks on this machine (%s), float32 sum in place; median "
           "of repetitions, slowest rank per op\n",
           b->ranks, b->bind ? "rank k bound to CPU k mod ncpus, MPI alike" : "unbound");
    printf("%10s %6s %11s %9s %9s", "size", "algo", "flodl us", "algbw", "busbw");
    if (have_floor)
        printf(" | %9s %8s %9s %8s", "zmq 1-way", "f/floor", "zmq xchg", "f/xchg");
    if (have_mpi)
        printf(" | %11s %9s | %11s %9s | %12s %12s", "mpi-tcp us", "busbw", "mpi-shm us", "busbw",
               "busbw f/tcp", "time f/tcp");
    printf("\n");
    for (size_t i = 0; i < s->n; i++) {
        char sz[32];
        fmt_size(s->bytes[i], sz, sizeof sz);
        double algbw = fl[i] > 0 ? (double)s->bytes[i] / (fl[i] * 1e3) : 0;
        printf("%10s %6s %11.1f %7.3f GB/s %5.3f GB/s", sz, algo_name(algo_at(b, s->bytes[i])),
               fl[i], algbw, algbw * f);
        if (have_floor)
            printf(" | %9.1f %7.2fx %9.1f %7.2fx", floor[i],
                   floor[i] > 0 && fl[i] > 0 ? fl[i] / floor[i] : 0, xchg[i],
                   xchg[i] > 0 && fl[i] > 0 ? fl[i] / xchg[i] : 0);
        if (have_mpi) {
            double tb = tcp[i] > 0 ? (double)s->bytes[i] / (tcp[i] * 1e3) * f : 0;
            double sb = shm[i] > 0 ? (double)s->bytes[i] / (shm[i] * 1e3) * f : 0;
            printf(" | %11.1f %4.3f GB/s | %11.1f %4.3f GB/s | %11.2fx %11.2fx", tcp[i], tb, shm[i],
                   sb, tb > 0 && fl[i] > 0 ? (algbw * f) / tb : 0,
                   tcp[i] > 0 && fl[i] > 0 ? fl[i] / tcp[i] : 0);
        }
        printf("\n");
    }
    if (have_floor)
        printf("zmq 1-way: ZeroMQ's own one-way latency of one message of the size (PUSH/PULL "
               "over %s as flodl's ranks, 2 processes on the CPUs of ranks 0 and 1, half the "
               "median round trip); f/floor: flodl's time over it\nzmq xchg: both processes "
               "send one message of the size at once, then take the other's (the least 2 ranks' "
               "allreduce does); f/xchg: flodl's time over it\n",
               b->comm.ipc == 1 ? "ipc://" : "loopback TCP");
    if (have_mpi)
        printf("busbw f/tcp: flodl busbw over Open MPI's TCP busbw (higher is better); time "
               "f/tcp: flodl time over MPI's (lower is better)\n");
}

/* --algos: the sweep once per algorithm, forced, and the fastest per size, beside what AUTO
 * picks with these flags; then where the fastest changes (the measured switch points). */
static int run_algos(ar_bench_t *b, const bench_sizes_t *s)
{
    static char *const names[3] = {"direct", "rd", "ring"};
    double us[3][BENCH_MAX_SIZES];
    int status = 0;
    int nfwd = b->nfwd;
    for (int a = 0; a < 3; a++) {
        fprintf(stderr, "flodl-bench: flodl allreduce, %d ranks, --algo %s...\n", b->ranks,
                names[a]);
        b->fwd[nfwd] = "--algo";
        b->fwd[nfwd + 1] = names[a];
        b->nfwd = nfwd + 2;
        if (spawn_flodl(b, s, us[a]) != 0)
            status = 1;
    }
    b->nfwd = nfwd;
    printf("\nflodl-bench allreduce --algos: %d ranks, each algorithm forced (us per op, median); "
           "auto: what AUTO runs with --small %zu\n",
           b->ranks, b->comm.small_bytes);
    printf("%10s %11s %11s %11s | %8s %8s\n", "size", "direct", "rd", "ring", "fastest", "auto");
    int prev = -1;
    char switches[512] = "";
    size_t used = 0;
    for (size_t i = 0; i < s->n; i++) {
        int best = -1;
        for (int a = 0; a < 3; a++)
            if (us[a][i] > 0 && (best < 0 || us[a][i] < us[best][i]))
                best = a;
        char sz[32];
        fmt_size(s->bytes[i], sz, sizeof sz);
        printf("%10s %11.1f %11.1f %11.1f | %8s %8s\n", sz, us[0][i], us[1][i], us[2][i],
               best >= 0 ? names[best] : "-",
               algo_name(fl_allreduce_pick(b->ranks, s->bytes[i], b->comm.small_bytes)));
        if (best >= 0 && prev >= 0 && best != prev && used < sizeof switches)
            used += (size_t)snprintf(switches + used, sizeof switches - used, "%s%s -> %s at %s",
                                     used ? ", " : "", names[prev], names[best], sz);
        if (best >= 0)
            prev = best;
    }
    printf("measured switch points: %s; AUTO switches at %zu bytes (one-shot to recursive "
           "doubling, up to %d ranks) and above --small %zu (to the ring)\n",
           used ? switches : "none", FL_DIRECT_MAX_BYTES, FL_DIRECT_MAX_RANKS, b->comm.small_bytes);
    return status;
}

/* Launch mode: the floor, flodl's ranks, Open MPI, then the table. */
static int launch(ar_bench_t *b, const bench_sizes_t *sizes)
{
    double fl[BENCH_MAX_SIZES], tcp[BENCH_MAX_SIZES], shm[BENCH_MAX_SIZES];
    double floor_us[BENCH_MAX_SIZES];
    double xchg_us[BENCH_MAX_SIZES];
    bool have_floor = false;
    if (!b->no_floor) {
        fprintf(stderr, "flodl-bench: ZeroMQ one-way floor, 2 processes...\n");
        have_floor = bench_floor_run(b->min, b->max, b->bind, b->comm.ipc == 1, sizes, floor_us,
                                     xchg_us) == 0;
    }
    fprintf(stderr, "flodl-bench: flodl allreduce, %d ranks...\n", b->ranks);
    int status = spawn_flodl(b, sizes, fl);
    bool have_mpi = false;
    if (!b->no_mpi) {
        fprintf(stderr, "flodl-bench: Open MPI over TCP...\n");
        have_mpi = spawn_mpi(b, sizes, "tcp,self", tcp) == 0;
        if (have_mpi) {
            fprintf(stderr, "flodl-bench: Open MPI over shared memory...\n");
            spawn_mpi(b, sizes, "vader,self", shm);
        } else {
            fprintf(stderr, "flodl-bench: no MPI comparison (needs mpirun and flodl-mpi-bench; "
                            "scripts/install-deps.sh bench, then rebuild)\n");
        }
    }
    print_table(b, sizes, fl, tcp, shm, have_mpi, floor_us, xchg_us, have_floor);
    return status;
}

int bench_allreduce_main(int argc, char **argv);
int bench_allreduce_main(int argc, char **argv)
{
    ar_bench_t b;
    memset(&b, 0, sizeof b);
    b.ranks = 4;
    b.bind = true;
    b.min = 4096;
    b.max = (size_t)256 << 20;
    fl_comm_opts_init(&b.comm);
    b.comm.log_level = FL_LOG_WARN;
    int status = bench_flags_parse(argc, argv, flags, &comm_flags, usage, &b);
    if (status >= 0)
        return status;
    if (b.min > b.max) {
        fprintf(stderr, "flodl-bench: --min %zu is above --max %zu\n", b.min, b.max);
        return 2;
    }
    bench_sizes_t sizes;
    bench_sizes_range(&sizes, b.min, b.max);
    if (b.comm.rank >= 0) {
        if (b.comm.world_size < 1 || b.comm.coordinator == NULL) {
            fprintf(stderr, "flodl-bench: --rank needs --world-size and --coordinator\n");
            return 2;
        }
        /* Joined by hand (one rank per host), not --report: rank 0 prints readable lines. */
        if (!b.report)
            b.ranks = b.comm.world_size;
        return run_rank(&b);
    }
    if (b.algos)
        return run_algos(&b, &sizes);
    return launch(&b, &sizes);
}
