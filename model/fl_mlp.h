/* model: a multilayer perceptron on the device layer (mlp.c on the host, mlp_dev.c on any
 * device) and its parameters on disk (mlp_io.c). Knows nothing of datasets or the exchange. */
#ifndef FL_MLP_H
#define FL_MLP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fl_core.h"
#include "fl_dev.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the model: a multilayer perceptron (mlp.c on the CPU) ---- */

#define FL_MLP_MAX_LAYERS 16

typedef struct fl_mlp_shape {
    int nlayers;                      /* linear layers */
    int sizes[FL_MLP_MAX_LAYERS + 1]; /* sizes[0] inputs ... sizes[nlayers] classes */
} fl_mlp_shape_t;

/* Parses "784,512,256,10" (2 to 17 positive sizes). FL_OK or FL_EINVAL naming the problem. */
int fl_mlp_parse(const char *s, fl_mlp_shape_t *out);

/* Parameters in one flat buffer, PyTorch's order and layout: layer 0 weight [out, in]
 * row-major, layer 0 bias [out], layer 1 weight, ... */
size_t fl_mlp_nparams(const fl_mlp_shape_t *m);
size_t fl_mlp_weight_at(const fl_mlp_shape_t *m, int layer);
size_t fl_mlp_bias_at(const fl_mlp_shape_t *m, int layer);

/* A 64-bit signature of the layer sizes, which checkpoint manifests record (--resume refuses
 * another model's). The rendezvous compares fl_mlp_shapes' signature instead, which the
 * parameter server also computes from its --init file. */
uint64_t fl_mlp_signature(const fl_mlp_shape_t *m);

/* PyTorch's nn.Linear default: weight and bias uniform in [-1/sqrt(in), 1/sqrt(in)], from a
 * seeded generator (the same numbers on every machine for a seed). */
void fl_mlp_init(const fl_mlp_shape_t *m, float *params, uint64_t seed);

/* Activations and scratch for batches of up to `batch` samples. */
typedef struct fl_mlp_ws fl_mlp_ws_t;
int fl_mlp_ws_create(const fl_mlp_shape_t *m, size_t batch, fl_mlp_ws_t **out);
void fl_mlp_ws_destroy(fl_mlp_ws_t **ws);

/* Called during the backward pass when the gradient of layer `layer` (weight and bias) is
 * complete; layers finish last first. */
typedef void (*fl_mlp_layer_done_fn)(int layer, void *ud);

/* Forward and backward of b samples (x: b rows of sizes[0]; y: labels): mean softmax
 * cross-entropy in *loss, correct predictions in *correct, d loss / d params into grad (all n
 * parameters written). done may be NULL. FL_OK, FL_EINVAL (b above the workspace, label out of
 * range), FL_ENONFINITE (a non-finite loss: the detail says so). */
int fl_mlp_grad(const fl_mlp_shape_t *m, fl_mlp_ws_t *ws, const float *params, const float *x,
                const int32_t *y, size_t b, float *grad, double *loss, size_t *correct,
                fl_mlp_layer_done_fn done, void *ud);

/* Where the layers' parameters come from when they are not in one flat buffer (--shard full:
 * each layer gathered from its shards when needed). get sets *w to layer's weight with its bias
 * right after (as in the flat buffer) and returns FL_OK, or returns why it cannot (the detail in
 * fl_last_error); put says the layer is no longer needed. The forward pass gets layers 0..n-1 and
 * puts each after use but the last; the backward pass puts n-1, then gets and puts n-2..1 (layer
 * 0's weight gradient needs no weight). */
typedef struct fl_mlp_src {
    int (*get)(void *ud, int layer, const float **w);
    void (*put)(void *ud, int layer);
    void *ud;
} fl_mlp_src_t;

/* fl_mlp_grad with the parameters from src. A failed get: its error, the layer named. */
int fl_mlp_grad_src(const fl_mlp_shape_t *m, fl_mlp_ws_t *ws, const fl_mlp_src_t *src,
                    const float *x, const int32_t *y, size_t b, float *grad, double *loss,
                    size_t *correct, fl_mlp_layer_done_fn done, void *ud);

/* Forward only, in batches of the workspace's size: mean loss and correct predictions over n
 * samples. Works on a workspace of any device (the parameters and samples are copied in). */
