/* flodl-worker: one per host. Resolves rank, world size and coordinator from flags or the
 * launcher's environment, loads the data, joins the job and trains (or runs the
 * gradient-exchange drill). Exit 0 on success, 1 on a runtime failure (the message names rank,
 * peer and operation), 2 on bad flags, a model that does not fit the data or the init file, or
 * a model that differs from the other ranks' (one line saying what and where). The flags
 * themselves, one by one, are worker_flags.c's. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fl_coll.h"
#include "fl_core.h"
#include "fl_obs.h"
#include "fl_wk.h"
#include "worker_args.h"

/* The worker's observability: a metrics endpoint and a timeline, when asked for. */
typedef struct wobs {
    fl_obs_t *obs;
    fl_obs_http_t *http;
    fl_obs_healthz_t *healthz;
    fl_obs_timeline_t *tl;
    int last_id;
    double deadline_s;
} wobs_t;

/* What a run holds: the data and, networked, the communicator. */
typedef struct wjob {
    fl_dataset_t train;
    fl_dataset_t test;
    bool have_test;
    fl_comm_t *comm;
} wjob_t;

/* /healthz: healthy until a step is overdue (none for longer than the collective deadline). */
static bool worker_healthy(void *ud, char *why, size_t cap)
{
    wobs_t *w = ud;
    double last = fl_obs_get(w->obs, w->last_id);
    if (last <= 0)
        return true; /* not training yet: rendezvous and data loading have their own deadlines */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double ago = (double)ts.tv_sec + ts.tv_nsec / 1e9 - last;
    if (ago <= w->deadline_s)
        return true;
    snprintf(why, cap, "no step completed for %.0f s (deadline %.0f s)", ago, w->deadline_s);
    return false;
}

static int wobs_start(wargs_t *a, int rank, wobs_t *w)
{
    memset(w, 0, sizeof *w);
    int rc;
    if (a->timeline_path != NULL) {
        if ((rc = fl_obs_timeline_open(a->timeline_path, rank, &w->tl)) != FL_OK)
            return rc;
        a->to.timeline = w->tl;
    }
    if (a->metrics_port < 0 && a->health_port < 0)
        return FL_OK;
    if ((rc = fl_obs_create(&w->obs)) != FL_OK || (rc = fl_obs_add_process(w->obs)) != FL_OK)
        return rc;
    char labels[32];
    snprintf(labels, sizeof labels, "rank=\"%d\"", rank);
    w->last_id = fl_obs_add(w->obs, "flodl_last_step_timestamp_seconds",
                            "Unix time of the last step", FL_OBS_GAUGE, labels);
    w->deadline_s = a->co.timeout_ms / 1e3;
    a->to.obs = w->obs;
    const char *addr = a->metrics_bind ? a->metrics_bind : "0.0.0.0";
    if (a->metrics_port >= 0) {
        if ((rc = fl_obs_http_start(w->obs, a->metrics_bind, a->metrics_port, worker_healthy, w,
                                    &w->http)) != FL_OK)
            return rc;
        printf("rank %d: metrics on http://%s:%d/metrics\n", rank, addr, fl_obs_http_port(w->http));
    }
    if (a->health_port >= 0) {
        if ((rc = fl_obs_healthz_start(a->metrics_bind, a->health_port, worker_healthy, w,
                                       &w->healthz)) != FL_OK)
            return rc;
        printf("rank %d: health on http://%s:%d/healthz\n", rank, addr,
               fl_obs_healthz_port(w->healthz));
    }
    fflush(stdout);
    return FL_OK;
}

static int wobs_stop(wobs_t *w)
{
    fl_obs_healthz_stop(&w->healthz);
    fl_obs_http_stop(&w->http);
    fl_obs_destroy(&w->obs);
    return fl_obs_timeline_close(&w->tl);
}

/* Prints the current detail text as the one line of a failure; returns code. */
static int failed(int code)
{
    fprintf(stderr, "flodl-worker: %s\n", fl_last_error());
    return code;
}

/* ... of a usage error: exit code 2. */
static int usage_error(void)
{
    return failed(2);
}

