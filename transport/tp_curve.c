/* CurveZMQ for every TCP and IPC connection of a context: bound sockets are CURVE servers with
 * the job's server key, connecting sockets CURVE clients with this process's client key and
 * the server's public key, and a ZAP handler thread answers the servers' authentication
 * requests from an allowlist of client public keys. A client with an unknown key is refused
 * (and counted); one with no key or plain text fails ZeroMQ's handshake (counted by the guard of
 * the socket, tp_guard.c): neither gets a message through. Keys are Z85 text in files ZeroMQ's and
 * czmq's tools also read: public-key = "<40 characters>" secret-key = "<40 characters>" A key
 * directory holds server.key (the job's server key pair), client.key (a client key every member
 * may use) or per-member keys (rank-K.key, ps.key), and authorized/ (*.pub: the client keys
 * allowed in, each maybe bound to one member by `rank = "K"` or `role = "server"`). The ZAP
 * handler names a peer by its key and binding ("User-Id"), and the coordinator holds each
 * member to its binding. Secret key files must not be readable by others nor writable by their
 * group. inproc sockets (inside one process) are left as they are. */
#include "tp_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zmq.h>

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define KEY_TEXT 41 /* 40 characters of Z85 and the NUL */
#define MAX_ALLOWED 4096

struct fl_tp_curve {
    char server_public[KEY_TEXT];
    char server_secret[KEY_TEXT];
    char client_public[KEY_TEXT];
    char client_secret[KEY_TEXT];
    bool has_client; /* a process that only binds may have no client key */
    char client_path[4096];
    uint8_t (*allowed)[32];
    int *bound; /* per allowed key: a rank, FL_TP_KEY_SERVER or FL_TP_KEY_ANY */
    size_t nallowed;
    /* the ZAP handler, once attached to a context */
    fl_ctx_t *ctx;
    void *zap; /* REP at ZAP_ENDPOINT, owned by the thread */
    void *stop_tx, *stop_rx;
    pthread_t thread;
    bool running;
};

/* Finds `name = "<40 chars>"` in text. */
static bool find_key(const char *text, const char *name, char *out)
{
    const char *p = text;
    size_t nl = strlen(name);
    while ((p = strstr(p, name)) != NULL) {
        const char *q = p + nl;
        while (*q == ' ' || *q == '\t')
            q++;
        if (*q == '=') {
            q++;
            while (*q == ' ' || *q == '\t')
                q++;
            if (*q == '"' && strlen(q) >= 42 && q[41] == '"') {
                memcpy(out, q + 1, 40);
                out[40] = '\0';
                uint8_t bin[32];
                return zmq_z85_decode(bin, out) != NULL;
            }
        }
        p += nl;
    }
    return false;
}

/* Finds a line `name = "value"` (blanks before it allowed) in text: 1 and the value in out, 0
 * when no line sets name, -1 when one does but not as a quoted value that fits in cap. */
static int find_value(const char *text, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = text; p != NULL; p = strchr(p, '\n'), p = p != NULL ? p + 1 : NULL) {
        const char *q = p + strspn(p, " \t");
        if (strncmp(q, name, nl) != 0)
            continue;
        q += nl;
        q += strspn(q, " \t");
        if (*q++ != '=')
            continue;
        q += strspn(q, " \t");
        const char *end = *q == '"' ? strpbrk(q + 1, "\"\n") : NULL;
        if (end == NULL || *end != '"' || (size_t)(end - q - 1) >= cap)
            return -1;
        memcpy(out, q + 1, (size_t)(end - q - 1));
        out[end - q - 1] = '\0';
        return 1;
    }
    return 0;
}

/* The member a listed key is bound to, from its metadata (fl_tp.h's FL_TP_KEY_*). A binding
 * that cannot be read is refused: taken as none, it would let the key be any member. */
