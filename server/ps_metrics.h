/* flodl-ps's metrics endpoint (ps_metrics.c), private to the flodl-ps binary. */
#ifndef FL_PS_METRICS_H
#define FL_PS_METRICS_H

#include <flodl/coordinator.h>

#include "fl_ps.h"

typedef struct ps_metrics ps_metrics_t;

/* Serves /metrics and /healthz on bind:port, and /healthz alone on bind:health_port (its own
 * listener; either port -1: not served), for the coordinator (may be NULL) of world ranks and
 * the server (may be NULL), both borrowed until ps_metrics_stop. FL_OK or the endpoint's
 * error. */
int ps_metrics_start(const char *bind, int port, int health_port, fl_coord_t *coord,
                     fl_ps_server_t *srv, int world, ps_metrics_t **out);
int ps_metrics_port(const ps_metrics_t *m);        /* -1: not served */
int ps_metrics_health_port(const ps_metrics_t *m); /* -1: not served */
void ps_metrics_stop(ps_metrics_t **m);

#endif
