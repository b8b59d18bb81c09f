/* compression: lz4 blocks. Round trips of incompressible and compressible data (0 bytes to
 * 1 MiB), the bound and the cap check, and hostile blocks: every byte corrupted, every
 * truncation, a raw length that lies. Buffers are exact-size heap blocks followed by guard
 * bytes, so neither a read past the source (ASan) nor a write past the output goes unseen. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_cmp.h"
#include "testutil.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))
#define GUARD 64
#define GUARD_BYTE 0xa5
#define LZ4_MAX_BLOCK ((size_t)0x7E000000) /* LZ4_MAX_INPUT_SIZE */

static void fill_random(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)fl_test_rand(&s);
}

/* Compressible but not trivial: runs, repeated phrases, small numbers and some noise, so a
 * block holds both literals and matches of various lengths and offsets. */
static void fill_compressible(uint8_t *p, size_t n, uint64_t seed)
{
    static const char *const words[] = {"gradient ", "allreduce ", "rank ", "step ",
                                        "loss=",     "0.125 ",     "\n",    "tensor"};
    uint64_t s = seed;
    size_t i = 0;
    while (i < n) {
        uint64_t r = fl_test_rand(&s);
        switch (r % 4) {
        case 0: {
            size_t run = (size_t)(r >> 8) % 300;
            for (size_t k = 0; k < run && i < n; k++)
                p[i++] = (uint8_t)(r >> 40);
            break;
        }
        case 1:
        case 2: {
            const char *w = words[(r >> 8) % NELEM(words)];
            for (size_t k = 0; w[k] != '\0' && i < n; k++)
                p[i++] = (uint8_t)w[k];
            break;
        }
        default: p[i++] = (uint8_t)(r >> 16); break;
        }
    }
}

/* Half noise, half compressible stretches: blocks full of both literals and matches. */
static void fill_mixed(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    size_t i = 0;
    while (i < n) {
        size_t k = 1 + (size_t)(fl_test_rand(&s) % 200);
        if (k > n - i)
            k = n - i;
        if (fl_test_rand(&s) % 2)
            fill_random(p + i, k, fl_test_rand(&s));
        else
            fill_compressible(p + i, k, fl_test_rand(&s) % 4);
        i += k;
    }
}

/* An output buffer of n bytes followed by GUARD guard bytes. */
static uint8_t *guarded(size_t n)
{
    uint8_t *p = malloc(n + GUARD);
    ck_assert_ptr_nonnull(p);
    memset(p, GUARD_BYTE, n + GUARD);
    return p;
}

static bool guard_intact(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < GUARD; i++)
        if (p[n + i] != GUARD_BYTE)
            return false;
    return true;
}

/* A heap copy of exactly n bytes (ASan flags any read beyond it). */
static uint8_t *exact_copy(const uint8_t *src, size_t n)
{
    uint8_t *p = malloc(n > 0 ? n : 1);
    ck_assert_ptr_nonnull(p);
    if (n > 0)
        memcpy(p, src, n);
    return p;
}

/* Compresses n bytes into a fresh exact-size block; returns it and its size. */
static uint8_t *compress_block(const uint8_t *src, size_t n, size_t *len)
{
    size_t cap = fl_cmp_lz4_bound(n);
    uint8_t *dst = guarded(cap);
    int rc = fl_cmp_lz4_compress(src, n, dst, cap, len);
    ck_assert_msg(rc == FL_OK, "compress %zu bytes: %s", n, fl_last_error());
    ck_assert_msg(*len <= cap && guard_intact(dst, cap), "compress %zu bytes: %zu of cap %zu", n,
                  *len, cap);
    uint8_t *block = exact_copy(dst, *len);
    free(dst);
    return block;
}

