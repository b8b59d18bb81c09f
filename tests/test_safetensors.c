/* safetensors checkpoints (core/st_write.c, core/st_read.c): round trips of every dtype and
 * shape kind with metadata, atomic replacement, files made by hand as other tools write them,
 * and refusals: truncation at every length, corrupt data, lying headers, bad writer input
 * and I/O failures, each with its error code and a detail naming the path and the problem. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static char dir[256];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/fl_st_XXXXXX");
    if (mkdtemp(dir) == NULL)
        ck_abort_msg("mkdtemp: %s", strerror(errno));
}

/* The directory is flat, except for the subdirectories some cases make (emptied by them). */
static void teardown(void)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) != 0) {
            chmod(p, 0700);
            rmdir(p);
        }
    }
    closedir(d);
    rmdir(dir);
}

static void path_in(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

/* Number of entries in the test directory (not counting . and ..), and whether any is a
 * leftover temporary file. */
static size_t dir_entries(bool *has_tmp)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    size_t n = 0;
    struct dirent *e;
    *has_tmp = false;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        n++;
        *has_tmp = *has_tmp || strstr(e->d_name, ".tmp.") != NULL;
    }
    closedir(d);
    return n;
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "%s: %s", path, strerror(errno));
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    size_t got = fread(buf, 1, (size_t)n, fp);
    fclose(fp);
    ck_assert_uint_eq(got, (size_t)n);
    *len = (size_t)n;
    return buf;
}

static bool spit(const char *path, const void *data, size_t len)
{
    FILE *fp = fopen(path, "wb");
    if (fp == NULL)
        return false;
    bool ok = fwrite(data, 1, len, fp) == len;
    return fclose(fp) == 0 && ok;
}

/* A file as another tool writes it: the 8-byte length of json (padded with spaces to pad
 * bytes when pad > its length), the json, then data. */
static void write_raw(const char *path, const char *json, size_t pad, const void *data, size_t dlen)
{
    size_t jlen = strlen(json);
    size_t n = pad > jlen ? pad : jlen;
    unsigned char *buf = malloc(8 + n + dlen + 1);
    ck_assert_ptr_nonnull(buf);
    for (int b = 0; b < 8; b++)
        buf[b] = (unsigned char)(((uint64_t)n >> (8 * b)) & 0xff);
    memcpy(buf + 8, json, jlen);
    memset(buf + 8 + jlen, ' ', n - jlen);
    if (dlen > 0)
        memcpy(buf + 8 + n, data, dlen);
    ck_assert(spit(path, buf, 8 + n + dlen));
    free(buf);
}

/* Opening path must fail with FL_EPROTO, a detail naming the path and containing want. */
static void expect_proto_file(const char *path, const char *want, const char *what)
{
    fl_st_file_t *f = NULL;
    int rc = fl_st_open(path, 0, &f);
    if (rc != FL_EPROTO || f != NULL)
        ck_abort_msg("%s: rc %d (%s), expected FL_EPROTO", what, rc, fl_last_error());
    const char *err = fl_last_error();
    if (strstr(err, path) == NULL || strstr(err, want) == NULL)
        ck_abort_msg("%s: detail '%s' lacks the path or '%s'", what, err, want);
}

static void expect_proto(const char *json, const void *data, size_t dlen, const char *want)
{
    char p[512];
    path_in(p, sizeof p, "bad.safetensors");
    write_raw(p, json, 0, data, dlen);
    expect_proto_file(p, want, json);
}

/* ---- round trips ---- */

static const fl_dtype_t all_dtypes[] = {FL_UINT8,   FL_FLOAT32, FL_FLOAT16, FL_BFLOAT16,
                                        FL_FLOAT64, FL_INT32,   FL_INT64};

typedef struct kind {
    const char *name;
    size_t ndim;
    uint64_t shape[4];
} kind_t;

static const kind_t kinds[] = {
    {"scalar", 0, {0}},
    {"vec", 1, {5}},
    {"4d", 4, {2, 3, 1, 4}},
    {"empty", 3, {3, 0, 2}},
};

#define NT (NELEM(all_dtypes) * NELEM(kinds))

/* Fills t (NT tensors, data in bufs) with random bytes: NaNs and all, compared bit-exactly.
 * U8 comes first with odd sizes, so tensors after it are stored misaligned. */
