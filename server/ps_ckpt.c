/* Checkpoints of a parameter-server shard: one safetensors file per shard and step,
 * <dir>/shard-<i>-of-<S>.step-<t>.safetensors, written atomically (st_write.c: temporary file,
 * fsync, rename, fsync of the directory) with a CRC-32 over the data, keeping the newest K.
 * A file holds the parameters ("params"), the optimizer's buffers ("opt.buf1", "opt.buf2"
 * when it has them) and the ranks' clocks ("clocks", int64), and metadata naming the shard,
 * its key range, the step, the version, the optimizer and its step count. Reading trusts
 * nothing: a corrupt, truncated or foreign file is refused with the reason, and the caller
 * falls back to the previous one. */
#include "ps_int.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FORMAT "1"

static void path_of(const char *dir, uint32_t shard, uint32_t num_shards, uint64_t step, char *out,
                    size_t cap)
{
    snprintf(out, cap, "%s/shard-%u-of-%u.step-%012" PRIu64 ".safetensors", dir, shard, num_shards,
             step);
}

/* Parses "shard-<i>-of-<S>.step-<t>.safetensors": true with the three numbers. */
static bool parse_name(const char *name, uint32_t *shard, uint32_t *num, uint64_t *step)
{
    unsigned i, s;
    unsigned long long t;
    int end = 0;
    if (sscanf(name, "shard-%u-of-%u.step-%llu.safetensors%n", &i, &s, &t, &end) != 3 ||
        name[end] != '\0')
        return false;
    *shard = i;
    *num = s;
    *step = t;
    return true;
}

static int u64_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int fl_ps__ckpt_list(const char *dir, uint32_t shard, uint32_t num_shards, uint64_t *steps,
                     size_t cap, size_t *n, uint32_t *foreign)
{
    *n = 0;
    if (foreign != NULL)
        *foreign = 0;
    DIR *d = opendir(dir);
    if (d == NULL) {
        if (errno == ENOENT)
            return FL_OK;
        return fl_fail(FL_EIO, "checkpoint directory %s: %s", dir, strerror(errno));
    }
    size_t got = 0;
    uint64_t *all = NULL;
    size_t all_cap = 0;
    struct dirent *e;
    int rc = FL_OK;
    while ((e = readdir(d)) != NULL) {
        uint32_t i, s;
        uint64_t t;
        if (!parse_name(e->d_name, &i, &s, &t))
            continue;
        if (s != num_shards) {
            if (foreign != NULL && *foreign == 0)
                *foreign = s;
            continue;
        }
        if (i != shard)
            continue;
        if (got == all_cap) {
            size_t nc = all_cap ? all_cap * 2 : 16;
            uint64_t *na = realloc(all, nc * sizeof *na);
            if (na == NULL) {
                rc = fl_fail(FL_ENOMEM, "checkpoint directory %s: out of memory", dir);
                break;
            }
            all = na;
            all_cap = nc;
        }
        all[got++] = t;
    }
    closedir(d);
    if (rc == FL_OK && got > 0) {
        qsort(all, got, sizeof *all, u64_desc);
        *n = got < cap ? got : cap;
        memcpy(steps, all, *n * sizeof *steps);
    }
    free(all);
    return rc;
}

typedef struct served {
    uint32_t first, count, num_shards;
} served_t;

/* Checkpoint names of the shards this process serves: no other writes them. */
static bool served_name(const char *name, void *ud)
{
    const served_t *v = ud;
    uint32_t i, s;
    uint64_t t;
    return parse_name(name, &i, &s, &t) && s == v->num_shards && i >= v->first &&
           i - v->first < v->count;
}

int fl_ps__ckpt_clean(const char *dir, uint32_t first, uint32_t count, uint32_t num_shards,
                      size_t *nfiles, uint64_t *nbytes)
{
    served_t v = {first, count, num_shards};
    return fl_st_clean_tmp(dir, served_name, &v, nfiles, nbytes);
}

void fl_ps__ckpt_meta_init(ps_ckpt_meta_t *m)
{
    memset(m, 0, sizeof *m);
}

