/* Shard layout and ring segmentation: the arithmetic every rank must agree on, kept free of IO
 * so that it is tested exhaustively on its own. */
#include "fl_coll.h"
#include "fl_msg.h"

size_t fl_shard_offset(size_t count, int nshards, int index)
{
    if (nshards <= 0 || index < 0)
        return 0;
    size_t n = (size_t)nshards;
    size_t i = (size_t)index > n ? n : (size_t)index;
    size_t base = count / n;
    size_t extra = count % n;
    return i * base + (i < extra ? i : extra);
}

size_t fl_shard_count(size_t count, int nshards, int index)
{
    if (nshards <= 0 || index < 0 || index >= nshards)
        return 0;
    size_t n = (size_t)nshards;
    return count / n + ((size_t)index < count % n ? 1 : 0);
}

size_t fl_ring_segn(size_t chunk_cnt, size_t elem_bytes, size_t segment_bytes)
{
    size_t segn = segment_bytes / (elem_bytes ? elem_bytes : 1);
    if (segn == 0)
        segn = 1;
    /* Cap the number of segments per chunk: each is one message with a header. */
    size_t min_segn = (chunk_cnt + 4095) / 4096;
    if (segn < min_segn)
        segn = min_segn;
    return segn;
}

/* The kinds travel in heartbeats too, where the coordinator names them (proto/). */
_Static_assert(FL_COLL_ALLREDUCE == (int)FL_MSG_OP_ALLREDUCE &&
                   FL_COLL_REDUCE_SCATTER == (int)FL_MSG_OP_REDUCE_SCATTER &&
                   FL_COLL_ALLGATHER == (int)FL_MSG_OP_ALLGATHER &&
                   FL_COLL_BROADCAST == (int)FL_MSG_OP_BROADCAST &&
                   FL_COLL_BARRIER == (int)FL_MSG_OP_BARRIER &&
                   FL_COLL_SPARSE_ALLREDUCE == (int)FL_MSG_OP_SPARSE_ALLREDUCE,
               "collective kinds and heartbeat operations disagree");

const char *fl_coll_kind_name(int kind)
{
    if (kind < FL_COLL_ALLREDUCE || kind > FL_COLL_SPARSE_ALLREDUCE)
        return "unknown collective";
    return fl_msg_op_name((uint32_t)kind);
}

const char *fl_coll_phase_name(int phase)
{
    switch (phase) {
    case FL_PHASE_RS: return "reduce-scatter";
    case FL_PHASE_AG: return "all-gather";
    case FL_PHASE_RD_PRE: return "recursive-doubling fold-in";
    case FL_PHASE_RD: return "recursive doubling";
    case FL_PHASE_RD_POST: return "recursive-doubling hand-out";
    case FL_PHASE_BCAST: return "broadcast";
    case FL_PHASE_DIRECT: return "one-shot exchange";
    default: return "start";
    }
}
