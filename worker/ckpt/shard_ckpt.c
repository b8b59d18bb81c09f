/* Checkpoints of sharded training state: one safetensors file per owned range (its parameters
 * and optimizer buffers; under --shard full a device owns a range of every layer) and a
 * manifest naming every range of the job, so that a checkpoint
 * taken with some hosts, devices and --shard loads into others (resharding): the parameters
 * from all ranges, each new range's optimizer state from the saved ranges that overlap it.
 * Ranges replicated across hosts (--shard none, hybrid) are written by rank 0 only. Files carry
 * their step in the name and the manifest is written last, atomically, once every rank wrote:
 * a crash leaves the previous manifest and its files in place. */
#include "wk_ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MANIFEST "manifest.safetensors"
#define MAX_FILE_BYTES ((size_t)1 << 40)

static void shard_name(char *out, size_t cap, long step, int rank, int t)
{
    snprintf(out, cap, "shard-s%ld-r%d-d%d.safetensors", step, rank, t);
}

/* Ranks whose ranges the checkpoint holds: every rank when pieces differ across hosts. */
static int writers(const fl_wk_train_opts_t *o, int world)
{
    return o->shard == FL_WK_SHARD_GRAD || o->shard == FL_WK_SHARD_FULL ? world : 1;
}

int fl_wk_ranges(const fl_wk_train_opts_t *o, size_t np, int world, int rank, fl_wk_range_t *out)
{
    int n = 0;
    if (o->shard != FL_WK_SHARD_FULL) {
        int L = o->shard == FL_WK_SHARD_NONE ? 1 : o->replicas;
        for (int t = 0; t < L; t++) {
            fl_wk_range_t *r = &out[n++];
            fl_wk_shards_layout(o, np, world, rank, t, &r->off, &r->len);
            r->id = t;
            r->dev = t;
            r->at = 0;
            r->opt_len = r->len;
        }
        return n;
    }
    /* --shard full: device t's piece t W + rank of every layer (padding is not saved). */
    const fl_mlp_shape_t *m = &o->shape;
    size_t per_dev = 0;
    for (int u = 0; u < m->nlayers; u++) {
        size_t cnt;
        size_t c;
        fl_wk_full_layout(m, world, o->replicas, u, &cnt, &c);
        per_dev += c;
    }
    for (int t = 0; t < o->replicas; t++) {
        size_t at = 0;
        for (int u = 0; u < m->nlayers; u++) {
            size_t cnt;
            size_t c;
            fl_wk_full_layout(m, world, o->replicas, u, &cnt, &c);
            size_t first = ((size_t)t * (size_t)world + (size_t)rank) * c;
            if (first < cnt) {
                fl_wk_range_t *r = &out[n++];
                r->id = t * FL_MLP_MAX_LAYERS + u;
                r->dev = t;
                r->off = fl_mlp_weight_at(m, u) + first;
                r->len = cnt - first < c ? cnt - first : c;
                r->at = at;
                r->opt_len = per_dev;
            }
            at += c;
        }
    }
    return n;
}

static int write_range(const char *dir, int rank, const fl_wk_range_t *r, long step, int epoch,
                       const fl_wk_train_opts_t *o, const float *params, fl_opt_t *const *opts)
{
    size_t off = r->off;
    size_t len = r->len;
    const float *b1;
    const float *b2;
    uint64_t steps;
    fl_opt_state(opts[r->dev], &b1, &b2, &steps);
    fl_st_tensor_t ts[3];
    size_t nt = 0;
    ts[nt++] = (fl_st_tensor_t){"params", FL_FLOAT32, 1, {len}, params + off, len * 4};
    if (b1 != NULL)
        ts[nt++] = (fl_st_tensor_t){"opt.0", FL_FLOAT32, 1, {len}, b1 + r->at, len * 4};
    if (b2 != NULL)
        ts[nt++] = (fl_st_tensor_t){"opt.1", FL_FLOAT32, 1, {len}, b2 + r->at, len * 4};
    char so[32], sl[32], ss[32], st[32], se[32];
    snprintf(so, sizeof so, "%zu", off);
    snprintf(sl, sizeof sl, "%zu", len);
    snprintf(ss, sizeof ss, "%" PRIu64, steps);
    snprintf(st, sizeof st, "%ld", step);
    snprintf(se, sizeof se, "%d", epoch);
    fl_st_meta_t meta[6] = {{"flodl.offset", so},
                            {"flodl.length", sl},
                            {"flodl.opt_steps", ss},
                            {"flodl.step", st},
                            {"flodl.epoch", se},
                            {"flodl.optimizer", fl_opt_kind_name(o->opt.kind)}};
    char name[128];
    char path[4096];
    shard_name(name, sizeof name, step, rank, r->id);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return fl_st_write(path, ts, nt, meta, 6);
}

