/* safetensors reading: loads a whole file into memory and believes nothing in it until
 * checked (header length, JSON, dtypes, shapes, offsets, coverage of the data section, flodl's
 * format version and CRC-32). Every refusal is FL_EPROTO naming the path and the problem.
 * Writing is st_write.c; fl_core.h describes the format. */
#include "fl_core.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
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

#define NUM_LIMIT 9007199254740992.0 /* 2^53: above it a JSON number is no exact integer */
#define READ_CHUNK ((size_t)1 << 30)
#define NAME_FMT "'%.200s'" /* names come from the file: bound what reaches the message */

struct fl_st_file {
    unsigned char *buf;             /* the file, shifted so the data section is 8-aligned */
    cJSON *root;                    /* the header; tensor names and metadata point into it */
    const cJSON *meta;              /* its "__metadata__" object, or NULL */
    fl_st_tensor_t *tensors;        /* file order */
    size_t nt;                      /* number of tensors */
    const fl_st_tensor_t **by_name; /* sorted by name, for fl_st_find */
    unsigned char *side;            /* aligned copies of tensors the file stores misaligned */
    bool verified;
};

/* A tensor while the header is checked: its offsets and its place in the header. */
typedef struct entry {
    fl_st_tensor_t t;
    uint64_t begin;
    uint64_t end;
    size_t index;
} entry_t;

/* Everything the loader learnt about the layout of buf. */
typedef struct layout {
    const char *hdr; /* the JSON, hdr_len bytes (no terminator) */
    size_t hdr_len;
    const unsigned char *data; /* the data section, data_len bytes, 8-byte aligned */
    uint64_t data_len;
} layout_t;

static int bad(const char *path, const char *fmt, ...) FL_PRINTF(2, 3);

static int bad(const char *path, const char *fmt, ...)
{
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return fl_fail(FL_EPROTO, "safetensors file %s: %s", path, what);
}

