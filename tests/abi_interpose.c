/* A user program linked against the shared libflodl that happens to define functions named
 * as libflodl's internals (fl_coll__begin, fl_coll__end): the library must keep calling its
 * own, so a one-rank allreduce through an embedded coordinator gives the right numbers and never
 * reaches these. Uses the public API only, as a consumer does. Exit 0 on success. */
#include <flodl/flodl.h>

#include <stdio.h>

static int hijacked;

/* Deliberately the names (not the signatures) of libflodl internals. */
int fl_coll__begin(void);
int fl_coll__end(void);

int fl_coll__begin(void)
{
    hijacked++;
    return -42;
}

int fl_coll__end(void)
{
    hijacked++;
    return -42;
}

#define N 1000

int main(void)
{
    fl_coord_opts_t co;
    fl_coord_opts_init(&co);
    co.bind = "tcp://127.0.0.1:0";
    co.world_size = 1;
    co.log_level = FL_LOG_WARN;
    fl_coord_t *coord;
    if (fl_coord_create(&co, &coord) != FL_OK || fl_coord_start(coord) != FL_OK) {
        fprintf(stderr, "abi_interpose: coordinator: %s\n", fl_last_error());
        return 1;
    }
    fl_comm_opts_t o;
    fl_comm_opts_init(&o);
    o.rank = 0;
    o.world_size = 1;
    o.coordinator = fl_coord_endpoint(coord);
    o.host = "127.0.0.1";
    o.rendezvous_timeout_ms = 30000;
    o.timeout_ms = 30000;
    fl_comm_t *comm;
    if (fl_comm_init(&o, &comm) != FL_OK) {
        fprintf(stderr, "abi_interpose: comm: %s\n", fl_last_error());
        return 1;
    }
    static float in[N];
    static float out[N];
    for (int i = 0; i < N; i++)
        in[i] = (float)i * 0.5f;
    int rc = fl_allreduce(comm, in, out, N, FL_FLOAT32, FL_SUM);
    int bad = 0;
    for (int i = 0; rc == FL_OK && i < N; i++)
        bad += out[i] != in[i];
    fl_comm_destroy(&comm);
    fl_coord_wait(coord, 10000);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
    printf("abi_interpose: allreduce rc %d (%s), %d wrong, user's fl_coll__begin/fl_coll__end "
           "called %d times\n",
           rc, fl_strerror(rc), bad, hijacked);
    return rc == FL_OK && bad == 0 && hijacked == 0 ? 0 : 1;
}