static int write_manifest(const char *dir, int world, const fl_wk_train_opts_t *o, size_t np,
                          long step, int epoch, double samples)
{
    int W = writers(o, world);
    fl_wk_range_t *one = malloc(FL_WK_MAX_RANGES * sizeof *one);
    int64_t *ranges = malloc((size_t)W * FL_WK_MAX_RANGES * 4 * sizeof *ranges);
    if (ranges == NULL || one == NULL) {
        free(one);
        free(ranges);
        return fl_fail(FL_ENOMEM, "checkpoint: out of memory");
    }
    size_t n = 0;
    for (int r = 0; r < W; r++) {
        int k = fl_wk_ranges(o, np, world, r, one);
        for (int i = 0; i < k; i++, n++) {
            int64_t *e = &ranges[n * 4];
            e[0] = r;
            e[1] = one[i].id;
            e[2] = (int64_t)one[i].off;
            e[3] = (int64_t)one[i].len;
        }
    }
    free(one);
    fl_st_tensor_t ts = {"ranges", FL_INT64, 2, {n, 4}, ranges, n * 4 * sizeof *ranges};
    char sig[32], snp[32], st[32], se[32], sw[32], sl[32], ss[40];
    snprintf(ss, sizeof ss, "%.0f", samples);
    snprintf(sig, sizeof sig, "%016" PRIx64, fl_mlp_signature(&o->shape));
    snprintf(snp, sizeof snp, "%zu", np);
    snprintf(st, sizeof st, "%ld", step);
    snprintf(se, sizeof se, "%d", epoch);
    snprintf(sw, sizeof sw, "%d", world);
    snprintf(sl, sizeof sl, "%d", o->replicas);
    fl_st_meta_t meta[9] = {{"flodl.model_signature", sig},
                            {"flodl.parameters", snp},
                            {"flodl.step", st},
                            {"flodl.epoch", se},
                            {"flodl.hosts", sw},
                            {"flodl.devices", sl},
                            {"flodl.shard", fl_wk_shard_name(o->shard)},
                            {"flodl.optimizer", fl_opt_kind_name(o->opt.kind)},
                            {"flodl.samples", ss}};
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, MANIFEST);
    int rc = fl_st_write(path, &ts, 1, meta, 9);
    free(ranges);
    return rc;
}

/* Whether name is a file of one step and rank: a range's, or the rank's own state
 * (ckpt_rank.c). */
static bool step_file(const char *name, long *s, int *r)
{
    int t;
    int end = 0;
    if (sscanf(name, "shard-s%ld-r%d-d%d.safetensors%n", s, r, &t, &end) == 3 && name[end] == '\0')
        return true;
    end = 0;
    return sscanf(name, "state-s%ld-r%d.safetensors%n", s, r, &end) == 2 && name[end] == '\0';
}

/* Removes every rank's files of steps other than step and keep (rank 0, once the manifest of
 * step is written: the ranks of an earlier layout included). */
static void prune(const char *dir, long step, long keep)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long s;
        int r;
        if (!step_file(e->d_name, &s, &r) || s == step || s == keep)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

typedef struct own_names {
    int rank;
} own_names_t;

/* Names only this rank writes: its ranges' files, and on rank 0 the manifest. */
static bool own_name(const char *name, void *ud)
{
    const own_names_t *o = ud;
    long s;
    int r;
    if (o->rank == 0 && strcmp(name, MANIFEST) == 0)
        return true;
    return step_file(name, &s, &r) && r == o->rank;
}

void fl_wk_ckpt_clean(const char *dir, int rank, bool quiet)
{
    own_names_t o = {rank};
    size_t n = 0;
    uint64_t bytes = 0;
    /* Best effort: the load or save that follows names a directory it cannot read. */
    if (fl_st_clean_tmp(dir, own_name, &o, &n, &bytes) == FL_OK && n > 0 && !quiet)
        printf("rank %d: removed %zu temporary file(s) of killed checkpoint writers from %s "
               "(%.1f MiB)\n",
               rank, n, dir, (double)bytes / 1048576.0);
}

