/* flodl-keygen: CurveZMQ keys for a job.
 *   flodl-keygen DIR                  the job's keys: DIR/server.key (every process's server
 *                                     key pair), DIR/client.key (a client key pair every
 *                                     member may use) and DIR/authorized/client.pub (it,
 *                                     allowed in); mode 700
 *   flodl-keygen --ranks N DIR        the job's keys with one key per member instead of the
 *                                     shared one: rank-0.key .. rank-<N-1>.key, each bound to
 *                                     its rank, and ps.key, bound to the parameter servers
 *   flodl-keygen --rank K DIR         one more rank's key, DIR/rank-K.key, bound to rank K
 *   flodl-keygen --client NAME DIR    one more client key pair, DIR/NAME.key, bound to no
 *                                     member: give it to a host as its client.key beside a
 *                                     copy of server.key and authorized/
 *   flodl-keygen --if-missing DIR     the job's keys unless DIR has them all already (a
 *                                     container's one-shot key service, run again on restart)
 * Every new public key is allowed in (DIR/authorized/NAME.pub). Existing keys are never
 * overwritten. Exit 0, 1 on a failure (named), 2 on bad arguments. */
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
    "       flodl-keygen --ranks N DIR       the job's keys, one per member: server.key,\n"
    "                                        rank-0.key .. rank-<N-1>.key, ps.key, authorized/\n"
    "       flodl-keygen --rank K DIR        one more rank's key, bound to rank K, allowed in\n"
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

/* At most as many keys as the allowlist holds (transport/tp_curve.c). */
#define MAX_KEYS 4096

static bool valid_name(const char *s)
{
    if (s[0] == '\0' || strlen(s) > 64 || strcmp(s, "server") == 0 || strcmp(s, "ps") == 0 ||
        strncmp(s, "rank-", 5) == 0)
        return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.'))
            return false;
    return true;
}

/* base.key and base.pub, unless either exists; then the .pub into authorized/. */
static int make_pair(const char *dir, const char *name, const char *comment, int bound)
{
    char base[4096];
    char path[4200];
    snprintf(base, sizeof base, "%s/%s", dir, name);
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s.%s", base, k ? "pub" : "key");
        if (access(path, F_OK) == 0)
            return fail("%s exists: not overwriting keys", path);
    }
    if (fl_tp_curve_keygen(base, comment, bound) != FL_OK)
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

typedef struct args {
    const char *dir;
    const char *client; /* --client NAME */
    long ranks;         /* --ranks N, or 0 */
    long rank;          /* --rank K, or -1 */
    bool if_missing;
} args_t;

/* One flag at argv[*i] (and its value); -1 when it holds, else the exit code. */
static int parse_one(int argc, char **argv, int *i, args_t *a)
{
    const char *f = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    bool valued = v != NULL && (strcmp(f, "--client") == 0 || strcmp(f, "--ranks") == 0 ||
                                strcmp(f, "--rank") == 0);
    int rc = FL_OK;
    if (valued)
        ++*i;
    if (valued && f[2] == 'c')
        a->client = v;
    else if (valued && strcmp(f, "--ranks") == 0)
        rc = fl_cli_long(f, v, 1, MAX_KEYS - 1, &a->ranks);
    else if (valued)
        rc = fl_cli_long(f, v, 0, FL_MSG_MAX_PEERS - 1, &a->rank);
    else if (strcmp(f, "--if-missing") == 0)
        a->if_missing = true;
    else if (f[0] != '-' && a->dir == NULL)
        a->dir = f;
    else
        return fail("unexpected argument '%s' (see --help)", f), 2;
    return rc == FL_OK ? -1 : (fail("%s", fl_last_error()), 2);
}

/* -1 when the arguments hold, else the exit code (0 after --help or --version). */
static int parse(int argc, char **argv, args_t *a)
{
    *a = (args_t){.rank = -1};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return fputs(usage, stdout), 0;
        if (strcmp(argv[i], "--version") == 0)
            return fl_cli_version("flodl-keygen");
        int rc = parse_one(argc, argv, &i, a);
        if (rc >= 0)
            return rc;
    }
    if (a->dir == NULL)
        return fail("%s", "no DIR given (see --help)"), 2;
    if ((a->client != NULL) + (a->rank >= 0) + (a->ranks > 0) > 1)
        return fail("%s", "give one of --client, --rank and --ranks (see --help)"), 2;
    if (a->client != NULL && !valid_name(a->client))
        return fail("--client '%s': use letters, digits, '-', '_' or '.' (not 'server', 'ps' "
                    "nor 'rank-...', which name per-member keys)",
                    a->client),
               2;
    return -1;
}

