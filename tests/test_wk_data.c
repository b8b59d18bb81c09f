/* Datasets and the sampler (worker/data_builtin.c, data_idx.c, data_csv.c, sampler.c): the
 * built-in dataset is deterministic, well-formed and pinned; IDX files plain and gzipped load
 * with their values, and every malformed file is refused naming the file and the problem; CSV
 * likewise, naming the line; the sampler's batches partition each epoch's permutation. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "fl_wk.h"
#include "testutil.h"
#include "train_int.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static char dir[256];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/fl_wkdata_XXXXXX");
    if (mkdtemp(dir) == NULL)
        ck_abort_msg("mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
    static const char *const names[] = {"img", "lab", "img.gz", "lab.gz", "data.csv"};
    char p[512];
    for (size_t i = 0; i < NELEM(names); i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

static void path_in(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

/* ---- built-in ---- */

/* FNV-1a over the values' bit patterns (as integers, so byte order does not matter). */
static uint64_t fnv_u32(uint64_t h, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        h ^= (v >> (8 * i)) & 0xffu;
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t checksum(const fl_dataset_t *d, size_t samples)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < samples * d->dim; i++) {
        uint32_t bits;
        memcpy(&bits, &d->x[i], sizeof bits);
        h = fnv_u32(h, bits);
    }
    for (size_t i = 0; i < samples; i++)
        h = fnv_u32(h, (uint32_t)d->y[i]);
    return h;
}

START_TEST(test_builtin_shape)
{
    fl_dataset_t tr;
    fl_dataset_t te;
    ck_assert_int_eq(fl_data_builtin(1, &tr, &te), FL_OK);
    ck_assert_uint_eq(tr.n, FL_DATA_BUILTIN_TRAIN);
    ck_assert_uint_eq(te.n, FL_DATA_BUILTIN_TEST);
    ck_assert_uint_eq(tr.dim, FL_DATA_BUILTIN_DIM);
    ck_assert_uint_eq(te.dim, FL_DATA_BUILTIN_DIM);
    ck_assert_int_eq(tr.classes, FL_DATA_BUILTIN_CLASSES);
    ck_assert_int_eq(te.classes, FL_DATA_BUILTIN_CLASSES);
    ck_assert_str_eq(tr.source, "built-in (seed 1, train)");
    ck_assert_str_eq(te.source, "built-in (seed 1, test)");

    const fl_dataset_t *sets[2] = {&tr, &te};
    for (int s = 0; s < 2; s++) {
        const fl_dataset_t *d = sets[s];
        size_t count[FL_DATA_BUILTIN_CLASSES] = {0};
        for (size_t i = 0; i < d->n; i++) {
            if (d->y[i] < 0 || d->y[i] >= FL_DATA_BUILTIN_CLASSES)
                ck_abort_msg("%s: label %d of sample %zu", d->source, (int)d->y[i], i);
            count[d->y[i]]++;
        }
        /* Classes are drawn uniformly: each holds about a tenth of the samples. */
        for (int c = 0; c < FL_DATA_BUILTIN_CLASSES; c++)
            if (count[c] < d->n / 12 || count[c] > d->n / 8)
                ck_abort_msg("%s: class %d has %zu of %zu samples", d->source, c, count[c], d->n);
        /* Standardized features: mean ~0 and standard deviation ~1 each. */
        for (size_t j = 0; j < d->dim; j++) {
            double sum = 0.0;
            double sq = 0.0;
            for (size_t i = 0; i < d->n; i++) {
                double v = d->x[i * d->dim + j];
                if (!isfinite(v))
                    ck_abort_msg("%s: feature %zu of sample %zu is %g", d->source, j, i, v);
                sum += v;
                sq += v * v;
            }
            double mean = sum / (double)d->n;
            double sd = sqrt(sq / (double)d->n - mean * mean);
            if (fabs(mean) > 0.05 || fabs(sd - 1.0) > 0.05)
                ck_abort_msg("%s: feature %zu has mean %.4f, sd %.4f", d->source, j, mean, sd);
        }
    }
    /* Train and test are different draws. */
    ck_assert_int_ne(memcmp(tr.x, te.x, te.n * te.dim * sizeof *te.x), 0);
    fl_dataset_free(&tr);
    fl_dataset_free(&te);
    ck_assert_ptr_null(tr.x);
    ck_assert_uint_eq(tr.n, 0);
    fl_dataset_free(&tr);
    fl_dataset_free(NULL);
}
END_TEST

