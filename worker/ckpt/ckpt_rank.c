/* A rank's own training state in a checkpoint, beside the range files of shard_ckpt.c: the
 * error-feedback residuals of its exchanges (what top-k has not sent yet, different on every
 * rank and device) and local SGD's optimizer of each device. One file per rank and step,
 * state-s<step>-r<rank>.safetensors, written before the manifest (shard_ckpt.c prunes it with
 * the step's other files). It only means something in the layout it was taken in, so a resume
 * into other hosts, devices or hierarchy starts these at zero (the ranges still reshard). */
#include "wk_ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_FILE_BYTES ((size_t)1 << 40)

static void state_path(char *out, size_t cap, const char *dir, long step, int rank)
{
    snprintf(out, cap, "%s/state-s%ld-r%d.safetensors", dir, step, rank);
}

static const char *hier_name(const fl_wk_train_opts_t *o)
{
    return o->hierarchy == FL_WK_HIER_FLAT ? "flat" : "hybrid";
}

/* A residual per exchange and two buffers per optimizer, one of each per device at most; the
 * layout's four keys, and a key per residual and per optimizer. */
#define MAX_TENSORS (FL_DEV_MAX_DEVICES + 2 * FL_DEV_MAX_DEVICES)
#define MAX_META (4 + FL_DEV_MAX_DEVICES + FL_DEV_MAX_DEVICES)

int fl_wk_ckpt_rank_save(const char *dir, int rank, int world, const fl_wk_train_opts_t *o,
                         long step, const fl_wk_rank_state_t *s)
{
    fl_st_tensor_t ts[MAX_TENSORS];
    fl_st_meta_t meta[MAX_META];
    char names[MAX_TENSORS][32];
    char keys[MAX_META][40];
    char vals[MAX_META][48];
    float *bufs[FL_DEV_MAX_DEVICES] = {0};
    size_t nt = 0;
    size_t nm = 0;
    int rc = FL_OK;
    for (int j = 0; j < s->nx && j < FL_DEV_MAX_DEVICES && rc == FL_OK; j++) {
        fl_wk_xchg_t *x = s->xchg[j];
        if (!fl_wk_xchg_has_residual(x))
            continue;
        size_t from;
        size_t n;
        fl_wk_xchg_range(x, &from, &n);
        if ((bufs[j] = malloc((n ? n : 1) * sizeof(float))) == NULL) {
            rc = fl_fail(FL_ENOMEM, "--checkpoint: out of memory for the residuals");
            break;
        }
        if ((rc = fl_wk_xchg_residual_get(x, bufs[j])) != FL_OK)
            break;
        snprintf(names[nt], sizeof names[nt], "ef.%d", j);
        ts[nt] = (fl_st_tensor_t){names[nt], FL_FLOAT32, 1, {n}, bufs[j], n * sizeof(float)};
        nt++;
        snprintf(keys[nm], sizeof keys[nm], "flodl.ef.%d.offset", j);
        snprintf(vals[nm], sizeof vals[nm], "%zu", from);
        meta[nm] = (fl_st_meta_t){keys[nm], vals[nm]};
        nm++;
    }
    for (int j = 0; j < s->nopt && j < FL_DEV_MAX_DEVICES && rc == FL_OK; j++) {
        const float *b1;
        const float *b2;
        uint64_t steps;
        fl_opt_state(s->opt[j], &b1, &b2, &steps);
        size_t n = fl_opt_size(s->opt[j]);
        const float *b[2] = {b1, b2};
        for (int k = 0; k < 2; k++) {
            if (b[k] == NULL)
                continue;
            snprintf(names[nt], sizeof names[nt], "opt.%d.%d", j, k);
            ts[nt] = (fl_st_tensor_t){names[nt], FL_FLOAT32, 1, {n}, b[k], n * sizeof(float)};
            nt++;
        }
        snprintf(keys[nm], sizeof keys[nm], "flodl.opt.%d.steps", j);
        snprintf(vals[nm], sizeof vals[nm], "%" PRIu64, steps);
        meta[nm] = (fl_st_meta_t){keys[nm], vals[nm]};
        nm++;
    }
    if (rc == FL_OK && nt + (size_t)s->nopt > 0) {
        snprintf(vals[nm], sizeof vals[nm], "%d", world);
        meta[nm++] = (fl_st_meta_t){"flodl.hosts", vals[nm - 1]};
        snprintf(vals[nm], sizeof vals[nm], "%d", o->replicas);
        meta[nm++] = (fl_st_meta_t){"flodl.devices", vals[nm - 1]};
        meta[nm++] = (fl_st_meta_t){"flodl.hierarchy", hier_name(o)};
        snprintf(vals[nm], sizeof vals[nm], "%d", s->nopt);
        meta[nm++] = (fl_st_meta_t){"flodl.local_optimizers", vals[nm - 1]};
        char path[4096];
        state_path(path, sizeof path, dir, step, rank);
        rc = fl_st_write(path, ts, nt, meta, nm);
    }
    for (int j = 0; j < FL_DEV_MAX_DEVICES; j++)
        free(bufs[j]);
    return rc;
}

