/* The sparse block: top-k pairs on the wire. 40-byte header (little-endian):
 *   0 magic "FLSP"   4 version (1)   5 value type   6 index coding (1: delta varint)
 *   7 flags (bit 0: body is one lz4 block)   8 n (u64)   16 k (u64)
 *   24 index bytes (u32, decoded)   28 value bytes (u32, decoded)   32 body bytes (u32, stored)
 *   36 reserved (u32, 0)
 * then the body: index i as the LEB128 varint of idx[i] - idx[i-1] - 1 (idx[-1] = -1), so the
 * indices are strictly ascending by construction, followed by the k values. Decoding trusts
 * nothing: every size is checked against the others and against the buffer before anything is
 * allocated, decompressed or written. */
#include "cmp_int.h"

#include <math.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the sparse block codec assumes a "
                                                          "little-endian host");

#define MAGIC 0x50534C46u /* "FLSP" */
#define VERSION 1
#define CODING_DELTA_VARINT 1
#define FLAG_LZ4 1u
#define VARINT_MAX 5 /* a 32-bit delta */

void fl_cmp_sparse_opts_init(fl_cmp_sparse_opts_t *o)
{
    o->values = FL_FLOAT32;
    o->lz4 = true;
}

static size_t value_size(fl_dtype_t t)
{
    return t == FL_FLOAT32 ? 4 : (t == FL_FLOAT16 || t == FL_BFLOAT16) ? 2 : 0;
}

/* Largest finite values of the narrow types: a finite float beyond them saturates there
 * (rounding would make it infinite, and error feedback keeps the excess in the residual). */
#define F16_MAX 65504.0f
#define BF16_MAX 0x1.fep127f

static uint16_t narrow(float v, fl_dtype_t t)
{
    float lim = t == FL_FLOAT16 ? F16_MAX : BF16_MAX;
    if (isfinite(v) && v > lim)
        v = lim;
    else if (isfinite(v) && v < -lim)
        v = -lim;
    return t == FL_FLOAT16 ? fl_f32_to_f16(v) : fl_f32_to_bf16(v);
}

float fl_cmp_round(float v, fl_dtype_t values)
{
    if (values == FL_FLOAT16)
        return fl_f16_to_f32(narrow(v, values));
    if (values == FL_BFLOAT16)
        return fl_bf16_to_f32(narrow(v, values));
    return v;
}

int fl_cmp_sparse_check(const uint32_t *idx, size_t k, size_t n, fl_dtype_t values)
{
    if (value_size(values) == 0)
        return fl_fail(FL_EINVAL,
                       "sparse pairs: value type %s is not float32, float16 or "
                       "bfloat16",
                       fl_dtype_name(values));
    if (n == 0 || n > UINT32_MAX || k > n)
        return fl_fail(FL_EINVAL, "sparse pairs: %zu pairs of a tensor of %zu entries", k, n);
    int64_t prev = -1;
    for (size_t i = 0; i < k; i++) {
        if ((int64_t)idx[i] <= prev || idx[i] >= n)
            return fl_fail(FL_EINVAL, "sparse pairs: index %u at position %zu is %s", idx[i], i,
                           idx[i] >= n ? "out of range" : "not ascending");
        prev = idx[i];
    }
    return FL_OK;
}

size_t fl_cmp_sparse_bound(size_t k, fl_dtype_t values)
{
    size_t raw = k * (VARINT_MAX + value_size(values));
    size_t lz = fl_cmp_lz4_bound(raw);
    return FL_CMP_SPARSE_HEADER + (lz > raw ? lz : raw);
}

static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

