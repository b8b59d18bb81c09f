/* flodl-worker: one per host. Resolves rank, world size and coordinator from flags or the
 * launcher's environment, joins the job, and runs its work (today the gradient-exchange
 * drill). Exit 0 on success, 1 on a runtime failure (the message names rank, peer and
 * operation), 2 on bad flags. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_coll.h"
#include "fl_core.h"
#include "fl_wk.h"

static const char usage[] =
    "usage: flodl-worker --rank K --world-size N --coordinator tcp://HOST:PORT [options]\n"
    "  rank, world size and coordinator may come from the environment instead:\n"
    "  FLODL_RANK/FLODL_WORLD_SIZE/FLODL_COORDINATOR, torchrun's RANK/WORLD_SIZE/MASTER_ADDR/\n"
    "  MASTER_PORT, Open MPI's OMPI_COMM_WORLD_RANK/_SIZE, Kubernetes' JOB_COMPLETION_INDEX.\n"
    "communicator:\n"
    "  --host ADDR              address peers reach this rank at (default: route to coordinator)\n"
    "  --bind ENDPOINT          data endpoint (default tcp://ADDR:0)\n"
    "  --job-id ID              must match flodl-ps --job-id (default flodl)\n"
    "  --timeout MS             deadline of one collective (default 300000)\n"
    "  --rendezvous-timeout MS  deadline of joining the job (default 300000)\n"
    "  --stripes K              TCP connections per peer (default 1)\n"
    "  --segment BYTES          ring pipelining unit (default 1M)\n"
    "  --small BYTES            recursive doubling up to this size (default 64K)\n"
    "  --algo auto|ring|rd|direct  allreduce algorithm (default auto)\n"
    "  --log-level LEVEL        debug|info|warn|error (default warn, or FLODL_LOG)\n"
    "drill:\n"
    "  --size BYTES             gradient size (default 64M)\n"
    "  --steps N                steps (default 20)\n"
    "  --dtype TYPE             float32|float16|bfloat16|float64 (default float32)\n"
    "  --op sum|avg             reduction (default avg)\n"
    "  --quiet                  summary line only\n";

static const char *env_get(const char *name, void *ud)
{
    (void)ud;
    return getenv(name);
}

static int bad_flag(void)
{
    fprintf(stderr, "flodl-worker: %s\n", fl_last_error());
    return 2;
}

int main(int argc, char **argv)
{
    enum { O_SIZE = 1000, O_STEPS, O_DTYPE, O_OP, O_QUIET, O_HELP };
    static struct option longopts[32];
    int nopt = 0;
    for (int i = 0; fl_comm_opt_names[i] != NULL; i++)
        longopts[nopt++] = (struct option){fl_comm_opt_names[i], required_argument, NULL, i + 1};
    longopts[nopt++] = (struct option){"size", required_argument, NULL, O_SIZE};
    longopts[nopt++] = (struct option){"steps", required_argument, NULL, O_STEPS};
    longopts[nopt++] = (struct option){"dtype", required_argument, NULL, O_DTYPE};
    longopts[nopt++] = (struct option){"op", required_argument, NULL, O_OP};
    longopts[nopt++] = (struct option){"quiet", no_argument, NULL, O_QUIET};
    longopts[nopt++] = (struct option){"help", no_argument, NULL, O_HELP};
    longopts[nopt] = (struct option){NULL, 0, NULL, 0};

    fl_comm_opts_t co;
    fl_comm_opts_init(&co);
    fl_wk_drill_opts_t d;
    fl_wk_drill_opts_init(&d);

    fl_launch_info_t env;
    if (fl_launch_from_env(env_get, NULL, &env) != FL_OK)
        return bad_flag();
    if (env.rank >= 0)
        co.rank = env.rank;
    if (env.world_size > 0)
        co.world_size = env.world_size;
    if (env.coordinator[0] != '\0')
        co.coordinator = env.coordinator;
    if (env.host[0] != '\0')
        co.host = env.host;
    if (env.job_id[0] != '\0')
        co.job_id = env.job_id;
    if (env.log_level >= 0)
        co.log_level = (fl_log_level_t)env.log_level;

    int ch;
    long v;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (ch >= 1 && ch <= nopt - 6) {
            if (fl_comm_opts_set(&co, fl_comm_opt_names[ch - 1], optarg) != FL_OK)
                return bad_flag();
            continue;
        }
        switch (ch) {
        case O_SIZE:
            if (fl_cli_size("--size", optarg, 0, (size_t)16 << 30, &d.bytes) != FL_OK)
                return bad_flag();
            break;
        case O_STEPS:
            if (fl_cli_long("--steps", optarg, 0, 100000000, &v) != FL_OK)
                return bad_flag();
            d.steps = (int)v;
            break;
        case O_DTYPE:
            if (fl_dtype_parse(optarg, &d.dtype) != FL_OK ||
                !(d.dtype == FL_FLOAT32 || d.dtype == FL_FLOAT16 || d.dtype == FL_BFLOAT16 ||
                  d.dtype == FL_FLOAT64)) {
                fl_fail(FL_EINVAL, "--dtype: '%s' is not one of float32|float16|bfloat16|float64",
                        optarg);
                return bad_flag();
            }
            break;
        case O_OP:
            if (strcmp(optarg, "sum") == 0) {
                d.op = FL_SUM;
            } else if (strcmp(optarg, "avg") == 0) {
                d.op = FL_AVG;
            } else {
                fl_fail(FL_EINVAL, "--op: '%s' is not one of sum|avg", optarg);
                return bad_flag();
            }
            break;
        case O_QUIET: d.quiet = true; break;
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
    if (co.world_size < 1) {
        fl_fail(FL_EINVAL, "--world-size: missing (or set FLODL_WORLD_SIZE / WORLD_SIZE)");
        return bad_flag();
    }
    if (co.rank < 0) {
        fl_fail(FL_EINVAL, "--rank: missing (or set FLODL_RANK / RANK)");
        return bad_flag();
    }
    if (co.rank >= co.world_size) {
        fl_fail(FL_EINVAL, "--rank: %d is not below --world-size %d", co.rank, co.world_size);
        return bad_flag();
    }
    if (co.coordinator == NULL) {
        fl_fail(FL_EINVAL, "--coordinator: missing (or set FLODL_COORDINATOR / MASTER_ADDR)");
        return bad_flag();
    }

    fl_comm_t *comm;
    int rc = fl_comm_init(&co, &comm);
    if (rc == FL_EINVAL && strstr(fl_last_error(), "refused") == NULL)
        return bad_flag();
    if (rc != FL_OK) {
        fprintf(stderr, "flodl-worker: %s\n", fl_last_error());
        return 1;
    }
    rc = fl_wk_drill_run(comm, &d);
    if (rc != FL_OK)
        fprintf(stderr, "flodl-worker: %s\n", fl_last_error());
    fl_comm_destroy(&comm);
    return rc == FL_OK ? 0 : 1;
}
