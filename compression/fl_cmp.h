/* compression: pure functions over caller buffers: top-k selection, error feedback, the density
 * schedule and the sparse block codec (public in include/flodl/compress.h), and lz4 blocks with
 * every size checked before anything is written. No sockets; scratch memory lives in the
 * caller's workspace. */
#ifndef FL_CMP_H
#define FL_CMP_H

#include <stddef.h>

#include <flodl/compress.h>

#include "fl_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest compressed size of n input bytes (for sizing dst). 0 when n is too large for lz4
 * (over 2 GiB). */
size_t fl_cmp_lz4_bound(size_t n);

/* Compresses n bytes of src into dst (cap bytes). *out_len gets the compressed size.
 * FL_OK, FL_EINVAL (n too large for one block, or cap below fl_cmp_lz4_bound(n)).
 * Thread-safe. */
int fl_cmp_lz4_compress(const void *src, size_t n, void *dst, size_t cap, size_t *out_len);

/* Decompresses one block of n bytes into exactly raw_len bytes at dst. A corrupt, truncated
 * or lying block fails with FL_EPROTO; nothing is read or written outside the two buffers.
 * Thread-safe. */
int fl_cmp_lz4_decompress(const void *src, size_t n, void *dst, size_t raw_len);

#ifdef __cplusplus
}
#endif

#endif
