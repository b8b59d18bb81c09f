/* compression: the sparse block codec's round trips (float32/float16/bfloat16, lz4 on and off,
 * k = 0 to n, n = 1 to 2^32-1, 5-byte varints), the exact header layout, rounding, lz4 kept
 * only when it shrinks, accumulation, the bound, the workspace, and encode refusals. Blocks
 * are exact-size heap copies and every output carries canaries, so ASan and the guards see
 * strays. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_int.h"
#include "sparseutil.h"

/* Check records every passing ck_assert; inside loops, check in C and abort on failure. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            ck_abort_msg(__VA_ARGS__);                                                             \
    } while (0)

/* ---- helpers ---- */

/* A finite value beyond the narrow type's range saturates at its largest finite value (so
 * error feedback keeps the excess); NaN and infinities pass through. */
static float saturate(float v, fl_dtype_t t)
{
    float lim = t == FL_FLOAT16 ? 65504.0f : 0x1.fep127f;
    if (isfinite(v) && v > lim)
        return lim;
    if (isfinite(v) && v < -lim)
        return -lim;
    return v;
}

/* The bits the codec must store for v as type t (float16 / bfloat16). */
static uint16_t wire_bits(float v, fl_dtype_t t)
{
    v = saturate(v, t);
    return t == FL_FLOAT16 ? fl_f32_to_f16(v) : fl_f32_to_bf16(v);
}

/* What the codec must deliver for v after it travelled as type t. */
static float wire_round(float v, fl_dtype_t t)
{
    if (t == FL_FLOAT16)
        return fl_f16_to_f32(wire_bits(v, t));
    if (t == FL_BFLOAT16)
        return fl_bf16_to_f32(wire_bits(v, t));
    return v;
}

static size_t varint_len(uint32_t d)
{
    size_t n = 1;
    while (d >= 0x80) {
        d >>= 7;
        n++;
    }
    return n;
}

/* Size of the index stream of ascending indices, by the format's rule (gaps minus one). */
static size_t index_bytes_of(const uint32_t *idx, size_t k)
{
    size_t b = 0;
    int64_t prev = -1;
    for (size_t i = 0; i < k; i++) {
        b += varint_len((uint32_t)((int64_t)idx[i] - prev - 1));
        prev = idx[i];
    }
    return b;
}

/* ---- round trips ---- */

static const shape_t shapes[] = {
    {"n=1 k=0", 1, 0, IDX_RANDOM},
    {"n=1 k=1", 1, 1, IDX_ALL},
    {"k=0", 1000, 0, IDX_RANDOM},
    {"k=1 first", 1000, 1, IDX_FIRST},
    {"k=1 last", 1000, 1, IDX_LAST},
    {"k=n", 4096, 4096, IDX_ALL},
    {"dense-ish", 5000, 4000, IDX_RANDOM},
    {"sparse", 100000, 1000, IDX_RANDOM},
    {"very sparse", 10000000, 16, IDX_RANDOM},
    {"n=2^32-1 near the top", N32, 6, IDX_TOP},
    {"n=2^32-1 5-byte gaps", N32, 15, IDX_GAPS},
    {"n=2^32-1 last", N32, 1, IDX_LAST},
};