static void make_tensors(fl_st_tensor_t *t, unsigned char **bufs, char (*names)[32])
{
    uint64_t rng = 42;
    size_t i = 0;
    for (size_t a = 0; a < NELEM(all_dtypes); a++) {
        for (size_t k = 0; k < NELEM(kinds); k++, i++) {
            fl_st_tensor_t *x = &t[i];
            memset(x, 0, sizeof *x);
            snprintf(names[i], sizeof names[i], "%s.%s", fl_dtype_name(all_dtypes[a]),
                     kinds[k].name);
            x->name = names[i];
            x->dtype = all_dtypes[a];
            x->ndim = kinds[k].ndim;
            size_t count = 1;
            for (size_t d = 0; d < x->ndim; d++) {
                x->shape[d] = kinds[k].shape[d];
                count *= (size_t)kinds[k].shape[d];
            }
            x->bytes = count * fl_dtype_size(x->dtype);
            bufs[i] = malloc(x->bytes + 1);
            for (size_t b = 0; b < x->bytes; b++)
                bufs[i][b] = (unsigned char)fl_test_rand(&rng);
            x->data = bufs[i];
        }
    }
}

/* Compares f against t in order; NULL when equal, else what differs (in buf). */
static const char *compare(const fl_st_file_t *f, const fl_st_tensor_t *t, size_t nt, char *buf,
                           size_t cap)
{
    if (fl_st_count(f) != nt) {
        snprintf(buf, cap, "%zu tensors, expected %zu", fl_st_count(f), nt);
        return buf;
    }
    for (size_t i = 0; i < nt; i++) {
        const fl_st_tensor_t *g = fl_st_at(f, i);
        const char *why = NULL;
        if (strcmp(g->name, t[i].name) != 0)
            why = "name";
        else if (g->dtype != t[i].dtype || g->ndim != t[i].ndim || g->bytes != t[i].bytes)
            why = "dtype, ndim or bytes";
        else if (memcmp(g->shape, t[i].shape, g->ndim * sizeof g->shape[0]) != 0)
            why = "shape";
        else if (g->bytes > 0 && memcmp(g->data, t[i].data, g->bytes) != 0)
            why = "data";
        else if (g->data == NULL || (uintptr_t)g->data % fl_dtype_size(g->dtype) != 0)
            why = "data pointer NULL or misaligned";
        else if (fl_st_find(f, t[i].name) != g)
            why = "fl_st_find";
        if (why != NULL) {
            snprintf(buf, cap, "tensor %zu '%s' (read as '%s'): %s differs", i, t[i].name, g->name,
                     why);
            return buf;
        }
    }
    return NULL;
}

START_TEST(test_round_trip)
{
    fl_st_tensor_t t[NT];
    unsigned char *bufs[NT];
    char names[NT][32];
    make_tensors(t, bufs, names);
    const fl_st_meta_t meta[] = {{"epoch", "7"}, {"model", "mlp \xc3\xbc \"quoted\"\n"}, {"e", ""}};
    char p[512];
    path_in(p, sizeof p, "ckpt.safetensors");

    int rc = fl_st_write(p, t, NT, meta, NELEM(meta));
    ck_assert_msg(rc == FL_OK, "write: %s", fl_last_error());
    fl_st_file_t *f = NULL;
    rc = fl_st_open(p, 0, &f);
    ck_assert_msg(rc == FL_OK, "open: %s", fl_last_error());
    char why[256];
    const char *diff = compare(f, t, NT, why, sizeof why);
    ck_assert_msg(diff == NULL, "%s", diff);
    ck_assert(fl_st_verified(f));
    ck_assert_str_eq(fl_st_meta_get(f, "epoch"), "7");
    ck_assert_str_eq(fl_st_meta_get(f, "model"), meta[1].value);
    ck_assert_str_eq(fl_st_meta_get(f, "e"), "");
    ck_assert_str_eq(fl_st_meta_get(f, "flodl.format"), "1");
    const char *crc = fl_st_meta_get(f, "flodl.crc32");
    ck_assert_ptr_nonnull(crc);
    ck_assert_uint_eq(strlen(crc), 8);
    ck_assert_ptr_null(fl_st_meta_get(f, "absent"));
    ck_assert_ptr_null(fl_st_find(f, "absent"));
    ck_assert_ptr_null(fl_st_find(f, ""));
    ck_assert_uint_eq(fl_st_at(f, 0)->ndim, 0);
    ck_assert_uint_eq(fl_st_at(f, 0)->bytes, 1);
    fl_st_close(&f);
    ck_assert_ptr_null(f);
    fl_st_close(&f);

    /* The layout: header padded to 8, data packed right behind it in the order given. */
    size_t len = 0;
    unsigned char *raw = slurp(p, &len);
    uint64_t n = 0;
    for (int b = 7; b >= 0; b--)
        n = (n << 8) | raw[b];
    size_t data_bytes = 0;
    for (size_t i = 0; i < NT; i++)
        data_bytes += t[i].bytes;
    ck_assert_uint_eq(n % 8, 0);
    ck_assert_uint_eq(len, 8 + n + data_bytes);
    ck_assert_int_eq(memcmp(raw + 8 + n, t[0].data, t[0].bytes), 0);
    ck_assert_int_eq(memcmp(raw + 8 + n + t[0].bytes, t[1].data, t[1].bytes), 0);
    ck_assert_int_eq(raw[8], '{');
    free(raw);

    for (size_t i = 0; i < NT; i++)
        free(bufs[i]);
}
END_TEST

