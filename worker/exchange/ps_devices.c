/* --mode ps with several devices per host: after the devices' reduce-scatter inside the host,
 * device j's exchange pushes and pulls its own key range (a run of whole PS shards, from
 * fl_ps_client_split) over its own connections, each part on its own thread (part 0 on the
 * training thread), with its own top-k error feedback over its range. The pulled ranges land
 * side by side in the host's parameter buffer that every device reads: the all-gather. The
 * devices, the training loop and the checkpoint files are the caller's. */
#include "wk_xchg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct psd_part {
    struct fl_wk_psdev *x;
    int j;
    fl_ps_client_t *cl;
    size_t lo, n;    /* its keys */
    fl_cmp_ef_t *ef; /* top-k: the residual of its keys */
    fl_cmp_ws_t *ws;
    uint32_t *idx;
    float *val;
    int rc;
    char err[1024];
} psd_part_t;

struct fl_wk_psdev {
    int parts;
    psd_part_t part[FL_DEV_MAX_DEVICES];
    fl_fanout_t *fan;            /* parts 1.. on their threads, part 0 the training thread's */
    fl_ps_client_stats_t before; /* of the part clients replaced by rejoins */
    /* the step's inputs, set by the training thread before a run starts */
    const float *grad;
    float *params;
    uint32_t batch;
    double density;
};

/* Part j's push of its keys (dense, or its top-k with error feedback) and the pull of them. */
static void part_step(psd_part_t *p)
{
    fl_wk_psdev_t *x = p->x;
    fl_ps_grad_t g;
    memset(&g, 0, sizeof g);
    g.batch = x->batch;
    p->rc = FL_OK;
    if (p->ef == NULL) {
        g.dense = x->grad;
    } else {
        fl_cmp_topk_opts_t k;
        fl_cmp_topk_opts_init(&k);
        k.density = x->density;
        size_t got = 0;
        bool skipped = false;
        p->rc = fl_cmp_ef_step(p->ef, p->ws, x->grad + p->lo, &k, p->idx, p->val, &got, &skipped);
        /* The selection is over the part's keys; the push speaks of the whole vector. */
        for (size_t i = 0; p->rc == FL_OK && i < got; i++)
            p->idx[i] += (uint32_t)p->lo;
        g.idx = p->idx;
        g.val = p->val;
        g.k = got;
    }
    if (p->rc == FL_OK)
        p->rc = fl_ps_client_push_pull(p->cl, &g, x->params);
    if (p->rc != FL_OK)
        snprintf(p->err, sizeof p->err, "device %d (keys %zu+%zu): %s", p->j, p->lo, p->n,
                 fl_last_error());
}

static int part_job(int j, void *ud)
{
    fl_wk_psdev_t *x = ud;
    part_step(&x->part[j]);
    return x->part[j].rc;
}

int fl_wk_psdev_create(fl_ps_client_t *cl, int parts, const fl_wk_train_opts_t *o,
                       fl_wk_psdev_t **out)
{
    *out = NULL;
    if (parts < 1 || parts > FL_DEV_MAX_DEVICES)
        return fl_fail(FL_EINVAL, "--mode ps: %d device clients outside 1..%d", parts,
                       FL_DEV_MAX_DEVICES);
    fl_wk_psdev_t *x = calloc(1, sizeof *x);
    if (x == NULL)
        return fl_fail(FL_ENOMEM, "out of memory for the device clients");
    int rc = FL_OK;
    for (int j = 0; j < parts && rc == FL_OK; j++) {
        psd_part_t *p = &x->part[j];
        p->x = x;
        p->j = j;
        x->parts = j + 1;
        if ((rc = fl_ps_client_split(cl, j, parts, &p->cl)) != FL_OK)
            break;
        fl_ps_client_part_range(p->cl, &p->lo, &p->n);
        if (o->topk > 0) {
            fl_cmp_ef_opts_t eo;
            fl_cmp_ef_opts_init(&eo);
            eo.n = p->n;
            eo.name = "gradient";
            eo.wire = o->topk_values;
            /* Clipping is the training thread's, on the whole mean, before the split. */
            eo.max_norm = 0.0;
            p->idx = malloc(p->n * sizeof *p->idx);
            p->val = malloc(p->n * sizeof *p->val);
            if (p->idx == NULL || p->val == NULL)
                rc = fl_fail(FL_ENOMEM, "out of memory for device %d's top-k pairs", j);
            if (rc == FL_OK && (rc = fl_cmp_ef_create(&eo, &p->ef)) == FL_OK)
                rc = fl_cmp_ws_create(&p->ws);
        }
    }
    if (rc == FL_OK)
        rc = fl_fanout_create(x->parts, 1, part_job, x, "--mode ps: the device clients", &x->fan);
    if (rc != FL_OK) {
        fl_wk_psdev_destroy(&x);
        return rc;
    }
    *out = x;
    return FL_OK;
}

