/* safetensors writing: validates tensors and metadata, builds the JSON header (with flodl's
 * CRC-32 of the data section), and replaces the file atomically: temporary file, fsync,
 * rename, directory fsync; and removes the temporary files of writers that were killed.
 * Reading and checking files is st_read.c; fl_core.h describes the format. Data is written
 * from host memory as it lies, so the host must be little-endian. */
#include "fl_core.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <zlib.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian: a big-endian host needs byte swapping here"
#endif

/* Readers (ours, Python's json) parse numbers as doubles: beyond 2^53 they are not exact. */
#define DIM_LIMIT (UINT64_C(1) << 53)

/* The temporary file of path is path TMP_MARK pid. */
#define TMP_MARK ".tmp."

/* write(2) moves at most about 2 GiB at once on Linux; larger calls just return short. */
#define WRITE_CHUNK ((size_t)1 << 30)

static const struct {
    fl_dtype_t dtype;
    const char *name;
} st_dtypes[] = {
    {FL_FLOAT32, "F32"}, {FL_FLOAT16, "F16"}, {FL_BFLOAT16, "BF16"}, {FL_FLOAT64, "F64"},
    {FL_INT32, "I32"},   {FL_INT64, "I64"},   {FL_UINT8, "U8"},
};

const char *fl_st_dtype_name(fl_dtype_t dtype)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (st_dtypes[i].dtype == dtype)
            return st_dtypes[i].name;
    return NULL;
}

int fl_st_dtype_parse(const char *s, fl_dtype_t *out)
{
    for (size_t i = 0; s != NULL && i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = st_dtypes[i].dtype;
            return FL_OK;
        }
    }
    return fl_fail(FL_EINVAL, "safetensors dtype '%s' is not one of F32|F16|BF16|F64|I32|I64|U8",
                   s ? s : "(null)");
}

/* Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF): the header is
 * JSON, which other readers (Rust's serde, Python's json) decode as UTF-8 and refuse if not. */
