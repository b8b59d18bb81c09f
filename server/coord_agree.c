/* What the ranks of one job must agree on, checked when a rank registers against a rank
 * already registered: the model signature, the collective settings (`tuning`) and the
 * settings the ranks declare (`settings`: optimizer, batch, top-k, data, ...). The refusal
 * names both ranks and both values in words; the rendezvous then fails for every rank, since
 * neither side is known to be the right one and waiting for a corrected rank would only run
 * into the rendezvous deadline. */
#include "coord_int.h"

#include <stdio.h>
#include <string.h>

/* The first registered rank other than r, or -1. */
static int first_registered(const fl_coord_t *c, int r)
{
    for (int q = 0; q < c->world; q++)
        if (q != r && c->ranks[q].registered)
            return q;
    return -1;
}

int fl_coord_check_agree(const fl_coord_t *c, int r, const fl_msg_register_t *reg, char *why,
                         size_t cap)
{
    int q = first_registered(c, r);
    if (q < 0)
        return FL_OK;
    const fl_msg_register_t *o = &c->ranks[q].reg;
    if (strcmp(o->tuning, reg->tuning) != 0) {
        snprintf(why, cap,
                 "rank %d (host %.64s) uses collective settings '%.120s', rank %d "
                 "(host %.64s) uses '%.120s'; all ranks must agree",
                 r, reg->host, reg->tuning, q, o->host, o->tuning);
        return FL_EINVAL;
    }
    char name[64];
    char mine[FL_MSG_SETTINGS_MAX];
    char theirs[FL_MSG_SETTINGS_MAX];
    if (fl_settings_differ(reg->settings, o->settings, name, sizeof name, mine, theirs,
                           sizeof mine)) {
        snprintf(why, cap,
                 "rank %d (host %.64s) and rank %d (host %.64s) disagree on %s: "
                 "'%.120s' on rank %d, '%.120s' on rank %d; it must be the same on "
                 "every rank",
                 r, reg->host, q, o->host, name, mine, r, theirs, q);
        return FL_EINVAL;
    }
    /* After the declared settings: they name a model that differs in words (layers, parameter
     * names and shapes); the signature alone is the last word for members that declare none. */
    if ((o->model_signature != 0 || reg->model_signature != 0) &&
        o->model_signature != reg->model_signature) {
        snprintf(why, cap,
                 "rank %d (host %.64s) has model signature 0x%016llx, rank %d (host "
                 "%.64s) 0x%016llx: the ranks run different models",
                 r, reg->host, (unsigned long long)reg->model_signature, q, o->host,
                 (unsigned long long)o->model_signature);
        return FL_EINVAL;
    }
    return FL_OK;
}
