/* The shard map: n parameters cut into S contiguous key ranges, balanced by bytes (every
 * parameter is a float32, so by count), boundaries on multiples of FL_PS_ALIGN parameters
 * (64 bytes: a cache line, a whole AVX-512 vector) so two shards never share a line. Range i
 * holds blocks [B*i/S, B*(i+1)/S) of the B = ceil(n / FL_PS_ALIGN) blocks, the last one cut at
 * n: sizes differ by at most one block, and with fewer blocks than shards some ranges are
 * empty. Pure arithmetic: the coordinator computes it, tests check it. */
#include "fl_ps.h"

/* floor(blocks * i / s) without overflow for blocks up to 2^64 / FL_PS_ALIGN. */
static uint64_t first_block(uint64_t blocks, uint32_t s, uint32_t i)
{
    uint64_t q = blocks / s, r = blocks % s;
    return q * i + (r * i) / s;
}

void fl_ps_map_range(uint64_t n, uint32_t nshards, uint32_t index, fl_ps_range_t *out)
{
    out->offset = 0;
    out->count = 0;
    if (nshards == 0 || index >= nshards)
        return;
    uint64_t blocks = n / FL_PS_ALIGN + (n % FL_PS_ALIGN != 0);
    uint64_t b0 = first_block(blocks, nshards, index);
    uint64_t b1 = first_block(blocks, nshards, index + 1);
    uint64_t lo = b0 * FL_PS_ALIGN, hi = b1 * FL_PS_ALIGN;
    if (lo > n)
        lo = n;
    if (hi > n)
        hi = n;
    out->offset = lo;
    out->count = hi - lo;
}
