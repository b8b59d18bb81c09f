/* libFuzzer target for the sparse block decoder (compression/sparse_codec.c): any input is fed
 * to peek, decode and accumulate, which must answer FL_OK or FL_EPROTO, agree with each other,
 * accept only valid sparse vectors, stay inside the caller's buffers and leak nothing. Built
 * with clang -fsanitize=fuzzer,address,undefined by tests/fuzz/CMakeLists.txt. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_cmp.h"

/* The dense tensor a receiver holds: the header's n when it is at most MAX_N, else FIXED_N (a
 * receiver of another size, which must refuse the block). */
#define MAX_N 65536
#define FIXED_N 1000
/* Room for pairs when decoding against the header's own n, which may be up to 2^32-1. */
#define MAX_K 4096

static void die(const char *what, int rc)
{
    fprintf(stderr, "fuzz_sparse_decode: %s (rc %d: %s)\n", what, rc, fl_last_error());
    abort();
}

static void check_rc(int rc, const char *what)
{
    if (rc != FL_OK && rc != FL_EPROTO)
        die(what, rc);
}

/* An accepted block must be a sparse vector: k_out within room, indices ascending below n. */
static void check_pairs(const uint32_t *idx, size_t k, size_t k_cap, size_t n)
{
    if (k > k_cap)
        die("more pairs than room", (int)k);
    for (size_t i = 0; i < k; i++)
        if (idx[i] >= n || (i > 0 && idx[i] <= idx[i - 1]))
            die("accepted an index out of range or order", (int)i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fl_cmp_ws_t *ws = NULL;
    if (fl_cmp_ws_create(&ws) != FL_OK)
        return 0;
    fl_cmp_sparse_info_t info;
    int prc = fl_cmp_sparse_peek(data, size, &info);
    check_rc(prc, "peek");
    size_t n = prc == FL_OK && info.n <= MAX_N ? (size_t)info.n : FIXED_N;

    /* Against the header's own n (any size), with bounded room: the varint paths for large
     * tensors are reached without a large allocation here. */
    if (prc == FL_OK) {
        size_t k_cap = info.k < MAX_K ? (size_t)info.k : MAX_K;
        uint32_t *idx = malloc((k_cap + 1) * sizeof *idx);
        float *val = malloc((k_cap + 1) * sizeof *val);
        if (idx != NULL && val != NULL) {
            size_t k = 0;
            int rc = fl_cmp_sparse_decode(ws, data, size, (size_t)info.n, k_cap, idx, val, &k);
            check_rc(rc, "decode, header's n");
            if (rc == FL_OK)
                check_pairs(idx, k, k_cap, (size_t)info.n);
        }
        free(idx);
        free(val);
    }

    /* Against the receiver's n, with room for every entry: decode and accumulate must agree. */
    uint32_t *idx = malloc(n * sizeof *idx);
    float *val = malloc(n * sizeof *val);
    float *dense = calloc(n, sizeof *dense);
    if (idx != NULL && val != NULL && dense != NULL) {
        size_t k = 0;
        int rc = fl_cmp_sparse_decode(ws, data, size, n, n, idx, val, &k);
        check_rc(rc, "decode");
        if (rc == FL_OK) {
            if (prc != FL_OK)
                die("decode accepted what peek refused", rc);
            check_pairs(idx, k, n, n);
        }
        size_t ka = 0;
        int arc = fl_cmp_sparse_accumulate(ws, data, size, dense, n, &ka);
        check_rc(arc, "accumulate");
        if (arc != rc || (rc == FL_OK && ka != k))
            die("decode and accumulate disagree", arc);
        if (arc != FL_OK) {
            for (size_t i = 0; i < n; i++)
                if (dense[i] != 0.0f)
                    die("a refused block changed the dense vector", (int)i);
        } else {
            /* dense now holds exactly the decoded pairs (NaN compares unequal: skip those). */
            for (size_t i = 0; i < k; i++)
                if (val[i] == val[i] && memcmp(&dense[idx[i]], &val[i], sizeof *val) != 0 &&
                    !(val[i] == 0.0f && dense[idx[i]] == 0.0f))
                    die("accumulate disagrees with decode on a value", (int)i);
        }
    }
    free(idx);
    free(val);
    free(dense);
    fl_cmp_ws_destroy(&ws);
    return 0;
}