START_TEST(test_builtin_deterministic)
{
    fl_dataset_t a[2];
    fl_dataset_t b[2];
    fl_dataset_t c[2];
    ck_assert_int_eq(fl_data_builtin(7, &a[0], &a[1]), FL_OK);
    ck_assert_int_eq(fl_data_builtin(7, &b[0], &b[1]), FL_OK);
    ck_assert_int_eq(fl_data_builtin(8, &c[0], &c[1]), FL_OK);
    for (int s = 0; s < 2; s++) {
        size_t n = a[s].n;
        if (memcmp(a[s].x, b[s].x, n * a[s].dim * sizeof(float)) != 0 ||
            memcmp(a[s].y, b[s].y, n * sizeof(int32_t)) != 0)
            ck_abort_msg("split %d: seed 7 made different data twice", s);
        if (memcmp(a[s].x, c[s].x, n * a[s].dim * sizeof(float)) == 0 ||
            memcmp(a[s].y, c[s].y, n * sizeof(int32_t)) == 0)
            ck_abort_msg("split %d: seeds 7 and 8 made the same data", s);
    }
    for (int s = 0; s < 2; s++) {
        fl_dataset_free(&a[s]);
        fl_dataset_free(&b[s]);
        fl_dataset_free(&c[s]);
    }
}
END_TEST

/* The generator's output is pinned: a change to it (or a platform that computes it
 * differently) must be noticed, since every rank of a job relies on making the same data. */
START_TEST(test_builtin_pinned)
{
    fl_dataset_t tr;
    fl_dataset_t te;
    ck_assert_int_eq(fl_data_builtin(1, &tr, &te), FL_OK);
    uint64_t htr = checksum(&tr, 1000);
    uint64_t hte = checksum(&te, 1000);
    ck_assert_msg(htr == 0xff1e44ee714b0444ull, "train checksum 0x%016llx",
                  (unsigned long long)htr);
    ck_assert_msg(hte == 0xc15e1e11a770172eull, "test checksum 0x%016llx", (unsigned long long)hte);
    fl_dataset_free(&tr);
    fl_dataset_free(&te);
}
END_TEST

/* ---- IDX ---- */

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Writes an IDX file: magic, ndims counts, then len bytes of data; gzipped when gz. */
static void write_idx(const char *path, bool gz, uint32_t magic, const uint32_t *dims, int ndims,
                      const void *data, size_t len)
{
    unsigned char h[16];
    put_be32(h, magic);
    for (int i = 0; i < ndims; i++)
        put_be32(h + 4 + 4 * i, dims[i]);
    size_t hlen = 4 + 4 * (size_t)ndims;
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(gzwrite(f, h, (unsigned)hlen), (int)hlen);
        if (len > 0)
            ck_assert_int_eq(gzwrite(f, data, (unsigned)len), (int)len);
        ck_assert_int_eq(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(fwrite(h, 1, hlen, f), hlen);
        if (len > 0)
            ck_assert_uint_eq(fwrite(data, 1, len, f), len);
        ck_assert_int_eq(fclose(f), 0);
    }
}

/* Five 3 x 4 images: pixel k of image i is (i * 12 + k) * 4 + 3, then 0 and 255 at the end. */
enum { NIMG = 5, ROWS = 3, COLS = 4 };
static unsigned char pixels[NIMG * ROWS * COLS];
static const unsigned char labels[NIMG] = {0, 3, 1, 2, 0};

static void write_pair(const char *img, const char *lab, bool gz_img, bool gz_lab)
{
    for (size_t i = 0; i < sizeof pixels; i++)
        pixels[i] = (unsigned char)(i * 4 + 3);
    pixels[sizeof pixels - 2] = 0;
    pixels[sizeof pixels - 1] = 255;
    const uint32_t di[3] = {NIMG, ROWS, COLS};
    const uint32_t dl[1] = {NIMG};
    write_idx(img, gz_img, 0x803, di, 3, pixels, sizeof pixels);
    write_idx(lab, gz_lab, 0x801, dl, 1, labels, sizeof labels);
}