static int read_binding(const char *path, const char *text, int *bound)
{
    char v[32];
    *bound = FL_TP_KEY_ANY;
    int has = find_value(text, "rank", v, sizeof v);
    char *end = NULL;
    long r = has == 1 ? strtol(v, &end, 10) : -1;
    if (has < 0 ||
        (has == 1 && (v[0] < '0' || v[0] > '9' || *end != '\0' || r >= FL_MSG_MAX_PEERS)))
        return fl_fail(FL_EINVAL, "CURVE: %s: the binding is not rank = \"K\" (K from 0 to %d)",
                       path, FL_MSG_MAX_PEERS - 1);
    if (has == 1)
        *bound = (int)r;
    has = find_value(text, "role", v, sizeof v);
    if (has < 0 || (has == 1 && (strcmp(v, "server") != 0 || *bound != FL_TP_KEY_ANY)))
        return fl_fail(FL_EINVAL,
                       "CURVE: %s: the binding is not role = \"server\" (a key's one role, and "
                       "not with a rank)",
                       path);
    if (has == 1)
        *bound = FL_TP_KEY_SERVER;
    return FL_OK;
}

/* Whether gid is the process's group, its own or a supplementary one. Kubernetes adds the pod's
 * fsGroup to the supplementary groups, and gives Secret files that group with group read. */
static bool own_group(gid_t gid)
{
    if (gid == getegid())
        return true;
    gid_t groups[256];
    int n = getgroups(256, groups);
    for (int i = 0; i < n; i++)
        if (groups[i] == gid)
            return true;
    return false;
}

/* A secret key: nothing for others, no write for the group, group read only for a group this
 * process is in (the fsGroup case: no other user can read it then). */
static int check_secret_mode(const char *path, const struct stat *st)
{
    unsigned mode = (unsigned)(st->st_mode & 0777);
    if ((mode & 007) != 0)
        return fl_fail(FL_EINVAL,
                       "CURVE: %s holds a secret key and is readable by others (mode %03o): "
                       "chmod 600 it",
                       path, mode);
    if ((mode & 030) != 0)
        return fl_fail(FL_EINVAL,
                       "CURVE: %s holds a secret key and is writable by its group (mode %03o): "
                       "chmod 600 it",
                       path, mode);
    if ((mode & 040) != 0 && !own_group(st->st_gid))
        return fl_fail(FL_EINVAL,
                       "CURVE: %s holds a secret key and is readable by group %u, not this "
                       "process's (mode %03o): chmod 600 it",
                       path, (unsigned)st->st_gid, mode);
    return FL_OK;
}

/* Reads a key file; a secret key's mode is check_secret_mode's. bound: NULL, or where the
 * key's binding goes (read_binding). */
static int read_key_file(const char *path, bool secret, char *pub, char *sec, int *bound)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return fl_fail(FL_EINVAL, "CURVE: %s: %s", path, strerror(errno));
    if (secret && check_secret_mode(path, &st) != FL_OK)
        return FL_EINVAL;
    if (st.st_size > 8192)
        return fl_fail(FL_EINVAL, "CURVE: %s is too large for a key file", path);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return fl_fail(FL_EINVAL, "CURVE: %s: %s", path, strerror(errno));
    char text[8193];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    if (!find_key(text, "public-key", pub))
        return fl_fail(FL_EINVAL,
                       "CURVE: %s has no valid public-key = \"...\" (40 Z85 "
                       "characters)",
                       path);
    if (secret && !find_key(text, "secret-key", sec))
        return fl_fail(FL_EINVAL, "CURVE: %s has no valid secret-key = \"...\"", path);
    return bound != NULL ? read_binding(path, text, bound) : FL_OK;
}

/* Who may change the key directory or the allowlist decides who gets in: no write for group or
 * others, unless nobody may write there at all (a read-only mount: Kubernetes mounts a Secret
 * volume's directory open to all, and the manifests mount it read-only). */
static int check_not_writable(const char *path, const char *what)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return fl_fail(FL_EINVAL, "CURVE: %s: %s", path, strerror(errno));
    struct statvfs fs;
    if ((st.st_mode & 022) != 0 && !(statvfs(path, &fs) == 0 && (fs.f_flag & ST_RDONLY) != 0))
        return fl_fail(FL_EINVAL,
                       "CURVE: %s %s and is writable by its group or others (mode %03o): "
                       "chmod go-w it",
                       path, what, (unsigned)(st.st_mode & 0777));
    return FL_OK;
}

