/* The built-in dataset: a synthetic 10-class problem made from a 64-bit seed, bit-identical on
 * every machine, so that training runs need no download and ranks need not ship data. Also
 * fl_dataset_free for every loader. Files (IDX, CSV) are data_idx.c's and data_csv.c's.
 *
 * How it is made (a Gaussian mixture seen through a random linear map, like scikit-learn's
 * make_classification with several clusters per class):
 *  1. A hidden space of LATENT = 10 dimensions holds 80 cluster centres, CLUSTERS = 8 per class,
 *     each coordinate N(0, SPREAD^2) with SPREAD = 1. A class is the union of its 8 clusters,
 *     scattered through the space, so no hyperplane separates it from the others.
 *  2. A sample picks its class uniformly from the 10, then one of the class's 8 clusters
 *     uniformly, and draws z = centre + N(0, SIGMA^2 I) in the hidden space, SIGMA = 0.45.
 *  3. Its 64 features are x = W z + N(0, TAU^2 I), TAU = 0.5, with W a fixed 64 x 10 matrix of
 *     N(0, 1/10) entries: every feature mixes all hidden directions, plus independent noise.
 *  4. Each feature is standardized with the mixture's exact mean and standard deviation
 *     (computed from the centres, W, SIGMA and TAU, not from the samples), so train and test
 *     are scaled alike and the features have mean ~0 and standard deviation ~1.
 * The centres and W come from the seed's "model" stream; the 60000 training and the 10000 test
 * samples from two further independent streams, so the splits are independent draws from one
 * distribution. The clusters overlap a little, so some samples are ambiguous. Measured with
 * PyTorch on seeds 1, 2 and 3: the MLP 64,256,128,10 (SGD, momentum 0.9, lr 0.05, batch 64)
 * reaches 92-93% test accuracy after one epoch and 94-95% after ten, while softmax regression
 * 64,10, trained to convergence, stays at 34-39%: hyperplanes cannot follow the clusters.
 *
 * Reproducibility: xoshiro256** seeded through splitmix64, normals by Marsaglia's polar method
 * with this file's own logarithm (plain IEEE arithmetic, no libm beyond the exactly rounded
 * sqrt), all in double precision, rounded to float once at the end. Floating-point contraction
 * (fused multiply-add) could change a double's last bit: GCC does not contract in ISO C mode
 * (the build's -std=c17) and the pragma below stops clang; even so, a -std=gnu17 -march=native
 * build that does use FMA made the same bytes, the rounding to float absorbing the difference.
 * tests/test_wk_data.c pins a checksum of the output. */
#include "fl_data.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_core.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

enum { DIM = FL_DATA_BUILTIN_DIM, CLASSES = FL_DATA_BUILTIN_CLASSES, LATENT = 10, CLUSTERS = 8 };

#define SPREAD 1.0
#define SIGMA 0.45
#define TAU 0.5

/* Independent generator streams of one seed. */
enum { STREAM_MODEL = 1, STREAM_TRAIN = 2, STREAM_TEST = 3 };