static bool meta_is(const fl_st_file_t *f, const char *key, const char *want)
{
    const char *v = fl_st_meta_get(f, key);
    return v != NULL && strcmp(v, want) == 0;
}

/* Whether the file was taken in this layout, every exchange with the range it has now. */
static bool same_layout(const fl_st_file_t *f, int world, const fl_wk_train_opts_t *o,
                        const fl_wk_rank_state_t *s)
{
    char w[16];
    char l[16];
    char n[16];
    snprintf(w, sizeof w, "%d", world);
    snprintf(l, sizeof l, "%d", o->replicas);
    snprintf(n, sizeof n, "%d", s->nopt);
    if (!meta_is(f, "flodl.hosts", w) || !meta_is(f, "flodl.devices", l) ||
        !meta_is(f, "flodl.hierarchy", hier_name(o)) || !meta_is(f, "flodl.local_optimizers", n))
        return false;
    for (int j = 0; j < s->nx && j < FL_DEV_MAX_DEVICES; j++) {
        fl_wk_xchg_t *x = s->xchg[j];
        char name[32];
        snprintf(name, sizeof name, "ef.%d", j);
        const fl_st_tensor_t *t = fl_st_find(f, name);
        if (!fl_wk_xchg_has_residual(x)) {
            if (t != NULL)
                return false;
            continue;
        }
        size_t from;
        size_t cnt;
        fl_wk_xchg_range(x, &from, &cnt);
        char key[40];
        char off[32];
        snprintf(key, sizeof key, "flodl.ef.%d.offset", j);
        snprintf(off, sizeof off, "%zu", from);
        if (t == NULL || t->dtype != FL_FLOAT32 || t->bytes != cnt * sizeof(float) ||
            !meta_is(f, key, off))
            return false;
    }
    return true;
}

static int restore_opt(const fl_st_file_t *f, const char *path, int j, fl_opt_t *opt)
{
    char n0[32];
    char n1[32];
    char key[40];
    snprintf(n0, sizeof n0, "opt.%d.0", j);
    snprintf(n1, sizeof n1, "opt.%d.1", j);
    snprintf(key, sizeof key, "flodl.opt.%d.steps", j);
    const fl_st_tensor_t *t0 = fl_st_find(f, n0);
    const fl_st_tensor_t *t1 = fl_st_find(f, n1);
    const char *sv = fl_st_meta_get(f, key);
    size_t n = fl_opt_size(opt);
    const float *b1;
    const float *b2;
    uint64_t steps;
    fl_opt_state(opt, &b1, &b2, &steps);
    if (sv == NULL || (t0 == NULL) != (b1 == NULL) || (t1 == NULL) != (b2 == NULL) ||
        (t0 != NULL && t0->bytes != n * sizeof(float)) ||
        (t1 != NULL && t1->bytes != n * sizeof(float)))
        return fl_fail(FL_EPROTO,
                       "--resume: %s: device %d's optimizer state does not fit this "
                       "run's optimizer",
                       path, j);
    return fl_opt_restore(opt, t0 ? t0->data : NULL, t1 ? t1->data : NULL, n,
                          strtoull(sv, NULL, 10));
}

int fl_wk_ckpt_rank_load(const char *dir, int rank, int world, const fl_wk_train_opts_t *o,
                         long step, fl_wk_rank_state_t *s, bool *restored)
{
    *restored = false;
    char path[4096];
    state_path(path, sizeof path, dir, step, rank);
    fl_st_file_t *f = NULL;
    if (fl_st_open(path, MAX_FILE_BYTES, &f) != FL_OK)
        return FL_OK; /* none: a checkpoint of a dense run, or of an older flodl */
    int rc = FL_OK;
    if (same_layout(f, world, o, s)) {
        for (int j = 0; j < s->nx && j < FL_DEV_MAX_DEVICES && rc == FL_OK; j++) {
            char name[32];
            snprintf(name, sizeof name, "ef.%d", j);
            const fl_st_tensor_t *t = fl_st_find(f, name);
            if (t != NULL)
                rc = fl_wk_xchg_residual_put(s->xchg[j], t->data);
        }
        for (int j = 0; j < s->nopt && rc == FL_OK; j++)
            rc = restore_opt(f, path, j, s->opt[j]);
        *restored = rc == FL_OK;
    }
    fl_st_close(&f);
    return rc;
}

int fl_wk_ckpt_rank_resume(const fl_wk_train_opts_t *o, int rank, int world, long step,
                           fl_wk_rank_state_t *s)
{
    bool restored = false;
    int rc = fl_wk_ckpt_rank_load(o->resume_dir, rank, world, o, step, s, &restored);
    bool any = s->nopt > 0;
    for (int j = 0; j < s->nx; j++)
        any = any || fl_wk_xchg_has_residual(s->xchg[j]);
    if (rc == FL_OK && any && !restored && rank == 0 && !o->quiet)
        printf("--resume: %s holds no %s of this layout (hosts, devices, hierarchy): they "
               "start afresh\n",
               o->resume_dir,
               s->nopt > 0 ? "per-device optimizer state" : "error-feedback residuals");
    return rc;
}

