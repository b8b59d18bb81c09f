/* Same-host data over ipc://: a rank that binds TCP also binds one Unix socket per stripe in a
 * private directory of the job (/tmp/flodl-<uid>-<hash of job id and coordinator>, mode 0700,
 * owned by this user), and dials a peer on the same host (the same advertised address, or
 * loopback on both sides) over its socket instead of TCP. A communicator's path is derived
 * from what the peer table already says (rank, pid), so the wire protocol does not change; a
 * sub-communicator's member binds its own sockets there under a name unique in its process and
 * sends it in the split's all-gather (comm_split.c). A peer whose socket is not there (another
 * filesystem, ipc turned off there, another coordinator string) is dialled over TCP. CURVE and
 * the size limits apply to ipc as to TCP (fl_tp_sock_bind). */
#include "comm_int.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define IPC_ROOT "/tmp"
/* A socket or an empty directory this old, that nothing listens on or uses, is left over. */
#define STALE_S 10

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s != '\0'; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

void fl_comm_ipc_dir_name(const char *job_id, const char *coordinator, char *out, size_t cap)
{
    uint64_t h = fnv1a(0xcbf29ce484222325ULL, job_id);
    h = fnv1a(h ^ 0xff, coordinator);
    snprintf(out, cap, IPC_ROOT "/flodl-%u-%016llx", (unsigned)geteuid(), (unsigned long long)h);
}

/* The job's directory: every rank of the job on this host computes the same name. */
static void ipc_dir(const fl_comm_t *c, char *out, size_t cap)
{
    fl_comm_ipc_dir_name(c->job_id, c->coordinator, out, cap);
}

static void ipc_path(const char *dir, const char *name, int k, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s.%d", dir, name, k);
}

/* True when dir is a directory of this user that nobody else may enter (not a link: lstat). */
static bool dir_private(const char *dir)
{
    struct stat st;
    return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() &&
           (st.st_mode & 0777) == 0700;
}

/* True when path is a socket of this user, bound over STALE_S ago, that refuses connections: its
 * rank ended without fl_comm_destroy (exit, a signal). A live one accepts (and sees the
 * connection close before any greeting); one just bound is young. */
static bool sock_stale(const char *path, time_t now)
{
    struct stat st;
    struct sockaddr_un a;
    size_t len = strlen(path);
    if (lstat(path, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_uid != geteuid() ||
        now - st.st_mtime < STALE_S || len >= sizeof a.sun_path)
        return false;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path, path, len + 1);
    /* Non-blocking: a listener with a full backlog answers EAGAIN at once instead of making
     * this wait. */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return false;
    bool stale = connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno == ECONNREFUSED;
    close(fd);
    return stale;
}

/* Removes what ranks that did not reach fl_comm_destroy left in this user's socket directories:
 * sockets nobody listens on, then directories empty for STALE_S. Another job's directory that
 * is in use keeps its sockets, so it is not removed. */
static void sweep(void)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "flodl-%u-", (unsigned)geteuid());
    size_t plen = strlen(prefix);
    DIR *root = opendir(IPC_ROOT);
    if (root == NULL)
        return;
    time_t now = time(NULL);
    struct dirent *e;
    while ((e = readdir(root)) != NULL) {
        if (strncmp(e->d_name, prefix, plen) != 0 || strlen(e->d_name) != plen + 16)
            continue;
        char dir[sizeof IPC_ROOT + sizeof e->d_name];
        snprintf(dir, sizeof dir, IPC_ROOT "/%s", e->d_name);
        /* Its age before the sweep: removing a socket makes it look new. */
        struct stat st;
        DIR *d = dir_private(dir) && lstat(dir, &st) == 0 ? opendir(dir) : NULL;
        if (d == NULL)
            continue;
        struct dirent *f;
        while ((f = readdir(d)) != NULL) {
            char path[sizeof dir + sizeof f->d_name];
            snprintf(path, sizeof path, "%s/%s", dir, f->d_name);
            if (f->d_name[0] != '.' && sock_stale(path, now))
                unlink(path);
        }
        closedir(d);
        if (now - st.st_mtime >= STALE_S)
            rmdir(dir); /* fails while it holds anything */
    }
    closedir(root);
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
    sweep();
    /* Made 0700 by whichever rank comes first; one made by anyone else, or with other modes,
     * is not used (a user who shares /tmp must not be able to plant or reach our sockets). */
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        FL_WARN(c->ctx, "data over ipc off: cannot make %s: %s; peers on this host use tcp", dir,
                strerror(errno));
        return FL_OK;
    }
    if (!dir_private(dir)) {
        FL_WARN(c->ctx,
                "data over ipc off: %s is not a directory of uid %u with mode 0700; "
                "peers on this host use tcp",
                dir, (unsigned)geteuid());
        return FL_OK;
    }
    snprintf(c->ipc_dir, sizeof c->ipc_dir, "%s", dir);
    if (c->ipc_name[0] == '\0') /* a sub-communicator's is set by fl_comm_split */
        snprintf(c->ipc_name, sizeof c->ipc_name, "r%d-p%d", c->rank, (int)getpid());
    for (int k = 0; k < stripes; k++) {
        char path[sizeof c->ipc_dir + FL_IPC_NAME_MAX + 16];
        char ep[sizeof path + 8];
        ipc_path(dir, c->ipc_name, k, path, sizeof path);
        snprintf(ep, sizeof ep, "ipc://%s", path);
        /* The directory may have gone since the check (the last rank of an earlier job with
         * the same id and coordinator leaving): TCP then, as peers find no socket. */
        if (fl_tp_sock_bind(c->data_in, ep, NULL, 0) != FL_OK) {
            FL_WARN(c->ctx, "data over ipc off: %s; peers on this host use tcp", fl_last_error());
            break;
        }
        c->ipc_bound = k + 1;
    }
    /* /tmp is sticky: only this user can remove the directory, and only when it is empty; if
     * it went and someone else made it again between the check and the bind, say so (peers,
     * which check it too before they dial, then use TCP). */
    if (c->ipc_bound > 0 && !dir_private(dir))
        FL_WARN(c->ctx, "data over ipc off: %s changed owner or mode while binding", dir);
    return FL_OK;
}

void fl_comm_ipc_remove(fl_comm_t *c)
{
    if (c->ipc_dir[0] == '\0')
        return;
    for (int k = 0; k < c->ipc_bound; k++) {
        char path[sizeof c->ipc_dir + FL_IPC_NAME_MAX + 16];
        ipc_path(c->ipc_dir, c->ipc_name, k, path, sizeof path);
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
    if (c->ipc_bound == 0 || peer == c->rank || !dir_private(c->ipc_dir))
        return false;
    const fl_msg_peer_t *p = &c->peers[peer];
    if (strcmp(p->host, c->host) != 0 && !(is_loopback(p->host) && is_loopback(c->host)))
        return false;
    char name[FL_IPC_NAME_MAX];
    if (c->peer_ipc_name != NULL)
        snprintf(name, sizeof name, "%s", c->peer_ipc_name[peer]);
    else
        snprintf(name, sizeof name, "r%d-p%d", peer, (int)p->pid);
    if (name[0] == '\0') /* a member that bound no ipc */
        return false;
    char path[sizeof c->ipc_dir + FL_IPC_NAME_MAX + 16];
    ipc_path(c->ipc_dir, name, (int)k, path, sizeof path);
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