/* One more allowed key; the same key twice would make its binding ambiguous. */
static int add_allowed(fl_tp_curve_t *c, const char *file, const char *pub)
{
    uint8_t *key = c->allowed[c->nallowed];
    zmq_z85_decode(key, pub);
    for (size_t i = 0; i < c->nallowed; i++)
        if (memcmp(c->allowed[i], key, 32) == 0)
            return fl_fail(FL_EINVAL, "CURVE: %s: key %s is in the allowlist twice", file, pub);
    c->nallowed++;
    return FL_OK;
}

/* This process's client key: DIR/<self>.key when self names one that exists, else
 * DIR/client.key, which only a process that binds alone (self NULL) may lack. */
static int read_client_key(const char *dir, const char *self, fl_tp_curve_t *c)
{
    if (self != NULL) {
        snprintf(c->client_path, sizeof c->client_path, "%s/%s.key", dir, self);
        if (access(c->client_path, F_OK) != 0)
            snprintf(c->client_path, sizeof c->client_path, "%s/client.key", dir);
    } else {
        snprintf(c->client_path, sizeof c->client_path, "%s/client.key", dir);
        if (access(c->client_path, F_OK) != 0)
            return FL_OK;
    }
    if (access(c->client_path, F_OK) != 0)
        return fl_fail(FL_EINVAL,
                       "CURVE: %s has neither %s.key (this process's own key) nor client.key "
                       "(the job's shared one)",
                       dir, self);
    c->has_client = true;
    return read_key_file(c->client_path, true, c->client_public, c->client_secret, NULL);
}

static int read_allowlist(const char *dir, fl_tp_curve_t *c)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/authorized", dir);
    DIR *d = opendir(path);
    if (d != NULL && check_not_writable(path, "decides who may connect") != FL_OK) {
        closedir(d);
        return FL_EINVAL;
    }
    if (d == NULL)
        return fl_fail(FL_EINVAL,
                       "CURVE: no allowlist %s (the client public keys allowed in, "
                       "*.pub): %s",
                       path, strerror(errno));
    c->allowed = calloc(MAX_ALLOWED, sizeof *c->allowed);
    c->bound = calloc(MAX_ALLOWED, sizeof *c->bound);
    if (c->allowed == NULL || c->bound == NULL) {
        closedir(d);
        return fl_fail(FL_ENOMEM, "CURVE: out of memory");
    }
    int rc = FL_OK;
    struct dirent *e;
    while (rc == FL_OK && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".pub") != 0)
            continue;
        if (c->nallowed == MAX_ALLOWED) {
            rc = fl_fail(FL_EINVAL, "CURVE: %s holds more than %d keys", path, MAX_ALLOWED);
            break;
        }
        char file[4352];
        char pub[KEY_TEXT];
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        if ((rc = check_not_writable(file, "decides who may connect")) == FL_OK &&
            (rc = read_key_file(file, false, pub, NULL, &c->bound[c->nallowed])) == FL_OK)
            rc = add_allowed(c, file, pub);
    }
    closedir(d);
    if (rc == FL_OK && c->nallowed == 0)
        rc = fl_fail(FL_EINVAL,
                     "CURVE: the allowlist %s holds no *.pub key: nobody could "
                     "connect",
                     path);
    return rc;
}

int fl_tp_curve_load(const char *dir, const char *self, fl_tp_curve_t **out)
{
    *out = NULL;
    if (!zmq_has("curve"))
        return fl_fail(FL_EINVAL, "CURVE: this libzmq was built without CURVE support");
    fl_tp_curve_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return fl_fail(FL_ENOMEM, "CURVE: out of memory");
    char path[4096];
    snprintf(path, sizeof path, "%s/server.key", dir);
    int rc = check_not_writable(dir, "holds the keys");
    if (rc == FL_OK)
        rc = read_key_file(path, true, c->server_public, c->server_secret, NULL);
    if (rc == FL_OK)
        rc = read_client_key(dir, self, c);
    if (rc == FL_OK)
        rc = read_allowlist(dir, c);
    if (rc != FL_OK) {
        fl_tp_curve_free(c);
        return rc;
    }
    *out = c;
    return FL_OK;
}

