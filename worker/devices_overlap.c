/* The two-level exchange's first leg in host memory (CPU replicas, and devices whose layers
 * are copied out behind their events as the pass finishes them), overlapped with the
 * backward pass: every device tells each layer as its gradient lands (last layer first); the
 * last device to finish a layer makes the parameters from that layer's weights on ready for
 * every shard reaching there, and each shard's exchange thread reduces a bucket across the
 * devices (fl_wk_devices_reduce_range, the arithmetic of the barrier's reduction, so the same
 * bits) just before it sends it, while the devices compute the earlier layers. */
#include "devices_int.h"

void fl_wk_devices_set_overlap(fl_wk_devices_t *d, bool on)
{
    d->overlap = on && d->n > 1 && d->local == FL_WK_LOCAL_SHARDS && d->intra == NULL;
}

bool fl_wk_devices_overlapped(const fl_wk_devices_t *d)
{
    return d->overlap && !d->cadence;
}

void fl_wk_devices_layer_told(int layer, void *ud)
{
    replica_t *r = ud;
    fl_wk_devices_t *d = r->d;
    pthread_mutex_lock(&d->mu);
    /* Each device tells its layers in order, so when layer l's count is full every later
     * layer's is too: the ready range only grows downwards. */
    bool last = ++d->layer_told[layer] == d->n;
    pthread_mutex_unlock(&d->mu);
    if (!last || d->ready == NULL)
        return;
    size_t from = fl_wk_mlp_weight_at(d->m, layer);
    for (int j = 0; j < d->n; j++) {
        size_t off = fl_shard_offset(d->np, d->n, j);
        size_t cnt = fl_shard_count(d->np, d->n, j);
        if (cnt > 0 && off + cnt > from)
            d->ready(j, from > off ? from : off, d->ud);
    }
}

void fl_wk_devices_reduce_range(fl_wk_devices_t *d, size_t start, size_t len)
{
    /* Only during an overlapped step: El Che's steps combine on the training thread. */
    if (!d->reducing)
        return;
    int L = d->n;
    float inv = 1.0f / (float)L;
    float *grad = d->rep[0].grad;
    for (size_t i = start; i < start + len; i++) {
        float s = grad[i];
        for (int k = 1; k < L; k++)
            s += d->rep[k].grad[i];
        grad[i] = s * inv;
    }
}