/* 2 for a configuration error, 1 for a runtime one. */
static int exit_code(int rc)
{
    return rc == FL_OK ? 0 : rc == FL_EINVAL ? 2 : 1;
}

static const char *env_get(const char *name, void *ud)
{
    (void)ud;
    return getenv(name);
}

/* The launcher's variables, as defaults the flags override. */
static int from_env(wargs_t *a)
{
    const fl_launch_info_t *env = &a->env;
    int rc = fl_launch_from_env(env_get, NULL, &a->env);
    if (rc != FL_OK)
        return rc;
    if (env->rank >= 0)
        a->co.rank = env->rank;
    if (env->world_size > 0)
        a->co.world_size = env->world_size;
    if (env->coordinator[0] != '\0')
        a->co.coordinator = env->coordinator;
    if (env->host[0] != '\0')
        a->co.host = env->host;
    if (env->job_id[0] != '\0')
        a->co.job_id = env->job_id;
    if (env->log_level >= 0)
        a->co.log_level = (fl_log_level_t)env->log_level;
    if (env->ipc >= 0)
        a->co.ipc = env->ipc;
    return FL_OK;
}

/* The simulated GPU's testing knobs, from the environment: FLODL_SIM_JITTER_US (a random delay
 * before each device operation, widening the window of a missing event), FLODL_SIM_MEM (each
 * device's memory, bytes) and FLODL_SIM_FAIL=RANK:DEVICE:N:OPERATION (a fault: on rank RANK,
 * device DEVICE's N-th run of OPERATION, named as device errors name it, fails as a GPU fault
 * would; with FLODL_SIM_STALL_MS=MS it stalls that long instead, as a hung kernel would). */
static int sim_env(fl_wk_train_opts_t *t, int rank)
{
    const char *j = getenv("FLODL_SIM_JITTER_US");
    const char *m = getenv("FLODL_SIM_MEM");
    const char *f = getenv("FLODL_SIM_FAIL");
    const char *st = getenv("FLODL_SIM_STALL_MS");
    if (st != NULL)
        t->sim_stall_ms = atoi(st);
    if (j != NULL)
        t->sim_jitter_us = atoi(j);
    if (m != NULL)
        t->sim_mem_bytes = (size_t)strtoull(m, NULL, 10);
    if (f == NULL || f[0] == '\0')
        return FL_OK;
    int r = -1;
    int dev = -1;
    long n = 0;
    int at = 0;
    if (sscanf(f, "%d:%d:%ld:%n", &r, &dev, &n, &at) != 3 || at == 0 || f[at] == '\0' || r < 0 ||
        dev < 0 || n < 1 || strlen(f + at) >= sizeof t->sim_fail_op)
        return fl_fail(FL_EINVAL, "FLODL_SIM_FAIL: '%s' is not RANK:DEVICE:N:OPERATION", f);
    if (r == rank) {
        t->sim_fail_device = dev;
        t->sim_fail_after = n;
        snprintf(t->sim_fail_op, sizeof t->sim_fail_op, "%s", f + at);
    }
    return FL_OK;
}

/* Flags of one mode given with another. Drill flags imply the drill when no mode is given. */
static int check_modes(wargs_t *a)
{
    if (a->drill_flag != NULL && a->mode < 0)
        a->mode = FL_WK_MODE_DRILL;
    if (a->drill_flag != NULL && a->mode != FL_WK_MODE_DRILL)
        return fl_fail(FL_EINVAL, "--%s applies to --mode drill only", a->drill_flag);
    if (a->mode == FL_WK_MODE_PS && a->optim_flag != NULL)
        return fl_fail(FL_EINVAL,
                       "--%s: in --mode ps the optimizer runs on the parameter "
                       "server: give it to flodl-ps",
                       a->optim_flag);
    if (a->ps_flag != NULL && a->mode != FL_WK_MODE_PS)
        return fl_fail(FL_EINVAL, "--%s applies to --mode ps only", a->ps_flag);
    if (a->resume_if_any != NULL && a->to.resume_dir != NULL)
        return fl_fail(FL_EINVAL, "--resume and --resume-if-any: give one");
    return FL_OK;
}

