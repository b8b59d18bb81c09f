/* The distributed sampler: which samples each data-parallel rank trains on, batch by batch, in
 * the manner of PyTorch's DistributedSampler with drop_last. Every rank draws the same
 * permutation from (seed, epoch) alone, so no coordination is needed, and rank r takes every
 * world-th entry from position r on. Pure logic: no IO, no clock. */
#include "fl_data.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "fl_core.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in 0..bound-1 without bias (Lemire's multiply-shift with rejection). */
static uint32_t below(uint64_t *st, uint32_t bound)
{
    uint64_t m = (splitmix64(st) >> 32) * (uint64_t)bound;
    uint32_t low = (uint32_t)m;
    if (low < bound) {
        uint32_t thresh = (uint32_t)(-bound) % bound;
        while (low < thresh) {
            m = (splitmix64(st) >> 32) * (uint64_t)bound;
            low = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

int fl_sampler_init(fl_sampler_t *s, size_t n, int world, int rank, size_t batch, bool shuffle,
                    uint64_t seed)
{
    assert(s != NULL);
    memset(s, 0, sizeof *s);
    if (world < 1)
        return fl_fail(FL_EINVAL, "sampler: world size %d (must be at least 1)", world);
    if (rank < 0 || rank >= world)
        return fl_fail(FL_EINVAL, "sampler: rank %d is out of range for %d ranks", rank, world);
    if (batch == 0)
        return fl_fail(FL_EINVAL, "sampler: batch size 0");
    if (n > UINT32_MAX)
        return fl_fail(FL_EINVAL, "sampler: %zu samples (at most %u)", n, UINT32_MAX);
    size_t share = n / (size_t)world;
    if (batch > share)
        return fl_fail(FL_EINVAL,
                       "sampler: batch size %zu is larger than rank %d's share of %zu samples "
                       "(%zu samples, %d ranks)",
                       batch, rank, share, n, world);
    s->perm = malloc(n * sizeof *s->perm);
    if (s->perm == NULL)
        return fl_fail(FL_ENOMEM, "sampler: no memory for %zu samples", n);
    s->n = n;
    s->world = world;
    s->rank = rank;
    s->batch = batch;
    s->shuffle = shuffle;
    s->seed = seed;
    fl_sampler_set_epoch(s, 0);
    return FL_OK;
}

void fl_sampler_deinit(fl_sampler_t *s)
{
    if (s == NULL)
        return;
    free(s->perm);
    memset(s, 0, sizeof *s);
}

void fl_sampler_set_epoch(fl_sampler_t *s, long epoch)
{
    assert(s != NULL && s->perm != NULL);
    for (size_t i = 0; i < s->n; i++)
        s->perm[i] = (uint32_t)i;
    if (!s->shuffle)
        return;
    /* Mixing the epoch through splitmix64 first keeps nearby epochs' streams unrelated. */
    uint64_t e = (uint64_t)epoch;
    uint64_t st = s->seed ^ splitmix64(&e);
    for (size_t i = s->n; i > 1; i--) {
        uint32_t j = below(&st, (uint32_t)i);
        uint32_t t = s->perm[i - 1];
        s->perm[i - 1] = s->perm[j];
        s->perm[j] = t;
    }
}

size_t fl_sampler_batches(const fl_sampler_t *s)
{
    assert(s != NULL && s->world >= 1 && s->batch >= 1);
    return (s->n / (size_t)s->world) / s->batch;
}

void fl_sampler_batch(const fl_sampler_t *s, size_t i, uint32_t *idx)
{
    assert(s != NULL && s->perm != NULL && i < fl_sampler_batches(s));
    size_t w = (size_t)s->world;
    size_t base = i * s->batch;
    for (size_t t = 0; t < s->batch; t++)
        idx[t] = s->perm[(size_t)s->rank + (base + t) * w];
}
