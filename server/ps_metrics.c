/* flodl-ps's metrics endpoint (--metrics-port): the coordinator's view of every rank (state,
 * silence, collectives done, lag behind the furthest rank) and the parameter-server shards'
 * counters, refreshed from their snapshots at every scrape; /healthz fails while a rank is
 * dead, on the metrics port and on the health listener (--health-port). */
#include "ps_metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_obs.h"

#define MAX_RANK_SERIES 1000 /* per-rank series for the first ranks; totals cover all */

struct ps_metrics {
    fl_obs_t *obs;
    fl_obs_http_t *http;
    fl_obs_healthz_t *healthz;
    fl_coord_t *coord;
    fl_ps_server_t *srv;
    int world;
    fl_coord_rank_info_t *ranks;
    /* /healthz runs on the metrics thread and on the health listener's: its own copy. */
    pthread_mutex_t health_mu;
    fl_coord_rank_info_t *hranks;
    bool failed; /* a series could not be registered */
    uint64_t auth_coord;
    int state_ids[4];
    int started, auth, dropped, pushes, pulls, refused, ckpts, timeouts, srv_bad;
    int bad[FL_STAT_COUNT]; /* the coordinator's refusals by kind; -1: not a refusal counter */
    int up[MAX_RANK_SERIES], silent[MAX_RANK_SERIES], seq[MAX_RANK_SERIES], lag[MAX_RANK_SERIES];
};

static const char *const state_name[4] = {"absent", "alive", "dead", "left"};

static void refresh(fl_obs_t *o, void *ud)
{
    ps_metrics_t *m = ud;
    uint64_t auth_shards = 0;
    uint64_t dropped = m->coord != NULL ? fl_coord_stat(m->coord, FL_STAT_CONN_DROPPED) : 0;
    if (m->coord != NULL) {
        fl_coord_info_t in;
        fl_coord_get_info(m->coord, &in, m->ranks, m->world);
        fl_obs_set(o, m->state_ids[FL_COORD_RANK_ABSENT], in.world - in.registered);
        fl_obs_set(o, m->state_ids[FL_COORD_RANK_ALIVE], in.alive);
        fl_obs_set(o, m->state_ids[FL_COORD_RANK_DEAD], in.dead);
        fl_obs_set(o, m->state_ids[FL_COORD_RANK_LEFT], in.left);
        fl_obs_set(o, m->started, in.started);
        for (int k = 0; k < FL_STAT_COUNT; k++)
            if (m->bad[k] >= 0)
                fl_obs_set(o, m->bad[k], (double)fl_coord_stat(m->coord, (fl_stat_t)k));
        m->auth_coord = in.auth_refused;
        uint64_t furthest = 0;
        for (int r = 0; r < m->world; r++)
            furthest = m->ranks[r].op_seq > furthest ? m->ranks[r].op_seq : furthest;
        for (int r = 0; r < m->world && r < MAX_RANK_SERIES; r++) {
            const fl_coord_rank_info_t *k = &m->ranks[r];
            fl_obs_set(o, m->up[r], k->state == FL_COORD_RANK_ALIVE);
            fl_obs_set(o, m->silent[r], k->silent_s);
            fl_obs_set(o, m->seq[r], (double)k->op_seq);
            fl_obs_set(o, m->lag[r], (double)(furthest - k->op_seq));
        }
    }
    if (m->srv != NULL) {
        fl_ps_server_stats_t st;
        fl_ps_server_get_stats(m->srv, &st);
        fl_obs_set(o, m->pushes, (double)st.pushes);
        fl_obs_set(o, m->pulls, (double)st.pulls);
        fl_obs_set(o, m->refused, (double)st.refused);
        fl_obs_set(o, m->ckpts, (double)st.checkpoints);
        fl_obs_set(o, m->timeouts, (double)st.timeouts);
        fl_obs_set(o, m->srv_bad, (double)st.bad_msgs);
        auth_shards = st.auth_refused;
        dropped += st.conn_dropped;
    }
    fl_obs_set(o, m->auth, (double)(m->auth_coord + auth_shards));
    fl_obs_set(o, m->dropped, (double)dropped);
}

static bool healthy(void *ud, char *why, size_t cap)
{
    ps_metrics_t *m = ud;
    if (m->coord == NULL)
        return true;
    fl_coord_info_t in;
    bool ok = true;
    pthread_mutex_lock(&m->health_mu);
    fl_coord_get_info(m->coord, &in, m->hranks, m->world);
    for (int r = 0; r < m->world && ok; r++) {
        if (m->hranks[r].state == FL_COORD_RANK_DEAD) {
            snprintf(why, cap, "rank %d (%s) is dead", r, m->hranks[r].host);
            ok = false;
        }
    }
    pthread_mutex_unlock(&m->health_mu);
    return ok;
}

static int add(ps_metrics_t *m, const char *name, const char *help, fl_obs_kind_t kind,
               const char *labels)
{
    int id = fl_obs_add(m->obs, name, help, kind, labels);
    if (id < 0)
        m->failed = true;
    return id;
}