int fl_ps__ckpt_write(const char *dir, const ps_ckpt_meta_t *m, const float *params,
                      const float *buf1, const float *buf2, const uint64_t *clocks, size_t nclocks,
                      int keep)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return fl_fail(FL_EIO, "checkpoint directory %s: %s", dir, strerror(errno));
    fl_st_tensor_t t[4];
    size_t nt = 0;
    size_t bytes = (size_t)m->count * sizeof(float);
    t[nt++] = (fl_st_tensor_t){"params", FL_FLOAT32, 1, {m->count}, params, bytes};
    if (buf1 != NULL)
        t[nt++] = (fl_st_tensor_t){"opt.buf1", FL_FLOAT32, 1, {m->count}, buf1, bytes};
    if (buf2 != NULL)
        t[nt++] = (fl_st_tensor_t){"opt.buf2", FL_FLOAT32, 1, {m->count}, buf2, bytes};
    t[nt++] = (fl_st_tensor_t){"clocks", FL_INT64, 1, {nclocks}, clocks, nclocks * sizeof *clocks};
    char v[10][32];
    snprintf(v[0], sizeof v[0], "%u", m->shard);
    snprintf(v[1], sizeof v[1], "%u", m->num_shards);
    snprintf(v[2], sizeof v[2], "%" PRIu64, m->offset);
    snprintf(v[3], sizeof v[3], "%" PRIu64, m->count);
    snprintf(v[4], sizeof v[4], "%" PRIu64, m->param_count);
    snprintf(v[5], sizeof v[5], "%" PRIu64, m->step);
    snprintf(v[6], sizeof v[6], "%" PRIu64, m->version);
    snprintf(v[7], sizeof v[7], "%" PRIu64, m->opt_steps);
    snprintf(v[8], sizeof v[8], "%s", fl_opt_kind_name(m->opt));
    snprintf(v[9], sizeof v[9], "%s", fl_ps_consistency_name(m->consistency));
    const fl_st_meta_t meta[] = {
        {"flodl.ps.format", FORMAT},    {"flodl.ps.shard", v[0]},
        {"flodl.ps.num_shards", v[1]},  {"flodl.ps.offset", v[2]},
        {"flodl.ps.count", v[3]},       {"flodl.ps.param_count", v[4]},
        {"flodl.ps.step", v[5]},        {"flodl.ps.version", v[6]},
        {"flodl.ps.opt_steps", v[7]},   {"flodl.ps.optimizer", v[8]},
        {"flodl.ps.consistency", v[9]},
    };
    char path[4096];
    path_of(dir, m->shard, m->num_shards, m->step, path, sizeof path);
    int rc = fl_st_write(path, t, nt, meta, sizeof meta / sizeof meta[0]);
    if (rc != FL_OK)
        return rc;
    /* Keep the newest `keep`: older files go, the one just written never does. */
    uint64_t steps[256];
    size_t n = 0;
    if (keep > 0 && fl_ps__ckpt_list(dir, m->shard, m->num_shards, steps, 256, &n, NULL) == FL_OK) {
        for (size_t i = (size_t)keep; i < n; i++) {
            if (steps[i] == m->step)
                continue;
            path_of(dir, m->shard, m->num_shards, steps[i], path, sizeof path);
            unlink(path);
        }
    }
    return FL_OK;
}

static int meta_u64(const fl_st_file_t *f, const char *path, const char *key, uint64_t *out)
{
    const char *s = fl_st_meta_get(f, key);
    char *end = NULL;
    if (s == NULL || s[0] == '\0' || s[0] == '-')
        return fl_fail(FL_EPROTO, "checkpoint %s: metadata %s missing", path, key);
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return fl_fail(FL_EPROTO, "checkpoint %s: metadata %s = '%s' is not a number", path, key,
                       s);
    *out = v;
    return FL_OK;
}

/* A float32 tensor of exactly count entries, or NULL with why. */
static const float *tensor_f32(const fl_st_file_t *f, const char *path, const char *name,
                               uint64_t count, bool required, int *rc)
{
    const fl_st_tensor_t *t = fl_st_find(f, name);
    if (t == NULL) {
        if (required)
            *rc = fl_fail(FL_EPROTO, "checkpoint %s: tensor %s missing", path, name);
        return NULL;
    }
    if (t->dtype != FL_FLOAT32 || t->ndim != 1 || t->shape[0] != count) {
        *rc = fl_fail(FL_EPROTO, "checkpoint %s: tensor %s is not float32 [%" PRIu64 "]", path,
                      name, count);
        return NULL;
    }
    return t->data;
}