static void check_pair(const fl_dataset_t *d, const char *img)
{
    ck_assert_uint_eq(d->n, NIMG);
    ck_assert_uint_eq(d->dim, ROWS * COLS);
    ck_assert_int_eq(d->classes, 4);
    ck_assert_str_eq(d->source, img);
    for (size_t i = 0; i < sizeof pixels; i++)
        if (d->x[i] != (float)pixels[i] / 255.0f)
            ck_abort_msg("pixel %zu is %g, expected %d / 255", i, (double)d->x[i], pixels[i]);
    ck_assert_float_eq(d->x[sizeof pixels - 1], 1.0f);
    ck_assert_float_eq(d->x[sizeof pixels - 2], 0.0f);
    for (size_t i = 0; i < NIMG; i++)
        if (d->y[i] != labels[i])
            ck_abort_msg("label %zu is %d, expected %d", i, (int)d->y[i], labels[i]);
}

START_TEST(test_idx_load)
{
    char img[512];
    char lab[512];
    char imgz[512];
    char labz[512];
    path_in(img, sizeof img, "img");
    path_in(lab, sizeof lab, "lab");
    path_in(imgz, sizeof imgz, "img.gz");
    path_in(labz, sizeof labz, "lab.gz");
    write_pair(img, lab, false, false);
    write_pair(imgz, labz, true, true);
    fl_dataset_t d;
    ck_assert_int_eq(fl_data_idx(img, lab, &d), FL_OK);
    check_pair(&d, img);
    fl_dataset_free(&d);
    ck_assert_int_eq(fl_data_idx(imgz, labz, &d), FL_OK);
    check_pair(&d, imgz);
    fl_dataset_free(&d);
    ck_assert_int_eq(fl_data_idx(img, labz, &d), FL_OK);
    check_pair(&d, img);
    fl_dataset_free(&d);
}
END_TEST

/* Expects rc from loading (img, lab), and a detail naming `file` and containing each of the
 * NULL-terminated fragments. */
static void expect_refusal(int rc, int want, const char *file, const char *const *frags)
{
    const char *e = fl_last_error();
    if (rc != want)
        ck_abort_msg("got %s, expected %s: %s", fl_strerror(rc), fl_strerror(want), e);
    if (strstr(e, file) == NULL)
        ck_abort_msg("detail \"%s\" does not name %s", e, file);
    for (int i = 0; frags[i] != NULL; i++)
        if (strstr(e, frags[i]) == NULL)
            ck_abort_msg("detail \"%s\" does not say \"%s\"", e, frags[i]);
}

