/* flodl-trace-merge OUT IN...: the ranks' --timeline files as one Chrome trace. Exit 0, 2 on
 * bad arguments or a file that is not a trace, 1 when writing fails. */
#include <stdio.h>
#include <string.h>

#include "fl_core.h"
#include "fl_obs.h"

static const char usage[] =
    "usage: flodl-trace-merge OUT.json TRACE.json...\n"
    "  merges the ranks' flodl-worker --timeline files (times in Unix-epoch microseconds, one\n"
    "  process per rank) into one trace for chrome://tracing or Perfetto\n";

int main(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "--version") == 0)
        return fl_cli_version("flodl-trace-merge");
    if (argc < 3 || argv[1][0] == '-') {
        fprintf(stderr, "flodl-trace-merge: give OUT.json and at least one trace (see --help)\n");
        return 2;
    }
    int rc = fl_obs_trace_merge(argv[1], (const char *const *)argv + 2, (size_t)argc - 2);
    if (rc != FL_OK) {
        fprintf(stderr, "flodl-trace-merge: %s\n", fl_last_error());
        return rc == FL_EIO ? 1 : 2;
    }
    return 0;
}
