/* Which devices a worker trains on: --device auto|cpu|sim|cuda and --gpus ID,ID,... resolved
 * into the training options before anything starts, so a missing GPU, an id out of range or
 * flags that do not go together end the process with one line (the entry point exits 2).
 * auto takes CUDA when a GPU is usable; only then is the CUDA driver loaded. */
#include "wk_devices.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Parses "0,1,1" into ids (at most FL_DEV_MAX_DEVICES). */
static int parse_ids(const char *s, int *ids, int *n)
{
    *n = 0;
    const char *p = s;
    for (;;) {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno != 0 || v < 0 || v > 1023)
            return fl_fail(FL_EINVAL, "--gpus '%s': entry %d is not a device id in 0..1023", s,
                           *n + 1);
        if (*n == FL_DEV_MAX_DEVICES)
            return fl_fail(FL_EINVAL, "--gpus '%s': more than %d devices", s, FL_DEV_MAX_DEVICES);
        ids[(*n)++] = (int)v;
        if (*end == '\0')
            return FL_OK;
        if (*end != ',')
            return fl_fail(FL_EINVAL, "--gpus '%s': expected a comma after entry %d", s, *n);
        p = end + 1;
    }
}

int fl_wk_device_select(const char *device, const char *gpus, bool replicas_given,
                        fl_wk_train_opts_t *o)
{
    bool automatic = device == NULL || strcmp(device, "auto") == 0;
    fl_dev_kind_t kind = FL_DEV_CPU;
    if (!automatic && fl_dev_kind_parse(device, &kind) != FL_OK)
        return fl_fail(FL_EINVAL, "--device: '%s' is not one of auto|cpu|sim|cuda", device);
    char why[256] = "";
    if (automatic)
        kind = fl_dev_count(FL_DEV_CUDA, why, sizeof why) > 0 ? FL_DEV_CUDA : FL_DEV_CPU;
    if (automatic && kind == FL_DEV_CPU && gpus != NULL)
        return fl_fail(FL_EINVAL, "--gpus %s: no usable GPU on this host (%s)", gpus, why);
    if (kind == FL_DEV_CPU) {
        if (gpus != NULL)
            return fl_fail(FL_EINVAL, "--gpus applies to --device cuda or sim (on the CPU, "
                                      "--cpu-replicas L sets the devices)");
        o->device = FL_DEV_CPU;
        return FL_OK;
    }
    if (replicas_given && kind == FL_DEV_CUDA)
        return fl_fail(FL_EINVAL, "--cpu-replicas is for --device cpu: with --device cuda, "
                                  "--gpus 0,1,... names the GPUs");
    if (replicas_given && gpus != NULL)
        return fl_fail(FL_EINVAL, "--cpu-replicas and --gpus: give one of them");
    int ids[FL_DEV_MAX_DEVICES];
    int n = 0;
    int rc;
    if (gpus != NULL && (rc = parse_ids(gpus, ids, &n)) != FL_OK)
        return rc;
    if (gpus == NULL) {
        /* One device, or (sim) --cpu-replicas simulated ones. */
        n = kind == FL_DEV_SIM && replicas_given ? o->replicas : 1;
        for (int j = 0; j < n; j++)
            ids[j] = j;
    }
    if (kind == FL_DEV_CUDA) {
        int have = fl_dev_count(FL_DEV_CUDA, why, sizeof why);
        if (have == 0)
            return fl_fail(FL_EINVAL, "--device cuda: no usable GPU: %s", why);
        for (int j = 0; j < n; j++)
            if (ids[j] >= have)
                return fl_fail(FL_EINVAL,
                               "--gpus: GPU %d does not exist: this host has %d "
                               "GPU(s), ids 0..%d",
                               ids[j], have, have - 1);
    }
    o->device = kind;
    o->replicas = n;
    for (int j = 0; j < n; j++)
        o->gpus[j] = ids[j];
    return FL_OK;
}