typedef struct rng {
    uint64_t s[4];
    bool has_spare; /* the polar method makes normals in pairs */
    double spare;
} rng_t;

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(rng_t *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed;
    uint64_t salt = splitmix64(&x) ^ (stream * 0xd1b54a32d192ed03ull);
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&salt);
    r->has_spare = false;
    r->spare = 0.0;
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** (Blackman and Vigna). */
static uint64_t rng_next(rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* Uniform in [0, 1), 53 random bits. */
static double rng_uniform(rng_t *r)
{
    return (double)(rng_next(r) >> 11) * 0x1p-53;
}

/* Uniform in 0..n-1 for small n; the bias (n / 2^32) is far below anything measurable here. */
static int rng_below(rng_t *r, int n)
{
    return (int)(((rng_next(r) >> 32) * (uint64_t)n) >> 32);
}

/* Natural logarithm of a positive finite x, from frexp (exact) and the series
 * log(m) = 2 atanh((m - 1) / (m + 1)) on m in [sqrt(1/2), sqrt(2)), where |t| < 0.172 and 20
 * terms leave an error far below a double's last bit. Used instead of libm's log, whose last
 * bit may differ between C libraries. */
static double log_pos(double x)
{
    int e;
    double m = frexp(x, &e);
    if (m < 0.70710678118654752440) {
        m *= 2.0;
        e--;
    }
    double t = (m - 1.0) / (m + 1.0);
    double t2 = t * t;
    double term = t;
    double sum = 0.0;
    for (int k = 1; k < 40; k += 2) {
        sum += term / k;
        term *= t2;
    }
    return 2.0 * sum + (double)e * 0.69314718055994530942;
}

/* Standard normal, Marsaglia's polar method. */
static double rng_normal(rng_t *r)
{
    if (r->has_spare) {
        r->has_spare = false;
        return r->spare;
    }
    double u;
    double v;
    double s;
    do {
        u = 2.0 * rng_uniform(r) - 1.0;
        v = 2.0 * rng_uniform(r) - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    double f = sqrt(-2.0 * log_pos(s) / s);
    r->spare = v * f;
    r->has_spare = true;
    return u * f;
}

/* What every sample of one seed shares: the centres, the map and the standardization. */
typedef struct model {
    double centre[CLASSES * CLUSTERS][LATENT];
    double w[DIM][LATENT];
    double mean[DIM];
    double sd[DIM];
} model_t;

static void model_make(model_t *m, uint64_t seed)
{
    rng_t r;
    rng_seed(&r, seed, STREAM_MODEL);
    for (int c = 0; c < CLASSES * CLUSTERS; c++)
        for (int k = 0; k < LATENT; k++)
            m->centre[c][k] = SPREAD * rng_normal(&r);
    for (int j = 0; j < DIM; j++)
        for (int k = 0; k < LATENT; k++)
            m->w[j][k] = rng_normal(&r) / sqrt((double)LATENT);

    /* The mixture's moments in the hidden space: mean mu = the centres' average, covariance
     * = the centres' scatter around mu + SIGMA^2 I; a feature's are w_j . mu and
     * w_j' cov w_j + TAU^2. */
    double mu[LATENT] = {0};
    for (int c = 0; c < CLASSES * CLUSTERS; c++)
        for (int k = 0; k < LATENT; k++)
            mu[k] += m->centre[c][k] / (CLASSES * CLUSTERS);
    double cov[LATENT][LATENT] = {{0}};
    for (int c = 0; c < CLASSES * CLUSTERS; c++)
        for (int a = 0; a < LATENT; a++)
            for (int b = 0; b < LATENT; b++)
                cov[a][b] +=
                    (m->centre[c][a] - mu[a]) * (m->centre[c][b] - mu[b]) / (CLASSES * CLUSTERS);
    for (int a = 0; a < LATENT; a++)
        cov[a][a] += SIGMA * SIGMA;
    for (int j = 0; j < DIM; j++) {
        double mean = 0.0;
        double var = TAU * TAU;
        for (int a = 0; a < LATENT; a++) {
            mean += m->w[j][a] * mu[a];
            for (int b = 0; b < LATENT; b++)
                var += m->w[j][a] * cov[a][b] * m->w[j][b];
        }
        m->mean[j] = mean;
        m->sd[j] = sqrt(var);
    }
}

static int draw(const model_t *m, uint64_t seed, int stream, size_t n, const char *what,
                fl_dataset_t *d)
{
    d->x = malloc(n * DIM * sizeof *d->x);
    d->y = malloc(n * sizeof *d->y);
    if (d->x == NULL || d->y == NULL) {
        fl_dataset_free(d);
        return fl_fail(FL_ENOMEM, "built-in dataset: no memory for %zu samples", n);
    }
    d->n = n;
    d->dim = DIM;
    d->classes = CLASSES;
    snprintf(d->source, sizeof d->source, "built-in (seed %llu, %s)", (unsigned long long)seed,
             what);
    rng_t r;
    rng_seed(&r, seed, (uint64_t)stream);
    for (size_t i = 0; i < n; i++) {
        int cls = rng_below(&r, CLASSES);
        const double *c = m->centre[cls * CLUSTERS + rng_below(&r, CLUSTERS)];
        double z[LATENT];
        for (int k = 0; k < LATENT; k++)
            z[k] = c[k] + SIGMA * rng_normal(&r);
        float *x = d->x + i * DIM;
        for (int j = 0; j < DIM; j++) {
            double v = 0.0;
            for (int k = 0; k < LATENT; k++)
                v += m->w[j][k] * z[k];
            v += TAU * rng_normal(&r);
            x[j] = (float)((v - m->mean[j]) / m->sd[j]);
        }
        d->y[i] = cls;
    }
    return FL_OK;
}

int fl_data_builtin(uint64_t seed, fl_dataset_t *train, fl_dataset_t *test)
{
    assert(train != NULL && test != NULL);
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    model_t *m = malloc(sizeof *m);
    if (m == NULL)
        return fl_fail(FL_ENOMEM, "built-in dataset: no memory");
    model_make(m, seed);
    int rc = draw(m, seed, STREAM_TRAIN, FL_DATA_BUILTIN_TRAIN, "train", train);
    if (rc == FL_OK) {
        rc = draw(m, seed, STREAM_TEST, FL_DATA_BUILTIN_TEST, "test", test);
        if (rc != FL_OK)
            fl_dataset_free(train);
    }
    free(m);
    return rc;
}

void fl_dataset_free(fl_dataset_t *d)
{
    if (d == NULL)
        return;
    free(d->x);
    free(d->y);
    memset(d, 0, sizeof *d);
}