START_TEST(test_idx_refusals)
{
    char img[512];
    char lab[512];
    char labz[512];
    path_in(img, sizeof img, "img");
    path_in(lab, sizeof lab, "lab");
    path_in(labz, sizeof labz, "lab.gz");
    const uint32_t di[3] = {NIMG, ROWS, COLS};
    const uint32_t dl[1] = {NIMG};
    fl_dataset_t d;

    write_pair(img, lab, false, false);
    ck_assert_int_eq(unlink(lab), 0);
    expect_refusal(fl_data_idx(img, lab, &d), FL_EIO, lab,
                   (const char *const[]){"cannot open", "No such file", NULL});
    ck_assert_ptr_null(d.x);

    /* A label file where the images should be, and the other way round. */
    write_pair(img, lab, false, false);
    expect_refusal(fl_data_idx(lab, img, &d), FL_EPROTO, lab,
                   (const char *const[]){"wrong magic 0x00000801", "expected 0x00000803", NULL});
    write_idx(lab, false, 0x803, di, 1, labels, sizeof labels);
    expect_refusal(fl_data_idx(img, lab, &d), FL_EPROTO, lab,
                   (const char *const[]){"wrong magic 0x00000803", "expected 0x00000801", NULL});

    /* Truncated data, header and gzip stream. */
    write_pair(img, lab, false, false);
    write_idx(img, false, 0x803, di, 3, pixels, sizeof pixels - 7);
    expect_refusal(fl_data_idx(img, lab, &d), FL_EPROTO, img,
                   (const char *const[]){"truncated", "expected 76 bytes", "has 69", NULL});
    write_idx(lab, false, 0x801, dl, 1, labels, 2);
    expect_refusal(fl_data_idx(img, lab, &d), FL_EPROTO, lab,
                   (const char *const[]){"truncated", "expected 13 bytes", "has 10", NULL});
    write_idx(lab, false, 0x801, dl, 0, NULL, 0);
    expect_refusal(fl_data_idx(img, lab, &d), FL_EPROTO, lab,
                   (const char *const[]){"truncated header", "expected 8 bytes", "has 4", NULL});
    write_pair(img, labz, false, true);
    FILE *f = fopen(labz, "r+b");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(ftruncate(fileno(f), 16), 0);
    fclose(f);
    int rc = fl_data_idx(img, labz, &d);
    expect_refusal(rc, FL_EPROTO, labz, (const char *const[]){NULL});

    /* Counts that disagree, shapes no one would mean, labels that make no classifier. */
    write_pair(img, lab, false, false);
    const uint32_t dl4[1] = {NIMG - 1};
    write_idx(lab, false, 0x801, dl4, 1, labels, NIMG - 1);
    expect_refusal(fl_data_idx(img, lab, &d), FL_EPROTO, img,
                   (const char *const[]){"5 images", "4 labels", lab, NULL});
    const uint32_t huge[3] = {NIMG, 100000, 100000};
    write_idx(img, false, 0x803, huge, 3, pixels, sizeof pixels);
    expect_refusal(fl_data_idx(img, lab, &d), FL_EPROTO, img,
                   (const char *const[]){"implausible shape [5, 100000, 100000]", NULL});
    const uint32_t zero[3] = {0, ROWS, COLS};
    write_idx(img, false, 0x803, zero, 3, NULL, 0);
    expect_refusal(fl_data_idx(img, lab, &d), FL_EPROTO, img,
                   (const char *const[]){"implausible shape [0, 3, 4]", NULL});
    const unsigned char zeros[NIMG] = {0};
    write_pair(img, lab, false, false);
    write_idx(lab, false, 0x801, dl, 1, zeros, sizeof zeros);
    expect_refusal(fl_data_idx(img, lab, &d), FL_EPROTO, lab,
                   (const char *const[]){"at least 2 classes", NULL});

    /* A header promising 10^8 samples costs an error, not the memory it promises. */
    const uint32_t lie_i[3] = {100000000, 28, 28};
    const uint32_t lie_l[1] = {100000000};
    write_idx(img, false, 0x803, lie_i, 3, pixels, sizeof pixels);
    write_idx(lab, false, 0x801, lie_l, 1, labels, sizeof labels);
    expect_refusal(fl_data_idx(img, lab, &d), FL_EPROTO, lab,
                   (const char *const[]){"truncated", NULL});
    ck_assert_ptr_null(d.x);
    ck_assert_ptr_null(d.y);
}
END_TEST

/* A label the model has no output for is named against the labels file, with its index and
 * value (not against the images as a number of classes), in the training and the test split. */
START_TEST(test_idx_label_out_of_range)
{
    char img[512];
    char lab[512];
    char labz[512];
    path_in(img, sizeof img, "img");
    path_in(lab, sizeof lab, "lab");
    path_in(labz, sizeof labz, "lab.gz");
    write_pair(img, lab, false, false); /* labels 0, 3, 1, 2, 0 */
    fl_dataset_t d;
    ck_assert_int_eq(fl_data_idx(img, lab, &d), FL_OK);
    fl_mlp_shape_t m;
    ck_assert_int_eq(fl_mlp_parse("12,8,3", &m), FL_OK);
    int rc = fl_wk_check_model(&m, &d, NULL);
    expect_refusal(rc, FL_EINVAL, lab,
                   (const char *const[]){"label 3 at index 1", "out of range 0..2", "3 outputs",
                                         NULL});
    ck_assert_msg(strstr(fl_last_error(), img) == NULL, "names the images: %s", fl_last_error());
    ck_assert_int_eq(fl_mlp_parse("12,8,4", &m), FL_OK);
    ck_assert_int_eq(fl_wk_check_model(&m, &d, NULL), FL_OK);

    const unsigned char test_labels[NIMG] = {0, 1, 2, 0, 7};
    const uint32_t dl[1] = {NIMG};
    write_idx(labz, true, 0x801, dl, 1, test_labels, sizeof test_labels);
    fl_dataset_t t;
    ck_assert_int_eq(fl_data_idx(img, labz, &t), FL_OK);
    expect_refusal(fl_wk_check_model(&m, &d, &t), FL_EINVAL, labz,
                   (const char *const[]){"label 7 at index 4", "out of range 0..3", NULL});
    fl_dataset_free(&t);
    fl_dataset_free(&d);
}
END_TEST

