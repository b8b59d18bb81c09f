/* A user program linked against libflodl: joins the job described by the launcher's
 * environment (FLODL_*, torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, ...), averages a
 * gradient-like vector across ranks and checks the result. Build it with
 *   cc allreduce_env.c $(pkg-config --cflags --libs flodl)
 * or with CMake's find_package(flodl) (see CMakeLists.txt here). */
#include <flodl/flodl.h>
#include <math.h>
#include <stdio.h>

#define N 100000

int main(void)
{
    fl_comm_opts_t opts;
    fl_comm_opts_init(&opts);
    if (fl_comm_opts_from_env(&opts) != FL_OK) {
        fprintf(stderr, "allreduce_env: %s\n", fl_last_error());
        return 2;
    }
    fl_comm_t *comm;
    if (fl_comm_init(&opts, &comm) != FL_OK) {
        fprintf(stderr, "allreduce_env: %s\n", fl_last_error());
        return 1;
    }
    int rank = fl_comm_rank(comm);
    int size = fl_comm_size(comm);
    static float grad[N];
    for (int i = 0; i < N; i++)
        grad[i] = (float)(rank + 1) * 0.5f + (float)(i % 10);
    int rc = fl_allreduce(comm, grad, grad, N, FL_FLOAT32, FL_AVG);
    if (rc != FL_OK) {
        fprintf(stderr, "allreduce_env: %s (%s)\n", fl_last_error(), fl_strerror(rc));
        fl_comm_destroy(&comm);
        return 1;
    }
    /* mean over ranks of (r+1)/2 is (size+1)/4 */
    int bad = 0;
    for (int i = 0; i < N; i++) {
        float want = (float)(size + 1) * 0.25f + (float)(i % 10);
        if (fabsf(grad[i] - want) > 1e-5f * fabsf(want) + 1e-6f)
            bad++;
    }
    printf("rank %d of %d: averaged %d floats, %s\n", rank, size, N, bad ? "WRONG" : "ok");
    fl_comm_destroy(&comm);
    return bad ? 1 : 0;
}