START_TEST(test_round_trip)
{
    const shape_t *sh = &shapes[_i / 6];
    fl_dtype_t vt = vtypes[(_i / 2) % 3];
    bool lz4 = _i % 2 == 1;
    char what[128];
    snprintf(what, sizeof what, "%s, %s, lz4 %s", sh->name, fl_dtype_name(vt), lz4 ? "on" : "off");
    size_t k = sh->k;
    uint32_t *idx = xmalloc(k * sizeof *idx);
    float *val = xmalloc(k * sizeof *val);
    shape_indices(sh, idx, 17 + (uint64_t)_i);
    random_values(val, k, 99 + (uint64_t)_i);
    fl_cmp_ws_t *ws = new_ws();

    size_t len;
    uint8_t *block = encode_block(ws, idx, val, k, sh->n, vt, lz4, &len);
    size_t ib = index_bytes_of(idx, k);
    size_t raw = ib + k * vsize(vt);
    if (sh->kind == IDX_GAPS && ib != 5 * k)
        ck_abort_msg("%s: %zu index bytes, expected 5 per index", what, ib);

    fl_cmp_sparse_info_t in;
    ck_assert_msg(fl_cmp_sparse_peek(block, len, &in) == FL_OK, "%s: %s", what, fl_last_error());
    ck_assert_msg(in.n == sh->n && in.k == k && in.values == vt, "%s: peek n %llu k %llu %s", what,
                  (unsigned long long)in.n, (unsigned long long)in.k, fl_dtype_name(in.values));
    ck_assert_msg(in.index_bytes == ib && in.value_bytes == k * vsize(vt),
                  "%s: peek %zu index bytes (expected %zu), %zu value bytes", what, in.index_bytes,
                  ib, in.value_bytes);
    ck_assert_msg(in.body_bytes == len - HDR, "%s: body %zu of %zu", what, in.body_bytes, len);
    /* lz4 only when asked for and only when it shrinks the body. */
    ck_assert_msg(in.lz4 ? lz4 && in.body_bytes < raw : in.body_bytes == raw,
                  "%s: lz4 %d, body %zu, raw %zu", what, in.lz4, in.body_bytes, raw);
    ck_assert_msg(memcmp(block, "FLSP", 4) == 0 && block[4] == 1 && block[5] == (uint8_t)vt &&
                      block[6] == 1 && block[7] == (in.lz4 ? 1 : 0),
                  "%s: header bytes", what);

    /* Room for exactly k, then for more: the same pairs either way. */
    for (size_t extra = 0; extra <= 7; extra += 7) {
        pairs_t p;
        pairs_init(&p, k + extra);
        size_t kd = 0;
        int rc = decode_into(ws, block, len, sh->n, &p, &kd, what);
        if (rc != FL_OK || kd != k)
            ck_abort_msg("%s: decode rc %d, %zu pairs: %s", what, rc, kd, fl_last_error());
        for (size_t i = 0; i < k; i++) {
            if (p.idx[i] != idx[i])
                ck_abort_msg("%s: index %zu is %u, sent %u", what, i, p.idx[i], idx[i]);
            if (f32_bits(p.val[i]) != f32_bits(wire_round(val[i], vt)))
                ck_abort_msg("%s: value %zu is %a (0x%08x), sent %a", what, i, (double)p.val[i],
                             f32_bits(p.val[i]), (double)val[i]);
        }
        pairs_free(&p);
    }

    if (sh->n <= DENSE_MAX) {
        /* Accumulated into zeros twice: the decoded values, doubled; everything else zero. */
        float *dense = xmalloc(sh->n * sizeof *dense);
        memset(dense, 0, sh->n * sizeof *dense);
        for (int rep = 0; rep < 2; rep++) {
            size_t kq = SIZE_MAX;
            int rc = fl_cmp_sparse_accumulate(ws, block, len, dense, sh->n, &kq);
            if (rc != FL_OK || kq != k)
                ck_abort_msg("%s: accumulate rc %d k %zu: %s", what, rc, kq, fl_last_error());
        }
        size_t j = 0;
        for (size_t i = 0; i < sh->n; i++) {
            float want = 0.0f;
            if (j < k && idx[j] == i) {
                float w = wire_round(val[j++], vt);
                want = (0.0f + w) + w;
            }
            if (f32_bits(dense[i]) != f32_bits(want) && !(isnan(want) && isnan(dense[i])))
                ck_abort_msg("%s: dense[%zu] = %a, expected %a", what, i, (double)dense[i],
                             (double)want);
        }
        free(dense);
    }
    free(block);
    free(val);
    free(idx);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

/* The wire format byte for byte, for a block small enough to write out by hand. */
START_TEST(test_header_layout)
{
    const uint32_t idx[] = {0, 2, 300};
    const float val[] = {1.0f, -2.0f, 0.5f};
    /* gaps minus one: 0, 1, 297 = 0x129 -> a9 02 */
    const uint8_t istream[] = {0x00, 0x01, 0xa9, 0x02};
    const uint16_t half[3][3] = {{0, 0, 0}, {0x3c00, 0xc000, 0x3800}, {0x3f80, 0xc000, 0x3f00}};
    fl_cmp_ws_t *ws = new_ws();
    for (size_t t = 0; t < NELEM(vtypes); t++) {
        fl_dtype_t vt = vtypes[t];
        size_t vb = 3 * vsize(vt);
        uint8_t want[HDR + 4 + 12];
        memset(want, 0, sizeof want);
        memcpy(want, "FLSP", 4);
        want[4] = 1;
        want[5] = (uint8_t)vt;
        want[6] = 1;
        want[7] = 0;
        put_le(want + 8, 8, 1000);
        put_le(want + 16, 8, 3);
        put_le(want + 24, 4, 4);
        put_le(want + 28, 4, vb);
        put_le(want + 32, 4, 4 + vb);
        memcpy(want + HDR, istream, 4);
        for (size_t i = 0; i < 3; i++) {
            if (vt == FL_FLOAT32)
                put_le(want + HDR + 4 + 4 * i, 4, f32_bits(val[i]));
            else
                put_le(want + HDR + 4 + 2 * i, 2, half[t][i]);
        }
        for (int lz4 = 0; lz4 < 2; lz4++) {
            size_t len;
            uint8_t *block = encode_block(ws, idx, val, 3, 1000, vt, lz4 == 1, &len);
            /* Too small for lz4 to shrink: the same raw block with lz4 on. */
            if (len != HDR + 4 + vb || memcmp(block, want, len) != 0) {
                char hex[3 * sizeof want + 1];
                for (size_t i = 0; i < len && i < sizeof want; i++)
                    snprintf(hex + 3 * i, 4, "%02x ", block[i]);
                ck_abort_msg("%s lz4=%d: %zu bytes: %s", fl_dtype_name(vt), lz4, len, hex);
            }
            free(block);
        }
    }
    /* k = 0: a bare header, body empty, lz4 off even when asked for. */
    size_t len;
    uint8_t *block = encode_block(ws, NULL, NULL, 0, 7, FL_FLOAT32, true, &len);
    ck_assert_uint_eq(len, HDR);
    ck_assert_int_eq(block[7], 0);
    ck_assert_uint_eq(get_u32(block + 24) | get_u32(block + 28) | get_u32(block + 32), 0);
    free(block);

    fl_cmp_sparse_opts_t o;
    memset(&o, 0xff, sizeof o);
    fl_cmp_sparse_opts_init(&o);
    ck_assert(o.values == FL_FLOAT32 && o.lz4);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

/* Values exactly as fl_f32_to_f16 / fl_f32_to_bf16 round them (nearest even) after saturating
 * at the type's largest finite value, stored as those bits, and a few results by hand. */
START_TEST(test_rounding)
{
    const float vals[] = {1.0f + 0x1p-11f,
                          1.0f + 0x3p-11f,
                          1.0f + 0x1p-8f,
                          1.0f + 0x3p-8f,
                          65519.0f,
                          65520.0f,
                          0x1p-24f,
                          0x1p-25f,
                          0x3p-26f,
                          -0.0f,
                          NAN,
                          -INFINITY,
                          0.1f,
                          -3.14159f,
                          1e-40f,
                          3.4e38f};
    const size_t k = NELEM(vals);
    uint32_t idx[NELEM(vals)];
    for (size_t i = 0; i < k; i++)
        idx[i] = (uint32_t)(3 * i);
    fl_cmp_ws_t *ws = new_ws();
    for (size_t t = 1; t < NELEM(vtypes); t++) {
        fl_dtype_t vt = vtypes[t];
        size_t len;
        uint8_t *block = encode_block(ws, idx, vals, k, 100, vt, false, &len);
        const uint8_t *vbytes = block + HDR + index_bytes_of(idx, k);
        pairs_t p;
        pairs_init(&p, k);
        size_t kd;
        CHECK(decode_into(ws, block, len, 100, &p, &kd, "rounding") == FL_OK, "%s: %s",
              fl_dtype_name(vt), fl_last_error());
        for (size_t i = 0; i < k; i++) {
            uint16_t h = wire_bits(vals[i], vt);
            uint16_t got = (uint16_t)(vbytes[2 * i] | vbytes[2 * i + 1] << 8);
            if (got != h)
                ck_abort_msg("%s: %a stored as 0x%04x, expected 0x%04x", fl_dtype_name(vt),
                             (double)vals[i], got, h);
            if (f32_bits(p.val[i]) != f32_bits(wire_round(vals[i], vt)))
                ck_abort_msg("%s: %a decoded as %a", fl_dtype_name(vt), (double)vals[i],
                             (double)p.val[i]);
        }
        if (vt == FL_FLOAT16) {
            /* ties to even; 65520 saturates; 2^-25 is the tie between 0 and 2^-24 */
            CHECK(p.val[0] == 1.0f && p.val[1] == 1.0f + 0x1p-9f, "float16 ties");
            CHECK(p.val[5] == 65504.0f && p.val[4] == 65504.0f, "float16 saturation");
            CHECK(p.val[6] == 0x1p-24f && p.val[7] == 0.0f && p.val[8] == 0x1p-24f,
                  "float16 subnormals");
        } else {
            CHECK(p.val[2] == 1.0f && p.val[3] == 1.0f + 0x1p-6f && !isinf(p.val[5]),
                  "bfloat16 ties");
            CHECK(p.val[15] == 0x1.fep127f, "bfloat16 saturation");
        }
        CHECK(signbit(p.val[9]) && p.val[9] == 0.0f && isnan(p.val[10]), "-0 and NaN");
        CHECK(isinf(p.val[11]) && p.val[11] < 0, "-inf");
        pairs_free(&p);
        free(block);
    }
    fl_cmp_ws_destroy(&ws);
}
END_TEST

/* Adds into an existing vector: once gives base + v, twice base + v + v, indices untouched
 * elsewhere; an empty block changes nothing. */
START_TEST(test_accumulate)
{
    const size_t n = 1000;
    const uint32_t idx[] = {3, 10, 500, 999};
    const float val[] = {1.5f, -2.25f, 1000.0f, 0.1f};
    fl_cmp_ws_t *ws = new_ws();
    float *dense = xmalloc(n * sizeof *dense);
    float *base = xmalloc(n * sizeof *base);
    uint64_t s = 5;
    for (size_t i = 0; i < n; i++)
        base[i] = (float)fl_test_uniform(&s);
    for (size_t t = 0; t < NELEM(vtypes); t++) {
        fl_dtype_t vt = vtypes[t];
        size_t len;
        uint8_t *block = encode_block(ws, idx, val, 4, n, vt, true, &len);
        memcpy(dense, base, n * sizeof *dense);
        size_t kq = 0;
        int rc = fl_cmp_sparse_accumulate(ws, block, len, dense, n, &kq);
        CHECK(rc == FL_OK && kq == 4, "%s: rc %d k %zu", fl_dtype_name(vt), rc, kq);
        rc = fl_cmp_sparse_accumulate(ws, block, len, dense, n, &kq);
        CHECK(rc == FL_OK, "%s: rc %d", fl_dtype_name(vt), rc);
        size_t j = 0;
        for (size_t i = 0; i < n; i++) {
            float want = base[i];
            if (j < 4 && idx[j] == i) {
                float v = wire_round(val[j++], vt);
                want = (base[i] + v) + v;
            }
            if (f32_bits(dense[i]) != f32_bits(want))
                ck_abort_msg("%s: dense[%zu] = %a, expected %a", fl_dtype_name(vt), i,
                             (double)dense[i], (double)want);
        }
        /* Into zeros: exactly doubled. */
        memset(dense, 0, n * sizeof *dense);
        rc = fl_cmp_sparse_accumulate(ws, block, len, dense, n, &kq);
        rc |= fl_cmp_sparse_accumulate(ws, block, len, dense, n, &kq);
        CHECK(rc == FL_OK, "%s: rc %d", fl_dtype_name(vt), rc);
        for (size_t i = 0; i < 4; i++)
            if (dense[idx[i]] != 2.0f * wire_round(val[i], vt))
                ck_abort_msg("%s: dense[%u] = %a, not doubled", fl_dtype_name(vt), idx[i],
                             (double)dense[idx[i]]);
        free(block);
    }
    size_t len;
    uint8_t *empty = encode_block(ws, NULL, NULL, 0, n, FL_FLOAT32, true, &len);
    memcpy(dense, base, n * sizeof *dense);
    size_t kq = 99;
    ck_assert_int_eq(fl_cmp_sparse_accumulate(ws, empty, len, dense, n, &kq), FL_OK);
    ck_assert_uint_eq(kq, 0);
    ck_assert(memcmp(dense, base, n * sizeof *dense) == 0);
    free(empty);
    free(base);
    free(dense);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

/* lz4 is kept only when it shrinks the body: random pairs stay raw, regular ones compress. */
START_TEST(test_lz4_choice)
{
    const size_t n = 1000000;
    const size_t k = 2000;
    uint32_t *idx = xmalloc(k * sizeof *idx);
    float *val = xmalloc(k * sizeof *val);
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_sparse_info_t in;
    size_t len;

    random_indices(idx, k, n, 3);
    uint64_t s = 4;
    for (size_t i = 0; i < k; i++)
        val[i] = bits_f32((uint32_t)fl_test_rand(&s) & 0x3fffffffu); /* finite, random bits */
    uint8_t *block = encode_block(ws, idx, val, k, n, FL_FLOAT32, true, &len);
    ck_assert_int_eq(fl_cmp_sparse_peek(block, len, &in), FL_OK);
    ck_assert_msg(!in.lz4 && len == HDR + in.index_bytes + 4 * k, "random: lz4 %d, %zu bytes",
                  in.lz4, len);
    free(block);

    for (size_t i = 0; i < k; i++) {
        idx[i] = (uint32_t)(i * 400 + 7);
        val[i] = (float)(i % 4) * 0.25f;
    }
    for (size_t t = 0; t < NELEM(vtypes); t++) {
        const char *name = fl_dtype_name(vtypes[t]);
        block = encode_block(ws, idx, val, k, n, vtypes[t], true, &len);
        CHECK(fl_cmp_sparse_peek(block, len, &in) == FL_OK, "%s: %s", name, fl_last_error());
        size_t raw = in.index_bytes + in.value_bytes;
        CHECK(in.lz4 && block[7] == 1 && in.body_bytes < raw / 4, "regular %s: lz4 %d, %zu of %zu",
              name, in.lz4, in.body_bytes, raw);
        free(block);
        /* Not asked for: raw, however well it would compress. */
        block = encode_block(ws, idx, val, k, n, vtypes[t], false, &len);
        CHECK(fl_cmp_sparse_peek(block, len, &in) == FL_OK, "%s: %s", name, fl_last_error());
        CHECK(!in.lz4 && block[7] == 0 && in.body_bytes == in.index_bytes + in.value_bytes,
              "regular %s without lz4: flag %d, body %zu", name, block[7], in.body_bytes);
        free(block);
    }
    free(val);
    free(idx);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

/* The bound: its formula, the worst case fits it exactly, one byte less is refused. */
START_TEST(test_bound)
{
    static const size_t ks[] = {0, 1, 15, 1000, 1u << 20};
    for (size_t i = 0; i < NELEM(ks); i++) {
        for (size_t t = 0; t < NELEM(vtypes); t++) {
            size_t raw = ks[i] * (5 + vsize(vtypes[t]));
            size_t lz = fl_cmp_lz4_bound(raw);
            size_t want = HDR + (lz > raw ? lz : raw);
            if (fl_cmp_sparse_bound(ks[i], vtypes[t]) != want)
                ck_abort_msg("bound(%zu, %s) = %zu, expected %zu", ks[i], fl_dtype_name(vtypes[t]),
                             fl_cmp_sparse_bound(ks[i], vtypes[t]), want);
        }
    }
    /* Worst case: 5-byte varints and random values. */
    shape_t sh = {"gaps", N32, 15, IDX_GAPS};
    uint32_t idx[15];
    float val[15];
    shape_indices(&sh, idx, 0);
    uint64_t s = 8;
    for (size_t i = 0; i < 15; i++)
        val[i] = bits_f32((uint32_t)fl_test_rand(&s) & 0x3fffffffu);
    fl_cmp_ws_t *ws = new_ws();
    size_t len;
    uint8_t *block = encode_block(ws, idx, val, 15, N32, FL_FLOAT32, false, &len);
    ck_assert_uint_eq(len, HDR + 15 * 9);
    ck_assert_uint_le(len, fl_cmp_sparse_bound(15, FL_FLOAT32));
    free(block);
    block = encode_block(ws, idx, val, 15, N32, FL_FLOAT32, true, &len);
    ck_assert_uint_lt(len, HDR + 15 * 9); /* the repeated varints compress */
    free(block);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

/* A workspace survives refusals, shrinking and growing blocks and switches between lz4 and raw
 * bodies without stale bytes leaking into results; destroy is NULL-safe. */
START_TEST(test_workspace)
{
    fl_cmp_ws_t *ws = new_ws();
    static const size_t ks[] = {5000, 3, 0, 20000, 1, 7000};
    const size_t n = 50000;
    uint32_t *idx = xmalloc(20000 * sizeof *idx);
    float *val = xmalloc(20000 * sizeof *val);
    pairs_t p;
    pairs_init(&p, 20000);
    for (size_t r = 0; r < NELEM(ks); r++) {
        size_t k = ks[r];
        random_indices(idx, k, n, r);
        for (size_t i = 0; i < k; i++)
            val[i] = r % 2 ? (float)(i % 5) : (float)i * 0.001f + (float)r;
        size_t len;
        uint8_t *block = encode_block(ws, idx, val, k, n, FL_FLOAT32, true, &len);
        /* A refusal in between must not poison the next call. */
        int rc = decode_guarded(ws, block, len > HDR ? len - 1 : len, n, k, "cut");
        CHECK(rc == (len > HDR ? FL_EPROTO : FL_OK), "round %zu: cut block rc %d", r, rc);
        size_t kd = 0;
        rc = decode_into(ws, block, len, n, &p, &kd, "reuse");
        if (rc != FL_OK || kd != k || memcmp(p.idx, idx, k * sizeof *idx) != 0 ||
            memcmp(p.val, val, k * sizeof *val) != 0)
            ck_abort_msg("round %zu: %zu pairs differ after reuse", r, k);
        free(block);
    }
    pairs_free(&p);
    free(val);
    free(idx);
    fl_cmp_ws_destroy(&ws);
    ck_assert_ptr_null(ws);
    fl_cmp_ws_destroy(&ws);
    fl_cmp_ws_destroy(NULL);
}
END_TEST

/* ---- encode refusals ---- */

typedef struct enc_case {
    const char *name;
    uint32_t idx[3];
    size_t k;
    size_t n;
    fl_dtype_t vt;
    long cap_delta; /* cap = bound + cap_delta */
    const char *want;
} enc_case_t;

START_TEST(test_encode_refusals)
{
    static const enc_case_t cases[] = {
        {"descending", {5, 3, 8}, 3, 10, FL_FLOAT32, 0, "index 3 at position 1 is not ascending"},
        {"duplicate", {1, 5, 5}, 3, 10, FL_FLOAT16, 0, "index 5 at position 2 is not ascending"},
        {"out of range", {1, 10}, 2, 10, FL_FLOAT32, 0, "index 10 at position 1 is out of range"},
        {"far out", {UINT32_MAX}, 1, 10, FL_BFLOAT16, 0, "index 4294967295 at position 0"},
        {"k > n", {0, 1, 2}, 3, 2, FL_FLOAT32, 0, "3 pairs of a tensor of 2 entries"},
        {"n = 0", {0}, 0, 0, FL_FLOAT32, 0, "0 pairs of a tensor of 0 entries"},
        {"n = 2^32", {0}, 1, N32 + 1, FL_FLOAT32, 0, "tensor of 4294967296 entries"},
        {"cap", {0, 1}, 2, 10, FL_FLOAT32, -1, "bytes of room"},
        {"cap 0", {0}, 1, 10, FL_FLOAT16, LONG_MIN, "0 bytes of room"},
        {"float64", {0}, 1, 10, FL_FLOAT64, 0, "value type float64"},
        {"int32", {0}, 1, 10, FL_INT32, 0, "value type int32"},
        {"type 0", {0}, 1, 10, (fl_dtype_t)0, 0, "value type unknown"},
    };
    const float val[3] = {1.0f, 2.0f, 3.0f};
    fl_cmp_ws_t *ws = new_ws();
    for (size_t c = 0; c < NELEM(cases); c++) {
        const enc_case_t *e = &cases[c];
        fl_cmp_sparse_opts_t o;
        fl_cmp_sparse_opts_init(&o);
        o.values = e->vt;
        size_t bound = fl_cmp_sparse_bound(e->k, e->vt == FL_FLOAT16 ? FL_FLOAT16 : FL_FLOAT32);
        size_t cap = e->cap_delta == LONG_MIN ? 0 : (size_t)((long)bound + e->cap_delta);
        uint8_t *dst = xmalloc(bound + GUARD);
        memset(dst, BYTE_CANARY, bound + GUARD);
        size_t len = 12345;
        fl_error_clear();
        int rc = fl_cmp_sparse_encode(ws, e->idx, val, e->k, e->n, &o, dst, cap, &len);
        if (rc != FL_EINVAL)
            ck_abort_msg("%s: rc %d, expected FL_EINVAL", e->name, rc);
        if (strstr(fl_last_error(), e->want) == NULL)
            ck_abort_msg("%s: detail '%s' lacks '%s'", e->name, fl_last_error(), e->want);
        if (len != 12345)
            ck_abort_msg("%s: refused but *len set to %zu", e->name, len);
        for (size_t i = 0; i < bound + GUARD; i++)
            if (dst[i] != BYTE_CANARY)
                ck_abort_msg("%s: refused but wrote byte %zu of dst", e->name, i);
        free(dst);
    }
    /* The edges just inside: the last index, k = n, the exact bound. */
    const uint32_t last[] = {0, 9};
    size_t len;
    uint8_t *block = encode_block(ws, last, val, 2, 10, FL_FLOAT32, true, &len);
    free(block);
    block = encode_block(ws, last, val, 2, 10, FL_FLOAT16, false, &len);
    free(block);
    const uint32_t all[] = {0, 1, 2};
    block = encode_block(ws, all, val, 3, 3, FL_BFLOAT16, true, &len);
    free(block);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

Suite *cmp_sparse_round_trip_suite(void);
Suite *cmp_sparse_round_trip_suite(void)
{
    Suite *s = suite_create("cmp_sparse_round_trip");
    TCase *t = tcase_create("round_trip");
    tcase_set_timeout(t, 30);
    tcase_add_loop_test(t, test_round_trip, 0, (int)(NELEM(shapes) * 6));
    tcase_add_test(t, test_header_layout);
    tcase_add_test(t, test_rounding);
    tcase_add_test(t, test_accumulate);
    tcase_add_test(t, test_lz4_choice);
    tcase_add_test(t, test_bound);
    tcase_add_test(t, test_workspace);
    tcase_add_test(t, test_encode_refusals);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(cmp_sparse_round_trip_suite());
}
