/* compression: the sparse block codec against hostile blocks: every truncation, every header
 * field, corrupt index streams and lz4 bodies, garbage and single-byte mutations, and small
 * blocks claiming huge tensors, refused before anything grows. Blocks are exact-size heap
 * copies and every output carries canaries, so ASan and the guards see strays. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_int.h"
#include "sparseutil.h"

/* ---- helpers ---- */

static void fill_random(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)fl_test_rand(&s);
}

/* A block assembled field by field, for blocks the encoder would never make. */
typedef struct raw_hdr {
    const char *magic;
    uint8_t version, vtype, coding, flags;
    uint64_t n, k;
    uint32_t ib, vb, bb, reserved;
} raw_hdr_t;

static void raw_hdr_init(raw_hdr_t *h, uint64_t n, uint64_t k, fl_dtype_t vt, uint32_t ib)
{
    h->magic = "FLSP";
    h->version = 1;
    h->vtype = (uint8_t)vt;
    h->coding = 1;
    h->flags = 0;
    h->n = n;
    h->k = k;
    h->ib = ib;
    h->vb = (uint32_t)(k * vsize(vt));
    h->bb = 0;
    h->reserved = 0;
}

static uint8_t *assemble(const raw_hdr_t *h, const uint8_t *body, size_t body_len, size_t *len)
{
    *len = HDR + body_len;
    uint8_t *b = xmalloc(*len);
    memcpy(b, h->magic, 4);
    b[4] = h->version;
    b[5] = h->vtype;
    b[6] = h->coding;
    b[7] = h->flags;
    put_le(b + 8, 8, h->n);
    put_le(b + 16, 8, h->k);
    put_le(b + 24, 4, h->ib);
    put_le(b + 28, 4, h->vb);
    put_le(b + 32, 4, h->bb);
    put_le(b + 36, 4, h->reserved);
    if (body_len > 0)
        memcpy(b + HDR, body, body_len);
    return b;
}

/* A block of k pairs of a tensor of n whose index stream is the given bytes and whose values
 * are a pattern, the body stored raw or as one lz4 block (used even when it does not shrink).
 * The header is consistent with the body, so only the decoder's body checks can refuse it. */
static uint8_t *craft(uint64_t n, uint64_t k, fl_dtype_t vt, const uint8_t *istream, size_t ib,
                      bool lz4, size_t *len)
{
    raw_hdr_t h;
    raw_hdr_init(&h, n, k, vt, (uint32_t)ib);
    size_t raw = ib + h.vb;
    uint8_t *body = xmalloc(raw);
    if (ib > 0)
        memcpy(body, istream, ib);
    /* Values start with 0x00 bytes: a decoder reading past the index stream would find a
     * varint terminator there and wrongly succeed. */
    for (size_t i = ib; i < raw; i++)
        body[i] = (uint8_t)((i - ib) % 3 == 0 ? 0x00 : 0x3f);
    uint8_t *block;
    if (lz4) {
        size_t cap = fl_cmp_lz4_bound(raw);
        uint8_t *z = xmalloc(cap);
        size_t clen = 0;
        if (fl_cmp_lz4_compress(body, raw, z, cap, &clen) != FL_OK)
            ck_abort_msg("lz4 of %zu bytes: %s", raw, fl_last_error());
        h.flags = 1;
        h.bb = (uint32_t)clen;
        block = assemble(&h, z, clen, len);
        free(z);
    } else {
        h.bb = (uint32_t)raw;
        block = assemble(&h, body, raw, len);
    }
    free(body);
    return block;
}

/* A copy of block with width little-endian bytes at off replaced by v. */
static uint8_t *patched(const uint8_t *block, size_t len, size_t off, size_t width, uint64_t v)
{
    uint8_t *p = exact_copy(block, len);
    put_le(p + off, width, v);
    return p;
}

/* Accumulates an exact-size copy of block into a dense vector of n entries holding a pattern
 * and followed by canaries. A refusal must leave it bit for bit as it was. */