START_TEST(test_nothing_and_limits)
{
    char p[512];
    path_in(p, sizeof p, "empty.safetensors");
    ck_assert_int_eq(fl_st_write(p, NULL, 0, NULL, 0), FL_OK);
    fl_st_file_t *f = NULL;
    ck_assert_msg(fl_st_open(p, 0, &f) == FL_OK, "%s", fl_last_error());
    ck_assert_uint_eq(fl_st_count(f), 0);
    ck_assert(fl_st_verified(f));
    ck_assert_str_eq(fl_st_meta_get(f, "flodl.crc32"), "00000000");
    ck_assert_ptr_null(fl_st_find(f, "x"));
    fl_st_close(&f);

    /* max_bytes bounds the file: exactly its size passes, one less is refused. */
    const float v[3] = {1.0f, -2.5f, 3.25f};
    fl_st_tensor_t t = {
        .name = "v", .dtype = FL_FLOAT32, .ndim = 1, .shape = {3}, .data = v, .bytes = sizeof v};
    ck_assert_int_eq(fl_st_write(p, &t, 1, NULL, 0), FL_OK);
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_msg(fl_st_open(p, (size_t)st.st_size, &f) == FL_OK, "%s", fl_last_error());
    ck_assert(memcmp(fl_st_find(f, "v")->data, v, sizeof v) == 0);
    fl_st_close(&f);
    ck_assert_int_eq(fl_st_open(p, (size_t)st.st_size - 1, &f), FL_EPROTO);
    ck_assert_ptr_null(f);
    ck_assert_ptr_nonnull(strstr(fl_last_error(), "exceeds the limit"));
    ck_assert_ptr_nonnull(strstr(fl_last_error(), p));

    /* Whatever the JSON's length, spaces pad the header to a multiple of 8. */
    char name[16] = "";
    for (size_t len = 1; len < sizeof name; len++) {
        strcat(name, "n");
        t.name = name;
        int rc = fl_st_write(p, &t, 1, NULL, 0);
        size_t flen = 0;
        unsigned char *raw = rc == FL_OK ? slurp(p, &flen) : NULL;
        uint64_t n = 0;
        for (int b = 7; raw != NULL && b >= 0; b--)
            n = (n << 8) | raw[b];
        if (raw == NULL || n % 8 != 0 || flen != 8 + n + sizeof v)
            ck_abort_msg("name of %zu bytes: rc %d, header length %" PRIu64 ", file %zu bytes, "
                         "%s",
                         len, rc, n, flen, fl_last_error());
        free(raw);
    }
}
END_TEST

START_TEST(test_replace_atomically)
{
    char p[512];
    path_in(p, sizeof p, "model.safetensors");
    const int32_t a[4] = {1, 2, 3, 4};
    const int64_t b[2] = {-5, INT64_MAX};
    fl_st_tensor_t ta = {
        .name = "w", .dtype = FL_INT32, .ndim = 2, .shape = {2, 2}, .data = a, .bytes = sizeof a};
    fl_st_tensor_t tb = {
        .name = "w", .dtype = FL_INT64, .ndim = 1, .shape = {2}, .data = b, .bytes = sizeof b};
    const fl_st_meta_t m1 = {"step", "1"};
    const fl_st_meta_t m2 = {"step", "2"};
    ck_assert_int_eq(fl_st_write(p, &ta, 1, &m1, 1), FL_OK);
    bool has_tmp = false;
    ck_assert_uint_eq(dir_entries(&has_tmp), 1);
    ck_assert(!has_tmp);

    /* A reader holding the old file keeps it whole while the new one replaces it. */
    fl_st_file_t *old = NULL;
    ck_assert_int_eq(fl_st_open(p, 0, &old), FL_OK);
    ck_assert_int_eq(fl_st_write(p, &tb, 1, &m2, 1), FL_OK);
    ck_assert_uint_eq(dir_entries(&has_tmp), 1);
    ck_assert(!has_tmp);
    fl_st_file_t *f = NULL;
    ck_assert_int_eq(fl_st_open(p, 0, &f), FL_OK);
    ck_assert_str_eq(fl_st_meta_get(f, "step"), "2");
    ck_assert_int_eq(fl_st_at(f, 0)->dtype, FL_INT64);
    ck_assert(memcmp(fl_st_at(f, 0)->data, b, sizeof b) == 0);
    ck_assert_str_eq(fl_st_meta_get(old, "step"), "1");
    ck_assert(memcmp(fl_st_at(old, 0)->data, a, sizeof a) == 0);
    fl_st_close(&f);
    fl_st_close(&old);

    /* A relative path (directory ".") works too. */
    char cwd[512];
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    ck_assert_int_eq(chdir(dir), 0);
    ck_assert_int_eq(fl_st_write("rel.safetensors", &ta, 1, NULL, 0), FL_OK);
    ck_assert_int_eq(fl_st_open("rel.safetensors", 0, &f), FL_OK);
    fl_st_close(&f);
    ck_assert_int_eq(chdir(cwd), 0);
    ck_assert_uint_eq(dir_entries(&has_tmp), 2);
    ck_assert(!has_tmp);
}
END_TEST

