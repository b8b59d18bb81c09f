/* compression: the sparse block codec. Round trips (float32/float16/bfloat16, lz4 on and off,
 * k = 0 to n, n = 1 to 2^32-1, 5-byte varints), the exact header layout, lz4 kept only when it
 * shrinks, accumulation, encode refusals, and hostile blocks: every truncation, every header
 * field, corrupt index streams and lz4 bodies, garbage and single-byte mutations. Blocks are
 * exact-size heap copies and every output carries canaries, so ASan and the guards see strays. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_int.h"
#include "testutil.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))
#define HDR FL_CMP_SPARSE_HEADER
#define GUARD 16                    /* canary entries after every output array */
#define IDX_CANARY 0xdeadbeefu      /* idx[k_cap..] */
#define VAL_CANARY 0x7fa5a5a5u      /* bits of val[k_cap..] and of dense[n..] */
#define BYTE_CANARY 0xa5            /* bytes after an encoder's dst */
#define DENSE_MAX ((size_t)1 << 20) /* largest n accumulated into a real dense vector */
#define N32 ((size_t)UINT32_MAX)    /* the largest tensor a block can describe */

/* Check records every passing ck_assert; inside loops, check in C and abort on failure. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            ck_abort_msg(__VA_ARGS__);                                                             \
    } while (0)

static const fl_dtype_t vtypes[] = {FL_FLOAT32, FL_FLOAT16, FL_BFLOAT16};

/* ---- helpers ---- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static size_t vsize(fl_dtype_t t)
{
    return t == FL_FLOAT32 ? 4 : 2;
}

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

static void *xmalloc(size_t n)
{
    void *p = malloc(n > 0 ? n : 1);
    if (p == NULL)
        ck_abort_msg("out of memory for %zu bytes", n);
    return p;
}

/* A heap copy of exactly n bytes: ASan flags any read beyond it. */
static uint8_t *exact_copy(const uint8_t *src, size_t n)
{
    uint8_t *p = xmalloc(n);
    if (n > 0)
        memcpy(p, src, n);
    return p;
}

