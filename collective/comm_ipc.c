/* Same-host data over ipc://: a rank that binds TCP also binds one Unix socket per stripe in a
 * private directory of the job (/tmp/flodl-<uid>-<hash of job id and coordinator>, mode 0700,
 * owned by this user), and dials a peer on the same host (the same advertised address, or
 * loopback on both sides) over its socket instead of TCP. The path is derived from what the
 * peer table already says (rank, pid), so the wire protocol does not change; a peer whose
 * socket is not there (another filesystem, ipc turned off there, another coordinator string)
 * is dialled over TCP. CURVE and the size limits apply to ipc as to TCP (fl_tp_sock_bind). */
#include "comm_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define IPC_ROOT "/tmp"

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s != '\0'; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* The job's directory: every rank of the job on this host computes the same name. */
static void ipc_dir(const fl_comm_t *c, char *out, size_t cap)
{
    uint64_t h = fnv1a(0xcbf29ce484222325ULL, c->job_id);
    h = fnv1a(h ^ 0xff, c->coordinator);
    snprintf(out, cap, IPC_ROOT "/flodl-%u-%016llx", (unsigned)geteuid(), (unsigned long long)h);
}

static void ipc_path(const char *dir, int rank, int pid, int k, char *out, size_t cap)
{
    snprintf(out, cap, "%s/r%d-p%d.%d", dir, rank, pid, k);
}

/* True when dir is a directory of this user that nobody else may enter (not a link: lstat). */
static bool dir_private(const char *dir)
{
    struct stat st;
    return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() &&
           (st.st_mode & 0777) == 0700;
}

static bool is_loopback(const char *host)
{
    return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
           strcmp(host, "localhost") == 0;
}

int fl_comm_ipc_bind(fl_comm_t *c, int stripes)
{
    char dir[sizeof c->ipc_dir];
    ipc_dir(c, dir, sizeof dir);
    /* Made 0700 by whichever rank comes first; one made by anyone else, or with other modes,
     * is not used (a user who shares /tmp must not be able to plant or reach our sockets). */
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        FL_WARN(c->ctx, "data over ipc off: cannot make %s: %s; peers on this host use tcp",
                dir, strerror(errno));
        return FL_OK;
    }
    if (!dir_private(dir)) {
        FL_WARN(c->ctx, "data over ipc off: %s is not a directory of uid %u with mode 0700; "
                        "peers on this host use tcp",
                dir, (unsigned)geteuid());
        return FL_OK;
    }
    snprintf(c->ipc_dir, sizeof c->ipc_dir, "%s", dir);
    for (int k = 0; k < stripes; k++) {
        char path[sizeof c->ipc_dir + 48];
        char ep[sizeof path + 8];
        ipc_path(dir, c->rank, (int)getpid(), k, path, sizeof path);
        snprintf(ep, sizeof ep, "ipc://%s", path);
        int rc = fl_tp_sock_bind(c->data_in, ep, NULL, 0);
        if (rc != FL_OK)
            return fl_fail_ctx(rc, "rank %d: data endpoint over ipc (FLODL_IPC=0 turns it off)",
                               c->rank);
        c->ipc_bound = k + 1;
    }
    return FL_OK;
}

void fl_comm_ipc_remove(fl_comm_t *c)
{
    if (c->ipc_dir[0] == '\0')
        return;
    for (int k = 0; k < c->ipc_bound; k++) {
        char path[sizeof c->ipc_dir + 48];
        ipc_path(c->ipc_dir, c->rank, (int)getpid(), k, path, sizeof path);
        unlink(path); /* ZeroMQ unlinks it when the socket closes; this covers the rest */
    }
    /* Fails while other ranks of the job on this host still have sockets in it: the last one
     * out removes it. */
    rmdir(c->ipc_dir);
    c->ipc_dir[0] = '\0';
    c->ipc_bound = 0;
}

bool fl_comm_ipc_endpoint(const fl_comm_t *c, int peer, uint32_t k, char *out, size_t cap)
{
    if (c->ipc_bound == 0 || peer == c->rank)
        return false;
    const fl_msg_peer_t *p = &c->peers[peer];
    if (strcmp(p->host, c->host) != 0 && !(is_loopback(p->host) && is_loopback(c->host)))
        return false;
    char path[sizeof c->ipc_dir + 48];
    ipc_path(c->ipc_dir, peer, (int)p->pid, (int)k, path, sizeof path);
    /* Bound before the peer registered, so it is there now if the peer shares this
     * filesystem; a socket of another user is not ours to dial. */
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_uid != geteuid())
        return false;
    int n = snprintf(out, cap, "ipc://%s", path);
    return n > 0 && (size_t)n < cap;
}

const char *fl_comm_ipc_dir(const fl_comm_t *c)
{
    return c->ipc_dir;
}

bool fl_comm_peer_is_ipc(const fl_comm_t *c, int peer)
{
    return c->peer_ipc != NULL && peer >= 0 && peer < c->size && c->peer_ipc[peer];
}
