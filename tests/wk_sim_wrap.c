/* Linked into the *_sim worker suites with -Wl,--wrap=fl_wk_train_opts_init: every options
 * struct a test makes trains on simulated GPUs (one per replica), with a little jitter before
 * each device operation so that a missing event shows as a wrong result. */
#include "fl_wk.h"

void __real_fl_wk_train_opts_init(fl_wk_train_opts_t *o);
void __wrap_fl_wk_train_opts_init(fl_wk_train_opts_t *o);

void __wrap_fl_wk_train_opts_init(fl_wk_train_opts_t *o)
{
    __real_fl_wk_train_opts_init(o);
    o->device = FL_DEV_SIM;
    o->sim_jitter_us = 20;
}