/* ---- CSV ---- */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fputs(text, f) >= 0, 1);
    ck_assert_int_eq(fclose(f), 0);
}

START_TEST(test_csv_load)
{
    char p[512];
    path_in(p, sizeof p, "data.csv");
    static const char *const files[] = {
        "label,a,b\n1,0.5,-2\n0,1e-3,3\n4, 4 ,5.25\n\n\n",
        "1,0.5,-2\r\n0,0.001,3\r\n4,4,5.25",
    };
    const float want_x[] = {0.5f, -2.0f, 1e-3f, 3.0f, 4.0f, 5.25f};
    const int32_t want_y[] = {1, 0, 4};
    for (size_t k = 0; k < NELEM(files); k++) {
        write_text(p, files[k]);
        fl_dataset_t d;
        int rc = fl_data_csv(p, &d);
        if (rc != FL_OK)
            ck_abort_msg("file %zu: %s", k, fl_last_error());
        if (d.n != 3 || d.dim != 2 || d.classes != 5 || strcmp(d.source, p) != 0)
            ck_abort_msg("file %zu: n %zu dim %zu classes %d source %s", k, d.n, d.dim, d.classes,
                         d.source);
        for (size_t i = 0; i < NELEM(want_x); i++)
            if (d.x[i] != want_x[i])
                ck_abort_msg("file %zu: x[%zu] is %g", k, i, (double)d.x[i]);
        for (size_t i = 0; i < NELEM(want_y); i++)
            if (d.y[i] != want_y[i])
                ck_abort_msg("file %zu: y[%zu] is %d", k, i, (int)d.y[i]);
        fl_dataset_free(&d);
    }
}
END_TEST

START_TEST(test_csv_refusals)
{
    char p[512];
    path_in(p, sizeof p, "data.csv");
    static const struct {
        const char *text;
        const char *says;
    } cases[] = {
        {"0,1,2\n1,x,3\n", "line 2 column 2: \"x\" is not a number"},
        {"0,1,2\n1,2e,3\n", "line 2 column 2: \"2e\" is not a number"},
        {"0,1,2\n1,2\n", "line 2 has 2 columns, earlier lines have 3"},
        {"0,1,2\n1,2,3,4\n", "line 2 has 4 columns, earlier lines have 3"},
        {"0,1\n-1,2\n", "line 2 column 1: label -1 is negative"},
        {"0,1\n1.5,2\n", "line 2 column 1: label 1.5 is not an integer"},
        {"0,1\nlabel,2\n", "line 2 column 1: label \"label\" is not a number"},
        {"0,1\n70000,2\n", "line 2 column 1: label 70000 is above the limit"},
        {"label,x\n", "no data rows"},
        {"", "no data rows"},
        {"\n\n", "no data rows"},
        {"0,1,2\n0,1,2\n1,2,nan\n", "line 3 column 3 is nan"},
        {"0,1,2\n1,-inf,2\n", "line 2 column 2 is infinite"},
        {"0,1,2\n1,1e39,2\n", "line 2 column 2: 1e39 is out of float range"},
        {"0,1,2\n1,,2\n", "line 2 column 2 is empty"},
        {"0,1\n\n1,2\n", "line 2 is blank"},
        {"a,b\n3\n", "line 2 has a label and no features"},
    };
    for (size_t k = 0; k < NELEM(cases); k++) {
        write_text(p, cases[k].text);
        fl_dataset_t d;
        int rc = fl_data_csv(p, &d);
        const char *e = fl_last_error();
        if (rc != FL_EPROTO || strstr(e, p) == NULL || strstr(e, cases[k].says) == NULL)
            ck_abort_msg("case %zu: got %s \"%s\", expected FL_EPROTO \"%s: ... %s\"", k,
                         fl_strerror(rc), e, p, cases[k].says);
        if (d.x != NULL || d.y != NULL || d.n != 0)
            ck_abort_msg("case %zu: the refused dataset is not empty", k);
    }
    ck_assert_int_eq(unlink(p), 0);
    fl_dataset_t d;
    expect_refusal(fl_data_csv(p, &d), FL_EIO, p,
                   (const char *const[]){"cannot open", "No such file", NULL});
}
END_TEST