/* --resume-if-any DIR: --resume DIR when DIR holds a whole checkpoint. */
static void resume_if_any(wargs_t *a)
{
    if (a->resume_if_any == NULL)
        return;
    /* The manifest is written last, after every shard file (shard_ckpt.c): with it the
     * checkpoint is whole; without it there is nothing to resume from. */
    char manifest[4200];
    snprintf(manifest, sizeof manifest, "%s/manifest.safetensors", a->resume_if_any);
    if (access(manifest, F_OK) == 0)
        a->to.resume_dir = a->resume_if_any;
    else
        printf("--resume-if-any: no checkpoint in %s yet: starting fresh\n", a->resume_if_any);
}

/* What --mode ps leaves to the parameter server. */
static int check_ps(const wargs_t *a)
{
    const fl_wk_train_opts_t *t = &a->to;
    if (a->mode != FL_WK_MODE_PS)
        return FL_OK;
    if (t->shard != FL_WK_SHARD_NONE || t->max_anchor > 0 || t->policy != FL_WK_POLICY_SYNC)
        return fl_fail(FL_EINVAL, "--shard, --max-anchor and --policy: in --mode ps the "
                                  "optimizer state lives on the parameter server and the "
                                  "devices' mean is pushed every step");
    if ((t->checkpoint_dir != NULL || t->resume_dir != NULL) && !(t->topk > 0))
        return fl_fail(FL_EINVAL, "--checkpoint and --resume: in --mode ps the training state "
                                  "lives on the parameter server (flodl-ps --checkpoint-dir); "
                                  "the worker keeps only --topk's residual");
    return FL_OK;
}

static int check_optim(wargs_t *a)
{
    /* The default momentum belongs to the default SGD: Adam and AdamW have betas instead, and
     * only a --momentum given with them is a mistake. */
    if (a->to.opt.kind != FL_OPT_SGD && !a->momentum_given)
        a->to.opt.momentum = 0.0;
    return fl_cli_optim_check(&a->to.opt, &a->to.lr);
}

/* The mode when none was given, and what a networked one needs. A coordinator or a world of
 * several ranks means a networked run, so a missing piece of it is an error rather than a
 * silent local run. */
static int check_network(wargs_t *a)
{
    fl_comm_opts_t *co = &a->co;
    if (a->mode < 0)
        a->mode = co->coordinator != NULL || co->world_size > 1 || co->rank > 0 ? FL_WK_MODE_RING
                                                                                : FL_WK_MODE_LOCAL;
    if (a->mode == FL_WK_MODE_LOCAL)
        return FL_OK;
    if (co->world_size < 1)
        return fl_fail(FL_EINVAL, "--world-size: missing (or set FLODL_WORLD_SIZE / WORLD_SIZE)");
    if (co->rank < 0)
        return fl_fail(FL_EINVAL, "--rank: missing (or set FLODL_RANK / RANK)");
    if (co->rank >= co->world_size)
        return fl_fail(FL_EINVAL, "--rank: %d is not below --world-size %d", co->rank,
                       co->world_size);
    if (co->coordinator == NULL)
        return fl_fail(FL_EINVAL,
                       "--coordinator: missing (or set FLODL_COORDINATOR / MASTER_ADDR)");
    return fl_cli_security(co->curve_dir, a->insecure, a->env.curve_dir, a->env.insecure,
                           &co->curve_dir);
}

/* The flags taken together, in this order (the first refusal is the one reported), then the
 * devices and the simulated GPU's knobs. FL_OK or FL_EINVAL. */
static int settle(wargs_t *a)
{
    int rc = check_modes(a);
    if (rc != FL_OK)
        return rc;
    resume_if_any(a);
    if ((rc = check_ps(a)) != FL_OK || (rc = check_optim(a)) != FL_OK ||
        (rc = check_network(a)) != FL_OK)
        return rc;
    if (a->mode != FL_WK_MODE_DRILL &&
        (rc = fl_wk_device_select(a->device, a->gpus, a->replicas_given, &a->to)) != FL_OK)
        return rc;
    return sim_env(&a->to, a->co.rank > 0 ? a->co.rank : 0);
}