int fl_cmp_sparse_encode(fl_cmp_ws_t *ws, const uint32_t *idx, const float *val, size_t k, size_t n,
                         const fl_cmp_sparse_opts_t *o, void *dst, size_t cap, size_t *len)
{
    size_t vs = value_size(o->values);
    if (vs == 0)
        return fl_fail(FL_EINVAL,
                       "sparse encode: value type %s is not float32, float16 or "
                       "bfloat16",
                       fl_dtype_name(o->values));
    if (n == 0 || n > UINT32_MAX || k > n)
        return fl_fail(FL_EINVAL, "sparse encode: %zu pairs of a tensor of %zu entries", k, n);
    if (cap < fl_cmp_sparse_bound(k, o->values))
        return fl_fail(FL_EINVAL, "sparse encode: %zu bytes of room, %zu needed for %zu pairs", cap,
                       fl_cmp_sparse_bound(k, o->values), k);
    size_t raw_max = k * (VARINT_MAX + vs);
    if (raw_max > UINT32_MAX)
        return fl_fail(FL_EINVAL,
                       "sparse encode: %zu pairs do not fit one block (its sizes are "
                       "32-bit)",
                       k);
    int rc = fl_cmp_grow((void **)&ws->buf, 1, NULL, 0, &ws->buf_cap, raw_max + 1);
    if (rc != FL_OK)
        return rc;
    uint8_t *p = ws->buf;
    int64_t prev = -1;
    for (size_t i = 0; i < k; i++) {
        if ((int64_t)idx[i] <= prev || idx[i] >= n)
            return fl_fail(FL_EINVAL, "sparse encode: index %u at position %zu is %s", idx[i], i,
                           idx[i] >= n ? "out of range" : "not ascending");
        uint32_t d = (uint32_t)((int64_t)idx[i] - prev - 1);
        prev = idx[i];
        while (d >= 0x80) {
            *p++ = (uint8_t)(d | 0x80);
            d >>= 7;
        }
        *p++ = (uint8_t)d;
    }
    size_t index_bytes = (size_t)(p - ws->buf);
    for (size_t i = 0; i < k; i++) {
        if (o->values == FL_FLOAT32) {
            memcpy(p, &val[i], 4);
        } else {
            uint16_t h = narrow(val[i], o->values);
            memcpy(p, &h, 2);
        }
        p += vs;
    }
    size_t raw = (size_t)(p - ws->buf);

    uint8_t *out = dst;
    size_t body = raw;
    uint32_t flags = 0;
    if (o->lz4 && raw > 0) {
        size_t clen = 0;
        if (fl_cmp_lz4_compress(ws->buf, raw, out + FL_CMP_SPARSE_HEADER,
                                cap - FL_CMP_SPARSE_HEADER, &clen) == FL_OK &&
            clen < raw) {
            body = clen;
            flags = FLAG_LZ4;
        }
    }
    if (flags == 0 && raw > 0)
        memcpy(out + FL_CMP_SPARSE_HEADER, ws->buf, raw);
    put32(out, MAGIC);
    out[4] = VERSION;
    out[5] = (uint8_t)o->values;
    out[6] = CODING_DELTA_VARINT;
    out[7] = (uint8_t)flags;
    put64(out + 8, n);
    put64(out + 16, k);
    put32(out + 24, (uint32_t)index_bytes);
    put32(out + 28, (uint32_t)(k * vs));
    put32(out + 32, (uint32_t)body);
    put32(out + 36, 0);
    *len = FL_CMP_SPARSE_HEADER + body;
    return FL_OK;
}

int fl_cmp_sparse_peek(const void *src, size_t len, fl_cmp_sparse_info_t *info)
{
    const uint8_t *s = src;
    memset(info, 0, sizeof *info);
    if (len < FL_CMP_SPARSE_HEADER)
        return fl_fail(FL_EPROTO, "sparse block: %zu bytes, shorter than its %d-byte header", len,
                       FL_CMP_SPARSE_HEADER);
    if (get32(s) != MAGIC)
        return fl_fail(FL_EPROTO, "sparse block: bad magic 0x%08x", get32(s));
    if (s[4] != VERSION)
        return fl_fail(FL_EPROTO, "sparse block: version %u, expected %d", s[4], VERSION);
    fl_dtype_t vt = (fl_dtype_t)s[5];
    size_t vs = value_size(vt);
    if (vs == 0)
        return fl_fail(FL_EPROTO, "sparse block: unknown value type %u", s[5]);
    if (s[6] != CODING_DELTA_VARINT)
        return fl_fail(FL_EPROTO, "sparse block: unknown index coding %u", s[6]);
    if ((s[7] & ~FLAG_LZ4) != 0 || get32(s + 36) != 0)
        return fl_fail(FL_EPROTO, "sparse block: unknown flags 0x%02x or reserved bits set", s[7]);
    uint64_t n = get64(s + 8);
    uint64_t k = get64(s + 16);
    uint32_t ib = get32(s + 24);
    uint32_t vb = get32(s + 28);
    uint32_t bb = get32(s + 32);
    if (n == 0 || n > UINT32_MAX || k > n)
        return fl_fail(FL_EPROTO, "sparse block: k = %llu pairs of a tensor of n = %llu entries",
                       (unsigned long long)k, (unsigned long long)n);
    if ((uint64_t)vb != k * vs)
        return fl_fail(FL_EPROTO, "sparse block: %u value bytes for %llu %s values", vb,
                       (unsigned long long)k, fl_dtype_name(vt));
    if ((uint64_t)ib < k || (uint64_t)ib > k * VARINT_MAX)
        return fl_fail(FL_EPROTO, "sparse block: %u index bytes cannot hold %llu indices", ib,
                       (unsigned long long)k);
    if ((uint64_t)bb != (uint64_t)(len - FL_CMP_SPARSE_HEADER))
        return fl_fail(FL_EPROTO, "sparse block: header says %u body bytes, %zu arrived", bb,
                       len - FL_CMP_SPARSE_HEADER);
    bool lz4 = (s[7] & FLAG_LZ4) != 0;
    uint64_t raw = (uint64_t)ib + vb;
    if (!lz4 && bb != raw)
        return fl_fail(FL_EPROTO, "sparse block: raw body of %u bytes, %llu declared", bb,
                       (unsigned long long)raw);
    /* lz4 expands at most ~255:1: a body claiming more cannot be honest, and the claim would
     * otherwise size the decompression buffer. */
    if (lz4 &&
        (bb == 0 || bb > fl_cmp_lz4_bound((size_t)raw) || raw == 0 || raw > 255ull * bb + 16))
        return fl_fail(FL_EPROTO, "sparse block: lz4 body of %u bytes cannot decode to %llu", bb,
                       (unsigned long long)raw);
    info->n = n;
    info->k = k;
    info->values = vt;
    info->lz4 = lz4;
    info->index_bytes = ib;
    info->value_bytes = vb;
    info->body_bytes = bb;
    return FL_OK;
}