static int accumulate_guarded(fl_cmp_ws_t *ws, const uint8_t *block, size_t len, size_t n,
                              const char *what)
{
    float *dense = xmalloc((n + GUARD) * sizeof *dense);
    for (size_t i = 0; i < n; i++)
        dense[i] = (float)(i % 13) - 6.0f;
    for (size_t i = n; i < n + GUARD; i++)
        dense[i] = bits_f32(VAL_CANARY);
    float *before = xmalloc(n * sizeof *before);
    memcpy(before, dense, n * sizeof *dense);
    uint8_t *src = exact_copy(block, len);
    size_t k = SIZE_MAX;
    int rc = fl_cmp_sparse_accumulate(ws, src, len, dense, n, &k);
    free(src);
    if (rc != FL_OK && rc != FL_EPROTO)
        ck_abort_msg("%s: accumulate rc %d (%s)", what, rc, fl_last_error());
    if (rc != FL_OK && memcmp(before, dense, n * sizeof *dense) != 0)
        ck_abort_msg("%s: refused block changed the dense vector", what);
    if (rc == FL_OK && k > n)
        ck_abort_msg("%s: accumulate reports %zu pairs of %zu", what, k, n);
    for (size_t i = n; i < n + GUARD; i++)
        if (f32_bits(dense[i]) != VAL_CANARY)
            ck_abort_msg("%s: accumulate wrote dense[%zu] of %zu", what, i, n);
    free(before);
    free(dense);
    return rc;
}

/* The block must be refused with FL_EPROTO and a detail containing want: by peek when peek_rc
 * says so (FL_OK: the header is fine, the body is not), by decode with room for k_cap pairs, and
 * by accumulate when acc (n small enough for a dense vector). */
static void expect_refused(fl_cmp_ws_t *ws, const uint8_t *block, size_t len, size_t n,
                           size_t k_cap, int peek_rc, bool acc, const char *want, const char *what)
{
    uint8_t *src = exact_copy(block, len);
    fl_cmp_sparse_info_t info;
    fl_error_clear();
    int rc = fl_cmp_sparse_peek(src, len, &info);
    free(src);
    if (rc != peek_rc)
        ck_abort_msg("%s: peek rc %d, expected %d (%s)", what, rc, peek_rc, fl_last_error());
    if (rc != FL_OK && strstr(fl_last_error(), want) == NULL)
        ck_abort_msg("%s: peek detail '%s' lacks '%s'", what, fl_last_error(), want);
    fl_error_clear();
    rc = decode_guarded(ws, block, len, n, k_cap, what);
    if (rc != FL_EPROTO)
        ck_abort_msg("%s: decode rc %d, expected FL_EPROTO", what, rc);
    if (strstr(fl_last_error(), want) == NULL)
        ck_abort_msg("%s: decode detail '%s' lacks '%s'", what, fl_last_error(), want);
    if (!acc)
        return;
    fl_error_clear();
    rc = accumulate_guarded(ws, block, len, n, what);
    if (rc != FL_EPROTO)
        ck_abort_msg("%s: accumulate rc %d, expected FL_EPROTO", what, rc);
    if (strstr(fl_last_error(), want) == NULL)
        ck_abort_msg("%s: accumulate detail '%s' lacks '%s'", what, fl_last_error(), want);
}

/* ---- hostile blocks ---- */

/* A small zoo of valid blocks to break. */
typedef struct zoo {
    uint8_t *block;
    size_t len;
    size_t n;
    size_t k;
    const char *name;
} zoo_t;

enum { ZOO_F32_RAW, ZOO_F16_LZ4, ZOO_BF16_DENSE, ZOO_EMPTY, ZOO_F16_RAW, ZOO_HUGE_N, ZOO_COUNT };