/* The step of the manifest in dir, or -1. */
static long manifest_step(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, MANIFEST);
    fl_st_file_t *f = NULL;
    if (fl_st_open(path, MAX_FILE_BYTES, &f) != FL_OK)
        return -1;
    const char *v = fl_st_meta_get(f, "flodl.step");
    long s = v != NULL ? strtol(v, NULL, 10) : -1;
    fl_st_close(&f);
    return s;
}

int fl_wk_ckpt_mkdirs(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *c = p + 1; *c; c++) {
        if (*c != '/')
            continue;
        *c = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return -1;
        *c = '/';
    }
    return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* Every rank hears whether any failed (comm NULL: one host): this rank's own failure comes back
 * with its code and text; another's as FL_EPEER (not this rank's fault: fl_comm_abort), with
 * `other` after the lowest failing rank, which the allreduce carries as size - rank under MAX;
 * or the collective's error. */
static int agree(fl_comm_t *comm, int rc, const char *other)
{
    int size = comm != NULL ? fl_comm_size(comm) : 1;
    int rank = comm != NULL ? fl_comm_rank(comm) : 0;
    double failed = rc != FL_OK ? (double)(size - rank) : 0.0;
    char detail[1024] = "";
    if (rc != FL_OK)
        snprintf(detail, sizeof detail, "%s", fl_last_error());
    int crc;
    if (comm != NULL &&
        (crc = fl_allreduce(comm, &failed, &failed, 1, FL_FLOAT64, FL_MAX)) != FL_OK)
        return crc;
    if (rc != FL_OK)
        return fl_fail(rc, "%s", detail);
    if (failed > 0)
        return fl_fail(FL_EPEER, "rank %d %s", size - (int)failed, other);
    return FL_OK;
}

int fl_wk_ckpt_save(const char *dir, fl_comm_t *comm, int rank, int world,
                    const fl_wk_train_opts_t *o, const float *params, fl_opt_t *const *opts,
                    const fl_wk_rank_state_t *own, long step, int epoch, double samples)
{
    /* A failure here is still reported through the ranks' agreement below, so that no rank
     * is left waiting in it. */
    int rc = FL_OK;
    if (fl_wk_ckpt_mkdirs(dir) != 0)
        rc = fl_fail(FL_EIO, "--checkpoint: cannot make %s: %s", dir, strerror(errno));
    long previous = rc == FL_OK ? manifest_step(dir) : -1; /* keeps a failure's text */
    fl_wk_range_t *mine = malloc(FL_WK_MAX_RANGES * sizeof *mine);
    if (rc == FL_OK && mine == NULL)
        rc = fl_fail(FL_ENOMEM, "--checkpoint: out of memory");
    if (rc == FL_OK && rank < writers(o, world)) {
        int k = fl_wk_ranges(o, fl_mlp_nparams(&o->shape), world, rank, mine);
        for (int i = 0; i < k && rc == FL_OK; i++)
            rc = write_range(dir, rank, &mine[i], step, epoch, o, params, opts);
    }
    free(mine);
    if (rc == FL_OK && own != NULL)
        rc = fl_wk_ckpt_rank_save(dir, rank, world, o, step, own);
    /* Every rank says whether it wrote, so the manifest names only complete steps. */
    char other[4200];
    snprintf(other, sizeof other,
             "could not write its shards of step %ld (--checkpoint; its log says why)", step);
    if ((rc = agree(comm, rc, other)) != FL_OK)
        return rc;
    if (rank == 0)
        rc = write_manifest(dir, world, o, fl_mlp_nparams(&o->shape), step, epoch, samples);
    /* Everyone hears how the manifest went before pruning, and the next checkpoint reads it. */
    snprintf(other, sizeof other, "could not write the manifest of step %ld in %s (--checkpoint)",
             step, dir);
    if ((rc = agree(comm, rc, other)) != FL_OK)
        return rc;
    if (rank == 0)
        prune(dir, step, previous);
    return FL_OK;
}

/* ---- loading ---- */

