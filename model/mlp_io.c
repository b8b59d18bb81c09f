/* The model's parameters on disk: safetensors with PyTorch's names (layers.<i>.weight [out, in],
 * layers.<i>.bias [out], float32), so a PyTorch user loads them as they are, and a file whose
 * tensors do not fit the model is refused naming the tensor and both shapes; the same tensors
 * described for the rendezvous, where flodl-ps --init's are checked against them. */
#include "fl_mlp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The model's tensors in the flat vector's order, with PyTorch's names (into names) and
 * shapes; their data from params (NULL: none). */
static void tensors(const fl_mlp_shape_t *m, const float *params, fl_st_tensor_t *t,
                    char (*names)[32])
{
    for (int l = 0; l < m->nlayers; l++) {
        size_t out = (size_t)m->sizes[l + 1];
        size_t in = (size_t)m->sizes[l];
        snprintf(names[2 * l], sizeof names[0], "layers.%d.weight", l);
        snprintf(names[2 * l + 1], sizeof names[0], "layers.%d.bias", l);
        t[2 * l] = (fl_st_tensor_t){names[2 * l],
                                    FL_FLOAT32,
                                    2,
                                    {out, in},
                                    params ? params + fl_mlp_weight_at(m, l) : NULL,
                                    out * in * sizeof(float)};
        t[2 * l + 1] = (fl_st_tensor_t){
            names[2 * l + 1],   FL_FLOAT32, 1, {out}, params ? params + fl_mlp_bias_at(m, l) : NULL,
            out * sizeof(float)};
    }
}

int fl_mlp_save(const fl_mlp_shape_t *m, const float *params, const char *path,
                const fl_st_meta_t *meta, size_t nmeta)
{
    fl_st_tensor_t t[2 * FL_MLP_MAX_LAYERS];
    char names[2 * FL_MLP_MAX_LAYERS][32];
    tensors(m, params, t, names);
    return fl_st_write(path, t, (size_t)(2 * m->nlayers), meta, nmeta);
}

int fl_mlp_shapes(const fl_mlp_shape_t *m, fl_model_shapes_t *out)
{
    fl_st_tensor_t t[2 * FL_MLP_MAX_LAYERS];
    char names[2 * FL_MLP_MAX_LAYERS][32];
    tensors(m, NULL, t, names);
    int rc = FL_OK;
    for (int i = 0; i < 2 * m->nlayers && rc == FL_OK; i++)
        rc = fl_model_shapes_add(out, t[i].name, t[i].ndim, t[i].shape);
    return rc;
}

static int take(const fl_st_file_t *f, const char *path, const char *name, size_t ndim,
                const uint64_t *shape, float *dst)
{
    const fl_st_tensor_t *t = fl_st_find(f, name);
    if (t == NULL)
        return fl_fail(FL_EINVAL, "%s: no tensor '%s', which the model expects (%zu-d float32)",
                       path, name, ndim);
    if (t->dtype != FL_FLOAT32)
        return fl_fail(FL_EINVAL, "%s: tensor '%s' is %s, the model needs float32", path, name,
                       fl_dtype_name(t->dtype));
    bool same = t->ndim == ndim;
    for (size_t d = 0; same && d < ndim; d++)
        same = t->shape[d] == shape[d];
    if (!same) {
        char got[96] = "";
        size_t n = 0;
        for (size_t d = 0; d < t->ndim && n + 24 < sizeof got; d++)
            n += (size_t)snprintf(got + n, sizeof got - n, "%s%llu", d ? "," : "",
                                  (unsigned long long)t->shape[d]);
        return fl_fail(FL_EINVAL, "%s: tensor '%s' has shape [%s], the model needs [%llu%s%llu]",
                       path, name, got, (unsigned long long)shape[0], ndim > 1 ? "," : "",
                       ndim > 1 ? (unsigned long long)shape[1] : 0ULL);
    }
    memcpy(dst, t->data, t->bytes);
    /* A NaN or Inf would train (every step NaN) and be saved again: refused here, naming it. */
    const float *v = dst;
    for (size_t i = 0; i < t->bytes / sizeof(float); i++)
        if (!fl_is_finite(v[i]))
            return fl_fail(FL_EINVAL, "%s: tensor '%s' holds %s at index %zu", path, name,
                           v[i] != v[i] ? "NaN" : "Inf", i);
    return FL_OK;
}

