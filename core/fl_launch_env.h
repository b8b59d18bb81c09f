/* core: what launchers say through the environment (launch_env.c). Rank, world size, local rank
 * and size, coordinator and the rest, resolved from flodl's, torchrun's, Open MPI's and
 * Kubernetes' variables into one struct. fl_core.h includes it; it needs nothing else of core,
 * so a binary's entry point can include it alone. */
#ifndef FL_LAUNCH_ENV_H
#define FL_LAUNCH_ENV_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Looks up one variable; returns NULL when unset. The binaries pass a wrapper of getenv, tests a
 * table: core itself never reads the environment. */
typedef const char *(*fl_env_get_fn)(const char *name, void *ud);

#define FL_ENDPOINT_MAX 256
#define FL_HOST_MAX 256
#define FL_JOB_MAX 64

typedef struct fl_launch_info {
    int rank;                          /* -1 when no variable sets it */
    int world_size;                    /* -1 when no variable sets it */
    char coordinator[FL_ENDPOINT_MAX]; /* "" when unset */
    char host[FL_HOST_MAX];            /* "" when unset */
    char job_id[FL_JOB_MAX];           /* "" when unset */
    int log_level;                     /* -1 when unset, else an fl_log_level_t */
    char curve_dir[1024];              /* FLODL_CURVE_DIR, "" when unset */
    bool insecure;                     /* FLODL_INSECURE=1 */
    int ipc;                           /* FLODL_IPC: 1 or 0, -1 when unset */
    const char *rank_var;              /* the variable the rank came from, or NULL */
    const char *world_var;             /* the variable the world size came from, or NULL */
    int port;                          /* the coordinator's port, of FLODL_COORDINATOR or
                                          MASTER_PORT; 0 when neither says */
    int local_rank;                    /* LOCAL_RANK (torchrun, flodl-launch): this process's
                                          index among its host's; -1 when unset */
    int local_size;                    /* LOCAL_WORLD_SIZE: processes on this host; -1 when
                                          unset */
} fl_launch_info_t;

/* Resolves rank, world size and coordinator from the variables launchers set, first match
 * wins: FLODL_RANK, RANK (torchrun), OMPI_COMM_WORLD_RANK (Open MPI), JOB_COMPLETION_INDEX
 * (Kubernetes Indexed Job); FLODL_WORLD_SIZE, WORLD_SIZE, OMPI_COMM_WORLD_SIZE;
 * FLODL_COORDINATOR, else tcp://MASTER_ADDR:MASTER_PORT (port 29500 when unset), and that
 * port alone (flodl-ps binds it when no --bind is given). Also
 * FLODL_HOST, FLODL_JOB_ID, FLODL_LOG, FLODL_CURVE_DIR, FLODL_INSECURE (1 or 0),
 * FLODL_IPC (1 or 0), and torchrun's LOCAL_RANK and LOCAL_WORLD_SIZE (a local rank must be
 * below the local size when both are set). Returns FL_OK or FL_EINVAL naming the variable. */
int fl_launch_from_env(fl_env_get_fn get, void *ud, fl_launch_info_t *out);

#ifdef __cplusplus
}
#endif

#endif
