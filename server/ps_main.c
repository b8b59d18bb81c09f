/* flodl-ps: the coordinator of a job (and, later, its parameter server). Reads flags and the
 * environment, runs the coordinator until every rank has left (exit 0), a rank died or the
 * rendezvous failed (exit 1), or SIGINT/SIGTERM (exit 1 after telling the ranks). Bad flags
 * exit 2 with one line naming the flag. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fl_ps.h"

static const char usage[] =
    "usage: flodl-ps --world-size N [options]\n"
    "  --bind ENDPOINT             where ranks register (default tcp://0.0.0.0:29500)\n"
    "  --world-size N              ranks in the job (or FLODL_WORLD_SIZE / WORLD_SIZE)\n"
    "  --job-id ID                 ranks of another job are refused (default flodl)\n"
    "  --heartbeat-timeout MS      a rank silent this long is dead (default 5000)\n"
    "  --rendezvous-timeout MS     all ranks must register within this (default 300000)\n"
    "  --endpoint-file PATH        write the bound endpoint there (useful with port 0)\n"
    "  --log-level LEVEL           debug|info|warn|error (default info, or FLODL_LOG)\n";

static const char *env_get(const char *name, void *ud)
{
    (void)ud;
    return getenv(name);
}

static int bad_flag(void)
{
    fprintf(stderr, "flodl-ps: %s\n", fl_last_error());
    return 2;
}

int main(int argc, char **argv)
{
    enum { O_BIND = 1, O_WORLD, O_JOB, O_HBT, O_RDV, O_EPFILE, O_LOG, O_HELP };
    static const struct option longopts[] = {
        {"bind", required_argument, NULL, O_BIND},
        {"world-size", required_argument, NULL, O_WORLD},
        {"job-id", required_argument, NULL, O_JOB},
        {"heartbeat-timeout", required_argument, NULL, O_HBT},
        {"rendezvous-timeout", required_argument, NULL, O_RDV},
        {"endpoint-file", required_argument, NULL, O_EPFILE},
        {"log-level", required_argument, NULL, O_LOG},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    fl_coord_opts_t o;
    fl_coord_opts_init(&o);
    o.bind = "tcp://0.0.0.0:29500";
    const char *epfile = NULL;

    fl_launch_info_t env;
    if (fl_launch_from_env(env_get, NULL, &env) != FL_OK)
        return bad_flag();
    if (env.world_size > 0)
        o.world_size = env.world_size;
    if (env.job_id[0] != '\0')
        o.job_id = env.job_id;
    if (env.log_level >= 0)
        o.log_level = (fl_log_level_t)env.log_level;

    int ch;
    long v;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case O_BIND: o.bind = optarg; break;
        case O_WORLD:
            if (fl_cli_long("--world-size", optarg, 1, 65536, &v) != FL_OK)
                return bad_flag();
            o.world_size = (int)v;
            break;
        case O_JOB: o.job_id = optarg; break;
        case O_HBT:
            if (fl_cli_long("--heartbeat-timeout", optarg, 10, 3600000, &v) != FL_OK)
                return bad_flag();
            o.heartbeat_timeout_ms = (int)v;
            break;
        case O_RDV:
            if (fl_cli_long("--rendezvous-timeout", optarg, 1, 86400000, &v) != FL_OK)
                return bad_flag();
            o.rendezvous_timeout_ms = (int)v;
            break;
        case O_EPFILE: epfile = optarg; break;
        case O_LOG:
            if (fl_log_level_parse(optarg, &o.log_level) != FL_OK) {
                fl_fail(FL_EINVAL, "--log-level: '%s' is not one of debug|info|warn|error",
                        optarg);
                return bad_flag();
            }
            break;
        case 'h':
        case O_HELP: fputs(usage, stdout); return 0;
        default:
            fl_fail(FL_EINVAL, "unknown or incomplete flag '%s' (see --help)", argv[optind - 1]);
            return bad_flag();
        }
    }
    if (optind < argc) {
        fl_fail(FL_EINVAL, "unexpected argument '%s' (see --help)", argv[optind]);
        return bad_flag();
    }
    if (o.world_size < 1) {
        fl_fail(FL_EINVAL, "--world-size: missing (or set FLODL_WORLD_SIZE)");
        return bad_flag();
    }

    /* Signals are taken synchronously by this thread; the coordinator's thread never sees
     * them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    fl_coord_t *coord;
    int rc = fl_coord_create(&o, &coord);
    if (rc == FL_EINVAL)
        return bad_flag();
    if (rc != FL_OK) {
        fprintf(stderr, "flodl-ps: %s\n", fl_last_error());
        return 1;
    }
    if (epfile != NULL) {
        FILE *f = fopen(epfile, "w");
        if (f == NULL || fprintf(f, "%s\n", fl_coord_endpoint(coord)) < 0 || fclose(f) != 0) {
            fprintf(stderr, "flodl-ps: cannot write --endpoint-file %s\n", epfile);
            fl_coord_destroy(&coord);
            return 1;
        }
    }
    if ((rc = fl_coord_start(coord)) != FL_OK) {
        fprintf(stderr, "flodl-ps: %s\n", fl_last_error());
        fl_coord_destroy(&coord);
        return 1;
    }

    int signo = 0;
    struct timespec tick = {0, 100 * 1000000L};
    for (;;) {
        rc = fl_coord_wait(coord, 0);
        if (rc != FL_ETIMEDOUT)
            break;
        int s = sigtimedwait(&sigs, NULL, &tick);
        if (s > 0) {
            signo = s;
            break;
        }
    }
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", fl_last_error());
    if (rc != FL_OK && rc != FL_ETIMEDOUT && signo == 0) {
        /* The job failed: give the survivors time to hear it and leave before closing. */
        int64_t until = fl_now_ms() + o.heartbeat_timeout_ms + 2000;
        while (fl_coord_active(coord) > 0 && fl_now_ms() < until) {
            int s = sigtimedwait(&sigs, NULL, &tick);
            if (s > 0)
                break;
        }
    }
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
    if (signo != 0) {
        fprintf(stderr, "flodl-ps: stopped by signal %d\n", signo);
        return 1;
    }
    if (rc != FL_OK) {
        fprintf(stderr, "flodl-ps: job failed: %s\n", detail);
        return 1;
    }
    return 0;
}