static void register_all(ps_metrics_t *m)
{
    char l[128];
    for (int s = 0; s < 4; s++) {
        snprintf(l, sizeof l, "state=\"%s\"", state_name[s]);
        m->state_ids[s] = add(m, "flodl_ps_ranks", "Ranks of the job by state", FL_OBS_GAUGE, l);
    }
    m->started = add(m, "flodl_ps_job_started", "1 once every rank registered", FL_OBS_GAUGE, NULL);
    /* By kind, as the workers' flodl_bad_messages_total; refused connections have a series
     * of their own (flodl_ps_auth_refused_total, flodl_ps_conn_dropped_total). */
    for (int k = 0; k < FL_STAT_COUNT; k++) {
        m->bad[k] = -1;
        if (k < FL_STAT_BAD_HEADER || k == FL_STAT_ERRORS_SENT || k == FL_STAT_AUTH_REFUSED ||
            k == FL_STAT_CONN_DROPPED)
            continue;
        snprintf(l, sizeof l, "kind=\"%s\"", fl_stat_name((fl_stat_t)k));
        m->bad[k] = add(m, "flodl_ps_bad_messages_total",
                        "Messages the coordinator refused, by kind (malformed: bad_header, "
                        "bad_magic, bad_version, bad_frames, oversized; another job or "
                        "generation: bad_job; out of place: unexpected)",
                        FL_OBS_COUNTER, l);
    }
    m->auth = add(m, "flodl_ps_auth_refused_total",
                  "Connections refused by CURVE (a client key not allowed), coordinator and shards",
                  FL_OBS_COUNTER, NULL);
    m->dropped = add(m, "flodl_ps_conn_dropped_total",
                     "Connections closed in their handshake: over the caps per address and in "
                     "all on connections not yet authenticated",
                     FL_OBS_COUNTER, NULL);
    m->pushes = add(m, "flodl_ps_pushes_total", "Pushes the shards took", FL_OBS_COUNTER, NULL);
    m->pulls = add(m, "flodl_ps_pulls_total", "Pull replies sent", FL_OBS_COUNTER, NULL);
    m->refused = add(m, "flodl_ps_refused_total", "Requests refused with an error reply",
                     FL_OBS_COUNTER, NULL);
    m->ckpts =
        add(m, "flodl_ps_checkpoints_total", "Shard checkpoints written", FL_OBS_COUNTER, NULL);
    m->timeouts = add(m, "flodl_ps_pull_timeouts_total", "Pulls that waited past their deadline",
                      FL_OBS_COUNTER, NULL);
    m->srv_bad = add(m, "flodl_ps_shard_bad_messages_total",
                     "Messages the shards' transport refused", FL_OBS_COUNTER, NULL);
    for (int r = 0; r < m->world && r < MAX_RANK_SERIES; r++) {
        snprintf(l, sizeof l, "rank=\"%d\"", r);
        m->up[r] = add(m, "flodl_ps_rank_up", "1 while the rank is alive", FL_OBS_GAUGE, l);
        m->silent[r] = add(m, "flodl_ps_rank_silent_seconds",
                           "Seconds since the rank was last heard from", FL_OBS_GAUGE, l);
        m->seq[r] = add(m, "flodl_ps_rank_collectives_total",
                        "Collectives the rank has started (its latest heartbeat's count)",
                        FL_OBS_COUNTER, l);
        m->lag[r] =
            add(m, "flodl_ps_rank_lag", "Collectives behind the furthest rank", FL_OBS_GAUGE, l);
    }
}

int ps_metrics_start(const char *bind, int port, int health_port, fl_coord_t *coord,
                     fl_ps_server_t *srv, int world, ps_metrics_t **out)
{
    *out = NULL;
    ps_metrics_t *m = calloc(1, sizeof *m);
    if (m == NULL)
        return fl_fail(FL_ENOMEM, "metrics: out of memory");
    m->coord = coord;
    m->srv = srv;
    m->world = coord != NULL ? world : 0;
    pthread_mutex_init(&m->health_mu, NULL);
    m->ranks = calloc((size_t)(m->world > 0 ? m->world : 1), sizeof *m->ranks);
    m->hranks = calloc((size_t)(m->world > 0 ? m->world : 1), sizeof *m->hranks);
    int rc = m->ranks != NULL && m->hranks != NULL ? fl_obs_create(&m->obs)
                                                   : fl_fail(FL_ENOMEM, "out of memory");
    if (rc == FL_OK)
        rc = fl_obs_add_process(m->obs);
    if (rc == FL_OK) {
        register_all(m);
        if (m->failed)
            rc =
                fl_fail(FL_EINVAL, "metrics: could not register every series: %s", fl_last_error());
    }
    if (rc == FL_OK) {
        fl_obs_on_render(m->obs, refresh, m);
        if (port >= 0)
            rc = fl_obs_http_start(m->obs, bind, port, healthy, m, &m->http);
    }
    if (rc == FL_OK && health_port >= 0)
        rc = fl_obs_healthz_start(bind, health_port, healthy, m, &m->healthz);
    if (rc != FL_OK) {
        ps_metrics_stop(&m);
        return rc;
    }
    *out = m;
    return FL_OK;
}

int ps_metrics_port(const ps_metrics_t *m)
{
    return m->http != NULL ? fl_obs_http_port(m->http) : -1;
}

int ps_metrics_health_port(const ps_metrics_t *m)
{
    return m->healthz != NULL ? fl_obs_healthz_port(m->healthz) : -1;
}

void ps_metrics_stop(ps_metrics_t **pm)
{
    if (pm == NULL || *pm == NULL)
        return;
    ps_metrics_t *m = *pm;
    fl_obs_healthz_stop(&m->healthz);
    fl_obs_http_stop(&m->http);
    fl_obs_destroy(&m->obs);
    pthread_mutex_destroy(&m->health_mu);
    free(m->hranks);
    free(m->ranks);
    free(m);
    *pm = NULL;
}
