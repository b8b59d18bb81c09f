/* IDX files, the format of MNIST and Fashion-MNIST: u8 images [n, rows, cols] and u8 labels
 * [n], big-endian counts after a 4-byte magic. Plain or gzip-compressed files are read
 * through zlib. Headers are checked before anything large is allocated, and buffers grow with
 * the data actually read, so a lying header costs an error message, not gigabytes. */
#include "fl_data.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "fl_core.h"

#define MAGIC_IMAGES 0x00000803u /* u8, three dimensions */
#define MAGIC_LABELS 0x00000801u /* u8, one dimension */
#define MAX_SAMPLES 1000000000ull
#define MAX_PIXELS 10000000ull /* rows * cols */
#define CHUNK ((size_t)1 << 20)

/* Reads up to len bytes; *got says how many arrived before the end of the file. FL_OK at the
 * end of the file too; FL_EIO or FL_EPROTO (corrupt gzip stream) naming the file. */
static int read_some(gzFile f, const char *path, void *buf, size_t len, size_t *got)
{
    *got = 0;
    while (*got < len) {
        size_t want = len - *got;
        if (want > INT_MAX / 2)
            want = INT_MAX / 2;
        int n = gzread(f, (unsigned char *)buf + *got, (unsigned)want);
        if (n < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            if (zerr == Z_ERRNO)
                return fl_fail(FL_EIO, "%s: read: %s", path, strerror(errno));
            return fl_fail(FL_EPROTO, "%s: corrupt gzip data: %s", path, msg);
        }
        if (n == 0)
            break;
        *got += (size_t)n;
    }
    return FL_OK;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Opens path and reads its header: the magic, then ndims big-endian counts into dims. */
static int open_header(const char *path, uint32_t magic, const char *what, int ndims,
                       uint32_t *dims, gzFile *out)
{
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (f == NULL)
        return fl_fail(FL_EIO, "%s: cannot open: %s", path,
                       errno ? strerror(errno) : "out of memory");
    unsigned char h[16];
    size_t len = 4 + 4 * (size_t)ndims;
    size_t got;
    int rc = read_some(f, path, h, len, &got);
    if (rc == FL_OK && got >= 4 && be32(h) != magic)
        rc = fl_fail(FL_EPROTO, "%s: wrong magic 0x%08x, expected 0x%08x (IDX %s)", path, be32(h),
                     magic, what);
    else if (rc == FL_OK && got < len)
        rc = fl_fail(FL_EPROTO, "%s: truncated header: expected %zu bytes, the file has %zu", path,
                     len, got);
    if (rc != FL_OK) {
        gzclose(f);
        return rc;
    }
    for (int i = 0; i < ndims; i++)
        dims[i] = be32(h + 4 + 4 * i);
    *out = f;
    return FL_OK;
}

/* Makes room for need elements of size sz in *buf, doubling as data arrives. */
static int grow(void **buf, size_t *cap, size_t need, size_t sz, size_t limit)
{
    if (need <= *cap)
        return FL_OK;
    size_t c = *cap ? *cap : CHUNK;
    while (c < need)
        c *= 2;
    if (c > limit)
        c = limit;
    void *p = realloc(*buf, c * sz);
    if (p == NULL)
        return fl_fail(FL_ENOMEM, "IDX: no memory for %zu bytes", c * sz);
    *buf = p;
    *cap = c;
    return FL_OK;
}

static int truncated(const char *path, size_t header, size_t want, size_t got)
{
    return fl_fail(FL_EPROTO,
                   "%s: truncated: expected %zu bytes (%zu header + %zu data), the file has %zu",
                   path, header + want, header, want, header + got);
}

/* Reads n labels and returns the number of classes. */
static int read_labels(gzFile f, const char *path, size_t n, uint8_t **out, int *classes)
{
    uint8_t *lab = NULL;
    size_t cap = 0;
    size_t have = 0;
    int rc = FL_OK;
    while (rc == FL_OK && have < n) {
        size_t want = n - have < CHUNK ? n - have : CHUNK;
        rc = grow((void **)&lab, &cap, have + want, 1, n);
        size_t got = 0;
        if (rc == FL_OK)
            rc = read_some(f, path, lab + have, want, &got);
        have += got;
        if (rc == FL_OK && got < want)
            rc = truncated(path, 8, n, have);
    }
    int max = 0;
    for (size_t i = 0; rc == FL_OK && i < n; i++)
        if (lab[i] > max)
            max = lab[i];
    if (rc == FL_OK && max == 0)
        rc =
            fl_fail(FL_EPROTO, "%s: every label is 0: a classifier needs at least 2 classes", path);
    if (rc != FL_OK) {
        free(lab);
        return rc;
    }
    *out = lab;
    *classes = max + 1;
    return FL_OK;
}

/* Reads n images of dim pixels into floats in [0, 1]. */
static int read_images(gzFile f, const char *path, size_t n, size_t dim, float **out)
{
    float scale[256];
    for (int i = 0; i < 256; i++)
        scale[i] = (float)i / 255.0f;
    unsigned char *raw = malloc(CHUNK);
    float *x = NULL;
    size_t cap = 0;
    size_t total = n * dim;
    size_t have = 0;
    int rc = raw ? FL_OK : fl_fail(FL_ENOMEM, "IDX: no memory");
    while (rc == FL_OK && have < total) {
        size_t want = total - have < CHUNK ? total - have : CHUNK;
        rc = grow((void **)&x, &cap, have + want, sizeof *x, total);
        size_t got = 0;
        if (rc == FL_OK)
            rc = read_some(f, path, raw, want, &got);
        for (size_t i = 0; i < got; i++)
            x[have + i] = scale[raw[i]];
        have += got;
        if (rc == FL_OK && got < want)
            rc = truncated(path, 16, total, have);
    }
    free(raw);
    if (rc != FL_OK) {
        free(x);
        return rc;
    }
    *out = x;
    return FL_OK;
}

int fl_data_idx(const char *images, const char *labels, fl_dataset_t *out)
{
    memset(out, 0, sizeof *out);
    gzFile fi = NULL;
    gzFile fl = NULL;
    uint32_t di[3] = {0}; /* filled by open_header() on success; zeroed for -O2 -Werror */
    uint32_t dl[1] = {0};
    uint8_t *lab = NULL;
    int classes = 0;
    int rc = open_header(images, MAGIC_IMAGES, "u8 images [n, rows, cols]", 3, di, &fi);
    if (rc == FL_OK)
        rc = open_header(labels, MAGIC_LABELS, "u8 labels [n]", 1, dl, &fl);
    if (rc != FL_OK)
        goto done;
    uint64_t pixels = (uint64_t)di[1] * di[2];
    if (di[0] == 0 || di[0] > MAX_SAMPLES || di[1] == 0 || di[2] == 0 || pixels > MAX_PIXELS) {
        rc = fl_fail(FL_EPROTO,
                     "%s: implausible shape [%u, %u, %u] (at most %llu samples of %llu pixels)",
                     images, di[0], di[1], di[2], MAX_SAMPLES, MAX_PIXELS);
        goto done;
    }
    if ((uint64_t)di[0] * pixels > SIZE_MAX / sizeof(float)) {
        rc = fl_fail(FL_ENOMEM, "%s: %u images of %llu pixels do not fit in memory", images, di[0],
                     (unsigned long long)pixels);
        goto done;
    }
    if (dl[0] != di[0]) {
        rc = fl_fail(FL_EPROTO, "%s has %u images but %s has %u labels", images, di[0], labels,
                     dl[0]);
        goto done;
    }
    /* Labels first: they are small, and a bad label file should not cost reading the images. */
    rc = read_labels(fl, labels, di[0], &lab, &classes);
    if (rc == FL_OK)
        rc = read_images(fi, images, di[0], (size_t)pixels, &out->x);
    if (rc != FL_OK)
        goto done;
    out->y = malloc(di[0] * sizeof *out->y);
    if (out->y == NULL) {
        rc = fl_fail(FL_ENOMEM, "%s: no memory for %u labels", labels, di[0]);
        goto done;
    }
    for (size_t i = 0; i < di[0]; i++)
        out->y[i] = lab[i];
    out->n = di[0];
    out->dim = (size_t)pixels;
    out->classes = classes;
    snprintf(out->source, sizeof out->source, "%s", images);
    snprintf(out->labels, sizeof out->labels, "%s", labels);
done:
    free(lab);
    if (fi != NULL)
        gzclose(fi);
    if (fl != NULL)
        gzclose(fl);
    if (rc != FL_OK)
        fl_dataset_free(out);
    return rc;
}