static void round_trip(const uint8_t *src, size_t n, size_t *clen)
{
    size_t len = 0;
    uint8_t *block = compress_block(src, n, &len);
    uint8_t *out = guarded(n);
    int rc = fl_cmp_lz4_decompress(block, len, out, n);
    ck_assert_msg(rc == FL_OK, "decompress %zu -> %zu bytes: %s", len, n, fl_last_error());
    ck_assert_msg(n == 0 || memcmp(out, src, n) == 0, "%zu bytes differ after a round trip", n);
    ck_assert_msg(guard_intact(out, n), "write past %zu output bytes", n);
    free(out);
    free(block);
    *clen = len;
}

static const size_t sizes[] = {0, 1, 2, 15, 16, 17, 255, 4096, 65536, 65537, (size_t)1 << 20};

START_TEST(test_round_trip_random)
{
    size_t n = sizes[_i];
    uint8_t *src = calloc(n > 0 ? n : 1, 1);
    fill_random(src, n, 1000 + n);
    size_t clen;
    round_trip(src, n, &clen);
    /* Incompressible: the block grows a little, within the bound. */
    ck_assert_msg(clen >= n && clen <= fl_cmp_lz4_bound(n), "%zu random bytes -> %zu", n, clen);
    free(src);
}
END_TEST

START_TEST(test_round_trip_compressible)
{
    size_t n = sizes[_i];
    uint8_t *src = calloc(n > 0 ? n : 1, 1);
    fill_compressible(src, n, 7 + n);
    size_t clen;
    round_trip(src, n, &clen);
    if (n >= 4096)
        ck_assert_msg(clen < n / 2, "%zu compressible bytes -> %zu", n, clen);
    /* All zeros compress to almost nothing. */
    memset(src, 0, n);
    round_trip(src, n, &clen);
    if (n >= 65536)
        ck_assert_msg(clen < n / 100, "%zu zero bytes -> %zu", n, clen);
    free(src);
}
END_TEST

START_TEST(test_bound_and_cap)
{
    static const size_t ns[] = {0, 1, 254, 255, 256, 4096, (size_t)1 << 20, 1000000007};
    for (size_t i = 0; i < NELEM(ns); i++) {
        size_t want = ns[i] + ns[i] / 255 + 16;
        if (fl_cmp_lz4_bound(ns[i]) != want)
            ck_abort_msg("bound(%zu) = %zu, expected %zu", ns[i], fl_cmp_lz4_bound(ns[i]), want);
    }
    ck_assert_uint_eq(fl_cmp_lz4_bound(LZ4_MAX_BLOCK), LZ4_MAX_BLOCK + LZ4_MAX_BLOCK / 255 + 16);
    ck_assert_uint_eq(fl_cmp_lz4_bound(LZ4_MAX_BLOCK + 1), 0);
    ck_assert_uint_eq(fl_cmp_lz4_bound(SIZE_MAX), 0);

    /* A cap one byte below the bound is refused before anything is written, even when the
     * data would have fit. */
    size_t n = 4096;
    uint8_t *src = malloc(n);
    fill_compressible(src, n, 3);
    size_t bound = fl_cmp_lz4_bound(n);
    uint8_t *dst = guarded(bound);
    size_t len = 999;
    fl_error_clear();
    ck_assert_int_eq(fl_cmp_lz4_compress(src, n, dst, bound - 1, &len), FL_EINVAL);
    ck_assert_uint_eq(len, 999);
    ck_assert_msg(strstr(fl_last_error(), "bound") != NULL, "%s", fl_last_error());
    for (size_t i = 0; i < bound + GUARD; i++)
        if (dst[i] != GUARD_BYTE)
            ck_abort_msg("byte %zu of the output written by a refused call", i);
    ck_assert_int_eq(fl_cmp_lz4_compress(src, n, dst, 0, &len), FL_EINVAL);
    ck_assert_int_eq(fl_cmp_lz4_compress(src, 0, dst, 15, &len), FL_EINVAL);
    /* Exactly the bound is enough. */
    ck_assert_int_eq(fl_cmp_lz4_compress(src, n, dst, bound, &len), FL_OK);
    ck_assert(len > 0 && len < n && guard_intact(dst, bound));
    /* Over one block's maximum: refused without reading the input. */
    ck_assert_int_eq(fl_cmp_lz4_compress(src, LZ4_MAX_BLOCK + 1, dst, SIZE_MAX, &len), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "block") != NULL, "%s", fl_last_error());
    free(dst);
    free(src);
}
END_TEST