/* ---- the ZAP handler ---- */

/* The key's place in the allowlist, or -1. */
static long allowed(const fl_tp_curve_t *c, const uint8_t *key)
{
    for (size_t i = 0; i < c->nallowed; i++)
        if (memcmp(c->allowed[i], key, 32) == 0)
            return (long)i;
    return -1;
}

/* user: the id ZeroMQ then attaches to the peer's messages ("User-Id"): its key, Z85, and its
 * binding, " rank=K" or " server" (fl_tp_user_bound reads it back). */
static void zap_reply(void *s, const char *version, zmq_msg_t *id, const char *code,
                      const char *text, const char *user)
{
    zmq_send(s, version, strlen(version), ZMQ_SNDMORE);
    zmq_send(s, zmq_msg_data(id), zmq_msg_size(id), ZMQ_SNDMORE);
    zmq_send(s, code, strlen(code), ZMQ_SNDMORE);
    zmq_send(s, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(s, user, strlen(user), ZMQ_SNDMORE);
    zmq_send(s, "", 0, 0); /* metadata */
}

/* One request: version, request id, domain, address, routing id, mechanism, credentials. */
static void zap_serve(fl_tp_curve_t *c)
{
    zmq_msg_t f[8];
    int n = 0;
    int more = 1;
    while (more && n < 8) {
        zmq_msg_init(&f[n]);
        if (zmq_msg_recv(&f[n], c->zap, 0) < 0) {
            zmq_msg_close(&f[n]);
            break;
        }
        more = zmq_msg_more(&f[n]);
        n++;
    }
    while (more) { /* a request longer than any ZAP request: drain it */
        zmq_msg_t x;
        zmq_msg_init(&x);
        if (zmq_msg_recv(&x, c->zap, 0) < 0)
            more = 0;
        else
            more = zmq_msg_more(&x);
        zmq_msg_close(&x);
    }
    if (n < 2) {
        /* Not a ZAP request (libzmq sends well-formed ones): still answer, or the REP socket
         * would refuse every later request. */
        zmq_msg_t empty;
        zmq_msg_init(&empty);
        zap_reply(c->zap, "1.0", &empty, "500", "malformed ZAP request", "");
        zmq_msg_close(&empty);
    } else {
        char address[64] = "";
        if (n >= 4)
            snprintf(address, sizeof address, "%.*s", (int)zmq_msg_size(&f[3]),
                     (const char *)zmq_msg_data(&f[3]));
        bool curve = n >= 7 && zmq_msg_size(&f[5]) == 5 &&
                     memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 && zmq_msg_size(&f[6]) == 32;
        long at = curve ? allowed(c, zmq_msg_data(&f[6])) : -1;
        bool ok = at >= 0;
        if (!ok) {
            char key[KEY_TEXT] = "none";
            if (curve)
                zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
            fl_ctx_count(c->ctx, FL_STAT_AUTH_REFUSED, 1);
            FL_WARN(c->ctx,
                    "CURVE: refused a connection from %s: client key %s is not in the "
                    "allowlist",
                    address[0] ? address : "an unknown address", key);
        }
        char user[KEY_TEXT + 24] = "";
        if (ok) {
            zmq_z85_encode(user, zmq_msg_data(&f[6]), 32);
            if (c->bound[at] >= 0)
                snprintf(user + 40, sizeof user - 40, " rank=%d", c->bound[at]);
            else if (c->bound[at] == FL_TP_KEY_SERVER)
                snprintf(user + 40, sizeof user - 40, " server");
        }
        zap_reply(c->zap, "1.0", &f[1], ok ? "200" : "400", ok ? "OK" : "client key not allowed",
                  user);
    }
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
}

int fl_tp_user_bound(const char *user, char *key, size_t cap)
{
    size_t n = strcspn(user, " ");
    snprintf(key, cap, "%.*s", (int)n, user);
    if (strcmp(user + n, " server") == 0)
        return FL_TP_KEY_SERVER;
    if (strncmp(user + n, " rank=", 6) == 0)
        return atoi(user + n + 6); /* written by zap_serve: digits of a rank in range */
    return FL_TP_KEY_ANY;
}

static void *zap_main(void *arg)
{
    fl_tp_curve_t *c = arg;
    for (;;) {
        zmq_pollitem_t items[2] = {{c->zap, 0, ZMQ_POLLIN, 0}, {c->stop_rx, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, 2, -1) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            break;
        }
        if (items[1].revents & ZMQ_POLLIN)
            break;
        if (items[0].revents & ZMQ_POLLIN)
            zap_serve(c);
    }
    int zero = 0;
    zmq_setsockopt(c->zap, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(c->zap);
    c->zap = NULL;
    return NULL;
}

static void curve_free_cb(void *p)
{
    fl_tp_curve_free(p);
}

int fl_tp_curve_attach(fl_ctx_t *ctx, fl_tp_curve_t *c)
{
    if (fl_ctx_security(ctx) != NULL) {
        fl_tp_curve_free(c);
        return fl_fail(FL_EINVAL, "CURVE: the context has its keys already");
    }
    c->ctx = ctx;
    void *z = fl_ctx_zmq(ctx);
    int zero = 0;
    char stop_ep[64];
    snprintf(stop_ep, sizeof stop_ep, "inproc://flodl-zap-stop-%p", (void *)c);
    c->zap = zmq_socket(z, ZMQ_REP);
    c->stop_rx = zmq_socket(z, ZMQ_PAIR);
    c->stop_tx = zmq_socket(z, ZMQ_PAIR);
    int rc = FL_OK;
    if (c->zap == NULL || c->stop_rx == NULL || c->stop_tx == NULL ||
        zmq_bind(c->zap, ZAP_ENDPOINT) != 0 || zmq_bind(c->stop_rx, stop_ep) != 0 ||
        zmq_connect(c->stop_tx, stop_ep) != 0)
        rc = fl_fail(FL_EIO, "CURVE: cannot start the authentication handler: %s",
                     zmq_strerror(zmq_errno()));
    if (c->stop_rx != NULL)
        zmq_setsockopt(c->stop_rx, ZMQ_LINGER, &zero, sizeof zero);
    if (c->stop_tx != NULL)
        zmq_setsockopt(c->stop_tx, ZMQ_LINGER, &zero, sizeof zero);
    if (rc == FL_OK && pthread_create(&c->thread, NULL, zap_main, c) != 0)
        rc = fl_fail(FL_EIO, "CURVE: cannot start the authentication thread");
    if (rc != FL_OK) {
        if (c->zap != NULL) {
            zmq_setsockopt(c->zap, ZMQ_LINGER, &zero, sizeof zero);
            zmq_close(c->zap);
            c->zap = NULL;
        }
        fl_tp_curve_free(c);
        return rc;
    }
    c->running = true;
    fl_ctx_set_security(ctx, c, curve_free_cb);
    return FL_OK;
}

void fl_tp_curve_free(fl_tp_curve_t *c)
{
    if (c == NULL)
        return;
    if (c->running) {
        zmq_send(c->stop_tx, "", 0, 0);
        pthread_join(c->thread, NULL);
        c->running = false;
    }
    if (c->stop_tx != NULL)
        zmq_close(c->stop_tx);
    if (c->stop_rx != NULL)
        zmq_close(c->stop_rx);
    /* Secrets do not outlive their use in freed memory. */
    explicit_bzero(c->server_secret, sizeof c->server_secret);
    explicit_bzero(c->client_secret, sizeof c->client_secret);
    free(c->allowed);
    free(c->bound);
    free(c);
}

/* ---- sockets ---- */

static bool secured(const char *endpoint)
{
    return strncmp(endpoint, "inproc://", 9) != 0;
}

int fl_tp_curve_server(void *zs, const fl_ctx_t *ctx, const char *endpoint)
{
    const fl_tp_curve_t *c = fl_ctx_security(ctx);
    if (c == NULL || !secured(endpoint))
        return FL_OK;
    int one = 1;
    if (zmq_setsockopt(zs, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(zs, ZMQ_CURVE_SECRETKEY, c->server_secret, 40) != 0 ||
        zmq_setsockopt(zs, ZMQ_ZAP_DOMAIN, "flodl", 5) != 0)
        return fl_fail(FL_EIO, "CURVE: server options: %s", zmq_strerror(zmq_errno()));
    return FL_OK;
}

int fl_tp_curve_client(void *zs, const fl_ctx_t *ctx, const char *endpoint)
{
    const fl_tp_curve_t *c = fl_ctx_security(ctx);
    if (c == NULL || !secured(endpoint))
        return FL_OK;
    if (!c->has_client)
        return fl_fail(FL_EINVAL, "CURVE: this process has no client key (%s) to connect to %s",
                       c->client_path, endpoint);
    if (zmq_setsockopt(zs, ZMQ_CURVE_SERVERKEY, c->server_public, 40) != 0 ||
        zmq_setsockopt(zs, ZMQ_CURVE_PUBLICKEY, c->client_public, 40) != 0 ||
        zmq_setsockopt(zs, ZMQ_CURVE_SECRETKEY, c->client_secret, 40) != 0)
        return fl_fail(FL_EIO, "CURVE: client options: %s", zmq_strerror(zmq_errno()));
    return FL_OK;
}

bool fl_tp_curve_on(const fl_ctx_t *ctx)
{
    return fl_ctx_security(ctx) != NULL;
}

/* ---- keys ---- */

static int write_file(const char *path, const char *text, mode_t mode)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = NULL;
    unlink(tmp); /* a leftover, or a planted link: never written through */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0 && fchmod(fd, mode) != 0) {
        close(fd);
        fd = -1;
    }
    if (fd >= 0)
        f = fdopen(fd, "w");
    if (f == NULL) {
        if (fd >= 0)
            close(fd);
        return fl_fail(FL_EIO, "flodl-keygen: cannot write %s: %s", tmp, strerror(errno));
    }
    bool ok = fputs(text, f) != EOF && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return fl_fail(FL_EIO, "flodl-keygen: cannot write %s: %s", path, strerror(errno));
    }
    return FL_OK;
}

