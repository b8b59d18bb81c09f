/* Writes the seed corpus of the sparse decoder's fuzzer (tests/fuzz/corpus/sparse/): a few
 * small valid blocks made by the encoder and a few invalid ones, each broken in one way the
 * decoder must refuse. Run once by hand (target fuzz_make_corpus); its output is committed.
 *   fuzz_make_corpus DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_cmp.h"

#define HDR FL_CMP_SPARSE_HEADER
#define MAXB 4096

typedef struct blk {
    uint8_t b[MAXB];
    size_t len;
} blk_t;

static const char *dir;
static int failures;

static void put_le(uint8_t *p, size_t width, uint64_t v)
{
    for (size_t i = 0; i < width; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void save(const char *name, const uint8_t *b, size_t len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(b, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "fuzz_make_corpus: cannot write %s\n", path);
        failures++;
        return;
    }
    printf("%-28s %5zu bytes\n", name, len);
}

static void encode(fl_cmp_ws_t *ws, const uint32_t *idx, const float *val, size_t k, size_t n,
                   fl_dtype_t vt, bool lz4, blk_t *out)
{
    fl_cmp_sparse_opts_t o;
    fl_cmp_sparse_opts_init(&o);
    o.values = vt;
    o.lz4 = lz4;
    out->len = 0;
    if (fl_cmp_sparse_bound(k, vt) > MAXB ||
        fl_cmp_sparse_encode(ws, idx, val, k, n, &o, out->b, MAXB, &out->len) != FL_OK) {
        fprintf(stderr, "fuzz_make_corpus: encode of %zu pairs: %s\n", k, fl_last_error());
        failures++;
    }
}

/* A block whose header matches a raw body of the given index stream and k zero values. */
static void craft(uint64_t n, uint64_t k, const uint8_t *istream, size_t ib, blk_t *out)
{
    memset(out->b, 0, HDR);
    memcpy(out->b, "FLSP", 4);
    out->b[4] = 1;
    out->b[5] = FL_FLOAT32;
    out->b[6] = 1;
    put_le(out->b + 8, 8, n);
    put_le(out->b + 16, 8, k);
    put_le(out->b + 24, 4, ib);
    put_le(out->b + 28, 4, 4 * k);
    put_le(out->b + 32, 4, ib + 4 * k);
    memcpy(out->b + HDR, istream, ib);
    memset(out->b + HDR + ib, 0, 4 * k);
    out->len = HDR + ib + 4 * k;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_make_corpus DIR\n");
        return 2;
    }
    dir = argv[1];
    fl_cmp_ws_t *ws = NULL;
    if (fl_cmp_ws_create(&ws) != FL_OK)
        return 1;
    static uint32_t idx[300];
    static float val[300];
    blk_t b;

    const uint32_t few[] = {0, 17, 130, 400, 999};
    const float fewv[] = {-2.0f, 0.5f, 3.25f, -0.0f, 1e-3f};
    encode(ws, few, fewv, 5, 1000, FL_FLOAT32, false, &b);
    save("valid_f32_raw", b.b, b.len);
    blk_t f32 = b;

    for (size_t i = 0; i < 300; i++) {
        idx[i] = (uint32_t)(i * 200 + 199);
        val[i] = (float)(i % 8) * 0.5f;
    }
    encode(ws, idx, val, 300, 60000, FL_FLOAT16, true, &b);
    save("valid_f16_lz4", b.b, b.len);
    blk_t lz = b;

    for (size_t i = 0; i < 64; i++) {
        idx[i] = (uint32_t)i;
        val[i] = (float)(i % 5) - 2.0f;
    }
    encode(ws, idx, val, 64, 64, FL_BFLOAT16, true, &b);
    save("valid_bf16_dense", b.b, b.len);

    encode(ws, idx, val, 0, 10, FL_FLOAT32, true, &b);
    save("valid_empty", b.b, b.len);

    for (size_t i = 0; i < 15; i++) {
        idx[i] = (uint32_t)(i * ((1u << 28) + 1) + (1u << 28));
        val[i] = (float)i * 1.5f;
    }
    idx[14] = UINT32_MAX - 1;
    encode(ws, idx, val, 15, UINT32_MAX, FL_FLOAT32, true, &b);
    save("valid_n32_gaps", b.b, b.len);

    for (size_t i = 0; i < 200; i++) {
        idx[i] = (uint32_t)(i * 20 + 3);
        val[i] = (float)(i % 3);
    }
    encode(ws, idx, val, 200, 4096, FL_FLOAT32, true, &b);
    save("valid_f32_lz4", b.b, b.len);

    b = f32;
    b.b[0] = 'X';
    save("bad_magic", b.b, b.len);
    save("bad_truncated", f32.b, f32.len - 3);
    save("bad_header_only", f32.b, 30);
    b = f32;
    put_le(b.b + 8, 8, 4); /* n = 4 < k = 5 */
    save("bad_k_above_n", b.b, b.len);
    b = f32;
    b.b[37] = 1;
    save("bad_reserved", b.b, b.len);

    b = lz;
    for (size_t i = HDR + 4; i < b.len; i += 7)
        b.b[i] ^= 0x5a;
    save("bad_lz4_corrupt", b.b, b.len);
    b = lz;
    put_le(b.b + 24, 4, 601); /* decodes to 1 byte less than declared */
    save("bad_lz4_size", b.b, b.len);

    const uint8_t overlong[] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00, 0x00};
    craft(1000, 2, overlong, sizeof overlong, &b);
    save("bad_varint_overlong", b.b, b.len);
    const uint8_t past[] = {0x00, 0x80};
    craft(1000, 2, past, sizeof past, &b);
    save("bad_varint_past_stream", b.b, b.len);
    const uint8_t range[] = {0x05, 0x04};
    craft(10, 2, range, sizeof range, &b);
    save("bad_index_range", b.b, b.len);
    const uint8_t left[] = {0x00, 0x00, 0x00};
    craft(1000, 2, left, sizeof left, &b);
    save("bad_index_leftover", b.b, b.len);

    fl_cmp_ws_destroy(&ws);
    return failures == 0 ? 0 : 1;
}