/* ---- files from other tools ---- */

START_TEST(test_foreign_file)
{
    /* As Python's safetensors lays it out, but unpadded, keys out of data order and an I64
     * at offset 12 (misaligned: it must come back aligned, by copy). */
    const float a[3] = {0.5f, -1.0f, 2.0f};
    const int64_t b[2] = {-1, 1234567890123};
    const uint16_t c[1] = {0x3c00}; /* 1.0 in half precision */
    unsigned char data[30];
    memcpy(data, a, 12);
    memcpy(data + 12, b, 16);
    memcpy(data + 28, c, 2);
    const char *json = "{\"b\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[12,28]},"
                       "\"__metadata__\":{\"format\":\"pt\"},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                       "\"h\":{\"dtype\":\"F16\",\"shape\":[1,1],\"data_offsets\":[28,30]},"
                       "\"z\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[30,30]}}";
    char p[512];
    path_in(p, sizeof p, "foreign.safetensors");
    write_raw(p, json, 0, data, sizeof data);

    fl_st_file_t *f = NULL;
    ck_assert_msg(fl_st_open(p, 0, &f) == FL_OK, "%s", fl_last_error());
    ck_assert(!fl_st_verified(f));
    ck_assert_uint_eq(fl_st_count(f), 4);
    ck_assert_str_eq(fl_st_at(f, 0)->name, "a");
    ck_assert_str_eq(fl_st_at(f, 1)->name, "b");
    ck_assert_str_eq(fl_st_at(f, 2)->name, "h");
    ck_assert_str_eq(fl_st_at(f, 3)->name, "z");
    const fl_st_tensor_t *tb = fl_st_find(f, "b");
    ck_assert_ptr_nonnull(tb);
    ck_assert_uint_eq((uintptr_t)tb->data % 8, 0);
    ck_assert(memcmp(tb->data, b, sizeof b) == 0);
    ck_assert_int_eq(((const int64_t *)tb->data)[1], 1234567890123);
    ck_assert(memcmp(fl_st_find(f, "a")->data, a, sizeof a) == 0);
    const fl_st_tensor_t *th = fl_st_find(f, "h");
    ck_assert_uint_eq(th->ndim, 2);
    ck_assert(fl_f16_to_f32(*(const uint16_t *)th->data) == 1.0f);
    ck_assert_uint_eq(fl_st_find(f, "z")->bytes, 0);
    ck_assert_str_eq(fl_st_meta_get(f, "format"), "pt");
    ck_assert_ptr_null(fl_st_meta_get(f, "flodl.crc32"));
    fl_st_close(&f);

    /* Padded with spaces to 8 bytes, and without any metadata. */
    const char *json2 = "{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}";
    size_t pad = (strlen(json2) + 7) / 8 * 8 + 8;
    write_raw(p, json2, pad, "\x01\xff", 2);
    ck_assert_msg(fl_st_open(p, 0, &f) == FL_OK, "%s", fl_last_error());
    ck_assert(!fl_st_verified(f));
    ck_assert_uint_eq(fl_st_count(f), 1);
    ck_assert_int_eq(((const uint8_t *)fl_st_at(f, 0)->data)[1], 0xff);
    ck_assert_ptr_null(fl_st_meta_get(f, "format"));
    fl_st_close(&f);

    /* No tensors at all, no data section. */
    write_raw(p, "{}", 0, NULL, 0);
    ck_assert_msg(fl_st_open(p, 0, &f) == FL_OK, "%s", fl_last_error());
    ck_assert_uint_eq(fl_st_count(f), 0);
    fl_st_close(&f);
}
END_TEST

/* ---- refusals of damaged and lying files ---- */

static void write_small(const char *p)
{
    const float w[4] = {1, 2, 3, 4};
    const uint8_t u[3] = {7, 8, 9};
    fl_st_tensor_t t[2] = {
        {.name = "w", .dtype = FL_FLOAT32, .ndim = 2, .shape = {2, 2}, .data = w, .bytes = 16},
        {.name = "u", .dtype = FL_UINT8, .ndim = 1, .shape = {3}, .data = u, .bytes = 3},
    };
    const fl_st_meta_t m = {"k", "v"};
    ck_assert_msg(fl_st_write(p, t, 2, &m, 1) == FL_OK, "%s", fl_last_error());
}

