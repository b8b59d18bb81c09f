/* server: flodl-ps. The coordinator (rendezvous, peer table, heartbeats, failure broadcast)
 * whose public face is include/flodl/coordinator.h; the parameter-server shards join it (#4).
 * This header holds what tests and the binary need beyond the public API. */
#ifndef FL_PS_H
#define FL_PS_H

#include <flodl/coordinator.h>

#include "fl_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A counter of the coordinator's context (bad messages refused, errors sent, ...). */
uint64_t fl_coord_stat(const fl_coord_t *coord, fl_stat_t stat);

/* Ranks registered so far (thread-safe). */
int fl_coord_registered(const fl_coord_t *coord);

/* Ranks registered that have neither left nor been declared dead (thread-safe). */
int fl_coord_active(const fl_coord_t *coord);

/* Largest control message accepted, in bytes (frames up to twice this are refused with an
 * answer; larger ones make ZeroMQ drop the connection). */
#define FL_COORD_MAX_MSG ((size_t)1 << 20)

#ifdef __cplusplus
}
#endif

#endif