static int meta_long(const fl_st_file_t *f, const char *path, const char *key, long *out)
{
    const char *v = fl_st_meta_get(f, key);
    char *end = NULL;
    if (v != NULL)
        *out = strtol(v, &end, 10);
    if (v == NULL || end == v || *end != '\0')
        return fl_fail(FL_EPROTO, "--resume: %s has no valid %s", path, key);
    return FL_OK;
}

/* Copies what saved range [soff, soff + slen) of src holds of [off, off + len) into dst
 * (indexed from off). */
static void overlap(size_t off, size_t len, size_t soff, size_t slen, const float *src, float *dst)
{
    size_t a = off > soff ? off : soff;
    size_t b = off + len < soff + slen ? off + len : soff + slen;
    if (a < b)
        memcpy(dst + (a - off), src + (a - soff), (b - a) * sizeof(float));
}

typedef struct loaded {
    fl_wk_range_t *mine; /* this rank's ranges */
    int nmine;
    int ndev;
    float *b1[FL_DEV_MAX_DEVICES]; /* device t's optimizer buffers, assembled */
    float *b2[FL_DEV_MAX_DEVICES];
    uint64_t steps;
    bool has1;
    bool has2;
} loaded_t;

/* One saved range: its parameters into params, its optimizer buffers into the ranges we own. */
static int take_file(const char *path, size_t np, float *params, uint8_t *pcov, loaded_t *ld,
                     bool first)
{
    fl_st_file_t *f = NULL;
    int rc = fl_st_open(path, MAX_FILE_BYTES, &f);
    if (rc != FL_OK)
        return rc;
    long off = 0;
    long len = 0;
    long steps = 0;
    const fl_st_tensor_t *p = fl_st_find(f, "params");
    const fl_st_tensor_t *o1 = fl_st_find(f, "opt.0");
    const fl_st_tensor_t *o2 = fl_st_find(f, "opt.1");
    if ((rc = meta_long(f, path, "flodl.offset", &off)) != FL_OK ||
        (rc = meta_long(f, path, "flodl.length", &len)) != FL_OK ||
        (rc = meta_long(f, path, "flodl.opt_steps", &steps)) != FL_OK)
        goto out;
    if (off < 0 || len < 0 || (size_t)off + (size_t)len > np || p == NULL ||
        p->dtype != FL_FLOAT32 || p->bytes != (size_t)len * 4 ||
        (o1 != NULL && o1->bytes != p->bytes) || (o2 != NULL && o2->bytes != p->bytes)) {
        rc = fl_fail(FL_EPROTO,
                     "--resume: %s: range %ld+%ld or its tensors do not fit %zu "
                     "parameters",
                     path, off, len, np);
        goto out;
    }
    if (first) {
        ld->has1 = o1 != NULL;
        ld->has2 = o2 != NULL;
        ld->steps = (uint64_t)steps;
    } else if (ld->has1 != (o1 != NULL) || ld->has2 != (o2 != NULL) ||
               ld->steps != (uint64_t)steps) {
        rc = fl_fail(FL_EPROTO,
                     "--resume: %s holds other optimizer state than the other "
                     "shards",
                     path);
        goto out;
    }
    memcpy(params + off, p->data, p->bytes);
    for (long i = 0; i < len; i++)
        pcov[off + i]++;
    for (int i = 0; i < ld->nmine; i++) {
        const fl_wk_range_t *r = &ld->mine[i];
        if (o1 != NULL)
            overlap(r->off, r->len, (size_t)off, (size_t)len, o1->data, ld->b1[r->dev] + r->at);
        if (o2 != NULL)
            overlap(r->off, r->len, (size_t)off, (size_t)len, o2->data, ld->b2[r->dev] + r->at);
    }
out:
    fl_st_close(&f);
    return rc;
}

static int check_manifest(const fl_st_file_t *m, const char *path, const fl_wk_train_opts_t *o,
                          size_t np)
{
    char sig[32];
    snprintf(sig, sizeof sig, "%016" PRIx64, fl_mlp_signature(&o->shape));
    const char *msig = fl_st_meta_get(m, "flodl.model_signature");
    if (msig == NULL || strcmp(msig, sig) != 0)
        return fl_fail(FL_EINVAL,
                       "--resume: %s is of another model (signature %s, this model "
                       "%s with %zu parameters)",
                       path, msig ? msig : "none", sig, np);
    const char *opt = fl_st_meta_get(m, "flodl.optimizer");
    if (opt == NULL || strcmp(opt, fl_opt_kind_name(o->opt.kind)) != 0)
        return fl_fail(FL_EINVAL, "--resume: %s was trained with optimizer %s, this run uses %s",
                       path, opt ? opt : "none", fl_opt_kind_name(o->opt.kind));
    return FL_OK;
}