START_TEST(test_truncated_every_length)
{
    char p[512];
    char q[512];
    path_in(p, sizeof p, "whole.safetensors");
    path_in(q, sizeof q, "cut.safetensors");
    write_small(p);
    size_t len = 0;
    unsigned char *raw = slurp(p, &len);
    char fails[1024] = "";
    size_t nfail = 0;
    for (size_t cut = 0; cut < len; cut++) {
        if (!spit(q, raw, cut))
            ck_abort_msg("writing %s: %s", q, strerror(errno));
        fl_st_file_t *f = NULL;
        int rc = fl_st_open(q, 0, &f);
        if (rc != FL_EPROTO || f != NULL || strstr(fl_last_error(), q) == NULL) {
            size_t at = strlen(fails);
            snprintf(fails + at, sizeof fails - at, " [%zu bytes: rc %d: %s]", cut, rc,
                     fl_last_error());
            nfail++;
            fl_st_close(&f);
        }
    }
    ck_assert_msg(nfail == 0, "%zu of %zu prefixes not refused:%s", nfail, len, fails);

    /* The messages say what is wrong at each stage. */
    ck_assert(spit(q, raw, 5));
    expect_proto_file(q, "shorter than the 8-byte header length", "5 bytes");
    ck_assert(spit(q, raw, 40));
    expect_proto_file(q, "header length", "40 bytes");
    ck_assert(spit(q, raw, len - 1));
    expect_proto_file(q, "data section truncated: 18 of 19 bytes", "one byte short");

    /* One byte too many is refused as well: the tensors must cover the data section. */
    unsigned char *more = malloc(len + 1);
    memcpy(more, raw, len);
    more[len] = 0;
    ck_assert(spit(q, more, len + 1));
    expect_proto_file(q, "1 bytes after the last tensor", "one byte extra");
    free(more);
    free(raw);
}
END_TEST

START_TEST(test_corrupt_data)
{
    char p[512];
    char q[512];
    path_in(p, sizeof p, "whole.safetensors");
    path_in(q, sizeof q, "flipped.safetensors");
    write_small(p);
    size_t len = 0;
    unsigned char *raw = slurp(p, &len);
    size_t data_at = len - 19;
    size_t nfail = 0;
    char fails[1024] = "";
    for (size_t i = data_at; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 7) {
            raw[i] ^= (unsigned char)(1u << bit);
            bool written = spit(q, raw, len);
            raw[i] ^= (unsigned char)(1u << bit);
            fl_st_file_t *f = NULL;
            int rc = written ? fl_st_open(q, 0, &f) : FL_EIO;
            if (rc != FL_EPROTO || strstr(fl_last_error(), "CRC-32") == NULL) {
                size_t at = strlen(fails);
                snprintf(fails + at, sizeof fails - at, " [byte %zu bit %d: rc %d: %s]", i, bit, rc,
                         fl_last_error());
                nfail++;
                fl_st_close(&f);
            }
        }
    }
    ck_assert_msg(nfail == 0, "%zu flips not caught:%s", nfail, fails);
    ck_assert_ptr_nonnull(strstr(fl_last_error(), q));
    ck_assert_ptr_nonnull(strstr(fl_last_error(), "corrupt"));
    free(raw);
}
END_TEST

START_TEST(test_lying_header_length)
{
    char p[512];
    path_in(p, sizeof p, "len.safetensors");
    write_small(p);
    size_t len = 0;
    unsigned char *raw = slurp(p, &len);

    /* Larger than the file. */
    uint64_t n = len;
    for (int b = 0; b < 8; b++)
        raw[b] = (unsigned char)(n >> (8 * b));
    ck_assert(spit(p, raw, len));
    expect_proto_file(p, "larger than the", "header length = file size");

    /* Past the 100 MB limit, and absurd (2^63). */
    n = 200000000;
    for (int b = 0; b < 8; b++)
        raw[b] = (unsigned char)(n >> (8 * b));
    ck_assert(spit(p, raw, len));
    expect_proto_file(p, "exceeds the limit of 100000000", "header length 2e8");
    memset(raw, 0, 8);
    raw[7] = 0x80;
    ck_assert(spit(p, raw, len));
    expect_proto_file(p, "header length 9223372036854775808", "header length 2^63");

    /* Zero: an empty header is no JSON. */
    memset(raw, 0, 8);
    ck_assert(spit(p, raw, len));
    expect_proto_file(p, "not valid JSON", "header length 0");
    free(raw);
}
END_TEST

