/* The allreduce algorithm AUTO picks by size and rank count: pure arithmetic, the same on every
 * rank, kept apart so that the tests can find its switch points. */
#include "fl_coll.h"

fl_algo_t fl_allreduce_pick(int n, size_t bytes, size_t small_bytes)
{
    if (bytes > small_bytes)
        return FL_ALGO_RING;
    if (n <= FL_DIRECT_MAX_RANKS && bytes <= FL_DIRECT_MAX_BYTES)
        return FL_ALGO_DIRECT;
    return FL_ALGO_RD;
}