/* Reads len bytes at offset; the number read (short only at end of file) or -errno. */
static int64_t read_at(int fd, unsigned char *out, size_t len, uint64_t offset)
{
    size_t got = 0;
    while (got < len) {
        size_t want = len - got < READ_CHUNK ? len - got : READ_CHUNK;
        ssize_t r = pread(fd, out + got, want, (off_t)(offset + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -(int64_t)errno;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (int64_t)got;
}

/* Checks the size and the header length, then reads the whole file into f->buf. */
static int load(fl_st_file_t *f, const char *path, size_t max_bytes, layout_t *lay)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fl_fail(FL_EIO, "safetensors file %s: open: %s", path, strerror(errno));
    int rc = FL_OK;
    struct stat st;
    unsigned char len8[8];
    int64_t got;
    if (fstat(fd, &st) != 0) {
        rc = fl_fail(FL_EIO, "safetensors file %s: stat: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = fl_fail(FL_EIO, "safetensors file %s: not a regular file", path);
        goto out;
    }
    uint64_t size = (uint64_t)st.st_size;
    if ((max_bytes > 0 && size > max_bytes) || size > SIZE_MAX - 16) {
        rc = bad(path, "file of %" PRIu64 " bytes exceeds the limit of %zu", size,
                 max_bytes > 0 ? max_bytes : SIZE_MAX - 16);
        goto out;
    }
    if (size < 8) {
        rc = bad(path, "file of %" PRIu64 " bytes is shorter than the 8-byte header length", size);
        goto out;
    }
    got = read_at(fd, len8, 8, 0);
    if (got != 8) {
        rc = got < 0 ? fl_fail(FL_EIO, "safetensors file %s: read: %s", path, strerror((int)-got))
                     : bad(path, "file shrank while being read");
        goto out;
    }
    uint64_t n = 0;
    for (int b = 7; b >= 0; b--)
        n = (n << 8) | len8[b];
    if (n > FL_ST_MAX_HEADER) {
        rc = bad(path, "header length %" PRIu64 " exceeds the limit of %u bytes", n,
                 FL_ST_MAX_HEADER);
        goto out;
    }
    if (n > size - 8) {
        rc = bad(path,
                 "header length %" PRIu64 " is larger than the %" PRIu64 " bytes that follow it", n,
                 size - 8);
        goto out;
    }
    /* Shift the file so that its data section (at 8 + n) lands 8-aligned; malloc aligns to 16.
     * One spare byte keeps the end of an empty data section inside the allocation. */
    size_t shift = (size_t)((8 - n % 8) % 8);
    f->buf = malloc(shift + (size_t)size + 1);
    if (f->buf == NULL) {
        rc = fl_fail(FL_ENOMEM, "safetensors file %s: out of memory for %" PRIu64 " bytes", path,
                     size);
        goto out;
    }
    got = read_at(fd, f->buf + shift, (size_t)size, 0);
    if (got < 0)
        rc = fl_fail(FL_EIO, "safetensors file %s: read: %s", path, strerror((int)-got));
    else if ((uint64_t)got != size)
        rc = bad(path, "file shrank while being read: %" PRId64 " of %" PRIu64 " bytes", got, size);
    lay->hdr = (const char *)f->buf + shift + 8;
    lay->hdr_len = (size_t)n;
    lay->data = f->buf + shift + 8 + n;
    lay->data_len = size - 8 - n;
out:
    close(fd);
    return rc;
}

static bool json_u64(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d < NUM_LIMIT) || (double)(uint64_t)d != d)
        return false;
    *out = (uint64_t)d;
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

static int parse_entry(const char *path, const cJSON *e, entry_t *out)
{
    fl_st_tensor_t *t = &out->t;
    t->name = e->string;
    if (!cJSON_IsObject(e))
        return bad(path, "tensor " NAME_FMT ": entry is not a JSON object", t->name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(dt))
        return bad(path, "tensor " NAME_FMT ": no \"dtype\" string", t->name);
    if (fl_st_dtype_parse(dt->valuestring, &t->dtype) != FL_OK)
        return bad(path, "tensor " NAME_FMT ": unknown dtype '%.32s' (F32|F16|BF16|F64|I32|I64|U8)",
                   t->name, dt->valuestring);

    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsArray(shape))
        return bad(path, "tensor " NAME_FMT ": no \"shape\" array", t->name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > FL_ST_MAX_DIMS)
        return bad(path, "tensor " NAME_FMT ": %d dimensions, at most %d supported", t->name, ndim,
                   FL_ST_MAX_DIMS);
    t->ndim = (size_t)ndim;
    size_t d = 0;
    for (const cJSON *v = shape->child; v != NULL; v = v->next, d++)
        if (!json_u64(v, &t->shape[d]))
            return bad(path, "tensor " NAME_FMT ": shape[%zu] is not an integer in [0, 2^53)",
                       t->name, d);

    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !json_u64(offs->child, &out->begin) || !json_u64(offs->child->next, &out->end))
        return bad(path, "tensor " NAME_FMT ": \"data_offsets\" is not two integers in [0, 2^53)",
                   t->name);
    if (out->end < out->begin)
        return bad(path,
                   "tensor " NAME_FMT ": data_offsets [%" PRIu64 ", %" PRIu64 "] run "
                   "backwards",
                   t->name, out->begin, out->end);

    /* product(shape) * size, saturating: any 0 makes it 0, overflow makes it "too much". */
    uint64_t need = fl_dtype_size(t->dtype);
    bool zero = false;
    bool over = false;
    for (d = 0; d < t->ndim; d++) {
        zero = zero || t->shape[d] == 0;
        over = over || (t->shape[d] != 0 && need > UINT64_MAX / t->shape[d]);
        need = over ? need : need * t->shape[d];
    }
    need = zero ? 0 : need;
    if ((over && !zero) || need != out->end - out->begin) {
        char sh[256];
        fmt_shape(sh, sizeof sh, t->shape, t->ndim);
        return bad(path,
                   "tensor " NAME_FMT ": data_offsets [%" PRIu64 ", %" PRIu64 "] hold "
                   "%" PRIu64 " bytes, but shape %s of %s needs %s%" PRIu64,
                   t->name, out->begin, out->end, out->end - out->begin, sh,
                   fl_st_dtype_name(t->dtype), over && !zero ? "more than " : "", need);
    }
    t->bytes = (size_t)need;
    return FL_OK;
}