#define T_F32(name, shape, b, e)                                                                   \
    "\"" name "\":{\"dtype\":\"F32\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

START_TEST(test_bad_json)
{
    static const unsigned char zero[64];
    expect_proto("{\"a\":{\"dtype\":\"F32\",", zero, 0, "not valid JSON");
    expect_proto("garbage", zero, 0, "not valid JSON");
    expect_proto("{\"a\" \"b\"}", zero, 0, "not valid JSON");
    expect_proto("[1, 2]", zero, 0, "not a JSON object");
    expect_proto("\"str\"", zero, 0, "not a JSON object");
    expect_proto("{}x", zero, 0, "bytes after the JSON");
    expect_proto("{}{}", zero, 0, "bytes after the JSON");
    expect_proto("{\"a\":5}", zero, 0, "'a': entry is not a JSON object");
    expect_proto("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", zero, 4, "no \"dtype\"");
    expect_proto("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", zero, 4, "no \"shape\"");
    expect_proto("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", zero, 4, "\"data_offsets\"");
    expect_proto("{\"__metadata__\":[1]}", zero, 0, "\"__metadata__\" is not a JSON object");
    expect_proto("{\"__metadata__\":{\"k\":1}}", zero, 0, "metadata 'k' is not a string");
    expect_proto("{\"__metadata__\":{},\"__metadata__\":{}}", zero, 0, "appears twice");
    expect_proto("{\"__metadata__\":{\"k\":\"1\",\"j\":\"0\",\"k\":\"2\"}}", zero, 0,
                 "metadata key 'k' appears twice");
    expect_proto("{\"__metadata__\":{\"flodl.crc32\":\"xyz\"}}", zero, 0, "not 8 hex digits");
    expect_proto("{\"__metadata__\":{\"flodl.format\":\"2\"}}", zero, 0,
                 "flodl.format '2' is not supported");
}
END_TEST