int fl_tp_curve_keygen(const char *base, const char *comment, int bound)
{
    char pub[KEY_TEXT];
    char sec[KEY_TEXT];
    if (zmq_curve_keypair(pub, sec) != 0)
        return fl_fail(FL_EIO, "flodl-keygen: zmq_curve_keypair: %s", zmq_strerror(zmq_errno()));
    char text[512];
    char path[4096];
    char meta[64] = "";
    if (bound >= 0)
        snprintf(meta, sizeof meta, "    rank = \"%d\"\n", bound);
    else if (bound == FL_TP_KEY_SERVER)
        snprintf(meta, sizeof meta, "    role = \"server\"\n");
    snprintf(text, sizeof text,
             "#   flodl CURVE key pair (%s): keep this file secret (mode 600)\n"
             "metadata\n%scurve\n    public-key = \"%s\"\n    secret-key = \"%s\"\n",
             comment, meta, pub, sec);
    snprintf(path, sizeof path, "%s.key", base);
    int rc = write_file(path, text, 0600);
    explicit_bzero(sec, sizeof sec);
    explicit_bzero(text, sizeof text);
    if (rc != FL_OK)
        return rc;
    snprintf(text, sizeof text,
             "#   flodl CURVE public key (%s)\nmetadata\n%scurve\n    public-key = \"%s\"\n",
             comment, meta, pub);
    snprintf(path, sizeof path, "%s.pub", base);
    return write_file(path, text, 0644);
}

int fl_tp_curve_use(fl_ctx_t *ctx, const char *dir, const char *self)
{
    if (dir == NULL)
        return FL_OK;
    fl_tp_curve_t *c = NULL;
    int rc = fl_tp_curve_load(dir, self, &c);
    return rc == FL_OK ? fl_tp_curve_attach(ctx, c) : rc;
}

const char *fl_tp_curve_client_key(const fl_ctx_t *ctx)
{
    const fl_tp_curve_t *c = fl_ctx_security(ctx);
    return c != NULL ? c->client_public : "";
}