/* A name "<prefix><k>.weight": k, and the prefix's length; false for other names. */
static bool seq_weight(const char *name, long *k, size_t *prefix)
{
    size_t n = strlen(name);
    static const char tail[] = ".weight";
    if (n <= sizeof tail - 1 || strcmp(name + n - (sizeof tail - 1), tail) != 0)
        return false;
    size_t end = n - (sizeof tail - 1);
    size_t start = end;
    while (start > 0 && name[start - 1] >= '0' && name[start - 1] <= '9')
        start--;
    if (start == end || end - start > 6 || (start > 0 && name[start - 1] != '.'))
        return false;
    *k = strtol(name + start, NULL, 10);
    *prefix = start;
    return true;
}

/* The file's names for the model's tensors: flodl's (layers.<i>.weight/bias), or, when the
 * file has none of those, an nn.Sequential's state dict (<k>.weight/bias, possibly under a
 * prefix such as "net."), its Linear modules taken in the order of k (the ReLUs between them
 * have no tensors). FL_EINVAL saying which names were expected and what the file holds. */
static int file_names(const fl_st_file_t *f, const fl_mlp_shape_t *m, const char *path,
                      char (*w)[128], char (*b)[128])
{
    int L = m->nlayers;
    for (int l = 0; l < L; l++) {
        snprintf(w[l], sizeof w[l], "layers.%d.weight", l);
        snprintf(b[l], sizeof b[l], "layers.%d.bias", l);
    }
    if (fl_st_find(f, "layers.0.weight") != NULL)
        return FL_OK; /* flodl's own names: take() names any one that is missing */
    long ks[FL_MLP_MAX_LAYERS];
    int found = 0;
    size_t plen = 0;
    const char *prefix = NULL;
    for (size_t i = 0; i < fl_st_count(f); i++) {
        const char *name = fl_st_at(f, i)->name;
        long k;
        size_t p;
        if (!seq_weight(name, &k, &p))
            continue;
        if (prefix != NULL && (p != plen || strncmp(name, prefix, p) != 0))
            return fl_fail(FL_EINVAL,
                           "%s: weights under two prefixes ('%.*s' and '%.*s'): "
                           "expected layers.<i>.weight or one nn.Sequential's "
                           "<k>.weight",
                           path, (int)plen, prefix, (int)p, name);
        prefix = name;
        plen = p;
        if (found == L)
            return fl_fail(FL_EINVAL,
                           "%s: more than %d weight tensors for a model of %d linear "
                           "layers (--layers)",
                           path, L, L);
        int at = found++;
        while (at > 0 && ks[at - 1] > k) { /* insertion by module index */
            ks[at] = ks[at - 1];
            at--;
        }
        ks[at] = k;
    }
    if (found != L)
        return fl_fail(FL_EINVAL,
                       "%s: expected tensors layers.0.weight .. layers.%d.bias "
                       "(flodl's names) or an nn.Sequential's <k>.weight/<k>.bias "
                       "for %d linear layers; found %d such weights",
                       path, L - 1, L, found);
    for (int l = 0; l < L; l++) {
        snprintf(w[l], sizeof w[l], "%.*s%ld.weight", (int)plen, prefix, ks[l]);
        snprintf(b[l], sizeof b[l], "%.*s%ld.bias", (int)plen, prefix, ks[l]);
    }
    return FL_OK;
}

int fl_mlp_load(const fl_mlp_shape_t *m, float *params, const char *path)
{
    fl_st_file_t *f = NULL;
    int rc = fl_st_open(path, 0, &f);
    if (rc != FL_OK)
        return rc;
    char w[FL_MLP_MAX_LAYERS][128];
    char b[FL_MLP_MAX_LAYERS][128];
    rc = file_names(f, m, path, w, b);
    for (int l = 0; l < m->nlayers && rc == FL_OK; l++) {
        uint64_t ws[2] = {(uint64_t)m->sizes[l + 1], (uint64_t)m->sizes[l]};
        rc = take(f, path, w[l], 2, ws, params + fl_mlp_weight_at(m, l));
        if (rc == FL_OK)
            rc = take(f, path, b[l], 1, ws, params + fl_mlp_bias_at(m, l));
    }
    if (rc == FL_OK && fl_st_count(f) != (size_t)(2 * m->nlayers))
        rc = fl_fail(FL_EINVAL, "%s: %zu tensors, the model has %d layers (%d tensors)", path,
                     fl_st_count(f), m->nlayers, 2 * m->nlayers);
    fl_st_close(&f);
    return rc;
}
