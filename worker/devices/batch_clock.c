/* El Che's clock: a device's time for its batches from timed events on its compute stream
 * (cudaEventElapsedTime on a GPU; on cpu and sim the host clock when each record completed),
 * so a GPU's figure is the time between its own start and end, not when the host thread
 * queued the work. cadence.c turns the figures into a plan. */
#include "wk_devices.h"

int fl_wk_bclock_start(fl_wk_bclock_t *c, fl_wk_rdev_t *rd)
{
    fl_dev_t *dev = fl_wk_rdev_dev(rd);
    int rc = fl_wk_rdev_bind(rd);
    if (rc == FL_OK && c->t0 == NULL && (rc = fl_event_create_timed(dev, &c->t0)) == FL_OK)
        rc = fl_event_create_timed(dev, &c->t1);
    return rc == FL_OK ? fl_event_record(c->t0, fl_wk_rdev_stream(rd)) : rc;
}

int fl_wk_bclock_stop(fl_wk_bclock_t *c, fl_wk_rdev_t *rd, double *seconds)
{
    double ms = 0.0;
    int rc = fl_event_record(c->t1, fl_wk_rdev_stream(rd));
    if (rc == FL_OK)
        rc = fl_event_sync(c->t1, 0);
    if (rc == FL_OK)
        rc = fl_event_elapsed_ms(c->t0, c->t1, &ms);
    *seconds = ms / 1e3;
    return rc;
}

void fl_wk_bclock_deinit(fl_wk_bclock_t *c)
{
    fl_event_destroy(&c->t0);
    fl_event_destroy(&c->t1);
}
