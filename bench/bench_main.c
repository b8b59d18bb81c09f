/* flodl-bench: benchmarks that print figures, side by side with a peer where one exists.
 * Subcommands: allreduce, topk, sparse-allreduce, train, ps, pytorch. */
#include <stdio.h>
#include <string.h>

#include "fl_core.h"

int bench_allreduce_main(int argc, char **argv);
int bench_topk_main(int argc, char **argv);
int bench_sparse_main(int argc, char **argv);
int bench_train_main(int argc, char **argv);
int bench_ps_main(int argc, char **argv);
int bench_pytorch_main(int argc, char **argv);
int bench_floor_main(int argc, char **argv);

static const char usage[] =
    "usage: flodl-bench SUBCOMMAND [flags]   (SUBCOMMAND --help)\n"
    "  allreduce          dense allreduce over N ranks, beside Open MPI\n"
    "  topk               top-k selection on one thread, beside torch.topk\n"
    "  sparse-allreduce   top-k sparse allreduce over N ranks, beside the dense one\n"
    "  train              end-to-end training: samples/s and time to accuracy, 1..N workers\n"
    "  ps                 parameter-server push/pull steps, 1..S shards, beside the ring\n"
    "  pytorch            flodl's DistributedOptimizer beside PyTorch DDP (gloo), 4 processes\n";

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0)
        return fl_cli_version("flodl-bench");
    if (strcmp(argv[1], "allreduce") == 0)
        return bench_allreduce_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "topk") == 0)
        return bench_topk_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "sparse-allreduce") == 0)
        return bench_sparse_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "train") == 0)
        return bench_train_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "ps") == 0)
        return bench_ps_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "pytorch") == 0)
        return bench_pytorch_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "zmq-floor") == 0) /* the floor's peers, started by allreduce */
        return bench_floor_main(argc - 1, argv + 1);
    fprintf(stderr, "flodl-bench: unknown subcommand '%s'\n%s", argv[1], usage);
    return 2;
}