START_TEST(test_bad_entries)
{
    static const unsigned char zero[64];
    expect_proto("{\"a\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]}}", zero, 1,
                 "unknown dtype 'BOOL'");
    expect_proto("{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", zero, 4,
                 "unknown dtype 'f32'");
    expect_proto("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", zero, 4,
                 "no \"dtype\" string");
    expect_proto("{" T_F32("a", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", zero, 4,
                 "9 dimensions, at most 8");
    expect_proto("{" T_F32("a", "[-1]", 0, 4) "}", zero, 4, "shape[0] is not an integer");
    expect_proto("{" T_F32("a", "[1, 1.5]", 0, 4) "}", zero, 4, "shape[1] is not an integer");
    expect_proto("{" T_F32("a", "[\"1\"]", 0, 4) "}", zero, 4, "shape[0] is not an integer");
    expect_proto("{" T_F32("a", "[1e300]", 0, 4) "}", zero, 4, "shape[0] is not an integer");
    expect_proto("{" T_F32("a", "[1]", 0, 4.5) "}", zero, 4, "\"data_offsets\" is not two");
    expect_proto("{" T_F32("a", "[1]", -4, 0) "}", zero, 4, "\"data_offsets\" is not two");
    expect_proto("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", zero, 8,
                 "\"data_offsets\" is not two");
    expect_proto("{" T_F32("a", "[0]", 4, 0) "}", zero, 4, "run backwards");

    /* Shape and byte count disagree. */
    expect_proto("{" T_F32("a", "[4]", 0, 12) "}", zero, 12,
                 "hold 12 bytes, but shape [4] of F32 "
                 "needs 16");
    expect_proto("{" T_F32("a", "[]", 0, 8) "}", zero, 8, "shape [] of F32 needs 4");
    expect_proto("{" T_F32("a", "[2,0]", 0, 8) "}", zero, 8, "needs 0");
    expect_proto("{" T_F32("a", "[4294967296,4294967296]", 0, 8) "}", zero, 8, "needs more than");
}
END_TEST

START_TEST(test_bad_layout)
{
    static const unsigned char zero[64];
    /* Out of range: the file holds less than the header claims. */
    expect_proto("{" T_F32("a", "[1]", 0, 4) "," T_F32("b", "[250]", 4, 1004) "}", zero, 16,
                 "data section truncated: 16 of 1004 bytes (tensor 'b' ends at 1004)");
    expect_proto("{" T_F32("a", "[1]", 9007199254740988, 9007199254740992) "}", zero, 4,
                 "\"data_offsets\" is not two");
    /* Overlap, gaps, unused data. */
    expect_proto("{" T_F32("a", "[2]", 0, 8) "," T_F32("b", "[2]", 4, 12) "}", zero, 12,
                 "tensors 'a' and 'b' overlap: data_offsets [0, 8] and [4, 12]");
    expect_proto("{" T_F32("a", "[2]", 0, 8) "," T_F32("b", "[2]", 0, 8) "}", zero, 8, "overlap");
    expect_proto("{" T_F32("a", "[1]", 4, 8) "}", zero, 8,
                 "gap of 4 bytes in the data section before tensor 'a'");
    expect_proto("{" T_F32("a", "[1]", 0, 4) "," T_F32("b", "[1]", 8, 12) "}", zero, 12,
                 "gap of 4 bytes in the data section before tensor 'b'");
    expect_proto("{" T_F32("a", "[1]", 0, 4) "}", zero, 12, "8 bytes after the last tensor");
    expect_proto("{}", zero, 3, "3 bytes after the last tensor");
    /* Duplicate names (JSON allows them; we cannot tell which one is meant). */
    expect_proto("{" T_F32("a", "[1]", 0, 4) "," T_F32("a", "[1]", 4, 8) "}", zero, 8,
                 "tensor 'a' appears twice");
}
END_TEST

START_TEST(test_open_io_errors)
{
    char p[512];
    path_in(p, sizeof p, "missing.safetensors");
    fl_st_file_t *f = NULL;
    ck_assert_int_eq(fl_st_open(p, 0, &f), FL_EIO);
    ck_assert_ptr_null(f);
    ck_assert_ptr_nonnull(strstr(fl_last_error(), p));
    ck_assert_ptr_nonnull(strstr(fl_last_error(), strerror(ENOENT)));
    ck_assert_int_eq(fl_st_open(dir, 0, &f), FL_EIO);
    ck_assert_ptr_nonnull(strstr(fl_last_error(), "not a regular file"));
}
END_TEST

/* ---- writer refusals ---- */

/* fl_st_write(t, nt, meta, nmeta) must fail with code, a detail containing want, and leave
 * the directory empty. */
static void expect_write_fail(const fl_st_tensor_t *t, size_t nt, const fl_st_meta_t *meta,
                              size_t nmeta, int code, const char *want)
{
    char p[512];
    path_in(p, sizeof p, "refused.safetensors");
    int rc = fl_st_write(p, t, nt, meta, nmeta);
    if (rc != code)
        ck_abort_msg("'%s': rc %d, expected %d (%s)", want, rc, code, fl_last_error());
    if (strstr(fl_last_error(), want) == NULL || strstr(fl_last_error(), p) == NULL)
        ck_abort_msg("detail '%s' lacks the path or '%s'", fl_last_error(), want);
    bool has_tmp = false;
    if (dir_entries(&has_tmp) != 0)
        ck_abort_msg("'%s': the directory is not empty after a refusal", want);
}

START_TEST(test_write_refusals)
{
    const float v[4] = {0};
    fl_st_tensor_t t[2] = {
        {.name = "a", .dtype = FL_FLOAT32, .ndim = 1, .shape = {2}, .data = v, .bytes = 8},
        {.name = "a", .dtype = FL_FLOAT32, .ndim = 1, .shape = {2}, .data = v + 2, .bytes = 8},
    };
    expect_write_fail(t, 2, NULL, 0, FL_EINVAL, "tensor name 'a' appears twice");
    t[1].name = "";
    expect_write_fail(t, 2, NULL, 0, FL_EINVAL, "tensor #1 has an empty name");
    t[1].name = NULL;
    expect_write_fail(t, 2, NULL, 0, FL_EINVAL, "tensor #1 has an empty name");
    t[1].name = "__metadata__";
    expect_write_fail(t, 2, NULL, 0, FL_EINVAL, "reserved");
    t[1].name = "bad\xff";
    expect_write_fail(t, 2, NULL, 0, FL_EINVAL, "not valid UTF-8");
    t[1].name = "\xed\xa0\x80"; /* an encoded surrogate */
    expect_write_fail(t, 2, NULL, 0, FL_EINVAL, "not valid UTF-8");
    t[1].name = "b";
    t[1].bytes = 12;
    expect_write_fail(t, 2, NULL, 0, FL_EINVAL,
                      "tensor 'b': 12 bytes, but shape [2] of F32 "
                      "needs 8");
    t[1].bytes = 8;
    t[1].shape[0] = 3;
    expect_write_fail(t, 2, NULL, 0, FL_EINVAL, "tensor 'b': 8 bytes, but shape [3]");
    t[1].shape[0] = 2;
    t[1].ndim = 9;
    expect_write_fail(t, 2, NULL, 0, FL_EINVAL, "tensor 'b': 9 dimensions, at most 8");
    t[1].ndim = 2;
    t[1].shape[1] = UINT64_C(1) << 53;
    expect_write_fail(t, 2, NULL, 0, FL_EINVAL, "below 2^53");
    t[1].ndim = 1;
    t[1].dtype = (fl_dtype_t)99;
    expect_write_fail(t, 2, NULL, 0, FL_EINVAL, "tensor 'b': invalid dtype 99");
    t[1].dtype = FL_FLOAT32;
    t[1].data = NULL;
    expect_write_fail(t, 2, NULL, 0, FL_EINVAL, "tensor 'b': data is NULL");
    t[1].data = v;

    fl_st_meta_t m[2] = {{"k", "1"}, {"k", "2"}};
    expect_write_fail(t, 2, m, 2, FL_EINVAL, "metadata key 'k' appears twice");
    m[1].key = "flodl.crc32";
    expect_write_fail(t, 2, m, 2, FL_EINVAL, "metadata 'flodl.crc32' is reserved");
    m[1].key = "";
    expect_write_fail(t, 2, m, 2, FL_EINVAL, "empty key");
    m[1].key = "j";
    m[1].value = NULL;
    expect_write_fail(t, 2, m, 2, FL_EINVAL, "metadata 'j': value is NULL");
    m[1].value = "\xc0\x80"; /* overlong NUL */
    expect_write_fail(t, 2, m, 2, FL_EINVAL, "metadata 'j': not valid UTF-8");

    /* The same tensors, corrected, are written. */
    m[1].value = "2";
    char p[512];
    path_in(p, sizeof p, "fine.safetensors");
    ck_assert_msg(fl_st_write(p, t, 2, m, 2) == FL_OK, "%s", fl_last_error());
}
END_TEST

START_TEST(test_write_io_errors)
{
    const uint8_t u[2] = {1, 2};
    fl_st_tensor_t t = {
        .name = "u", .dtype = FL_UINT8, .ndim = 1, .shape = {2}, .data = u, .bytes = 2};
    char p[512];
    bool has_tmp = false;

    /* A directory that does not exist. */
    path_in(p, sizeof p, "nowhere/x.safetensors");
    ck_assert_int_eq(fl_st_write(p, &t, 1, NULL, 0), FL_EIO);
    ck_assert_ptr_nonnull(strstr(fl_last_error(), p));
    ck_assert_ptr_nonnull(strstr(fl_last_error(), strerror(ENOENT)));

    /* The target is a directory: the rename fails, the temporary file is removed. */
    path_in(p, sizeof p, "adir");
    ck_assert_int_eq(mkdir(p, 0700), 0);
    ck_assert_int_eq(fl_st_write(p, &t, 1, NULL, 0), FL_EIO);
    ck_assert_ptr_nonnull(strstr(fl_last_error(), p));
    ck_assert_ptr_nonnull(strstr(fl_last_error(), "rename"));
    ck_assert_uint_eq(dir_entries(&has_tmp), 1);
    ck_assert(!has_tmp);
    ck_assert_int_eq(rmdir(p), 0);

    /* An unwritable directory (root writes anyway, so only checked for other users). */
    path_in(p, sizeof p, "ro");
    ck_assert_int_eq(mkdir(p, 0500), 0);
    char q[600];
    snprintf(q, sizeof q, "%s/x.safetensors", p);
    int rc = fl_st_write(q, &t, 1, NULL, 0);
    if (geteuid() != 0) {
        ck_assert_int_eq(rc, FL_EIO);
        ck_assert_ptr_nonnull(strstr(fl_last_error(), q));
        ck_assert_ptr_nonnull(strstr(fl_last_error(), strerror(EACCES)));
    }
    ck_assert_int_eq(chmod(p, 0700), 0);
    if (rc == FL_OK)
        ck_assert_int_eq(unlink(q), 0);
    ck_assert_int_eq(rmdir(p), 0);
    ck_assert_uint_eq(dir_entries(&has_tmp), 0);
}
END_TEST

static Suite *safetensors_suite(void)
{
    Suite *s = suite_create("safetensors");
    TCase *t = tcase_create("round_trip");
    tcase_set_timeout(t, 30);
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, test_round_trip);
    tcase_add_test(t, test_nothing_and_limits);
    tcase_add_test(t, test_replace_atomically);
    tcase_add_test(t, test_foreign_file);
    suite_add_tcase(s, t);

    t = tcase_create("refusals");
    tcase_set_timeout(t, 60);
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, test_truncated_every_length);
    tcase_add_test(t, test_corrupt_data);
    tcase_add_test(t, test_lying_header_length);
    tcase_add_test(t, test_bad_json);
    tcase_add_test(t, test_bad_entries);
    tcase_add_test(t, test_bad_layout);
    tcase_add_test(t, test_open_io_errors);
    tcase_add_test(t, test_write_refusals);
    tcase_add_test(t, test_write_io_errors);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(safetensors_suite());
}
