/* Payloads of the parameter server: a push's frame turned into a gradient source (dense
 * float32, float16 or bfloat16, raw or lz4; or a sparse top-k block), with every size, index
 * and value checked before the shard uses any of it; and the lz4 encoding of pulled
 * parameters. No sockets: the shard hands in the frame's bytes and its description. */
#include "ps_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fl_cmp.h"
#include "fl_msg.h"

static int check_values(const ps_src_t *src, uint64_t n, double *maxabs)
{
    double m = 0.0;
    for (uint64_t i = 0; i < n; i++) {
        float v;
        switch (src->kind) {
        case PS_SRC_F32: v = ((const ps_uf32 *)src->dense)[i]; break;
        case PS_SRC_F16: v = fl_f16_to_f32(((const ps_u16 *)src->dense)[i]); break;
        case PS_SRC_BF16: v = fl_bf16_to_f32(((const ps_u16 *)src->dense)[i]); break;
        default: v = src->val[i]; break;
        }
        if (!isfinite(v))
            return fl_fail(FL_ENONFINITE, "gradient holds %s at index %" PRIu64 " of the shard",
                           isnan(v) ? "NaN" : "Inf",
                           src->kind == PS_SRC_SPARSE ? (uint64_t)src->idx[i] : i);
        double a = fabs((double)v);
        m = a > m ? a : m;
    }
    *maxabs = m;
    return FL_OK;
}

static int decode_sparse(fl_cmp_ws_t *ws, const void *data, size_t bytes, uint64_t count,
                         ps_src_t *src, void **owned)
{
    if (count == 0 || count > UINT32_MAX)
        return fl_fail(FL_EPROTO, "sparse push to a shard of %" PRIu64 " parameters", count);
    fl_cmp_sparse_info_t info;
    int rc = fl_cmp_sparse_peek(data, bytes, &info);
    if (rc != FL_OK)
        return rc;
    if (info.n != count)
        return fl_fail(FL_EPROTO, "sparse push for a tensor of %" PRIu64 " entries, the shard "
                                  "holds %" PRIu64,
                       info.n, count);
    /* k <= n is checked by peek: the allocation is bounded by the shard, not the sender. */
    size_t k = (size_t)info.k;
    void *mem = malloc((k + 1) * (sizeof(uint32_t) + sizeof(float)));
    if (mem == NULL)
        return fl_fail(FL_ENOMEM, "sparse push: out of memory for %zu pairs", k);
    uint32_t *idx = mem;
    float *val = (float *)(idx + k + 1);
    size_t got = 0;
    if ((rc = fl_cmp_sparse_decode(ws, data, bytes, (size_t)count, k, idx, val, &got)) !=
        FL_OK) {
        free(mem);
        return rc;
    }
    src->kind = PS_SRC_SPARSE;
    src->idx = idx;
    src->val = val;
    src->k = got;
    *owned = mem;
    return FL_OK;
}

int ps_payload_decode(fl_cmp_ws_t *ws, const void *data, size_t bytes, uint32_t dtype,
                      uint32_t codec, uint64_t raw_bytes, uint64_t count, ps_src_t *src,
                      void **owned)
{
    memset(src, 0, sizeof *src);
    *owned = NULL;
    int rc;
    if (codec == FL_CODEC_SPARSE) {
        if ((rc = decode_sparse(ws, data, bytes, count, src, owned)) != FL_OK)
            return rc;
    } else {
        size_t es;
        switch (dtype) {
        case FL_FLOAT32: src->kind = PS_SRC_F32, es = 4; break;
        case FL_FLOAT16: src->kind = PS_SRC_F16, es = 2; break;
        case FL_BFLOAT16: src->kind = PS_SRC_BF16, es = 2; break;
        default:
            return fl_fail(FL_EPROTO, "dense push of %s values (float32, float16 or bfloat16 "
                                      "expected)",
                           fl_dtype_name((fl_dtype_t)dtype));
        }
        if (raw_bytes != count * es)
            return fl_fail(FL_EPROTO, "dense push of %" PRIu64 " bytes for a shard of %" PRIu64
                                      " %s values (%" PRIu64 " bytes)",
                           raw_bytes, count, fl_dtype_name((fl_dtype_t)dtype), count * es);
        if (codec == FL_CODEC_LZ4) {
            void *buf = malloc(raw_bytes > 0 ? (size_t)raw_bytes : 1);
            if (buf == NULL)
                return fl_fail(FL_ENOMEM, "push: out of memory for %" PRIu64 " bytes",
                               raw_bytes);
            if ((rc = fl_cmp_lz4_decompress(data, bytes, buf, (size_t)raw_bytes)) != FL_OK) {
                free(buf);
                return fl_fail_ctx(rc, "push");
            }
            src->dense = buf;
            *owned = buf;
        } else if (codec == FL_CODEC_RAW) {
            if (bytes != raw_bytes)
                return fl_fail(FL_EPROTO, "raw push frame of %zu bytes declares %" PRIu64,
                               bytes, raw_bytes);
            src->dense = data;
        } else {
            return fl_fail(FL_EPROTO, "push with unknown codec %u", codec);
        }
    }
    double m = 0.0;
    rc = check_values(src, src->kind == PS_SRC_SPARSE ? src->k : count, &m);
    if (rc != FL_OK) {
        free(*owned);
        *owned = NULL;
        return rc;
    }
    src->maxabs = m;
    return FL_OK;
}

int ps_payload_lz4(const float *params, uint64_t count, void **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    size_t n = (size_t)count * sizeof(float);
    size_t cap = fl_cmp_lz4_bound(n);
    if (count == 0 || cap == 0)
        return FL_OK; /* nothing to gain, or too large for one block */
    void *buf = malloc(cap);
    if (buf == NULL)
        return fl_fail(FL_ENOMEM, "pull: out of memory for %zu bytes", cap);
    size_t len;
    if (fl_cmp_lz4_compress(params, n, buf, cap, &len) != FL_OK || len >= n) {
        free(buf);
        return FL_OK;
    }
    *out = buf;
    *out_len = len;
    return FL_OK;
}