static bool utf8_valid(const char *s)
{
    static const uint32_t least[] = {0, 0x80, 0x800, 0x10000};
    const unsigned char *p = (const unsigned char *)s;

    while (*p != 0) {
        unsigned c = *p;
        size_t more;
        uint32_t cp;
        if (c < 0x80) {
            p++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            more = 1;
            cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            more = 2;
            cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            more = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        for (size_t i = 1; i <= more; i++) {
            if ((p[i] & 0xc0) != 0x80) /* also stops at the terminator */
                return false;
            cp = (cp << 6) | (p[i] & 0x3fu);
        }
        if (cp < least[more] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        p += more + 1;
    }
    return true;
}

static void fmt_shape(char *out, size_t cap, const uint64_t *shape, size_t ndim)
{
    size_t n = (size_t)snprintf(out, cap, "[");
    for (size_t d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, "%s%" PRIu64, d ? ", " : "", shape[d]);
    if (n < cap)
        snprintf(out + n, cap - n, "]");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorts names in place and returns one that appears twice, or NULL. */
static const char *find_duplicate(const char **names, size_t n)
{
    qsort(names, n, sizeof names[0], cmp_str);
    for (size_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            return names[i];
    return NULL;
}

static int check_tensor(const char *path, const fl_st_tensor_t *t, size_t i)
{
    if (t->name == NULL || t->name[0] == '\0')
        return fl_fail(FL_EINVAL, "checkpoint %s: tensor #%zu has an empty name", path, i);
    if (!utf8_valid(t->name))
        return fl_fail(FL_EINVAL, "checkpoint %s: tensor #%zu: name is not valid UTF-8", path, i);
    if (strcmp(t->name, "__metadata__") == 0)
        return fl_fail(FL_EINVAL,
                       "checkpoint %s: tensor #%zu: the name '__metadata__' is "
                       "reserved for the metadata",
                       path, i);
    const char *st_name = fl_st_dtype_name(t->dtype);
    if (st_name == NULL)
        return fl_fail(FL_EINVAL, "checkpoint %s: tensor '%s': invalid dtype %d", path, t->name,
                       (int)t->dtype);
    if (t->ndim > FL_ST_MAX_DIMS)
        return fl_fail(FL_EINVAL, "checkpoint %s: tensor '%s': %zu dimensions, at most %d", path,
                       t->name, t->ndim, FL_ST_MAX_DIMS);

    char shape[256];
    fmt_shape(shape, sizeof shape, t->shape, t->ndim);
    bool zero = false;
    for (size_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] >= DIM_LIMIT)
            return fl_fail(FL_EINVAL,
                           "checkpoint %s: tensor '%s': shape %s: dimensions must be "
                           "below 2^53",
                           path, t->name, shape);
        zero = zero || t->shape[d] == 0;
    }
    /* With a 0 in the shape the others may be anything; otherwise the product must fit. */
    uint64_t need = 0;
    if (!zero) {
        need = fl_dtype_size(t->dtype);
        for (size_t d = 0; d < t->ndim; d++) {
            if (t->shape[d] > SIZE_MAX / need)
                return fl_fail(FL_EINVAL,
                               "checkpoint %s: tensor '%s': shape %s of %s does not "
                               "fit in memory",
                               path, t->name, shape, st_name);
            need *= t->shape[d];
        }
    }
    if (t->bytes != need)
        return fl_fail(FL_EINVAL,
                       "checkpoint %s: tensor '%s': %zu bytes, but shape %s of %s "
                       "needs %" PRIu64,
                       path, t->name, t->bytes, shape, st_name, need);
    if (t->bytes > 0 && t->data == NULL)
        return fl_fail(FL_EINVAL, "checkpoint %s: tensor '%s': data is NULL", path, t->name);
    return FL_OK;
}

static int check_meta(const char *path, const fl_st_meta_t *m)
{
    if (m->key == NULL || m->key[0] == '\0')
        return fl_fail(FL_EINVAL, "checkpoint %s: metadata with an empty key", path);
    if (m->value == NULL)
        return fl_fail(FL_EINVAL, "checkpoint %s: metadata '%s': value is NULL", path, m->key);
    if (!utf8_valid(m->key) || !utf8_valid(m->value))
        return fl_fail(FL_EINVAL, "checkpoint %s: metadata '%s': not valid UTF-8", path, m->key);
    if (strcmp(m->key, "flodl.crc32") == 0 || strcmp(m->key, "flodl.format") == 0)
        return fl_fail(FL_EINVAL, "checkpoint %s: metadata '%s' is reserved: flodl sets it", path,
                       m->key);
    return FL_OK;
}

static int validate(const char *path, const fl_st_tensor_t *t, size_t nt, const fl_st_meta_t *meta,
                    size_t nmeta)
{
    int rc = FL_OK;
    for (size_t i = 0; i < nt && rc == FL_OK; i++)
        rc = check_tensor(path, &t[i], i);
    for (size_t i = 0; i < nmeta && rc == FL_OK; i++)
        rc = check_meta(path, &meta[i]);
    if (rc != FL_OK)
        return rc;

    size_t most = nt > nmeta ? nt : nmeta;
    const char **names = malloc((most ? most : 1) * sizeof *names);
    if (names == NULL)
        return fl_fail(FL_ENOMEM, "checkpoint %s: out of memory", path);
    for (size_t i = 0; i < nt; i++)
        names[i] = t[i].name;
    const char *dup = find_duplicate(names, nt);
    if (dup != NULL) {
        rc = fl_fail(FL_EINVAL, "checkpoint %s: tensor name '%s' appears twice", path, dup);
    } else {
        for (size_t i = 0; i < nmeta; i++)
            names[i] = meta[i].key;
        dup = find_duplicate(names, nmeta);
        if (dup != NULL)
            rc = fl_fail(FL_EINVAL, "checkpoint %s: metadata key '%s' appears twice", path, dup);
    }
    free(names);
    return rc;
}

/* Integers go in as raw text: cJSON prints numbers through double, and past 10^15 it may
 * choose an exponent form that no reader takes as an integer. */
static bool add_u64(cJSON *array, uint64_t v)
{
    char text[24];
    snprintf(text, sizeof text, "%" PRIu64, v);
    cJSON *item = cJSON_CreateRaw(text);
    return item != NULL && cJSON_AddItemToArray(array, item);
}

static bool add_tensor(cJSON *root, const fl_st_tensor_t *t, uint64_t begin)
{
    cJSON *e = cJSON_AddObjectToObject(root, t->name);
    if (e == NULL || cJSON_AddStringToObject(e, "dtype", fl_st_dtype_name(t->dtype)) == NULL)
        return false;
    cJSON *shape = cJSON_AddArrayToObject(e, "shape");
    cJSON *offsets = cJSON_AddArrayToObject(e, "data_offsets");
    bool ok = shape != NULL && offsets != NULL;
    for (size_t d = 0; d < t->ndim && ok; d++)
        ok = add_u64(shape, t->shape[d]);
    return ok && add_u64(offsets, begin) && add_u64(offsets, begin + t->bytes);
}

/* The 8-byte length and the JSON, padded with spaces so the data section starts 8-aligned.
 * Metadata first, then the tensors in data order (JSON objects keep insertion order here). */
static int build_header(const char *path, const fl_st_tensor_t *t, size_t nt,
                        const fl_st_meta_t *meta, size_t nmeta, uint32_t crc, char **out,
                        size_t *out_len)
{
    char crc_hex[16];
    snprintf(crc_hex, sizeof crc_hex, "%08" PRIx32, crc);
    cJSON *root = cJSON_CreateObject();
    cJSON *md = root ? cJSON_AddObjectToObject(root, "__metadata__") : NULL;
    bool ok = md != NULL;
    for (size_t i = 0; i < nmeta && ok; i++)
        ok = cJSON_AddStringToObject(md, meta[i].key, meta[i].value) != NULL;
    ok = ok && cJSON_AddStringToObject(md, "flodl.crc32", crc_hex) != NULL;
    ok = ok && cJSON_AddStringToObject(md, "flodl.format", "1") != NULL;
    uint64_t offset = 0;
    for (size_t i = 0; i < nt && ok; i++) {
        ok = add_tensor(root, &t[i], offset);
        offset += t[i].bytes;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (json == NULL)
        return fl_fail(FL_ENOMEM, "checkpoint %s: out of memory building the header", path);

    size_t len = strlen(json);
    size_t padded = (len + 7) & ~(size_t)7;
    if (padded > FL_ST_MAX_HEADER) {
        cJSON_free(json);
        return fl_fail(FL_EINVAL, "checkpoint %s: header of %zu bytes exceeds the limit of %u",
                       path, padded, FL_ST_MAX_HEADER);
    }
    char *buf = malloc(8 + padded);
    if (buf == NULL) {
        cJSON_free(json);
        return fl_fail(FL_ENOMEM, "checkpoint %s: out of memory building the header", path);
    }
    for (int b = 0; b < 8; b++)
        buf[b] = (char)(((uint64_t)padded >> (8 * b)) & 0xff);
    memcpy(buf + 8, json, len);
    memset(buf + 8 + len, ' ', padded - len);
    cJSON_free(json);
    *out = buf;
    *out_len = 8 + padded;
    return FL_OK;
}

/* 0 or an errno value. */
static int write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len < WRITE_CHUNK ? len : WRITE_CHUNK);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? errno : EIO;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Creates tmp and fills it durably. 0 or an errno value, with the step that failed in *op. */
static int write_tmp(const char *tmp, const char *hdr, size_t hdr_len, const fl_st_tensor_t *t,
                     size_t nt, const char **op)
{
    *op = "create";
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        return errno;
    *op = "write";
    int err = write_all(fd, hdr, hdr_len);
    for (size_t i = 0; i < nt && err == 0; i++)
        err = write_all(fd, t[i].data, t[i].bytes);
    if (err == 0 && fsync(fd) != 0) {
        *op = "fsync";
        err = errno;
    }
    /* close can report a delayed write error (NFS): it counts. */
    if (close(fd) != 0 && err == 0) {
        *op = "close";
        err = errno;
    }
    return err;
}

/* Makes the rename durable. 0 or an errno value; the directory's name goes to dir. */
static int sync_dir(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, cap, ".");
    else if (slash == path)
        snprintf(dir, cap, "/");
    else
        snprintf(dir, cap, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    int err = fsync(fd) == 0 ? 0 : errno;
    close(fd);
    /* Some file systems cannot fsync a directory (EINVAL): there is nothing more to do. */
    return err == EINVAL ? 0 : err;
}

int fl_st_write(const char *path, const fl_st_tensor_t *t, size_t nt, const fl_st_meta_t *meta,
                size_t nmeta)
{
    assert(path != NULL);
    assert(t != NULL || nt == 0);
    assert(meta != NULL || nmeta == 0);

    int rc = validate(path, t, nt, meta, nmeta);
    if (rc != FL_OK)
        return rc;
    uLong crc = crc32_z(0, Z_NULL, 0);
    for (size_t i = 0; i < nt; i++)
        if (t[i].bytes > 0)
            crc = crc32_z(crc, t[i].data, t[i].bytes);
    char *hdr = NULL;
    size_t hdr_len = 0;
    rc = build_header(path, t, nt, meta, nmeta, (uint32_t)crc, &hdr, &hdr_len);
    if (rc != FL_OK)
        return rc;

    size_t tmp_cap = strlen(path) + 32;
    char *tmp = malloc(tmp_cap);
    if (tmp == NULL) {
        free(hdr);
        return fl_fail(FL_ENOMEM, "checkpoint %s: out of memory", path);
    }
    snprintf(tmp, tmp_cap, "%s" TMP_MARK "%ld", path, (long)getpid());
    const char *op = NULL;
    int err = write_tmp(tmp, hdr, hdr_len, t, nt, &op);
    free(hdr);
    if (err == 0 && rename(tmp, path) != 0) {
        err = errno;
        rc = fl_fail(FL_EIO, "checkpoint %s: rename %s over it: %s", path, tmp, strerror(err));
    } else if (err != 0) {
        rc = fl_fail(FL_EIO, "checkpoint %s: %s %s: %s", path, op, tmp, strerror(err));
    }
    if (err != 0) {
        unlink(tmp); /* best effort; ENOENT when create failed */
        free(tmp);
        return rc;
    }
    free(tmp);

    char dir[4096];
    err = sync_dir(path, dir, sizeof dir);
    if (err != 0)
        return fl_fail(FL_EIO, "checkpoint %s: written, but fsync of directory %s: %s", path, dir,
                       strerror(err));
    return FL_OK;
}

/* The pid of a temporary file's name, or 0 when name is not "<something>.tmp.<pid>"; *base_len:
 * the length of <something>. */
static pid_t tmp_pid(const char *name, size_t *base_len)
{
    const char *mark = NULL;
    for (const char *p = strstr(name, TMP_MARK); p != NULL; p = strstr(p + 1, TMP_MARK))
        mark = p;
    if (mark == NULL || mark == name)
        return 0;
    const char *digits = mark + strlen(TMP_MARK);
    long pid = 0;
    for (const char *d = digits; *d != '\0'; d++) {
        if (*d < '0' || *d > '9' || d - digits >= 10)
            return 0;
        pid = pid * 10 + (*d - '0');
    }
    if (*digits == '\0' || *digits == '0' || pid > INT_MAX)
        return 0;
    *base_len = (size_t)(mark - name);
    return (pid_t)pid;
}

/* True when pid may still be writing: a running process other than this one. */
static bool pid_runs(pid_t pid)
{
    if (pid == getpid())
        return false;
    return kill(pid, 0) == 0 || errno != ESRCH;
}

int fl_st_clean_tmp(const char *dir, bool (*mine)(const char *name, void *ud), void *ud,
                    size_t *nfiles, uint64_t *nbytes)
{
    size_t files = 0;
    uint64_t bytes = 0;
    DIR *d = opendir(dir);
    if (d == NULL && errno != ENOENT)
        return fl_fail(FL_EIO, "checkpoint directory %s: %s", dir, strerror(errno));
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        size_t base_len = 0;
        pid_t pid = tmp_pid(e->d_name, &base_len);
        char base[NAME_MAX + 1];
        if (pid == 0 || base_len >= sizeof base)
            continue;
        memcpy(base, e->d_name, base_len);
        base[base_len] = '\0';
        if (!mine(base, ud) || pid_runs(pid))
            continue;
        char path[4096 + NAME_MAX + 2];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || unlink(path) != 0)
            continue;
        files++;
        bytes += (uint64_t)st.st_size;
    }
    if (d != NULL)
        closedir(d);
    if (nfiles != NULL)
        *nfiles = files;
    if (nbytes != NULL)
        *nbytes = bytes;
    return FL_OK;
}
