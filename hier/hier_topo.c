/* Where a rank sits among the job's hosts, from the host each rank registered with. */
#include "hier_int.h"

#include <stdlib.h>
#include <string.h>

static int same_host(const fl_comm_t *comm, int a, int b)
{
    const char *ha = fl_comm_peer_host(comm, a);
    const char *hb = fl_comm_peer_host(comm, b);
    return ha != NULL && hb != NULL && strcmp(ha, hb) == 0;
}

/* lead[r]: the lowest rank on rank r's host. Quadratic, once per engine: 1024 ranks take a
 * million short string compares. */
static void host_leaders(const fl_comm_t *comm, int *lead)
{
    int size = fl_comm_size(comm);
    for (int r = 0; r < size; r++) {
        lead[r] = r;
        for (int q = 0; q < r; q++)
            if (lead[q] == q && same_host(comm, q, r)) {
                lead[r] = q;
                break;
            }
    }
}

static void place(const int *lead, int size, int me, fl_hier_topo_t *out)
{
    memset(out, 0, sizeof *out);
    out->uniform = 1;
    for (int q = 0; q < size; q++) {
        out->local_rank += q < me && lead[q] == lead[me];
        out->local_size += lead[q] == lead[me];
    }
    for (int q = 0; q < size; q++) {
        if (lead[q] != q)
            continue;
        if (q == lead[me])
            out->cross_rank = out->cross_size;
        out->cross_size++;
        int n = 0;
        for (int p = q; p < size; p++)
            n += lead[p] == q;
        if (n != out->local_size)
            out->uniform = 0;
    }
}

int fl_hier_topology(const fl_comm_t *comm, fl_hier_topo_t *out)
{
    if (comm == NULL || out == NULL)
        return fl_fail(FL_EINVAL, "hier: topology of a NULL communicator");
    int size = fl_comm_size(comm);
    int *lead = malloc((size_t)size * sizeof *lead);
    if (lead == NULL)
        return fl_fail(FL_ENOMEM, "hier: topology of %d ranks: out of memory", size);
    host_leaders(comm, lead);
    place(lead, size, fl_comm_rank(comm), out);
    free(lead);
    return FL_OK;
}