/* ---- --mode ps: the worker's one residual, by the server's step ---- */

/* Removes rank's state files of steps other than step and keep. */
static void prune_rank(const char *dir, int rank, long step, long keep)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long s;
        int r;
        int end = 0;
        if (sscanf(e->d_name, "state-s%ld-r%d.safetensors%n", &s, &r, &end) != 2 ||
            e->d_name[end] != '\0' || r != rank || s == step || s == keep)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

int fl_wk_ckpt_efs_save(const char *dir, int rank, long step, long keep,
                        const fl_cmp_ef_t *const *ef, int nef)
{
    if (nef < 1 || nef > FL_DEV_MAX_DEVICES)
        return fl_fail(FL_EINVAL, "--checkpoint: %d residuals outside 1..%d", nef,
                       FL_DEV_MAX_DEVICES);
    if (fl_wk_ckpt_mkdirs(dir) != 0)
        return fl_fail(FL_EIO, "--checkpoint: cannot make %s: %s", dir, strerror(errno));
    fl_st_tensor_t ts[2 * FL_DEV_MAX_DEVICES]; /* a residual and its velocity per device */
    char names[2 * FL_DEV_MAX_DEVICES][32];
    size_t nt = 0;
    for (int j = 0; j < nef; j++) {
        const float *r;
        const float *v;
        size_t n;
        fl_cmp_ef_state(ef[j], &r, &v, &n);
        snprintf(names[nt], sizeof names[nt], "ef.%d", j);
        ts[nt] = (fl_st_tensor_t){names[nt], FL_FLOAT32, 1, {n}, r, n * sizeof(float)};
        nt++;
        if (v != NULL) {
            snprintf(names[nt], sizeof names[nt], "ef.%d.velocity", j);
            ts[nt] = (fl_st_tensor_t){names[nt], FL_FLOAT32, 1, {n}, v, n * sizeof(float)};
            nt++;
        }
    }
    char st[32], ne[16];
    snprintf(st, sizeof st, "%ld", step);
    snprintf(ne, sizeof ne, "%d", nef);
    /* One residual: the file a single client writes (no count, as before device clients). */
    fl_st_meta_t meta[3] = {{"flodl.mode", "ps"}, {"flodl.step", st}, {"flodl.ps.devices", ne}};
    char path[4096];
    state_path(path, sizeof path, dir, step, rank);
    int rc = fl_st_write(path, ts, nt, meta, nef > 1 ? 3 : 2);
    if (rc == FL_OK)
        prune_rank(dir, rank, step, keep);
    return rc;
}

int fl_wk_ckpt_ef_save(const char *dir, int rank, long step, long keep, const fl_cmp_ef_t *ef)
{
    return fl_wk_ckpt_efs_save(dir, rank, step, keep, &ef, 1);
}

int fl_wk_ckpt_efs_load(const char *dir, int rank, long step, fl_cmp_ef_t *const *ef, int nef,
                        bool *restored)
{
    *restored = false;
    char path[4096];
    state_path(path, sizeof path, dir, step, rank);
    fl_st_file_t *f = NULL;
    if (fl_st_open(path, MAX_FILE_BYTES, &f) != FL_OK)
        return FL_OK; /* none for this step: the server resumed from another */
    char ne[16];
    snprintf(ne, sizeof ne, "%d", nef);
    bool same = meta_is(f, "flodl.mode", "ps") &&
                (nef > 1 ? meta_is(f, "flodl.ps.devices", ne) : fl_st_find(f, "ef.1") == NULL);
    /* Every residual is checked before any is restored: a file of another split changes
     * nothing. */
    const fl_st_tensor_t *t[FL_DEV_MAX_DEVICES];
    const fl_st_tensor_t *tv[FL_DEV_MAX_DEVICES];
    for (int j = 0; same && j < nef; j++) {
        const float *r;
        const float *v;
        size_t n;
        char name[32];
        fl_cmp_ef_state(ef[j], &r, &v, &n);
        snprintf(name, sizeof name, "ef.%d", j);
        t[j] = fl_st_find(f, name);
        snprintf(name, sizeof name, "ef.%d.velocity", j);
        tv[j] = fl_st_find(f, name);
        same = t[j] != NULL && t[j]->dtype == FL_FLOAT32 && t[j]->bytes == n * sizeof(float) &&
               (tv[j] == NULL || tv[j]->bytes == t[j]->bytes);
    }
    int rc = FL_OK;
    for (int j = 0; same && j < nef && rc == FL_OK; j++) {
        size_t n = t[j]->bytes / sizeof(float);
        rc = fl_cmp_ef_restore(ef[j], t[j]->data, tv[j] != NULL ? tv[j]->data : NULL, n);
    }
    *restored = same && rc == FL_OK;
    fl_st_close(&f);
    return rc;
}

int fl_wk_ckpt_ef_load(const char *dir, int rank, long step, fl_cmp_ef_t *ef, bool *restored)
{
    return fl_wk_ckpt_efs_load(dir, rank, step, &ef, 1, restored);
}
