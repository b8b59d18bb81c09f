/* flodl-keygen: CurveZMQ keys for a job.
 *   flodl-keygen DIR                  the job's keys: DIR/server.key (every process's server
 *                                     key pair), DIR/client.key (a client key pair) and
 *                                     DIR/authorized/client.pub (it, allowed in); mode 700
 *   flodl-keygen --client NAME DIR    one more client key pair, DIR/NAME.key, allowed in
 *                                     (DIR/authorized/NAME.pub): give it to a host as its
 *                                     client.key beside a copy of server.key and authorized/
 *   flodl-keygen --if-missing DIR     the job's keys unless DIR has them all already (a
 *                                     container's one-shot key service, run again on restart)
 * Existing keys are never overwritten. Exit 0, 1 on a failure (named), 2 on bad arguments. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fl_core.h"
#include "fl_tp.h"

static const char usage[] =
    "usage: flodl-keygen DIR                 the job's keys: server.key, client.key, authorized/\n"
    "       flodl-keygen --client NAME DIR   one more client key, allowed in\n"
    "       flodl-keygen --if-missing DIR    the job's keys, unless DIR has them all already\n"
    "Point --curve-dir (or FLODL_CURVE_DIR) of flodl-ps and flodl-worker at DIR. Secret key\n"
    "files are mode 600; existing keys are never overwritten.\n";

static int fail(const char *fmt, ...) FL_PRINTF(1, 2);
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "flodl-keygen: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

static bool valid_name(const char *s)
{
    if (s[0] == '\0' || strlen(s) > 64 || strcmp(s, "server") == 0)
        return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.'))
            return false;
    return true;
}

/* base.key and base.pub, unless either exists; then the .pub into authorized/. */
static int make_pair(const char *dir, const char *name, const char *comment)
{
    char base[4096];
    char path[4200];
    snprintf(base, sizeof base, "%s/%s", dir, name);
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s.%s", base, k ? "pub" : "key");
        if (access(path, F_OK) == 0)
            return fail("%s exists: not overwriting keys", path);
    }
    if (fl_tp_curve_keygen(base, comment) != FL_OK)
        return fail("%s", fl_last_error());
    return 0;
}

static int allow(const char *dir, const char *name)
{
    char src[4200];
    char dst[4300];
    snprintf(src, sizeof src, "%s/%s.pub", dir, name);
    snprintf(dst, sizeof dst, "%s/authorized/%s.pub", dir, name);
    FILE *in = fopen(src, "r");
    FILE *out = in ? fopen(dst, "wx") : NULL;
    if (out == NULL) {
        if (in)
            fclose(in);
        return fail("cannot write %s (it may exist already)", dst);
    }
    char buf[1024];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        fwrite(buf, 1, n, out);
    fclose(in);
    if (fclose(out) != 0)
        return fail("cannot write %s", dst);
    return 0;
}

int main(int argc, char **argv)
{
    const char *client = NULL;
    const char *dir = NULL;
    bool if_missing = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(argv[i], "--version") == 0)
            return fl_cli_version("flodl-keygen");
        if (strcmp(argv[i], "--client") == 0 && i + 1 < argc)
            client = argv[++i];
        else if (strcmp(argv[i], "--if-missing") == 0)
            if_missing = true;
        else if (argv[i][0] != '-' && dir == NULL)
            dir = argv[i];
        else
            return fail("unexpected argument '%s' (see --help)", argv[i]), 2;
    }
    if (dir == NULL)
        return fail("%s", "no DIR given (see --help)"), 2;
    if (client != NULL && !valid_name(client))
        return fail("--client '%s': use letters, digits, '-', '_' or '.' (not 'server')", client),
               2;
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/authorized", dir);
    if (client == NULL && if_missing) {
        /* All three or none: a partial set is refused below, never completed or replaced. */
        static const char *const parts[] = {"server.key", "client.key", "authorized/client.pub"};
        size_t have = 0;
        for (size_t k = 0; k < 3; k++) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%s", dir, parts[k]);
            have += access(path, F_OK) == 0;
        }
        if (have == 3) {
            printf("flodl-keygen: keys in %s already\n", dir);
            return 0;
        }
    }
    if (client == NULL) {
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            return fail("cannot make %s: %s", dir, strerror(errno)), 2;
        if (mkdir(sub, 0755) != 0 && errno != EEXIST)
            return fail("cannot make %s: %s", sub, strerror(errno)), 2;
        int rc = make_pair(dir, "server", "the job's servers");
        if (rc == 0)
            rc = make_pair(dir, "client", "a client of the job");
        if (rc == 0)
            rc = allow(dir, "client");
        if (rc == 0)
            printf("flodl-keygen: keys in %s (server.key, client.key, authorized/client.pub); "
                   "give it to flodl-ps and flodl-worker with --curve-dir %s\n",
                   dir, dir);
        return rc;
    }
    if (access(sub, F_OK) != 0)
        return fail("%s has no authorized/: make the job's keys first (flodl-keygen DIR)", dir);
    int rc = make_pair(dir, client, client);
    if (rc == 0)
        rc = allow(dir, client);
    if (rc == 0)
        printf("flodl-keygen: %s/%s.key allowed in; a host using it needs it as its client.key, "
               "with server.key and authorized/\n",
               dir, client);
    return rc;
}