/* ---- sampler ---- */

static bool is_permutation(const uint32_t *perm, size_t n)
{
    bool *seen = calloc(n ? n : 1, 1);
    ck_assert_ptr_nonnull(seen);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        ok = perm[i] < n && !seen[perm[i]];
        if (ok)
            seen[perm[i]] = true;
    }
    free(seen);
    return ok;
}

/* Every rank of (n, world, batch) over two epochs: the batches of all ranks are disjoint and
 * together exactly the first world * batch * nb positions of the shared permutation. */
static void check_partition(size_t n, int world, size_t batch, bool shuffle)
{
    fl_sampler_t *s = calloc((size_t)world, sizeof *s);
    ck_assert_ptr_nonnull(s);
    for (int r = 0; r < world; r++)
        ck_assert_int_eq(fl_sampler_init(&s[r], n, world, r, batch, shuffle, 42), FL_OK);
    size_t nb = fl_sampler_batches(&s[0]);
    if (nb != (n / (size_t)world) / batch)
        ck_abort_msg("n %zu world %d batch %zu: %zu batches", n, world, batch, nb);
    size_t used = (size_t)world * batch * nb;
    uint32_t *idx = malloc(batch * sizeof *idx);
    unsigned char *seen = malloc(n);
    ck_assert_ptr_nonnull(idx);
    ck_assert_ptr_nonnull(seen);
    for (long epoch = 0; epoch < 2; epoch++) {
        memset(seen, 0, n);
        for (int r = 0; r < world; r++) {
            fl_sampler_set_epoch(&s[r], epoch);
            if (fl_sampler_batches(&s[r]) != nb ||
                memcmp(s[r].perm, s[0].perm, n * sizeof *s[0].perm) != 0)
                ck_abort_msg("n %zu world %d: rank %d disagrees with rank 0", n, world, r);
        }
        if (!is_permutation(s[0].perm, n))
            ck_abort_msg("n %zu world %d epoch %ld: not a permutation", n, world, epoch);
        for (size_t i = 0; i < nb; i++) {
            for (int r = 0; r < world; r++) {
                fl_sampler_batch(&s[r], i, idx);
                for (size_t t = 0; t < batch; t++) {
                    if (idx[t] >= n || seen[idx[t]])
                        ck_abort_msg("n %zu world %d: sample %u twice", n, world, idx[t]);
                    seen[idx[t]] = 1;
                    /* Without shuffle batch i of all ranks is [i W b, (i + 1) W b). */
                    size_t lo = i * (size_t)world * batch;
                    if (!shuffle && (idx[t] < lo || idx[t] >= lo + (size_t)world * batch))
                        ck_abort_msg("batch %zu of rank %d holds sample %u", i, r, idx[t]);
                }
            }
        }
        for (size_t k = 0; k < n; k++)
            if (seen[s[0].perm[k]] != (k < used))
                ck_abort_msg("n %zu world %d: position %zu of the permutation %s", n, world, k,
                             k < used ? "unused" : "used past the last batch");
    }
    free(seen);
    free(idx);
    for (int r = 0; r < world; r++)
        fl_sampler_deinit(&s[r]);
    free(s);
}

START_TEST(test_sampler_partition)
{
    check_partition(100, 1, 10, false);
    check_partition(100, 1, 7, true);
    check_partition(1000, 4, 32, true);
    check_partition(1000, 4, 32, false);
    check_partition(1003, 3, 5, true);
    check_partition(1003, 3, 5, false);
    check_partition(37, 5, 7, true);
    check_partition(60000, 8, 64, true);
}
END_TEST