int fl_cmp_sparse_decode(fl_cmp_ws_t *ws, const void *src, size_t len, size_t n, size_t k_cap,
                         uint32_t *idx, float *val, size_t *k_out)
{
    fl_cmp_sparse_info_t in;
    int rc = fl_cmp_sparse_peek(src, len, &in);
    if (rc != FL_OK)
        return rc;
    if (in.n != n)
        return fl_fail(FL_EPROTO, "sparse block: for a tensor of %llu entries, expected %zu",
                       (unsigned long long)in.n, n);
    if (in.k > k_cap)
        return fl_fail(FL_EPROTO, "sparse block: %llu pairs, room for %zu",
                       (unsigned long long)in.k, k_cap);
    const uint8_t *body = (const uint8_t *)src + FL_CMP_SPARSE_HEADER;
    size_t raw = in.index_bytes + in.value_bytes;
    if (in.lz4) {
        if ((rc = fl_cmp_grow((void **)&ws->buf, 1, NULL, 0, &ws->buf_cap, raw + 1)) != FL_OK)
            return rc;
        if ((rc = fl_cmp_lz4_decompress(body, in.body_bytes, ws->buf, raw)) != FL_OK)
            return fl_fail_ctx(rc, "sparse block");
        body = ws->buf;
    }
    const uint8_t *p = body;
    const uint8_t *end = body + in.index_bytes;
    int64_t prev = -1;
    for (size_t i = 0; i < in.k; i++) {
        uint64_t d = 0;
        int shift = 0;
        for (;;) {
            if (p == end)
                return fl_fail(FL_EPROTO, "sparse block: index stream ends inside index %zu", i);
            uint8_t b = *p++;
            d |= (uint64_t)(b & 0x7f) << shift;
            if (!(b & 0x80))
                break;
            shift += 7;
            if (shift >= 7 * VARINT_MAX)
                return fl_fail(FL_EPROTO, "sparse block: index %zu's varint is over %d bytes", i,
                               VARINT_MAX);
        }
        int64_t at = prev + 1 + (int64_t)d;
        if (d > UINT32_MAX || at >= (int64_t)n)
            return fl_fail(FL_EPROTO, "sparse block: index %zu is %lld, outside 0..%zu", i,
                           (long long)at, n - 1);
        idx[i] = (uint32_t)at;
        prev = at;
    }
    if (p != end)
        return fl_fail(FL_EPROTO, "sparse block: %zu index bytes left after %llu indices",
                       (size_t)(end - p), (unsigned long long)in.k);
    const uint8_t *v = end;
    for (size_t i = 0; i < in.k; i++) {
        if (in.values == FL_FLOAT32) {
            memcpy(&val[i], v + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, v + 2 * i, 2);
            val[i] = in.values == FL_FLOAT16 ? fl_f16_to_f32(h) : fl_bf16_to_f32(h);
        }
    }
    *k_out = (size_t)in.k;
    return FL_OK;
}

int fl_cmp_sparse_accumulate(fl_cmp_ws_t *ws, const void *src, size_t len, float *dense, size_t n,
                             size_t *k_out)
{
    fl_cmp_sparse_info_t in;
    int rc = fl_cmp_sparse_peek(src, len, &in);
    if (rc != FL_OK)
        return rc;
    /* Before any allocation: with n fixed by the caller, k <= n bounds the scratch by the
     * caller's own tensor, whatever the block claims. */
    if (in.n != n)
        return fl_fail(FL_EPROTO, "sparse block: for a tensor of %llu entries, expected %zu",
                       (unsigned long long)in.n, n);
    if ((rc = fl_cmp_grow((void **)&ws->dec_idx, sizeof *ws->dec_idx, (void **)&ws->dec_val,
                          sizeof *ws->dec_val, &ws->dec_cap, (size_t)in.k + 1)) != FL_OK)
        return rc;
    size_t k;
    if ((rc = fl_cmp_sparse_decode(ws, src, len, n, (size_t)in.k, ws->dec_idx, ws->dec_val, &k)) !=
        FL_OK)
        return rc;
    /* Only now, with the whole block valid, is the caller's tensor touched. */
    for (size_t i = 0; i < k; i++)
        dense[ws->dec_idx[i]] += ws->dec_val[i];
    *k_out = k;
    return FL_OK;
}