/* The members' key names of a new job: "client", or "ps" and "rank-0" .. */
static void member_name(const args_t *a, long i, char *out, size_t cap)
{
    if (a->ranks == 0)
        snprintf(out, cap, "client");
    else if (i == a->ranks)
        snprintf(out, cap, "ps");
    else
        snprintf(out, cap, "rank-%ld", i);
}

/* True when DIR has every key of the job already (--if-missing). */
static bool have_all(const args_t *a)
{
    char path[4200];
    char name[32];
    snprintf(path, sizeof path, "%s/server.key", a->dir);
    bool all = access(path, F_OK) == 0;
    for (long i = 0; all && i <= a->ranks; i++) {
        member_name(a, i, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s.key", a->dir, name);
        all = access(path, F_OK) == 0;
        snprintf(path, sizeof path, "%s/authorized/%s.pub", a->dir, name);
        all = all && access(path, F_OK) == 0;
    }
    return all;
}

/* A new job's keys: the server's, and the shared client key or one per member. A partial set
 * is refused (make_pair never overwrites), never completed or replaced. */
static int job_keys(const args_t *a)
{
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/authorized", a->dir);
    if (a->if_missing && have_all(a)) {
        printf("flodl-keygen: keys in %s already\n", a->dir);
        return 0;
    }
    if (mkdir(a->dir, 0700) != 0 && errno != EEXIST)
        return fail("cannot make %s: %s", a->dir, strerror(errno)), 2;
    if (mkdir(sub, 0755) != 0 && errno != EEXIST)
        return fail("cannot make %s: %s", sub, strerror(errno)), 2;
    int rc = make_pair(a->dir, "server", "the job's servers", FL_TP_KEY_ANY);
    for (long i = 0; rc == 0 && i <= a->ranks; i++) {
        char name[32];
        member_name(a, i, name, sizeof name);
        int bound = a->ranks == 0 ? FL_TP_KEY_ANY : i == a->ranks ? FL_TP_KEY_SERVER : (int)i;
        rc = make_pair(a->dir, name, a->ranks == 0 ? "a client of the job" : name, bound);
        if (rc == 0)
            rc = allow(a->dir, name);
    }
    if (rc == 0 && a->ranks == 0)
        printf("flodl-keygen: keys in %s (server.key, client.key, authorized/client.pub); "
               "give it to flodl-ps and flodl-worker with --curve-dir %s\n",
               a->dir, a->dir);
    else if (rc == 0)
        printf("flodl-keygen: keys in %s (server.key, rank-0.key .. rank-%ld.key, ps.key, "
               "authorized/); give each host server.key, authorized/ and its members' keys, "
               "with --curve-dir\n",
               a->dir, a->ranks - 1);
    return rc;
}

int main(int argc, char **argv)
{
    args_t a;
    int rc = parse(argc, argv, &a);
    if (rc >= 0)
        return rc;
    if (a.client == NULL && a.rank < 0)
        return job_keys(&a);
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/authorized", a.dir);
    if (access(sub, F_OK) != 0)
        return fail("%s has no authorized/: make the job's keys first (flodl-keygen DIR)", a.dir);
    char name[32];
    if (a.rank >= 0)
        snprintf(name, sizeof name, "rank-%ld", a.rank);
    rc = make_pair(a.dir, a.client ? a.client : name, a.client ? a.client : name,
                   a.client ? FL_TP_KEY_ANY : (int)a.rank);
    if (rc == 0)
        rc = allow(a.dir, a.client ? a.client : name);
    if (rc == 0 && a.client != NULL)
        printf("flodl-keygen: %s/%s.key allowed in; a host using it needs it as its client.key, "
               "with server.key and authorized/\n",
               a.dir, a.client);
    else if (rc == 0)
        printf("flodl-keygen: %s/%s.key allowed in, bound to rank %ld; the host of rank %ld "
               "needs it beside server.key and authorized/\n",
               a.dir, name, a.rank, a.rank);
    return rc;
}