/* A test set comes in the training set's format, whole: nothing given is ignored. */
static int check_data_flags(const wargs_t *a)
{
    if ((a->test_images != NULL) != (a->test_labels != NULL))
        return fl_fail(FL_EINVAL, "--test-images and --test-labels go together");
    if (a->test_images != NULL && a->train_images == NULL)
        return fl_fail(FL_EINVAL, "--test-images/--test-labels need --train-images and "
                                  "--train-labels (IDX)");
    if (a->test_csv != NULL && a->train_csv == NULL)
        return fl_fail(FL_EINVAL, "--test-csv needs --train-csv");
    if (a->train_csv != NULL && a->train_images != NULL)
        return fl_fail(FL_EINVAL, "--train-csv and --train-images: choose one data format");
    if ((a->train_images != NULL) != (a->train_labels != NULL))
        return fl_fail(FL_EINVAL, "--train-images and --train-labels go together");
    return FL_OK;
}

static int load_data(const wargs_t *a, wjob_t *j)
{
    int rc = check_data_flags(a);
    if (rc != FL_OK)
        return rc;
    if (a->train_images != NULL) {
        j->have_test = a->test_images != NULL;
        rc = fl_data_idx(a->train_images, a->train_labels, &j->train);
        if (rc == FL_OK && j->have_test)
            rc = fl_data_idx(a->test_images, a->test_labels, &j->test);
        return rc;
    }
    if (a->train_csv != NULL) {
        j->have_test = a->test_csv != NULL;
        rc = fl_data_csv(a->train_csv, &j->train);
        if (rc == FL_OK && j->have_test)
            rc = fl_data_csv(a->test_csv, &j->test);
        return rc;
    }
    j->have_test = true;
    return fl_data_builtin(a->data_seed, &j->train, &j->test);
}

/* The training job's data, and what every rank must agree on: the model's signature and the
 * settings. An exit code: 0, or 2 or 1 after saying why. */
static int prepare(wargs_t *a, wjob_t *j)
{
    int rc = load_data(a, j);
    if (rc != FL_OK)
        return failed(exit_code(rc));
    a->to.mode = (fl_wk_mode_t)a->mode;
    /* The signature the rendezvous compares, also with a parameter server's --init. */
    fl_model_shapes_t shapes;
    fl_model_shapes_init(&shapes);
    rc = fl_mlp_shapes(&a->to.shape, &shapes);
    a->co.model_signature = fl_model_shapes_signature(fl_model_shapes_text(&shapes));
    fl_model_shapes_deinit(&shapes);
    if (rc != FL_OK)
        return failed(1);
    if (fl_wk_settings(&a->to, &j->train, a->settings, sizeof a->settings) != FL_OK)
        return usage_error();
    a->co.settings = a->settings;
    return 0;
}

/* The lines after the summary's two, for what this run used. */
static void summary_more(int rank, const fl_wk_train_result_t *r)
{
    if (r->first_leg != NULL && r->first_leg[0] != '\0')
        printf("rank %d first leg inside the host: %s, %s%s%s\n", rank, r->first_leg,
               r->first_leg_overlapped ? "bucket by bucket during the backward pass (--overlap)"
                                       : "after the backward pass",
               r->topk_on_devices ? "; each shard's top-k on its device" : "",
               r->params_gathered_on_devices ? "; the updated ranges all-gathered on the devices"
                                             : "");
    if (r->gathers > 0)
        printf("rank %d --shard full: %llu layer gathers, %.0f%% ready before the device asked "
               "(prefetch), devices waited %.2f ms per step for the rest\n",
               rank, (unsigned long long)r->gathers,
               100.0 * (double)r->gathers_ready / (double)r->gathers, r->gather_wait_ms);
    if (r->run_ahead_max > 0 || r->throttles > 0)
        printf("rank %d --policy async: devices started up to %d round(s) beyond the last "
               "completed averaging; %ld round starts waited at the bound, %.1f ms in all\n",
               rank, r->run_ahead_max, r->throttles, r->throttled_ms);
    if (r->divergence > 0)
        printf("rank %d last averaging: weight-space divergence %.4g (||before - after|| / "
               "||after||, the device that strayed most)\n",
               rank, r->divergence);
}