static void put_le(uint8_t *p, size_t width, uint64_t v)
{
    for (size_t i = 0; i < width; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void fill_random(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)fl_test_rand(&s);
}

static fl_cmp_ws_t *new_ws(void)
{
    fl_cmp_ws_t *ws = NULL;
    int rc = fl_cmp_ws_create(&ws);
    ck_assert_msg(rc == FL_OK && ws != NULL, "workspace: %s", fl_last_error());
    return ws;
}

/* Encodes into a buffer of exactly the bound followed by canary bytes and returns an exact-size
 * copy of the block. Aborts when encode fails or writes past the bound. */
static uint8_t *encode_block(fl_cmp_ws_t *ws, const uint32_t *idx, const float *val, size_t k,
                             size_t n, fl_dtype_t vt, bool lz4, size_t *len)
{
    fl_cmp_sparse_opts_t o;
    fl_cmp_sparse_opts_init(&o);
    o.values = vt;
    o.lz4 = lz4;
    size_t cap = fl_cmp_sparse_bound(k, vt);
    uint8_t *dst = xmalloc(cap + GUARD);
    memset(dst, BYTE_CANARY, cap + GUARD);
    *len = 0;
    int rc = fl_cmp_sparse_encode(ws, idx, val, k, n, &o, dst, cap, len);
    if (rc != FL_OK)
        ck_abort_msg("encode k=%zu n=%zu %s lz4=%d: rc %d: %s", k, n, fl_dtype_name(vt), lz4, rc,
                     fl_last_error());
    if (*len < HDR || *len > cap)
        ck_abort_msg("encode k=%zu n=%zu: block of %zu bytes, cap %zu", k, n, *len, cap);
    for (size_t i = 0; i < GUARD; i++)
        if (dst[cap + i] != BYTE_CANARY)
            ck_abort_msg("encode k=%zu n=%zu: wrote byte %zu past its cap", k, n, i);
    uint8_t *block = exact_copy(dst, *len);
    free(dst);
    return block;
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

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Decoded pairs with GUARD canaries after idx[cap] and val[cap]. */
typedef struct pairs {
    uint32_t *idx;
    float *val;
    size_t cap;
} pairs_t;

static void pairs_init(pairs_t *p, size_t cap)
{
    p->cap = cap;
    p->idx = xmalloc((cap + GUARD) * sizeof *p->idx);
    p->val = xmalloc((cap + GUARD) * sizeof *p->val);
    for (size_t i = 0; i < cap + GUARD; i++) {
        p->idx[i] = IDX_CANARY;
        p->val[i] = bits_f32(VAL_CANARY);
    }
}

static void pairs_free(pairs_t *p)
{
    free(p->idx);
    free(p->val);
}

/* Decodes an exact-size copy of block into p (room for p->cap pairs). Aborts when the code is
 * neither FL_OK nor FL_EPROTO, when a canary past idx[cap] or val[cap] changed, or when an
 * accepted block yields pairs that are no sparse vector of n entries. */
static int decode_into(fl_cmp_ws_t *ws, const uint8_t *block, size_t len, size_t n, pairs_t *p,
                       size_t *k_out, const char *what)
{
    uint8_t *src = exact_copy(block, len);
    size_t k = SIZE_MAX;
    int rc = fl_cmp_sparse_decode(ws, src, len, n, p->cap, p->idx, p->val, &k);
    free(src);
    if (rc != FL_OK && rc != FL_EPROTO)
        ck_abort_msg("%s: decode rc %d (%s)", what, rc, fl_last_error());
    if (rc == FL_EPROTO && fl_last_error()[0] == '\0')
        ck_abort_msg("%s: refused without a detail", what);
    for (size_t i = p->cap; i < p->cap + GUARD; i++)
        if (p->idx[i] != IDX_CANARY || f32_bits(p->val[i]) != VAL_CANARY)
            ck_abort_msg("%s: decode wrote entry %zu, room for %zu", what, i, p->cap);
    if (rc == FL_OK) {
        if (k > p->cap)
            ck_abort_msg("%s: %zu pairs decoded, room for %zu", what, k, p->cap);
        for (size_t i = 0; i < k; i++)
            if (p->idx[i] >= n || (i > 0 && p->idx[i] <= p->idx[i - 1]))
                ck_abort_msg("%s: accepted index %u at %zu (n %zu)", what, p->idx[i], i, n);
        *k_out = k;
    }
    return rc;
}

static int decode_guarded(fl_cmp_ws_t *ws, const uint8_t *block, size_t len, size_t n,
                          size_t k_cap, const char *what)
{
    pairs_t p;
    pairs_init(&p, k_cap);
    size_t k;
    int rc = decode_into(ws, block, len, n, &p, &k, what);
    pairs_free(&p);
    return rc;
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
                           size_t k_cap, int peek_rc, bool acc, const char *want,
                           const char *what)
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

/* k distinct ascending indices below n, uniformly (selection sampling, O(n)). */
static void random_indices(uint32_t *idx, size_t k, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    size_t got = 0;
    for (size_t i = 0; i < n && got < k; i++)
        if (fl_test_rand(&s) % (n - i) < k - got)
            idx[got++] = (uint32_t)i;
}

/* Values of all magnitudes, with zeros, infinities, NaN and float16 under- and overflow among
 * them. */
static void random_values(float *val, size_t k, uint64_t seed)
{
    static const float specials[] = {0.0f, -0.0f, 1e-8f, -7e4f, 65520.0f, 3e38f, INFINITY,
                                     -INFINITY, NAN, 6e-5f};
    uint64_t s = seed;
    for (size_t i = 0; i < k; i++) {
        uint64_t r = fl_test_rand(&s);
        if (r % 29 == 0)
            val[i] = specials[(r >> 8) % NELEM(specials)];
        else
            val[i] = (float)(fl_test_uniform(&s) * pow(10.0, (double)((r >> 16) % 13) - 6.0));
    }
}

/* ---- round trips ---- */

enum { IDX_RANDOM, IDX_ALL, IDX_FIRST, IDX_LAST, IDX_TOP, IDX_GAPS };

typedef struct shape {
    const char *name;
    size_t n;
    size_t k;
    int kind;
} shape_t;

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

static void shape_indices(const shape_t *sh, uint32_t *idx, uint64_t seed)
{
    switch (sh->kind) {
    case IDX_RANDOM:
        random_indices(idx, sh->k, sh->n, seed);
        break;
    case IDX_ALL:
        for (size_t i = 0; i < sh->k; i++)
            idx[i] = (uint32_t)i;
        break;
    case IDX_FIRST:
        idx[0] = 0;
        break;
    case IDX_LAST:
        idx[0] = (uint32_t)(sh->n - 1);
        break;
    case IDX_TOP: {
        const uint32_t top[] = {0, 1, 1u << 31, UINT32_MAX - 3, UINT32_MAX - 2, UINT32_MAX - 1};
        memcpy(idx, top, sizeof top);
        break;
    }
    default:
        /* Every gap is 2^28, the smallest that needs all five varint bytes. */
        for (size_t i = 0; i < sh->k; i++)
            idx[i] = (uint32_t)(i * ((1u << 28) + 1) + (1u << 28));
        break;
    }
}

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
                  "%s: peek %zu index bytes (expected %zu), %zu value bytes", what,
                  in.index_bytes, ib, in.value_bytes);
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
    const float vals[] = {1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f,
                          65519.0f,        65520.0f,        0x1p-24f,       0x1p-25f,
                          0x3p-26f,        -0.0f,           NAN,            -INFINITY,
                          0.1f,            -3.14159f,       1e-40f,         3.4e38f};
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
        CHECK(in.lz4 && block[7] == 1 && in.body_bytes < raw / 4,
              "regular %s: lz4 %d, %zu of %zu", name, in.lz4, in.body_bytes, raw);
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
                ck_abort_msg("bound(%zu, %s) = %zu, expected %zu", ks[i],
                             fl_dtype_name(vtypes[t]), fl_cmp_sparse_bound(ks[i], vtypes[t]),
                             want);
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
    z[ZOO_F32_RAW].block = encode_block(ws, a, val, 5, 1000, FL_FLOAT32, false,
                                        &z[ZOO_F32_RAW].len);

    /* 300 float16 pairs 200 apart (2-byte varints), regular: lz4 */
    for (size_t i = 0; i < 300; i++) {
        idx[i] = (uint32_t)(i * 200 + 199);
        val[i] = (float)(i % 8) * 0.5f;
    }
    z[ZOO_F16_LZ4] = (zoo_t){NULL, 0, 60000, 300, "float16 lz4"};
    z[ZOO_F16_LZ4].block = encode_block(ws, idx, val, 300, 60000, FL_FLOAT16, true,
                                        &z[ZOO_F16_LZ4].len);

    /* k = n = 64 bfloat16, few distinct values: an lz4 body of mostly tokens and matches */
    for (size_t i = 0; i < 64; i++) {
        idx[i] = (uint32_t)i;
        val[i] = (float)(i % 4);
    }
    z[ZOO_BF16_DENSE] = (zoo_t){NULL, 0, 64, 64, "bfloat16 dense"};
    z[ZOO_BF16_DENSE].block = encode_block(ws, idx, val, 64, 64, FL_BFLOAT16, true,
                                           &z[ZOO_BF16_DENSE].len);

    z[ZOO_EMPTY] = (zoo_t){NULL, 0, 10, 0, "empty"};
    z[ZOO_EMPTY].block = encode_block(ws, idx, val, 0, 10, FL_FLOAT32, true, &z[ZOO_EMPTY].len);

    random_indices(idx, 40, 5000, 77);
    random_values(val, 40, 78);
    z[ZOO_F16_RAW] = (zoo_t){NULL, 0, 5000, 40, "float16 raw"};
    z[ZOO_F16_RAW].block = encode_block(ws, idx, val, 40, 5000, FL_FLOAT16, false,
                                        &z[ZOO_F16_RAW].len);

    shape_t sh = {"gaps", N32, 15, IDX_GAPS};
    shape_indices(&sh, idx, 0);
    z[ZOO_HUGE_N] = (zoo_t){NULL, 0, N32, 15, "n = 2^32-1"};
    z[ZOO_HUGE_N].block = encode_block(ws, idx, val, 15, N32, FL_FLOAT32, true,
                                       &z[ZOO_HUGE_N].len);
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
        {"6 continuation bytes", 1000, 2, {c80, c80, c80, c80, c80, c80, 0, 0}, 8,
         "index 0's varint is over 5 bytes"},
        {"5 continuation bytes", 1000, 2, {0, c80, c80, c80, c80, c80, 0}, 7,
         "index 1's varint is over 5 bytes"},
        {"past the stream", 1000, 2, {0x00, 0x80}, 2, "index stream ends inside index 1"},
        {"past the stream at once", 1000, 1, {0xff}, 1, "index stream ends inside index 0"},
        {"past the stream, 4 bytes", 1000, 1, {0xff, 0xff, 0xff, 0xff}, 4,
         "index stream ends inside index 0"},
        {"gap past n", 10, 2, {5, 4}, 2, "index 1 is 10, outside 0..9"},
        {"first index n", 10, 1, {10}, 1, "index 0 is 10, outside 0..9"},
        {"last index n-1", 10, 2, {5, 3}, 2, NULL},
        {"gap over 2^32", 1000, 1, {0xff, 0xff, 0xff, 0xff, 0x7f}, 5, "outside 0..999"},
        {"gap 2^32-1", N32, 1, {0xff, 0xff, 0xff, 0xff, 0x0f}, 5,
         "index 0 is 4294967295, outside 0..4294967294"},
        {"gap 2^32-2", N32, 1, {0xfe, 0xff, 0xff, 0xff, 0x0f}, 5, NULL},
        {"top then one more", N32, 2, {0xfe, 0xff, 0xff, 0xff, 0x0f, 0x00}, 6,
         "index 1 is 4294967295"},
        {"sum past 2^32", N32, 2, {0x80, 0x80, 0x80, 0x80, 0x08, 0x80, 0x80, 0x80, 0x80, 0x08},
         10, "index 1 is 4294967297"},
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

Suite *cmp_sparse_suite(void);
Suite *cmp_sparse_suite(void)
{
    Suite *s = suite_create("cmp_sparse");
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

    t = tcase_create("hostile");
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
    return fl_test_run(cmp_sparse_suite());
}
