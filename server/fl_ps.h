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

/* Parameter-server processes registered that have neither left nor been declared dead. */
int fl_coord_servers_active(const fl_coord_t *coord);

/* Largest control message accepted, in bytes (frames up to twice this are refused with an
 * answer; larger ones make ZeroMQ drop the connection). */
#define FL_COORD_MAX_MSG ((size_t)1 << 20)

/* ---- the shard map (ps_map.c) ---- */

/* Shard boundaries fall on multiples of this many parameters (64 bytes of float32). */
#define FL_PS_ALIGN 16

typedef struct fl_ps_range {
    uint64_t offset;
    uint64_t count; /* 0: an empty shard */
} fl_ps_range_t;

/* Key range `index` of n parameters cut into nshards contiguous ranges balanced by bytes:
 * boundaries on multiples of FL_PS_ALIGN, sizes differing by at most FL_PS_ALIGN, ranges in
 * index order covering 0..n-1 exactly once (with fewer than nshards blocks of FL_PS_ALIGN
 * some ranges are empty). An index out of range gives an empty range at 0. */
void fl_ps_map_range(uint64_t n, uint32_t nshards, uint32_t index, fl_ps_range_t *out);

#ifdef __cplusplus
}
#endif

#endif