static void summary(int rank, const fl_wk_train_result_t *r, bool have_test)
{
    double hidden = r->comm_ms > 0 ? 100.0 * (1.0 - r->exposed_ms / r->comm_ms) : 0.0;
    char acc[96];
    if (!have_test)
        snprintf(acc, sizeof acc, "no test set (give --test-images/--test-labels or --test-csv)");
    else if (isnan(r->test_acc))
        snprintf(acc, sizeof acc, "test accuracy on rank 0");
    else
        snprintf(acc, sizeof acc, "test accuracy %.2f%% (loss %.4f)", 100.0 * r->test_acc,
                 r->test_loss);
    char sent[160];
    if (r->bytes_sent == 0)
        snprintf(sent, sizeof sent, "nothing exchanged");
    else
        snprintf(sent, sizeof sent,
                 "sent %.1f MiB (%.3f MiB to other hosts), dense would send "
                 "%.1f MiB (%.1fx less)",
                 (double)r->bytes_sent / 1048576.0, (double)r->remote_bytes / 1048576.0,
                 (double)r->raw_bytes / 1048576.0, (double)r->raw_bytes / (double)r->bytes_sent);
    printf("rank %d summary: %d epochs, %ld steps, %s, %.1f s, %.0f samples/s; per step compute "
           "%.2f ms, exchange %.2f ms (exposed %.2f ms, %.0f%% hidden); %s\n",
           rank, r->epochs, r->steps, acc, r->seconds, r->samples_per_s, r->compute_ms, r->comm_ms,
           r->exposed_ms, hidden < 0 ? 0 : hidden, sent);
    char dev_mem[128] = "";
    if (r->mem_device_total > 0)
        snprintf(dev_mem, sizeof dev_mem,
                 "; in use on the device (its own count) %.2f MiB of "
                 "%.0f MiB",
                 (double)r->mem_device_used / 1048576.0, (double)r->mem_device_total / 1048576.0);
    printf("rank %d memory per device: parameters %.2f MiB, gradients %.2f MiB, optimizer state "
           "%.2f MiB, residuals %.2f MiB%s\n",
           rank, (double)r->mem_params / 1048576.0, (double)r->mem_grads / 1048576.0,
           (double)r->mem_opt_state / 1048576.0, (double)r->mem_residual / 1048576.0, dev_mem);
    summary_more(rank, r);
    fflush(stdout);
}

/* The parameter-server client's options; shapes holds the text model_shapes points into. */
static int ps_client_opts(const wargs_t *a, fl_model_shapes_t *shapes, fl_ps_client_opts_t *po)
{
    fl_ps_client_opts_init(po);
    po->rank = a->co.rank;
    po->world_size = a->co.world_size;
    po->coordinator = a->co.coordinator;
    po->job_id = a->co.job_id;
    po->curve_dir = a->co.curve_dir;
    po->host = a->co.host;
    po->param_count = fl_mlp_nparams(&a->to.shape);
    po->model_signature = a->co.model_signature;
    po->settings = a->co.settings;
    /* The parameter server's --init file is checked against these, tensor by tensor. */
    int rc = fl_mlp_shapes(&a->to.shape, shapes);
    po->model_shapes = fl_model_shapes_text(shapes);
    po->timeout_ms = a->co.timeout_ms;
    po->rendezvous_timeout_ms = a->co.rendezvous_timeout_ms;
    po->reconnect_timeout_ms = a->reconnect_ms;
    po->values = a->to.topk_values;
    po->lz4 = a->lz4;
    po->log_level = a->co.log_level;
    return rc;
}