static void zoo_make(fl_cmp_ws_t *ws, zoo_t *z)
{
    uint32_t idx[300];
    float val[300];

    /* 5 scattered float32 pairs, raw */
    const uint32_t a[] = {0, 17, 130, 200, 327}; /* 1-byte gaps: 5 index bytes */
    for (size_t i = 0; i < 5; i++)
        val[i] = (float)i * 1.25f - 2.0f;
    z[ZOO_F32_RAW] = (zoo_t){NULL, 0, 1000, 5, "float32 raw"};
    z[ZOO_F32_RAW].block =
        encode_block(ws, a, val, 5, 1000, FL_FLOAT32, false, &z[ZOO_F32_RAW].len);

    /* 300 float16 pairs 200 apart (2-byte varints), regular: lz4 */
    for (size_t i = 0; i < 300; i++) {
        idx[i] = (uint32_t)(i * 200 + 199);
        val[i] = (float)(i % 8) * 0.5f;
    }
    z[ZOO_F16_LZ4] = (zoo_t){NULL, 0, 60000, 300, "float16 lz4"};
    z[ZOO_F16_LZ4].block =
        encode_block(ws, idx, val, 300, 60000, FL_FLOAT16, true, &z[ZOO_F16_LZ4].len);

    /* k = n = 64 bfloat16, few distinct values: an lz4 body of mostly tokens and matches */
    for (size_t i = 0; i < 64; i++) {
        idx[i] = (uint32_t)i;
        val[i] = (float)(i % 4);
    }
    z[ZOO_BF16_DENSE] = (zoo_t){NULL, 0, 64, 64, "bfloat16 dense"};
    z[ZOO_BF16_DENSE].block =
        encode_block(ws, idx, val, 64, 64, FL_BFLOAT16, true, &z[ZOO_BF16_DENSE].len);

    z[ZOO_EMPTY] = (zoo_t){NULL, 0, 10, 0, "empty"};
    z[ZOO_EMPTY].block = encode_block(ws, idx, val, 0, 10, FL_FLOAT32, true, &z[ZOO_EMPTY].len);

    random_indices(idx, 40, 5000, 77);
    random_values(val, 40, 78);
    z[ZOO_F16_RAW] = (zoo_t){NULL, 0, 5000, 40, "float16 raw"};
    z[ZOO_F16_RAW].block =
        encode_block(ws, idx, val, 40, 5000, FL_FLOAT16, false, &z[ZOO_F16_RAW].len);

    shape_t sh = {"gaps", N32, 15, IDX_GAPS};
    shape_indices(&sh, idx, 0);
    z[ZOO_HUGE_N] = (zoo_t){NULL, 0, N32, 15, "n = 2^32-1"};
    z[ZOO_HUGE_N].block = encode_block(ws, idx, val, 15, N32, FL_FLOAT32, true, &z[ZOO_HUGE_N].len);
}

static void zoo_free(zoo_t *z)
{
    for (size_t i = 0; i < ZOO_COUNT; i++)
        free(z[i].block);
}

/* Every prefix of every block, and one byte too many: refused by the size checks. A truncated
 * lz4 body whose header is patched to match is refused by lz4. */