/* Decompresses a hostile block into a guarded buffer of raw_len bytes: the result must be a
 * refusal or exactly raw_len bytes, and the guard must hold either way. */
static int decode_hostile(const uint8_t *block, size_t n, size_t raw_len, const char *what)
{
    uint8_t *src = exact_copy(block, n);
    uint8_t *out = guarded(raw_len);
    int rc = fl_cmp_lz4_decompress(src, n, out, raw_len);
    if (rc != FL_OK && rc != FL_EPROTO)
        ck_abort_msg("%s: rc %d", what, rc);
    if (!guard_intact(out, raw_len))
        ck_abort_msg("%s: wrote past %zu output bytes", what, raw_len);
    free(out);
    free(src);
    return rc;
}

START_TEST(test_corrupt_blocks)
{
    static const size_t ns[] = {4096, 16384};
    static const uint8_t xors[] = {0xff, 0x80, 0x01, 0x10};
    for (size_t t = 0; t < NELEM(ns); t++) {
        size_t n = ns[t];
        uint8_t *src = malloc(n);
        if (t == 0)
            fill_compressible(src, n, 11);
        else
            fill_mixed(src, n, 11);
        size_t len;
        uint8_t *block = compress_block(src, n, &len);
        long refused = 0;
        char what[96];
        for (size_t pos = 0; pos < len; pos++) {
            for (size_t k = 0; k < NELEM(xors); k++) {
                block[pos] ^= xors[k];
                snprintf(what, sizeof what, "%zu-byte block, byte %zu ^ 0x%02x", len, pos, xors[k]);
                if (decode_hostile(block, len, n, what) == FL_EPROTO)
                    refused++;
                block[pos] ^= xors[k];
            }
        }
        /* Flips inside literals are undetectable; those in tokens, offsets and lengths are
         * mostly caught. Either way nothing was written past the output. */
        ck_assert_msg(refused > (long)len / 20, "only %ld of %zu corruptions refused", refused,
                      len * NELEM(xors));
        free(block);
        free(src);
    }
}
END_TEST

START_TEST(test_random_blocks)
{
    /* Pure garbage as a block, against several declared sizes. */
    uint8_t buf[300];
    static const size_t raws[] = {0, 1, 100, 5000};
    for (uint64_t seed = 1; seed <= 3000; seed++) {
        uint64_t s = seed;
        size_t n = 1 + (size_t)(fl_test_rand(&s) % sizeof buf);
        fill_random(buf, n, seed * 31);
        decode_hostile(buf, n, raws[seed % NELEM(raws)], "garbage");
    }
}
END_TEST

START_TEST(test_truncated_blocks)
{
    static const size_t ns[] = {1, 300, 4096, 65536};
    for (size_t t = 0; t < NELEM(ns); t++) {
        for (int kind = 0; kind < 2; kind++) {
            size_t n = ns[t];
            uint8_t *src = malloc(n);
            if (kind == 0)
                fill_random(src, n, 5 + t);
            else
                fill_compressible(src, n, 5 + t);
            size_t len;
            uint8_t *block = compress_block(src, n, &len);
            char what[64];
            /* Every cut for the small ones, a spread for the large ones. */
            size_t stride = len > 2000 ? len / 997 : 1;
            for (size_t cut = 0; cut < len; cut += stride) {
                snprintf(what, sizeof what, "%zu-byte block cut to %zu", len, cut);
                if (decode_hostile(block, cut, n, what) != FL_EPROTO)
                    ck_abort_msg("%s: accepted", what);
            }
            if (decode_hostile(block, len - 1, n, "last byte cut") != FL_EPROTO)
                ck_abort_msg("%zu-byte block without its last byte accepted", len);
            free(block);
            free(src);
        }
    }
}
END_TEST

