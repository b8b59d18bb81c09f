/* flodl-bench: benchmarks that print figures, side by side with a peer where one exists.
 * Subcommands: allreduce (more join with compression, the parameter server and training). */
#include <stdio.h>
#include <string.h>

int bench_allreduce_main(int argc, char **argv);

static const char usage[] = "usage: flodl-bench SUBCOMMAND [flags]   (SUBCOMMAND --help)\n"
                            "  allreduce   dense allreduce over N ranks, beside Open MPI\n";

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "allreduce") == 0)
        return bench_allreduce_main(argc - 1, argv + 1);
    fprintf(stderr, "flodl-bench: unknown subcommand '%s'\n%s", argv[1], usage);
    return 2;
}
