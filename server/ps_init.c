/* A parameter server's --init file: float32 tensors whose data, in file order, is the flat
 * parameter vector; every value finite and at least one of them. Checked before the server
 * touches the network, so that a file the job could not start from is refused at once, naming
 * the tensor and the index (the shards would only find it after the rendezvous, and the ranks
 * would then wait for a restart that cannot help). The shards take their ranges from it, and
 * its tensors' names and shapes go to the coordinator, which checks them against the ranks'
 * model. */
#include "ps_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Fails naming the first NaN or Inf of a tensor that holds one. */
static int check_finite(const char *path, const fl_st_tensor_t *t)
{
    const float *v = t->data;
    size_t n = t->bytes / sizeof(float);
    if (n == 0 || fl_f32_max_abs_bits(v, n) < 0x7f800000u)
        return FL_OK;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return fl_fail(FL_EINVAL,
                           "--init %s: tensor '%s' holds %s at index %zu, expected "
                           "finite values",
                           path, t->name, isnan(v[i]) ? "NaN" : "Inf", i);
    return FL_OK;
}

int fl_ps__init_open(const char *path, fl_st_file_t **out, uint64_t *param_count)
{
    *out = NULL;
    *param_count = 0;
    fl_st_file_t *f = NULL;
    if (fl_st_open(path, 0, &f) != FL_OK) /* a file named by a flag: a configuration error */
        return fl_fail_ctx(FL_EINVAL, "--init");
    uint64_t n = 0;
    int rc = FL_OK;
    for (size_t i = 0; i < fl_st_count(f) && rc == FL_OK; i++) {
        const fl_st_tensor_t *t = fl_st_at(f, i);
        if (t->dtype != FL_FLOAT32)
            rc = fl_fail(FL_EINVAL,
                         "--init %s: tensor %s is %s; the parameter server holds "
                         "float32",
                         path, t->name, fl_st_dtype_name(t->dtype));
        else
            rc = check_finite(path, t);
        n += t->bytes / sizeof(float);
    }
    if (rc == FL_OK && n == 0)
        rc = fl_fail(FL_EINVAL, "--init %s holds no parameters", path);
    if (rc != FL_OK) {
        fl_st_close(&f);
        return rc;
    }
    *out = f;
    *param_count = n;
    return FL_OK;
}

int fl_ps__init_shapes(const fl_st_file_t *f, const char *path, uint64_t *signature, char *shapes,
                       size_t cap)
{
    fl_model_shapes_t m;
    fl_model_shapes_init(&m);
    int rc = FL_OK;
    for (size_t i = 0; i < fl_st_count(f) && rc == FL_OK; i++) {
        const fl_st_tensor_t *t = fl_st_at(f, i);
        rc = fl_model_shapes_add(&m, t->name, t->ndim, t->shape);
    }
    if (rc == FL_OK) {
        *signature = fl_model_shapes_signature(fl_model_shapes_text(&m));
        /* The file's name goes first, outside the signature, for the coordinator's texts. */
        size_t n = 0;
        if (strlen(path) < cap / 4 && strchr(path, ';') == NULL && strchr(path, '\n') == NULL)
            n = (size_t)snprintf(shapes, cap, "%s%s;", FL_PS_INIT_FILE_TAG, path);
        fl_model_shapes_cut(fl_model_shapes_text(&m), shapes + n, cap - n);
    }
    fl_model_shapes_deinit(&m);
    return rc;
}

int fl_ps_server_check_init(const char *path)
{
    fl_st_file_t *f = NULL;
    uint64_t n = 0;
    int rc = fl_ps__init_open(path, &f, &n);
    fl_st_close(&f);
    return rc;
}