START_TEST(test_truncations)
{
    fl_cmp_ws_t *ws = new_ws();
    zoo_t z[ZOO_COUNT];
    zoo_make(ws, z);
    char what[96];
    for (size_t b = 0; b < ZOO_COUNT; b++) {
        bool acc = z[b].n <= DENSE_MAX;
        for (size_t cut = 0; cut < z[b].len; cut++) {
            snprintf(what, sizeof what, "%s cut to %zu of %zu", z[b].name, cut, z[b].len);
            expect_refused(ws, z[b].block, cut, z[b].n, z[b].k, FL_EPROTO, acc,
                           cut < HDR ? "shorter than its 40-byte header" : "arrived", what);
        }
        uint8_t *longer = xmalloc(z[b].len + 1);
        memcpy(longer, z[b].block, z[b].len);
        longer[z[b].len] = 0;
        snprintf(what, sizeof what, "%s plus a byte", z[b].name);
        expect_refused(ws, longer, z[b].len + 1, z[b].n, z[b].k, FL_EPROTO, acc, "arrived", what);
        free(longer);
    }
    const zoo_t *l = &z[ZOO_F16_LZ4];
    ck_assert_int_eq(l->block[7], 1);
    uint32_t ib;
    uint32_t vb;
    memcpy(&ib, l->block + 24, 4);
    memcpy(&vb, l->block + 28, 4);
    for (size_t cut = HDR + 1; cut < l->len; cut++) {
        uint8_t *p = patched(l->block, cut, 32, 4, cut - HDR);
        snprintf(what, sizeof what, "lz4 body cut to %zu, header patched", cut - HDR);
        /* lz4 expands at most ~255:1: a body too short for its claim is refused by peek
         * already, a longer one by lz4 itself. */
        int peek_rc = (uint64_t)ib + vb > 255ull * (cut - HDR) + 16 ? FL_EPROTO : FL_OK;
        expect_refused(ws, p, cut, l->n, l->k, peek_rc, true, "lz4", what);
        free(p);
    }
    zoo_free(z);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

typedef struct field_case {
    size_t off;
    size_t width;
    uint64_t value;
    int peek_rc;
    const char *want;
} field_case_t;

/* Every header field wrong in turn, against the 5-pair float32 raw block (n 1000, 5 index
 * bytes, 20 value bytes, body 25). */
START_TEST(test_header_fields)
{
    static const field_case_t cases[] = {
        {0, 1, 'X', FL_EPROTO, "bad magic"},
        {3, 1, 'p', FL_EPROTO, "bad magic"},
        {0, 4, 0, FL_EPROTO, "bad magic 0x00000000"},
        {4, 1, 0, FL_EPROTO, "version 0, expected 1"},
        {4, 1, 2, FL_EPROTO, "version 2, expected 1"},
        {4, 1, 255, FL_EPROTO, "version 255"},
        {5, 1, 0, FL_EPROTO, "unknown value type 0"},
        {5, 1, FL_FLOAT64, FL_EPROTO, "unknown value type 4"},
        {5, 1, FL_INT32, FL_EPROTO, "unknown value type 5"},
        {5, 1, 200, FL_EPROTO, "unknown value type 200"},
        {6, 1, 0, FL_EPROTO, "unknown index coding 0"},
        {6, 1, 2, FL_EPROTO, "unknown index coding 2"},
        {7, 1, 2, FL_EPROTO, "flags 0x02"},
        {7, 1, 0x80, FL_EPROTO, "flags 0x80"},
        {7, 1, 0xff, FL_EPROTO, "flags 0xff"},
        {36, 4, 1, FL_EPROTO, "reserved"},
        {39, 1, 0x80, FL_EPROTO, "reserved"},
        {8, 8, 0, FL_EPROTO, "n = 0 entries"},
        {8, 8, 4, FL_EPROTO, "k = 5 pairs of a tensor of n = 4 entries"},
        {8, 8, (uint64_t)N32 + 1, FL_EPROTO, "n = 4294967296"},
        {8, 8, UINT64_MAX, FL_EPROTO, "n = 18446744073709551615"},
        {16, 8, 1001, FL_EPROTO, "k = 1001 pairs of a tensor of n = 1000"},
        {16, 8, UINT64_MAX, FL_EPROTO, "k = 18446744073709551615"},
        {16, 8, 4, FL_EPROTO, "20 value bytes for 4 float32 values"},
        {16, 8, 6, FL_EPROTO, "20 value bytes for 6 float32 values"},
        {28, 4, 21, FL_EPROTO, "21 value bytes for 5"},
        {28, 4, 16, FL_EPROTO, "16 value bytes for 5"},
        {28, 4, 0, FL_EPROTO, "0 value bytes"},
        {24, 4, 4, FL_EPROTO, "4 index bytes cannot hold 5 indices"},
        {24, 4, 0, FL_EPROTO, "0 index bytes cannot hold"},
        {24, 4, 26, FL_EPROTO, "26 index bytes cannot hold 5 indices"},
        {24, 4, UINT32_MAX, FL_EPROTO, "cannot hold"},
        {24, 4, 6, FL_EPROTO, "raw body of 25 bytes, 26 declared"},
        {32, 4, 26, FL_EPROTO, "26 body bytes, 25 arrived"},
        {32, 4, 24, FL_EPROTO, "24 body bytes, 25 arrived"},
        {32, 4, 0, FL_EPROTO, "0 body bytes"},
        {32, 4, UINT32_MAX, FL_EPROTO, "arrived"},
        /* A raw body taken for lz4: within the bound, so only decompression can tell. */
        {7, 1, 1, FL_OK, "lz4"},
    };
    fl_cmp_ws_t *ws = new_ws();
    zoo_t z[ZOO_COUNT];
    zoo_make(ws, z);
    const zoo_t *a = &z[ZOO_F32_RAW];
    ck_assert_uint_eq(a->len, HDR + 25);
    ck_assert_uint_eq(get_u32(a->block + 24), 5);
    char what[96];
    for (size_t c = 0; c < NELEM(cases); c++) {
        const field_case_t *f = &cases[c];
        uint8_t *p = patched(a->block, a->len, f->off, f->width, f->value);
        snprintf(what, sizeof what, "byte %zu (%zu wide) = %llu", f->off, f->width,
                 (unsigned long long)f->value);
        expect_refused(ws, p, a->len, a->n, a->k + 8, f->peek_rc, true, f->want, what);
        free(p);
    }

    /* The lz4 block (300 2-byte varints): flag cleared, and index bytes one off either way so
     * the body decompresses to another size than declared. */
    const zoo_t *l = &z[ZOO_F16_LZ4];
    ck_assert_uint_eq(get_u32(l->block + 24), 600);
    uint8_t *p = patched(l->block, l->len, 7, 1, 0);
    expect_refused(ws, p, l->len, l->n, l->k, FL_EPROTO, true, "raw body of", "lz4 flag cleared");
    free(p);
    p = patched(l->block, l->len, 24, 4, 601);
    expect_refused(ws, p, l->len, l->n, l->k, FL_OK, true, "header declared 1201",
                   "lz4 body 1 byte short of the header");
    free(p);
    p = patched(l->block, l->len, 24, 4, 599);
    expect_refused(ws, p, l->len, l->n, l->k, FL_OK, true, "lz4", "lz4 body 1 byte too long");
    free(p);

    /* lz4 flag with nothing to decode, or a body beyond what lz4 can make of the raw size. */
    raw_hdr_t h;
    raw_hdr_init(&h, 10, 0, FL_FLOAT32, 0);
    h.flags = 1;
    h.bb = 1;
    const uint8_t zero[32] = {0};
    size_t len;
    p = assemble(&h, zero, 1, &len);
    expect_refused(ws, p, len, 10, 4, FL_EPROTO, true, "lz4 body of 1 bytes cannot decode to 0",
                   "lz4 k=0");
    free(p);
    raw_hdr_init(&h, 10, 1, FL_FLOAT32, 1);
    h.flags = 1;
    h.bb = (uint32_t)fl_cmp_lz4_bound(5) + 1;
    p = assemble(&h, zero, h.bb, &len);
    expect_refused(ws, p, len, 10, 4, FL_EPROTO, true, "cannot decode to 5", "lz4 over bound");
    free(p);
    h.bb = 0;
    p = assemble(&h, zero, 0, &len);
    expect_refused(ws, p, len, 10, 4, FL_EPROTO, true, "lz4 body of 0 bytes", "lz4 empty body");
    free(p);

    /* The caller's n and room. */
    expect_refused(ws, a->block, a->len, 999, 5, FL_OK, true, "1000 entries, expected 999",
                   "n too small");
    expect_refused(ws, a->block, a->len, 1001, 5, FL_OK, true, "expected 1001", "n too large");
    expect_refused(ws, a->block, a->len, 1000, 4, FL_OK, false, "5 pairs, room for 4", "k_cap");
    expect_refused(ws, a->block, a->len, 1000, 0, FL_OK, false, "room for 0", "k_cap 0");
    const zoo_t *d = &z[ZOO_BF16_DENSE];
    expect_refused(ws, d->block, d->len, 64, 63, FL_OK, false, "64 pairs, room for 63", "dense");
    /* The same block with enough room is fine. */
    ck_assert_int_eq(decode_guarded(ws, a->block, a->len, 1000, 5, "exact room"), FL_OK);
    zoo_free(z);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

typedef struct stream_case {
    const char *name;
    uint64_t n;
    uint64_t k;
    uint8_t bytes[10];
    size_t ib;
    const char *want; /* NULL: valid */
} stream_case_t;

/* Index streams the encoder never writes, raw and inside an lz4 body: each refused after
 * decompression, with the index named. */
START_TEST(test_index_stream)
{
    static const uint8_t c80 = 0x80;
    static const stream_case_t cases[] = {
        {"6 continuation bytes",
         1000,
         2,
         {c80, c80, c80, c80, c80, c80, 0, 0},
         8,
         "index 0's varint is over 5 bytes"},
        {"5 continuation bytes",
         1000,
         2,
         {0, c80, c80, c80, c80, c80, 0},
         7,
         "index 1's varint is over 5 bytes"},
        {"past the stream", 1000, 2, {0x00, 0x80}, 2, "index stream ends inside index 1"},
        {"past the stream at once", 1000, 1, {0xff}, 1, "index stream ends inside index 0"},
        {"past the stream, 4 bytes",
         1000,
         1,
         {0xff, 0xff, 0xff, 0xff},
         4,
         "index stream ends inside index 0"},
        {"gap past n", 10, 2, {5, 4}, 2, "index 1 is 10, outside 0..9"},
        {"first index n", 10, 1, {10}, 1, "index 0 is 10, outside 0..9"},
        {"last index n-1", 10, 2, {5, 3}, 2, NULL},
        {"gap over 2^32", 1000, 1, {0xff, 0xff, 0xff, 0xff, 0x7f}, 5, "outside 0..999"},
        {"gap 2^32-1",
         N32,
         1,
         {0xff, 0xff, 0xff, 0xff, 0x0f},
         5,
         "index 0 is 4294967295, outside 0..4294967294"},
        {"gap 2^32-2", N32, 1, {0xfe, 0xff, 0xff, 0xff, 0x0f}, 5, NULL},
        {"top then one more",
         N32,
         2,
         {0xfe, 0xff, 0xff, 0xff, 0x0f, 0x00},
         6,
         "index 1 is 4294967295"},
        {"sum past 2^32",
         N32,
         2,
         {0x80, 0x80, 0x80, 0x80, 0x08, 0x80, 0x80, 0x80, 0x80, 0x08},
         10,
         "index 1 is 4294967297"},
        {"1 byte left", 1000, 1, {0, 0}, 2, "1 index bytes left after 1 indices"},
        {"3 bytes left", 1000, 2, {1, 2, 3, 4, 5}, 5, "3 index bytes left after 2 indices"},
    };
    fl_cmp_ws_t *ws = new_ws();
    char what[96];
    for (size_t c = 0; c < NELEM(cases); c++) {
        const stream_case_t *s = &cases[c];
        for (int lz4 = 0; lz4 < 2; lz4++) {
            for (size_t t = 0; t < NELEM(vtypes); t++) {
                size_t len;
                uint8_t *b = craft(s->n, s->k, vtypes[t], s->bytes, s->ib, lz4 == 1, &len);
                snprintf(what, sizeof what, "%s, %s, lz4 %d", s->name, fl_dtype_name(vtypes[t]),
                         lz4);
                bool acc = s->n <= DENSE_MAX;
                if (s->want != NULL) {
                    expect_refused(ws, b, len, s->n, s->k, FL_OK, acc, s->want, what);
                } else {
                    if (decode_guarded(ws, b, len, s->n, s->k, what) != FL_OK)
                        ck_abort_msg("%s: refused: %s", what, fl_last_error());
                    if (acc && accumulate_guarded(ws, b, len, s->n, what) != FL_OK)
                        ck_abort_msg("%s: accumulate refused: %s", what, fl_last_error());
                }
                free(b);
            }
        }
    }
    fl_cmp_ws_destroy(&ws);
}
END_TEST

/* Every byte of an lz4 body flipped: refused or decoded to some valid sparse vector, never a
 * stray write; most flips in tokens and offsets are caught. */
START_TEST(test_lz4_corruption)
{
    static const uint8_t xors[] = {0xff, 0x80, 0x01, 0x10};
    fl_cmp_ws_t *ws = new_ws();
    zoo_t z[ZOO_COUNT];
    zoo_make(ws, z);
    const size_t which[] = {ZOO_F16_LZ4, ZOO_BF16_DENSE, ZOO_HUGE_N};
    char what[96];
    for (size_t w = 0; w < NELEM(which); w++) {
        const zoo_t *l = &z[which[w]];
        if (l->block[7] != 1)
            ck_abort_msg("%s: not lz4-compressed", l->name);
        uint8_t *b = exact_copy(l->block, l->len);
        long refused = 0;
        long tried = 0;
        for (size_t pos = HDR; pos < l->len; pos++) {
            for (size_t x = 0; x < NELEM(xors); x++) {
                b[pos] ^= xors[x];
                snprintf(what, sizeof what, "%s: body byte %zu ^ 0x%02x", l->name, pos - HDR,
                         xors[x]);
                int rc = decode_guarded(ws, b, l->len, l->n, l->k, what);
                if (l->n <= DENSE_MAX && accumulate_guarded(ws, b, l->len, l->n, what) != rc)
                    ck_abort_msg("%s: decode and accumulate disagree", what);
                refused += rc == FL_EPROTO;
                tried++;
                b[pos] ^= xors[x];
            }
        }
        /* Flips inside literal value bytes cannot be seen; those in tokens, offsets and the
         * index stream mostly are (12% to 45% of all flips for these blocks). */
        if (refused < tried / 10)
            ck_abort_msg("%s: only %ld of %ld corrupt bodies refused", l->name, refused, tried);
        free(b);
    }
    zoo_free(z);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

/* Random buffers of many sizes, some with a plausible header in front: refused or decoded to a
 * valid sparse vector, never a crash, a stray write or a touched dense vector. */
START_TEST(test_garbage)
{
    fl_cmp_ws_t *ws = new_ws();
    uint8_t *buf = xmalloc(1024);
    long accepted = 0;
    for (uint64_t seed = 1; seed <= 6000; seed++) {
        uint64_t s = seed;
        size_t len = (size_t)(fl_test_rand(&s) % 700);
        fill_random(buf, len, seed * 7919);
        uint64_t n = 1000;
        uint64_t k = 0;
        int flavour = (int)(seed % 3);
        if (flavour > 0 && len >= HDR) {
            /* A header that passes the cheap checks, so the body is what gets tested. */
            fl_dtype_t vt = vtypes[fl_test_rand(&s) % 3];
            n = 1 + fl_test_rand(&s) % 2000;
            k = fl_test_rand(&s) % (n < 40 ? n + 1 : 40);
            uint64_t ib = k + (k > 0 ? fl_test_rand(&s) % (4 * k + 1) : 0);
            raw_hdr_t h;
            raw_hdr_init(&h, n, k, vt, (uint32_t)ib);
            h.flags = flavour == 2 ? 1 : 0;
            if (flavour == 1) {
                len = HDR + (size_t)ib + h.vb;
                fill_random(buf + HDR, len - HDR, seed);
            }
            h.bb = (uint32_t)(len - HDR);
            size_t hl;
            uint8_t *hb = assemble(&h, NULL, 0, &hl);
            memcpy(buf, hb, HDR);
            free(hb);
        }
        char what[64];
        snprintf(what, sizeof what, "garbage %llu (%zu bytes)", (unsigned long long)seed, len);
        static const size_t caps[] = {0, 1, 7, 40, 1000};
        size_t n_dec = n <= 2000 ? (size_t)n : 1000;
        int rc = decode_guarded(ws, buf, len, n_dec, caps[seed % NELEM(caps)], what);
        int rc2 = accumulate_guarded(ws, buf, len, n_dec, what);
        if (rc == FL_OK && rc2 != FL_OK)
            ck_abort_msg("%s: decoded but not accumulated: %s", what, fl_last_error());
        accepted += rc2 == FL_OK;
    }
    /* The well-formed headers with a raw body of random varints are sometimes valid. */
    if (accepted == 0)
        ck_abort_msg("no garbage block was ever accepted: the body checks were not reached");
    free(buf);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

/* Every byte of every zoo block mutated: refused or decoded to a valid sparse vector, and
 * decode (room for n) and accumulate always agree. */
START_TEST(test_mutations)
{
    static const uint8_t xors[] = {0x01, 0x02, 0x10, 0x80, 0xff, 0x7f};
    fl_cmp_ws_t *ws = new_ws();
    zoo_t z[ZOO_COUNT];
    zoo_make(ws, z);
    char what[96];
    long refused = 0;
    long tried = 0;
    for (size_t b = 0; b < ZOO_COUNT; b++) {
        const zoo_t *m = &z[b];
        bool acc = m->n <= DENSE_MAX;
        size_t k_cap = acc ? m->n : m->k + 4;
        uint8_t *p = exact_copy(m->block, m->len);
        for (size_t pos = 0; pos < m->len; pos++) {
            for (size_t x = 0; x < NELEM(xors); x++) {
                p[pos] ^= xors[x];
                snprintf(what, sizeof what, "%s: byte %zu ^ 0x%02x", m->name, pos, xors[x]);
                int rc = decode_guarded(ws, p, m->len, m->n, k_cap, what);
                if (acc && accumulate_guarded(ws, p, m->len, m->n, what) != rc)
                    ck_abort_msg("%s: decode rc %d, accumulate disagrees", what, rc);
                refused += rc == FL_EPROTO;
                tried++;
                p[pos] ^= xors[x];
            }
        }
        free(p);
    }
    /* Header and index bytes are almost all checked; value bytes cannot be. */
    if (refused < tried / 4)
        ck_abort_msg("only %ld of %ld mutations refused", refused, tried);
    zoo_free(z);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

/* A small block that claims a huge tensor must be refused before the workspace grows to its
 * claims. A 42-byte lz4 block saying k = n = 10^8 (a 500 MB raw body) is refused by peek: lz4
 * cannot expand 2 bytes that far. One with a body just long enough for the claim (~2 MB)
 * passes peek, and then the caller's n (16 entries) must stop it before any allocation. */
START_TEST(test_claims_allocate_nothing)
{
    const uint64_t big = 100000000;
    raw_hdr_t h;
    raw_hdr_init(&h, big, big, FL_FLOAT32, (uint32_t)big);
    h.flags = 1;
    h.bb = 2;
    const uint8_t tiny[2] = {0x00, 0x00};
    size_t len;
    uint8_t *b = assemble(&h, tiny, sizeof tiny, &len);
    fl_cmp_sparse_info_t in;
    ck_assert_int_eq(fl_cmp_sparse_peek(b, len, &in), FL_EPROTO);
    free(b);

    uint64_t raw = big + big * 4;
    h.bb = (uint32_t)(raw / 255 + 16);
    uint8_t *body = calloc(h.bb, 1);
    ck_assert(body != NULL);
    b = assemble(&h, body, h.bb, &len);
    free(body);
    ck_assert_int_eq(fl_cmp_sparse_peek(b, len, &in), FL_OK);

    fl_cmp_ws_t *ws = new_ws();
    expect_refused(ws, b, len, 16, 16, FL_OK, false, "expected 16", "decode, n 16");
    expect_refused(ws, b, len, big, 16, FL_OK, false, "room for 16", "decode, k_cap 16");
    ck_assert_msg(ws->buf_cap < 4096, "decode grew its buffer to %zu bytes", ws->buf_cap);

    /* accumulate: the caller's tensor says how much can be needed, not the block. */
    float dense[16] = {0};
    size_t kq = 0;
    fl_error_clear();
    int rc = fl_cmp_sparse_accumulate(ws, b, len, dense, 16, &kq);
    ck_assert_msg(rc == FL_EPROTO, "accumulate rc %d (%s), expected FL_EPROTO", rc,
                  fl_last_error());
    ck_assert_msg(strstr(fl_last_error(), "expected 16") != NULL, "%s", fl_last_error());
    ck_assert_msg(ws->dec_cap < 4096,
                  "a refused 42-byte block grew the workspace to %zu decoded pairs "
                  "(%zu MB): accumulate sizes its scratch by the block's k before checking n",
                  ws->dec_cap, ws->dec_cap * 8 >> 20);
    free(b);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

Suite *cmp_sparse_hostile_suite(void);
Suite *cmp_sparse_hostile_suite(void)
{
    Suite *s = suite_create("cmp_sparse_hostile");
    TCase *t = tcase_create("hostile");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_truncations);
    tcase_add_test(t, test_header_fields);
    tcase_add_test(t, test_index_stream);
    tcase_add_test(t, test_lz4_corruption);
    tcase_add_test(t, test_garbage);
    tcase_add_test(t, test_mutations);
    tcase_add_test(t, test_claims_allocate_nothing);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(cmp_sparse_hostile_suite());
}