/* --mode ps: a parameter-server client instead of a communicator. An exit code. */
static int run_ps(wargs_t *a, wjob_t *j)
{
    fl_ps_client_opts_t po;
    fl_model_shapes_t shapes;
    fl_model_shapes_init(&shapes);
    int rc = ps_client_opts(a, &shapes, &po);
    fl_ps_client_t *cl = NULL;
    if (rc == FL_OK)
        rc = fl_ps_client_create(&po, &cl);
    fl_model_shapes_deinit(&shapes);
    if (rc == FL_OK) {
        fl_wk_train_result_t res;
        rc = fl_wk_train_ps(cl, po.rank, po.world_size, &j->train, j->have_test ? &j->test : NULL,
                            &a->to, &res);
        if (rc == FL_OK && !a->to.quiet)
            summary(po.rank, &res, j->have_test);
    }
    if (rc != FL_OK) {
        fprintf(stderr, "flodl-worker: %s\n", fl_last_error());
        fl_ps_client_abort(cl, rc, fl_last_error());
    }
    fl_ps_client_destroy(&cl);
    return exit_code(rc);
}

/* A networked run's process limits, plain-text notice and (but for --mode ps, whose client
 * connects as it starts) communicator. An exit code. */
static int join(wargs_t *a, wjob_t *j)
{
    if (a->mode == FL_WK_MODE_LOCAL)
        return 0;
    fl_fdlimit_start("flodl-worker", a->co.log_level);
    if (a->co.curve_dir == NULL)
        fl_cli_security_notice("flodl-worker");
    if (a->mode == FL_WK_MODE_PS)
        return 0;
    int rc = fl_comm_init(&a->co, &j->comm);
    /* A refusal (another job, world size or model) is a configuration error. */
    return rc == FL_OK ? 0 : failed(exit_code(rc));
}

static int train(wargs_t *a, wjob_t *j, int rank)
{
    fl_wk_train_result_t res;
    a->to.device_timeout_ms = a->co.timeout_ms;
    int rc = fl_wk_train(j->comm, &j->train, j->have_test ? &j->test : NULL, &a->to, &res);
    if (rc == FL_OK && !a->to.quiet)
        summary(rank, &res, j->have_test);
    return rc;
}

/* Trains, or runs the drill, with the metrics endpoint and timeline asked for. An exit code. */
static int run(wargs_t *a, wjob_t *j)
{
    int rank = j->comm != NULL ? fl_comm_rank(j->comm) : 0;
    wobs_t wo;
    int code;
    int rc = wobs_start(a, rank, &wo);
    if (rc != FL_OK) {
        code = exit_code(rc);
    } else if (a->mode == FL_WK_MODE_DRILL) {
        rc = fl_wk_drill_run(j->comm, &a->d);
        code = rc == FL_OK ? 0 : 1; /* its refusals are its flags', already checked */
    } else {
        rc = train(a, j, rank);
        code = exit_code(rc);
    }
    if (rc != FL_OK) {
        failed(code);
        /* The others hear it now (the coordinator passes it on), not at their deadline. */
        fl_comm_abort(j->comm, rc, fl_last_error());
    }
    if (wobs_stop(&wo) != FL_OK)
        code = failed(code != 0 ? code : 1);
    return code;
}

int main(int argc, char **argv)
{
    wargs_t a;
    wargs_what_t what = WARGS_RUN;
    fl_wk_args_init(&a);
    if (from_env(&a) != FL_OK || fl_wk_args_parse(&a, argc, argv, &what) != FL_OK)
        return usage_error();
    if (what == WARGS_HELP) {
        fl_wk_args_help(stdout);
        return 0;
    }
    if (what == WARGS_VERSION)
        return fl_cli_version("flodl-worker");
    if (settle(&a) != FL_OK)
        return usage_error();
    /* One BLAS thread per process: the devices are threads of their own and the ranks share
     * the machine's cores. */
    openblas_set_num_threads(1);
    wjob_t j;
    memset(&j, 0, sizeof j);
    /* The drill has no data and no model: the training code never sees its mode. */
    int code = a.mode == FL_WK_MODE_DRILL ? 0 : prepare(&a, &j);
    if (code == 0)
        code = join(&a, &j);
    if (code == 0)
        code = a.mode == FL_WK_MODE_PS ? run_ps(&a, &j) : run(&a, &j);
    fl_comm_destroy(&j.comm);
    fl_dataset_free(&j.train);
    fl_dataset_free(&j.test);
    return code;
}