START_TEST(test_sampler_epochs)
{
    const size_t n = 5000;
    fl_sampler_t a;
    fl_sampler_t b;
    ck_assert_int_eq(fl_sampler_init(&a, n, 2, 0, 16, true, 9), FL_OK);
    ck_assert_int_eq(fl_sampler_init(&b, n, 2, 1, 16, true, 9), FL_OK);
    uint32_t *e0 = malloc(n * sizeof *e0);
    ck_assert_ptr_nonnull(e0);
    memcpy(e0, a.perm, n * sizeof *e0);
    fl_sampler_set_epoch(&a, 1);
    ck_assert_int_ne(memcmp(e0, a.perm, n * sizeof *e0), 0);
    ck_assert(is_permutation(a.perm, n));
    /* A function of (seed, epoch) only: going back, or asking another rank, gives the same. */
    fl_sampler_set_epoch(&b, 5);
    fl_sampler_set_epoch(&b, 0);
    ck_assert_int_eq(memcmp(e0, b.perm, n * sizeof *e0), 0);
    fl_sampler_set_epoch(&a, 0);
    ck_assert_int_eq(memcmp(e0, a.perm, n * sizeof *e0), 0);
    /* It is shuffled, and another seed shuffles otherwise. */
    size_t fixed = 0;
    for (size_t i = 0; i < n; i++)
        fixed += a.perm[i] == i;
    ck_assert_uint_lt(fixed, 20);
    fl_sampler_deinit(&b);
    ck_assert_int_eq(fl_sampler_init(&b, n, 2, 1, 16, true, 10), FL_OK);
    ck_assert_int_ne(memcmp(e0, b.perm, n * sizeof *e0), 0);
    fl_sampler_deinit(&b);
    /* Without shuffle every epoch is the identity. */
    ck_assert_int_eq(fl_sampler_init(&b, n, 2, 1, 16, false, 9), FL_OK);
    fl_sampler_set_epoch(&b, 3);
    for (size_t i = 0; i < n; i++)
        if (b.perm[i] != i)
            ck_abort_msg("unshuffled perm[%zu] is %u", i, b.perm[i]);
    fl_sampler_deinit(&b);
    fl_sampler_deinit(&a);
    fl_sampler_deinit(&a);
    free(e0);
}
END_TEST

START_TEST(test_sampler_refusals)
{
    static const struct {
        size_t n;
        int world;
        int rank;
        size_t batch;
        const char *says;
    } cases[] = {
        {100, 0, 0, 10, "world size 0"},
        {100, 4, -1, 10, "rank -1 is out of range for 4 ranks"},
        {100, 4, 4, 10, "rank 4 is out of range for 4 ranks"},
        {100, 4, 0, 0, "batch size 0"},
        {1600, 4, 3, 512,
         "batch size 512 is larger than rank 3's share of 400 samples (1600 samples, 4 ranks)"},
        {3, 4, 0, 1, "batch size 1 is larger than rank 0's share of 0 samples"},
        {0, 1, 0, 1, "batch size 1 is larger than rank 0's share of 0 samples"},
    };
    for (size_t k = 0; k < NELEM(cases); k++) {
        fl_sampler_t s;
        int rc =
            fl_sampler_init(&s, cases[k].n, cases[k].world, cases[k].rank, cases[k].batch, true, 1);
        const char *e = fl_last_error();
        if (rc != FL_EINVAL || strstr(e, cases[k].says) == NULL || s.perm != NULL)
            ck_abort_msg("case %zu: got %s \"%s\", expected FL_EINVAL \"%s\"", k, fl_strerror(rc),
                         e, cases[k].says);
        fl_sampler_deinit(&s);
    }
    /* The largest batch that fits is accepted: one batch per epoch. */
    fl_sampler_t s;
    ck_assert_int_eq(fl_sampler_init(&s, 1600, 4, 3, 400, true, 1), FL_OK);
    ck_assert_uint_eq(fl_sampler_batches(&s), 1);
    fl_sampler_deinit(&s);
}
END_TEST

static Suite *wk_data_suite(void)
{
    Suite *s = suite_create("wk_data");
    TCase *t = tcase_create("builtin");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_builtin_shape);
    tcase_add_test(t, test_builtin_deterministic);
    tcase_add_test(t, test_builtin_pinned);
    suite_add_tcase(s, t);

    t = tcase_create("files");
    tcase_set_timeout(t, 30);
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, test_idx_load);
    tcase_add_test(t, test_idx_refusals);
    tcase_add_test(t, test_idx_label_out_of_range);
    tcase_add_test(t, test_csv_load);
    tcase_add_test(t, test_csv_refusals);
    suite_add_tcase(s, t);

    t = tcase_create("sampler");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_sampler_partition);
    tcase_add_test(t, test_sampler_epochs);
    tcase_add_test(t, test_sampler_refusals);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(wk_data_suite());
}