int fl_ps__ckpt_open(const char *dir, uint32_t shard, uint32_t num_shards, uint64_t step,
                     ps_ckpt_t *out)
{
    memset(out, 0, sizeof *out);
    path_of(dir, shard, num_shards, step, out->path, sizeof out->path);
    int rc = fl_st_open(out->path, 0, &out->file);
    if (rc != FL_OK)
        return rc;
    const fl_st_file_t *f = out->file;
    const char *path = out->path;
    ps_ckpt_meta_t *m = &out->meta;
    uint64_t v;
    const char *fmt = fl_st_meta_get(f, "flodl.ps.format");
    if (fmt == NULL || strcmp(fmt, FORMAT) != 0) {
        rc = fl_fail(FL_EPROTO,
                     "checkpoint %s: not a flodl parameter-server checkpoint "
                     "(format '%s')",
                     path, fmt ? fmt : "none");
        goto fail;
    }
    if (!fl_st_verified(f)) {
        rc = fl_fail(FL_EPROTO, "checkpoint %s: no checksum", path);
        goto fail;
    }
    if ((rc = meta_u64(f, path, "flodl.ps.shard", &v)) != FL_OK)
        goto fail;
    m->shard = (uint32_t)v;
    if ((rc = meta_u64(f, path, "flodl.ps.num_shards", &v)) != FL_OK)
        goto fail;
    m->num_shards = (uint32_t)v;
    if ((rc = meta_u64(f, path, "flodl.ps.offset", &m->offset)) != FL_OK ||
        (rc = meta_u64(f, path, "flodl.ps.count", &m->count)) != FL_OK ||
        (rc = meta_u64(f, path, "flodl.ps.param_count", &m->param_count)) != FL_OK ||
        (rc = meta_u64(f, path, "flodl.ps.step", &m->step)) != FL_OK ||
        (rc = meta_u64(f, path, "flodl.ps.version", &m->version)) != FL_OK ||
        (rc = meta_u64(f, path, "flodl.ps.opt_steps", &m->opt_steps)) != FL_OK)
        goto fail;
    if (m->shard != shard || m->num_shards != num_shards || m->step != step) {
        rc = fl_fail(FL_EPROTO, "checkpoint %s: its metadata says shard %u of %u, step %" PRIu64,
                     path, m->shard, m->num_shards, m->step);
        goto fail;
    }
    if (m->offset > m->param_count || m->count > m->param_count - m->offset) {
        rc = fl_fail(FL_EPROTO,
                     "checkpoint %s: range %" PRIu64 "+%" PRIu64 " outside %" PRIu64 " parameters",
                     path, m->offset, m->count, m->param_count);
        goto fail;
    }
    const char *opt = fl_st_meta_get(f, "flodl.ps.optimizer");
    if (opt == NULL || fl_opt_kind_parse(opt, &m->opt) != FL_OK) {
        rc = fl_fail(FL_EPROTO, "checkpoint %s: unknown optimizer '%s'", path, opt ? opt : "");
        goto fail;
    }
    const char *cons = fl_st_meta_get(f, "flodl.ps.consistency");
    if (cons == NULL || fl_ps_consistency_parse(cons, &m->consistency) != FL_OK) {
        rc = fl_fail(FL_EPROTO, "checkpoint %s: unknown consistency '%s'", path, cons ? cons : "");
        goto fail;
    }
    rc = FL_OK;
    out->params = tensor_f32(f, path, "params", m->count, true, &rc);
    if (rc == FL_OK)
        out->buf1 = tensor_f32(f, path, "opt.buf1", m->count, false, &rc);
    if (rc == FL_OK)
        out->buf2 = tensor_f32(f, path, "opt.buf2", m->count, false, &rc);
    if (rc != FL_OK)
        goto fail;
    const fl_st_tensor_t *c = fl_st_find(f, "clocks");
    if (c == NULL || c->dtype != FL_INT64 || c->ndim != 1 || c->shape[0] == 0) {
        rc = fl_fail(FL_EPROTO, "checkpoint %s: tensor clocks missing or not int64 [W]", path);
        goto fail;
    }
    out->clocks = c->data;
    out->nclocks = (size_t)c->shape[0];
    return FL_OK;
fail:
    fl_st_close(&out->file);
    return rc;
}

void fl_ps__ckpt_close(ps_ckpt_t *c)
{
    fl_st_close(&c->file);
    memset(c, 0, sizeof *c);
}

int fl_ps__ckpt_valid_steps(const char *dir, uint32_t shard, uint32_t num_shards, fl_ctx_t *ctx,
                            uint64_t *steps, size_t cap, size_t *n, uint64_t *param_count)
{
    *n = 0;
    uint64_t found[256];
    size_t nf = 0;
    uint32_t foreign = 0;
    int rc = fl_ps__ckpt_list(dir, shard, num_shards, found, 256, &nf, &foreign);
    if (rc != FL_OK)
        return rc;
    if (nf == 0 && foreign != 0)
        return fl_fail(FL_EINVAL,
                       "checkpoint directory %s holds checkpoints of a job with %u "
                       "shards; this one has %u (re-sharding a checkpoint is not "
                       "supported: use the same --num-shards)",
                       dir, foreign, num_shards);
    for (size_t i = 0; i < nf && *n < cap; i++) {
        ps_ckpt_t c;
        if (fl_ps__ckpt_open(dir, shard, num_shards, found[i], &c) != FL_OK) {
            FL_WARN(ctx, "refusing a checkpoint, falling back to an older one: %s",
                    fl_last_error());
            continue;
        }
        if (*param_count == 0)
            *param_count = c.meta.param_count;
        if (c.meta.param_count != *param_count) {
            FL_WARN(ctx, "refusing checkpoint %s: %" PRIu64 " parameters, newer ones have %" PRIu64,
                    c.path, c.meta.param_count, *param_count);
            fl_ps__ckpt_close(&c);
            continue;
        }
        steps[(*n)++] = found[i];
        fl_ps__ckpt_close(&c);
    }
    return FL_OK;
}