START_TEST(test_lying_raw_len)
{
    static const size_t ns[] = {1, 1000, 65536};
    for (size_t t = 0; t < NELEM(ns); t++) {
        for (int kind = 0; kind < 2; kind++) {
            size_t n = ns[t];
            uint8_t *src = malloc(n);
            if (kind == 0)
                fill_random(src, n, 9 + t);
            else
                fill_compressible(src, n, 9 + t);
            size_t len;
            uint8_t *block = compress_block(src, n, &len);
            const size_t lies[] = {n + 1, n + 100, 2 * n, n - 1, n / 2, 0};
            for (size_t k = 0; k < NELEM(lies); k++) {
                if (lies[k] == n)
                    continue;
                char what[80];
                snprintf(what, sizeof what, "%zu bytes declared as %zu", n, lies[k]);
                fl_error_clear();
                if (decode_hostile(block, len, lies[k], what) != FL_EPROTO)
                    ck_abort_msg("%s: accepted", what);
                if (fl_last_error()[0] == '\0' || strstr(fl_last_error(), "lz4") == NULL)
                    ck_abort_msg("%s: detail '%s'", what, fl_last_error());
            }
            /* Declared bigger than the truth: the detail gives the declared size. */
            uint8_t *out = guarded(n + 100);
            ck_assert_int_eq(fl_cmp_lz4_decompress(block, len, out, n + 100), FL_EPROTO);
            char want[64];
            snprintf(want, sizeof want, "declared %zu", n + 100);
            ck_assert_msg(strstr(fl_last_error(), want) != NULL, "%s", fl_last_error());
            free(out);
            free(block);
            free(src);
        }
    }
}
END_TEST

START_TEST(test_empty_blocks)
{
    uint8_t out[8];
    memset(out, GUARD_BYTE, sizeof out);
    ck_assert_int_eq(fl_cmp_lz4_decompress(NULL, 0, out, 0), FL_OK);
    ck_assert_int_eq(fl_cmp_lz4_decompress(out, 0, out, 0), FL_OK);
    ck_assert_int_eq(fl_cmp_lz4_decompress(NULL, 0, out, 5), FL_EPROTO);
    ck_assert_msg(strstr(fl_last_error(), "empty block declares 5 bytes"), "%s", fl_last_error());
    for (size_t i = 0; i < sizeof out; i++)
        ck_assert_int_eq(out[i], GUARD_BYTE);

    /* The block lz4 makes for 0 bytes decodes to 0 bytes, and only to 0. */
    size_t len;
    uint8_t *block = compress_block(out, 0, &len);
    ck_assert_uint_gt(len, 0);
    ck_assert_int_eq(fl_cmp_lz4_decompress(block, len, out, 0), FL_OK);
    ck_assert_int_eq(decode_hostile(block, len, 1, "empty declared 1"), FL_EPROTO);
    free(block);

    /* Sizes beyond what one block can describe are refused up front. */
    ck_assert_int_eq(fl_cmp_lz4_decompress(out, (size_t)1 << 31, out, 8), FL_EPROTO);
    ck_assert_int_eq(fl_cmp_lz4_decompress(out, 8, out, (size_t)1 << 31), FL_EPROTO);
    ck_assert_msg(strstr(fl_last_error(), "too large"), "%s", fl_last_error());
}
END_TEST

Suite *cmp_lz4_suite(void);
Suite *cmp_lz4_suite(void)
{
    Suite *s = suite_create("cmp_lz4");
    TCase *t = tcase_create("round_trip");
    tcase_set_timeout(t, 30);
    tcase_add_loop_test(t, test_round_trip_random, 0, (int)NELEM(sizes));
    tcase_add_loop_test(t, test_round_trip_compressible, 0, (int)NELEM(sizes));
    tcase_add_test(t, test_bound_and_cap);
    suite_add_tcase(s, t);

    t = tcase_create("hostile");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_corrupt_blocks);
    tcase_add_test(t, test_random_blocks);
    tcase_add_test(t, test_truncated_blocks);
    tcase_add_test(t, test_lying_raw_len);
    tcase_add_test(t, test_empty_blocks);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(cmp_lz4_suite());
}