int fl_wk_ckpt_load(const char *dir, const fl_wk_train_opts_t *o, int world, int rank,
                    float *params, fl_opt_t *const *opts, long *step, int *epoch, double *samples)
{
    size_t np = fl_mlp_nparams(&o->shape);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, MANIFEST);
    fl_st_file_t *m = NULL;
    int rc = fl_st_open(path, MAX_FILE_BYTES, &m);
    if (rc != FL_OK)
        return rc;
    long ep = 0;
    const fl_st_tensor_t *rt = fl_st_find(m, "ranges");
    if ((rc = check_manifest(m, path, o, np)) != FL_OK ||
        (rc = meta_long(m, path, "flodl.step", step)) != FL_OK ||
        (rc = meta_long(m, path, "flodl.epoch", &ep)) != FL_OK) {
        fl_st_close(&m);
        return rc;
    }
    if (rt == NULL || rt->dtype != FL_INT64 || rt->ndim != 2 || rt->shape[1] != 4) {
        fl_st_close(&m);
        return fl_fail(FL_EPROTO, "--resume: %s has no ranges table", path);
    }
    *epoch = (int)ep;
    const char *sv = fl_st_meta_get(m, "flodl.samples");
    *samples = sv != NULL ? strtod(sv, NULL) : 0.0;
    loaded_t ld;
    memset(&ld, 0, sizeof ld);
    uint8_t *pcov = calloc(np, 1);
    ld.mine = malloc(FL_WK_MAX_RANGES * sizeof *ld.mine);
    if (pcov == NULL || ld.mine == NULL)
        rc = fl_fail(FL_ENOMEM, "--resume: out of memory");
    else
        ld.nmine = fl_wk_ranges(o, np, world, rank, ld.mine);
    /* Each device's optimizer buffers whole (padding stays zero). */
    for (int i = 0; i < ld.nmine && rc == FL_OK; i++) {
        const fl_wk_range_t *r = &ld.mine[i];
        ld.ndev = r->dev + 1 > ld.ndev ? r->dev + 1 : ld.ndev;
        if (ld.b1[r->dev] != NULL)
            continue;
        ld.b1[r->dev] = calloc(r->opt_len, sizeof(float));
        ld.b2[r->dev] = calloc(r->opt_len, sizeof(float));
        if (ld.b1[r->dev] == NULL || ld.b2[r->dev] == NULL)
            rc = fl_fail(FL_ENOMEM, "--resume: out of memory");
    }
    const int64_t *e = rt->data;
    for (uint64_t i = 0; i < rt->shape[0] && rc == FL_OK; i++) {
        char name[128];
        shard_name(name, sizeof name, *step, (int)e[i * 4], (int)e[i * 4 + 1]);
        char fpath[4096];
        snprintf(fpath, sizeof fpath, "%s/%s", dir, name);
        rc = take_file(fpath, np, params, pcov, &ld, i == 0);
    }
    fl_st_close(&m);
    /* Every parameter in exactly one saved range: then every owned range is covered too. */
    for (size_t i = 0; rc == FL_OK && i < np; i++)
        if (pcov[i] != 1)
            rc = fl_fail(FL_EPROTO, "--resume: %s: parameter %zu is in %d saved ranges", dir, i,
                         pcov[i]);
    /* Every device's optimizer, also one whose pieces are all padding (its step count). */
    if (o->shard == FL_WK_SHARD_FULL)
        ld.ndev = o->replicas;
    for (int t = 0; t < ld.ndev && rc == FL_OK; t++)
        rc = fl_opt_restore(opts[t], ld.has1 ? ld.b1[t] : NULL, ld.has2 ? ld.b2[t] : NULL,
                            fl_opt_size(opts[t]), ld.steps);
    for (int t = 0; t < ld.ndev; t++) {
        free(ld.b1[t]);
        free(ld.b2[t]);
    }
    free(ld.mine);
    free(pcov);
    return rc;
}
