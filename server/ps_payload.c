/* Payloads of the parameter server: a push's frames turned into a gradient source (dense
 * float32, float16 or bfloat16, raw or lz4, in pieces of a fixed element count; or a sparse
 * top-k block), with every size, index and value checked before the shard uses any of it; the
 * piece size senders use; and the lz4 encoding of pulled parameters. No sockets: the shard
 * hands in the frames' bytes and their descriptions. */
#include "ps_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fl_cmp.h"
#include "fl_msg.h"

/* The shard applies pieces in blocks: a piece boundary must be a block boundary. */
_Static_assert(FL_MSG_PS_ALIGN % PS_BLOCK == 0, "pieces must end on a block");

static float bits_float(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* Fails naming the first NaN or Inf of a dense piece starting at element `base`. */
static int name_nonfinite(const ps_src_t *src, const void *piece, uint64_t n, uint64_t base)
{
    for (uint64_t i = 0; i < n; i++) {
        float v;
        switch (src->kind) {
        case PS_SRC_F32: v = ((const ps_uf32 *)piece)[i]; break;
        case PS_SRC_F16: v = fl_f16_to_f32(((const ps_u16 *)piece)[i]); break;
        case PS_SRC_BF16: v = fl_bf16_to_f32(((const ps_u16 *)piece)[i]); break;
        default: v = 0; break;
        }
        if (!isfinite(v))
            return fl_fail(FL_ENONFINITE, "gradient holds %s at index %" PRIu64 " of the shard",
                           isnan(v) ? "NaN" : "Inf", base + i);
    }
    return FL_OK;
}

static int check_piece(const ps_src_t *src, const void *piece, uint64_t n, uint64_t base,
                       double *maxabs)
{
    double m = 0.0;
    if (src->kind == PS_SRC_F32) {
        uint32_t b = fl_f32_max_abs_bits(piece, (size_t)n);
        if (b >= 0x7f800000u)
            return name_nonfinite(src, piece, n, base);
        m = (double)bits_float(b);
    } else {
        const ps_u16 *h = piece;
        for (uint64_t i = 0; i < n; i++) {
            float v = src->kind == PS_SRC_F16 ? fl_f16_to_f32(h[i]) : fl_bf16_to_f32(h[i]);
            if (!isfinite(v))
                return name_nonfinite(src, piece, n, base);
            double a = fabs((double)v);
            m = a > m ? a : m;
        }
    }
    *maxabs = m > *maxabs ? m : *maxabs;
    return FL_OK;
}

static int check_values(const ps_src_t *src, uint64_t count, double *maxabs)
{
    *maxabs = 0.0;
    if (src->kind == PS_SRC_SPARSE) {
        for (size_t i = 0; i < src->k; i++) {
            float v = src->val[i];
            if (!isfinite(v))
                return fl_fail(FL_ENONFINITE, "gradient holds %s at index %u of the shard",
                               isnan(v) ? "NaN" : "Inf", src->idx[i]);
            double a = fabs((double)v);
            *maxabs = a > *maxabs ? a : *maxabs;
        }
        return FL_OK;
    }
    size_t es = src->kind == PS_SRC_F32 ? 4 : 2;
    uint64_t step = src->chunk_elems ? src->chunk_elems : count;
    for (uint64_t at = 0; at < count; at += step) {
        uint64_t n = count - at < step ? count - at : step;
        int rc = check_piece(src, ps_src_at(src, at, es), n, at, maxabs);
        if (rc != FL_OK)
            return rc;
    }
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
        return fl_fail(FL_EPROTO,
                       "sparse push for a tensor of %" PRIu64 " entries, the shard "
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
    if ((rc = fl_cmp_sparse_decode(ws, data, bytes, (size_t)count, k, idx, val, &got)) != FL_OK) {
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

/* Lays out a dense payload of nframes pieces: element type, sizes, piece lengths. */
static int decode_dense(const void *const *data, const size_t *bytes, const fl_msg_frame_t *desc,
                        size_t nframes, uint64_t count, ps_src_t *src, void **owned)
{
    size_t es;
    uint32_t dtype = desc[0].dtype, codec = desc[0].codec;
    switch (dtype) {
    case FL_FLOAT32: src->kind = PS_SRC_F32, es = 4; break;
    case FL_FLOAT16: src->kind = PS_SRC_F16, es = 2; break;
    case FL_BFLOAT16: src->kind = PS_SRC_BF16, es = 2; break;
    default:
        return fl_fail(FL_EPROTO,
                       "dense push of %s values (float32, float16 or bfloat16 "
                       "expected)",
                       fl_dtype_name((fl_dtype_t)dtype));
    }
    uint64_t total = 0, piece = desc[0].raw_bytes / es;
    for (size_t f = 0; f < nframes; f++) {
        if (desc[f].dtype != dtype || desc[f].codec != codec)
            return fl_fail(FL_EPROTO,
                           "dense push frame %zu has another type or codec than "
                           "frame 0",
                           f);
        if (codec != FL_CODEC_RAW && codec != FL_CODEC_LZ4)
            return fl_fail(FL_EPROTO, "push with unknown codec %u", codec);
        if (codec == FL_CODEC_RAW && bytes[f] != desc[f].raw_bytes)
            return fl_fail(FL_EPROTO, "raw push frame of %zu bytes declares %" PRIu64, bytes[f],
                           desc[f].raw_bytes);
        uint64_t elems = desc[f].raw_bytes / es;
        if (desc[f].raw_bytes % es != 0 || (f + 1 < nframes && elems != piece) ||
            (f + 1 == nframes && elems > piece) || elems == 0)
            return fl_fail(FL_EPROTO,
                           "dense push frame %zu of %" PRIu64 " bytes does not "
                           "continue pieces of %" PRIu64 " elements",
                           f, desc[f].raw_bytes, piece);
        total += elems;
    }
    if (total != count || (nframes > 1 && piece % PS_BLOCK != 0))
        return fl_fail(FL_EPROTO,
                       "dense push of %" PRIu64 " bytes for a shard of %" PRIu64
                       " %s values (%" PRIu64 " bytes)%s",
                       total * es, count, fl_dtype_name((fl_dtype_t)dtype), count * es,
                       total == count ? " in pieces that are not multiples of 2048" : "");
    if (codec == FL_CODEC_RAW) {
        if (nframes == 1) {
            src->dense = data[0];
            return FL_OK;
        }
        src->chunk_elems = piece;
        for (size_t f = 0; f < nframes; f++)
            src->chunk[f] = data[f];
        return FL_OK;
    }
    uint8_t *buf = malloc(count > 0 ? (size_t)(count * es) : 1);
    if (buf == NULL)
        return fl_fail(FL_ENOMEM, "push: out of memory for %" PRIu64 " bytes", count * es);
    for (size_t f = 0; f < nframes; f++) {
        int rc = fl_cmp_lz4_decompress(data[f], bytes[f], buf + f * piece * es,
                                       (size_t)desc[f].raw_bytes);
        if (rc != FL_OK) {
            free(buf);
            return fl_fail_ctx(rc, "push frame %zu", f);
        }
    }
    src->dense = buf;
    *owned = buf;
    return FL_OK;
}

int fl_ps__payload_decode(fl_cmp_ws_t *ws, const void *const *data, const size_t *bytes,
                          const fl_msg_frame_t *desc, size_t nframes, uint64_t count, ps_src_t *src,
                          void **owned)
{
    memset(src, 0, sizeof *src);
    *owned = NULL;
    if (nframes < 1 || nframes > FL_MSG_MAX_FRAMES)
        return fl_fail(FL_EPROTO, "push of %zu frames", nframes);
    int rc;
    if (desc[0].codec == FL_CODEC_SPARSE) {
        if (nframes != 1)
            return fl_fail(FL_EPROTO, "sparse push in %zu frames (one block expected)", nframes);
        rc = decode_sparse(ws, data[0], bytes[0], count, src, owned);
    } else {
        rc = decode_dense(data, bytes, desc, nframes, count, src, owned);
    }
    if (rc != FL_OK)
        return rc;
    double m = 0.0;
    rc = check_values(src, count, &m);
    if (rc != FL_OK) {
        free(*owned);
        *owned = NULL;
        return rc;
    }
    src->maxabs = m;
    return FL_OK;
}

int fl_ps__payload_lz4(const float *params, uint64_t count, void **out, size_t *out_len)
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
