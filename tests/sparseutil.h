/* Helpers shared by the sparse codec suites (test_cmp_sparse_*.c): float bits and value sizes,
 * exact-size heap copies, blocks encoded and decoded with canaries after every output (so ASan
 * and the guards see strays), random sparse vectors and the index shapes of the round trips. */
#ifndef FL_SPARSEUTIL_H
#define FL_SPARSEUTIL_H

#include "cmp_int.h"
#include "testutil.h"

#define HDR FL_CMP_SPARSE_HEADER
#define GUARD 16 /* canary entries after every output array */

#define VAL_CANARY 0x7fa5a5a5u      /* bits of val[k_cap..] and of dense[n..] */
#define BYTE_CANARY 0xa5            /* bytes after an encoder's dst */
#define DENSE_MAX ((size_t)1 << 20) /* largest n accumulated into a real dense vector */
#define N32 ((size_t)UINT32_MAX)    /* the largest tensor a block can describe */

static const fl_dtype_t vtypes[] = {FL_FLOAT32, FL_FLOAT16, FL_BFLOAT16};

uint32_t f32_bits(float f);

float bits_f32(uint32_t u);

size_t vsize(fl_dtype_t t);

void *xmalloc(size_t n);

/* A heap copy of exactly n bytes: ASan flags any read beyond it. */
uint8_t *exact_copy(const uint8_t *src, size_t n);

void put_le(uint8_t *p, size_t width, uint64_t v);

fl_cmp_ws_t *new_ws(void);

/* Encodes into a buffer of exactly the bound followed by canary bytes and returns an exact-size
 * copy of the block. Aborts when encode fails or writes past the bound. */
uint8_t *encode_block(fl_cmp_ws_t *ws, const uint32_t *idx, const float *val, size_t k, size_t n,
                      fl_dtype_t vt, bool lz4, size_t *len);

uint32_t get_u32(const uint8_t *p);

/* Decoded pairs with GUARD canaries after idx[cap] and val[cap]. */
typedef struct pairs {
    uint32_t *idx;
    float *val;
    size_t cap;
} pairs_t;

void pairs_init(pairs_t *p, size_t cap);

void pairs_free(pairs_t *p);

/* Decodes an exact-size copy of block into p (room for p->cap pairs). Aborts when the code is
 * neither FL_OK nor FL_EPROTO, when a canary past idx[cap] or val[cap] changed, or when an
 * accepted block yields pairs that are no sparse vector of n entries. */
int decode_into(fl_cmp_ws_t *ws, const uint8_t *block, size_t len, size_t n, pairs_t *p,
                size_t *k_out, const char *what);

int decode_guarded(fl_cmp_ws_t *ws, const uint8_t *block, size_t len, size_t n, size_t k_cap,
                   const char *what);

/* k distinct ascending indices below n, uniformly (selection sampling, O(n)). */
void random_indices(uint32_t *idx, size_t k, size_t n, uint64_t seed);

/* Values of all magnitudes, with zeros, infinities, NaN and float16 under- and overflow among
 * them. */
void random_values(float *val, size_t k, uint64_t seed);

enum { IDX_RANDOM, IDX_ALL, IDX_FIRST, IDX_LAST, IDX_TOP, IDX_GAPS };

typedef struct shape {
    const char *name;
    size_t n;
    size_t k;
    int kind;
} shape_t;

void shape_indices(const shape_t *sh, uint32_t *idx, uint64_t seed);

#endif