static void wk_psdev_destroy(fl_wk_psdev_t **px)
{
    if (px == NULL || *px == NULL)
        return;
    fl_wk_psdev_t *x = *px;
    fl_fanout_destroy(&x->fan);
    for (int j = 0; j < x->parts; j++) {
        psd_part_t *p = &x->part[j];
        fl_ps_client_destroy(&p->cl);
        fl_cmp_ef_destroy(&p->ef);
        fl_cmp_ws_destroy(&p->ws);
        free(p->idx);
        free(p->val);
    }
    free(x);
    *px = NULL;
}

void fl_wk_psdev_destroy(fl_wk_psdev_t **px)
{
    fl_error_keep_begin();
    wk_psdev_destroy(px);
    fl_error_keep_end();
}

int fl_wk_psdev_push_pull(fl_wk_psdev_t *x, const float *grad, uint32_t batch, double density,
                          float *params)
{
    x->grad = grad;
    x->params = params;
    x->batch = batch;
    x->density = density;
    fl_fanout_begin(x->fan);
    part_step(&x->part[0]);
    /* Each part's wait is bounded by its client's deadline, so this one is too. Meanwhile part
     * 0 hears the coordinator for the others (a failure, or a lost parameter server, stops
     * them); a part's end wakes this wait at once. */
    for (bool done = fl_fanout_poll(x->fan, 0); !done; done = fl_fanout_poll(x->fan, 20)) {
        int lrc = fl_ps_client_part_listen(x->part[0].cl, 0);
        if (lrc != FL_OK && x->part[0].rc == FL_OK) {
            x->part[0].rc = lrc;
            snprintf(x->part[0].err, sizeof x->part[0].err, "%s", fl_last_error());
        }
    }
    /* Which part's error wins is decided below: a lost parameter server first. */
    (void)fl_fanout_end(x->fan);
    /* The parameter server lost: every part stopped for the rejoin, whatever else it met. */
    for (int j = 0; j < x->parts; j++)
        if (x->part[j].rc == FL_ERESYNC)
            return fl_fail(FL_ERESYNC, "%s", x->part[j].err);
    for (int j = 0; j < x->parts; j++)
        if (x->part[j].rc != FL_OK)
            return fl_fail(x->part[j].rc, "%s", x->part[j].err);
    return FL_OK;
}

int fl_wk_psdev_rejoin(fl_wk_psdev_t *x, fl_ps_client_t *cl, float *params)
{
    /* The parts' threads wait for the next run: their clients are free to replace. */
    fl_ps_client_stats_t s;
    fl_wk_psdev_stats(x, &s);
    x->before = s;
    x->before.resyncs++;
    for (int j = 0; j < x->parts; j++)
        fl_ps_client_destroy(&x->part[j].cl);
    int rc = fl_ps_client_pull(cl, params);
    if (rc == FL_ERESYNC)
        rc = FL_OK; /* restarted again on the way: joined all the same */
    for (int j = 0; j < x->parts && rc == FL_OK; j++) {
        psd_part_t *p = &x->part[j];
        size_t lo, n;
        if ((rc = fl_ps_client_split(cl, j, x->parts, &p->cl)) != FL_OK)
            break;
        fl_ps_client_part_range(p->cl, &lo, &n);
        if (lo != p->lo || n != p->n)
            rc = fl_fail(FL_EINVAL,
                         "the restarted parameter server gives device %d keys "
                         "%zu+%zu, %zu+%zu before: restart it with the same shards",
                         j, lo, n, p->lo, p->n);
    }
    return rc;
}

int fl_wk_psdev_parts(const fl_wk_psdev_t *x)
{
    return x->parts;
}

uint64_t fl_wk_psdev_step(const fl_wk_psdev_t *x)
{
    return fl_ps_client_step(x->part[0].cl);
}

fl_cmp_ef_t *fl_wk_psdev_ef(fl_wk_psdev_t *x, int j)
{
    return j >= 0 && j < x->parts ? x->part[j].ef : NULL;
}

void fl_wk_psdev_stats(const fl_wk_psdev_t *x, fl_ps_client_stats_t *sum)
{
    *sum = x->before;
    for (int j = 0; j < x->parts && x->part[j].cl != NULL; j++) {
        fl_ps_client_stats_t s;
        fl_ps_client_get_stats(x->part[j].cl, &s);
        sum->bytes_sent += s.bytes_sent;
        sum->bytes_recv += s.bytes_recv;
        sum->raw_bytes += s.raw_bytes;
        sum->wait_ms += s.wait_ms;
        if (j == 0) {
            sum->pushes += s.pushes;
            sum->pulls += s.pulls;
        }
    }
}