int fl_mlp_eval(const fl_mlp_shape_t *m, fl_mlp_ws_t *ws, const float *params, const float *x,
                const int32_t *y, size_t n, double *loss, size_t *correct);

/* ---- the model on a device (mlp_dev.c) ---- */

/* A workspace on device dev, with its own stream (the device's compute stream): the host entry
 * points above use a workspace made by fl_mlp_ws_create, on a cpu device of its own. */
int fl_mlp_ws_create_on(fl_dev_t *dev, const fl_mlp_shape_t *m, size_t batch, fl_mlp_ws_t **out);
fl_dev_t *fl_mlp_ws_dev(const fl_mlp_ws_t *ws);
fl_stream_t *fl_mlp_ws_stream(const fl_mlp_ws_t *ws);

/* FL_EINVAL naming the first label outside 0..classes-1 (checked on the host before a batch
 * goes to a device). */
int fl_mlp_check_labels(const fl_mlp_shape_t *m, const int32_t *y, size_t b);

/* Layers on the device when they are not in one flat buffer: as fl_mlp_src_t, with device
 * addresses valid until put. */
typedef struct fl_mlp_dsrc {
    int (*get)(void *ud, int layer, fl_dptr_t *w);
    void (*put)(void *ud, int layer);
    void *ud;
} fl_mlp_dsrc_t;

/* Queues forward and backward of b samples (x, y: device addresses; labels checked) on the
 * workspace's stream, gradients into grad; parameters from params, or from src when src is not
 * NULL. done(l) is called once layer l's gradient is queued (the caller records an event there
 * to know when it is computed). Nothing is waited for: fl_mlp_dresult reads the results.
 * FL_OK, FL_EINVAL (b above the workspace), a source's error, a device's error. */
int fl_mlp_dgrad(const fl_mlp_shape_t *m, fl_mlp_ws_t *ws, fl_dptr_t params,
                 const fl_mlp_dsrc_t *src, fl_dptr_t x, fl_dptr_t y, size_t b, fl_dptr_t grad,
                 fl_mlp_layer_done_fn done, void *ud);

/* fl_mlp_dgrad with the layers from a host source (--shard full's gathers): each layer is
 * copied in (wrapped on cpu) and the copy waited for before the source hears put. */
int fl_mlp_dgrad_hsrc(const fl_mlp_shape_t *m, fl_mlp_ws_t *ws, const fl_mlp_src_t *src,
                      fl_dptr_t x, fl_dptr_t y, size_t b, fl_dptr_t grad, fl_mlp_layer_done_fn done,
                      void *ud);

/* Waits for the last pass of b samples: mean loss and correct predictions. FL_ENONFINITE for a
 * diverged loss, or the stream's error. */
int fl_mlp_dresult(fl_mlp_ws_t *ws, size_t b, double *loss, size_t *correct);

/* fl_mlp_eval with the parameters already on the device (the samples are host memory). */
int fl_mlp_deval(const fl_mlp_shape_t *m, fl_mlp_ws_t *ws, fl_dptr_t params, const float *x,
                 const int32_t *y, size_t n, double *loss, size_t *correct);

/* ---- parameters on disk (model_io.c): safetensors, PyTorch's names ---- */

/* Writes layers.<i>.weight [out, in] and layers.<i>.bias [out] (float32) plus metadata (may be
 * NULL/0), atomically. FL_OK, FL_EIO naming the path. */
int fl_mlp_save(const fl_mlp_shape_t *m, const float *params, const char *path,
                const fl_st_meta_t *meta, size_t nmeta);

/* Appends the model's tensors as fl_mlp_save names and shapes them, in the flat vector's
 * order, to out (fl_model_shapes_signature of its text: the model signature of the
 * rendezvous). FL_OK or FL_ENOMEM. */
int fl_mlp_shapes(const fl_mlp_shape_t *m, fl_model_shapes_t *out);

/* Loads parameters saved by fl_mlp_save or by PyTorch (safetensors.torch.save_file of an
 * nn.Sequential-like state dict renamed to layers.<i>.*). Every tensor must be there with the
 * right shape and dtype float32: FL_EINVAL naming the tensor and both shapes when the model
 * differs; FL_EPROTO / FL_EIO for a bad file. */
int fl_mlp_load(const fl_mlp_shape_t *m, float *params, const char *path);

#ifdef __cplusplus
}
#endif
#endif
