/* lz4 blocks for payload frames whose header says CODEC_LZ4. The decoder trusts nothing: the
 * decompressed size must be exactly what the header declared. */
#include "fl_cmp.h"

#include <limits.h>
#include <lz4.h>

size_t fl_cmp_lz4_bound(size_t n)
{
    if (n > (size_t)LZ4_MAX_INPUT_SIZE)
        return 0;
    return (size_t)LZ4_compressBound((int)n);
}

int fl_cmp_lz4_compress(const void *src, size_t n, void *dst, size_t cap, size_t *out_len)
{
    if (n > (size_t)LZ4_MAX_INPUT_SIZE)
        return fl_fail(FL_EINVAL, "lz4: %zu bytes exceed one block (%d)", n, LZ4_MAX_INPUT_SIZE);
    size_t bound = fl_cmp_lz4_bound(n);
    if (cap < bound)
        return fl_fail(FL_EINVAL, "lz4: output of %zu bytes below the bound %zu", cap, bound);
    int cap_i = cap > (size_t)INT_MAX ? INT_MAX : (int)cap;
    int r = LZ4_compress_default(src, dst, (int)n, cap_i);
    if (r <= 0 && n > 0)
        return fl_fail(FL_EINVAL, "lz4: compression of %zu bytes failed", n);
    *out_len = (size_t)(r < 0 ? 0 : r);
    return FL_OK;
}

int fl_cmp_lz4_decompress(const void *src, size_t n, void *dst, size_t raw_len)
{
    if (n > (size_t)INT_MAX || raw_len > (size_t)INT_MAX)
        return fl_fail(FL_EPROTO, "lz4: block of %zu bytes (%zu decoded) is too large", n, raw_len);
    if (n == 0)
        return raw_len == 0 ? FL_OK
                            : fl_fail(FL_EPROTO, "lz4: empty block declares %zu bytes", raw_len);
    int r = LZ4_decompress_safe(src, dst, (int)n, (int)raw_len);
    if (r < 0)
        return fl_fail(FL_EPROTO, "lz4: corrupt block of %zu bytes (error %d)", n, r);
    if ((size_t)r != raw_len)
        return fl_fail(FL_EPROTO, "lz4: block decodes to %d bytes, header declared %zu", r,
                       raw_len);
    return FL_OK;
}
