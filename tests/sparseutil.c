/* Helpers shared by the sparse codec suites: blocks with canaries, random sparse vectors. */
#include "sparseutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define IDX_CANARY 0xdeadbeefu /* idx[k_cap..] */

uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

size_t vsize(fl_dtype_t t)
{
    return t == FL_FLOAT32 ? 4 : 2;
}

void *xmalloc(size_t n)
{
    void *p = malloc(n > 0 ? n : 1);
    if (p == NULL)
        ck_abort_msg("out of memory for %zu bytes", n);
    return p;
}

uint8_t *exact_copy(const uint8_t *src, size_t n)
{
    uint8_t *p = xmalloc(n);
    if (n > 0)
        memcpy(p, src, n);
    return p;
}

void put_le(uint8_t *p, size_t width, uint64_t v)
{
    for (size_t i = 0; i < width; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

fl_cmp_ws_t *new_ws(void)
{
    fl_cmp_ws_t *ws = NULL;
    int rc = fl_cmp_ws_create(&ws);
    ck_assert_msg(rc == FL_OK && ws != NULL, "workspace: %s", fl_last_error());
    return ws;
}

uint8_t *encode_block(fl_cmp_ws_t *ws, const uint32_t *idx, const float *val, size_t k, size_t n,
                      fl_dtype_t vt, bool lz4, size_t *len)
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

uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void pairs_init(pairs_t *p, size_t cap)
{
    p->cap = cap;
    p->idx = xmalloc((cap + GUARD) * sizeof *p->idx);
    p->val = xmalloc((cap + GUARD) * sizeof *p->val);
    for (size_t i = 0; i < cap + GUARD; i++) {
        p->idx[i] = IDX_CANARY;
        p->val[i] = bits_f32(VAL_CANARY);
    }
}

void pairs_free(pairs_t *p)
{
    free(p->idx);
    free(p->val);
}

int decode_into(fl_cmp_ws_t *ws, const uint8_t *block, size_t len, size_t n, pairs_t *p,
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

int decode_guarded(fl_cmp_ws_t *ws, const uint8_t *block, size_t len, size_t n, size_t k_cap,
                   const char *what)
{
    pairs_t p;
    pairs_init(&p, k_cap);
    size_t k;
    int rc = decode_into(ws, block, len, n, &p, &k, what);
    pairs_free(&p);
    return rc;
}

void random_indices(uint32_t *idx, size_t k, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    size_t got = 0;
    for (size_t i = 0; i < n && got < k; i++)
        if (fl_test_rand(&s) % (n - i) < k - got)
            idx[got++] = (uint32_t)i;
}

void random_values(float *val, size_t k, uint64_t seed)
{
    static const float specials[] = {0.0f,  -0.0f,    1e-8f,     -7e4f, 65520.0f,
                                     3e38f, INFINITY, -INFINITY, NAN,   6e-5f};
    uint64_t s = seed;
    for (size_t i = 0; i < k; i++) {
        uint64_t r = fl_test_rand(&s);
        if (r % 29 == 0)
            val[i] = specials[(r >> 8) % NELEM(specials)];
        else
            val[i] = (float)(fl_test_uniform(&s) * pow(10.0, (double)((r >> 16) % 13) - 6.0));
    }
}

void shape_indices(const shape_t *sh, uint32_t *idx, uint64_t seed)
{
    switch (sh->kind) {
    case IDX_RANDOM: random_indices(idx, sh->k, sh->n, seed); break;
    case IDX_ALL:
        for (size_t i = 0; i < sh->k; i++)
            idx[i] = (uint32_t)i;
        break;
    case IDX_FIRST: idx[0] = 0; break;
    case IDX_LAST: idx[0] = (uint32_t)(sh->n - 1); break;
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