static int check_meta(const char *path, const cJSON *md)
{
    if (!cJSON_IsObject(md))
        return bad(path, "\"__metadata__\" is not a JSON object");
    for (const cJSON *v = md->child; v != NULL; v = v->next)
        if (!cJSON_IsString(v))
            return bad(path, "metadata " NAME_FMT " is not a string", v->string);
    return FL_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_offsets(const void *a, const void *b)
{
    const entry_t *x = a;
    const entry_t *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static int cmp_by_name(const void *a, const void *b)
{
    const fl_st_tensor_t *x = *(const fl_st_tensor_t *const *)a;
    const fl_st_tensor_t *y = *(const fl_st_tensor_t *const *)b;
    return strcmp(x->name, y->name);
}

/* Metadata keys must be unique: a reader that keeps the first and one that keeps the last
 * would disagree about the file. */
static int check_unique_meta(const char *path, const cJSON *md)
{
    size_t n = (size_t)cJSON_GetArraySize(md);
    if (n < 2)
        return FL_OK;
    const char **keys = malloc(n * sizeof *keys);
    if (keys == NULL)
        return fl_fail(FL_ENOMEM, "safetensors file %s: out of memory", path);
    size_t i = 0;
    for (const cJSON *v = md->child; v != NULL; v = v->next)
        keys[i++] = v->string;
    qsort(keys, n, sizeof keys[0], cmp_str);
    int rc = FL_OK;
    for (i = 1; i < n && rc == FL_OK; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0)
            rc = bad(path, "metadata key " NAME_FMT " appears twice", keys[i]);
    free(keys);
    return rc;
}

/* Parses the JSON; leaves the metadata in f->meta and the tensors, in header order, in *out. */
static int parse_header(fl_st_file_t *f, const char *path, const layout_t *lay, entry_t **out,
                        size_t *count)
{
    const char *end = NULL;
    f->root = cJSON_ParseWithLengthOpts(lay->hdr, lay->hdr_len, &end, false);
    if (f->root == NULL)
        return bad(path, "header is not valid JSON (error at byte %td of %zu)",
                   end != NULL ? end - lay->hdr : 0, lay->hdr_len);
    /* safetensors pads the header with spaces; anything else after the JSON is garbage. */
    for (const char *p = end; p < lay->hdr + lay->hdr_len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            return bad(path, "header has bytes after the JSON (at byte %td of %zu)", p - lay->hdr,
                       lay->hdr_len);
    if (!cJSON_IsObject(f->root))
        return bad(path, "header is not a JSON object");

    size_t nt = 0;
    for (const cJSON *e = f->root->child; e != NULL; e = e->next) {
        if (strcmp(e->string, "__metadata__") != 0) {
            nt++;
        } else if (f->meta != NULL) {
            return bad(path, "\"__metadata__\" appears twice");
        } else {
            f->meta = e;
            int rc = check_meta(path, e);
            rc = rc == FL_OK ? check_unique_meta(path, e) : rc;
            if (rc != FL_OK)
                return rc;
        }
    }
    entry_t *ent = calloc(nt ? nt : 1, sizeof *ent);
    if (ent == NULL)
        return fl_fail(FL_ENOMEM, "safetensors file %s: out of memory for %zu tensors", path, nt);
    *out = ent;
    *count = nt;
    size_t i = 0;
    for (const cJSON *e = f->root->child; e != NULL; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0)
            continue;
        ent[i].index = i;
        int rc = parse_entry(path, e, &ent[i]);
        if (rc != FL_OK)
            return rc;
        i++;
    }
    return FL_OK;
}

/* Orders the tensors by offset and checks that they tile the data section exactly: no
 * overlap, no gap, nothing missing at the end, nothing left over. */
static int check_layout(const char *path, entry_t *ent, size_t nt, const layout_t *lay)
{
    qsort(ent, nt, sizeof ent[0], cmp_offsets);
    uint64_t at = 0;
    for (size_t i = 0; i < nt; i++) {
        if (ent[i].begin < at)
            return bad(path,
                       "tensors " NAME_FMT " and " NAME_FMT " overlap: data_offsets [%" PRIu64
                       ", %" PRIu64 "] and [%" PRIu64 ", %" PRIu64 "]",
                       ent[i - 1].t.name, ent[i].t.name, ent[i - 1].begin, ent[i - 1].end,
                       ent[i].begin, ent[i].end);
        if (ent[i].begin > at)
            return bad(path,
                       "gap of %" PRIu64 " bytes in the data section before tensor " NAME_FMT
                       " (data_offsets [%" PRIu64 ", %" PRIu64 "])",
                       ent[i].begin - at, ent[i].t.name, ent[i].begin, ent[i].end);
        at = ent[i].end;
    }
    if (at > lay->data_len)
        return bad(path,
                   "data section truncated: %" PRIu64 " of %" PRIu64 " bytes (tensor " NAME_FMT
                   " ends at %" PRIu64 ")",
                   lay->data_len, at, ent[nt - 1].t.name, at);
    if (at < lay->data_len)
        return bad(path,
                   "data section has %" PRIu64 " bytes after the last tensor (%" PRIu64
                   " of %" PRIu64 " used)",
                   lay->data_len - at, at, lay->data_len);
    return FL_OK;
}

static int check_flodl_meta(fl_st_file_t *f, const char *path, const layout_t *lay)
{
    const char *format = fl_st_meta_get(f, "flodl.format");
    if (format != NULL && strcmp(format, "1") != 0)
        return bad(path, "flodl.format '%.32s' is not supported (this build reads \"1\")", format);
    const char *want = fl_st_meta_get(f, "flodl.crc32");
    if (want == NULL)
        return FL_OK; /* another tool wrote it: nothing to check against */
    if (strlen(want) != 8 || strspn(want, "0123456789abcdefABCDEF") != 8)
        return bad(path, "flodl.crc32 '%.32s' is not 8 hex digits", want);
    unsigned long expected = strtoul(want, NULL, 16);
    uLong crc = crc32_z(0, Z_NULL, 0);
    if (lay->data_len > 0)
        crc = crc32_z(crc, lay->data, (z_size_t)lay->data_len);
    if (crc != expected)
        return bad(path,
                   "CRC-32 of the data section is %08lx, the header says %08lx: the data "
                   "is corrupt",
                   (unsigned long)crc, expected);
    f->verified = true;
    return FL_OK;
}

/* Points each tensor at its data. The data section is 8-aligned, so a tensor is aligned for
 * its dtype when its offset is a multiple of the element size; files laid out otherwise (legal:
 * tensors are packed with no padding) get their misaligned tensors copied, so that callers
 * may use data as a typed pointer. */
static int place_data(fl_st_file_t *f, const char *path, const entry_t *ent, size_t nt,
                      const layout_t *lay)
{
    size_t side_len = 0;
    for (size_t i = 0; i < nt; i++)
        if (ent[i].begin % fl_dtype_size(ent[i].t.dtype) != 0)
            side_len += (ent[i].t.bytes + 7) & ~(size_t)7;
    if (side_len > 0 && (f->side = malloc(side_len)) == NULL)
        return fl_fail(FL_ENOMEM, "safetensors file %s: out of memory", path);
    size_t at = 0;
    for (size_t i = 0; i < nt; i++) {
        f->tensors[i] = ent[i].t;
        f->tensors[i].data = lay->data + ent[i].begin;
        if (ent[i].begin % fl_dtype_size(ent[i].t.dtype) != 0) {
            memcpy(f->side + at, lay->data + ent[i].begin, ent[i].t.bytes);
            f->tensors[i].data = f->side + at;
            at += (ent[i].t.bytes + 7) & ~(size_t)7;
        }
        f->by_name[i] = &f->tensors[i];
    }
    qsort(f->by_name, nt, sizeof f->by_name[0], cmp_by_name);
    for (size_t i = 1; i < nt; i++)
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0)
            return bad(path, "tensor " NAME_FMT " appears twice in the header",
                       f->by_name[i]->name);
    return FL_OK;
}

int fl_st_open(const char *path, size_t max_bytes, fl_st_file_t **out)
{
    assert(path != NULL);
    assert(out != NULL);
    *out = NULL;
    fl_st_file_t *f = calloc(1, sizeof *f);
    if (f == NULL)
        return fl_fail(FL_ENOMEM, "safetensors file %s: out of memory", path);
    layout_t lay = {0};
    entry_t *ent = NULL;
    size_t nt = 0;
    int rc = load(f, path, max_bytes, &lay);
    if (rc == FL_OK)
        rc = parse_header(f, path, &lay, &ent, &nt);
    if (rc == FL_OK)
        rc = check_layout(path, ent, nt, &lay);
    if (rc == FL_OK)
        rc = check_flodl_meta(f, path, &lay);
    if (rc == FL_OK) {
        f->nt = nt;
        f->tensors = calloc(nt ? nt : 1, sizeof *f->tensors);
        f->by_name = calloc(nt ? nt : 1, sizeof *f->by_name);
        rc = f->tensors && f->by_name
                 ? place_data(f, path, ent, nt, &lay)
                 : fl_fail(FL_ENOMEM, "safetensors file %s: out of memory for %zu tensors", path,
                           nt);
    }
    free(ent);
    if (rc != FL_OK) {
        fl_st_close(&f);
        return rc;
    }
    *out = f;
    return FL_OK;
}

size_t fl_st_count(const fl_st_file_t *f)
{
    assert(f != NULL);
    return f->nt;
}

const fl_st_tensor_t *fl_st_at(const fl_st_file_t *f, size_t i)
{
    assert(f != NULL);
    assert(i < f->nt);
    return &f->tensors[i];
}

static int cmp_key_name(const void *key, const void *elem)
{
    return strcmp(key, (*(const fl_st_tensor_t *const *)elem)->name);
}

const fl_st_tensor_t *fl_st_find(const fl_st_file_t *f, const char *name)
{
    assert(f != NULL);
    assert(name != NULL);
    const fl_st_tensor_t *const *hit =
        bsearch(name, f->by_name, f->nt, sizeof f->by_name[0], cmp_key_name);
    return hit != NULL ? *hit : NULL;
}

const char *fl_st_meta_get(const fl_st_file_t *f, const char *key)
{
    assert(f != NULL);
    assert(key != NULL);
    if (f->meta == NULL)
        return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

bool fl_st_verified(const fl_st_file_t *f)
{
    assert(f != NULL);
    return f->verified;
}

void fl_st_close(fl_st_file_t **f)
{
    if (f == NULL || *f == NULL)
        return;
    cJSON_Delete((*f)->root);
    free((*f)->tensors);
    free((*f)->by_name);
    free((*f)->side);
    free((*f)->buf);
    free(*f);
    *f = NULL;
}
