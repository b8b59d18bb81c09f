/* server/ps_state.c, ps_apply.c, ps_payload.c: a shard's consistency rules and updates without
 * sockets. Sync averaging (rank order, batch weights) gives bit for bit what a local SGD or
 * Adam computation gives, whatever order the pushes arrive in and across block boundaries;
 * async applies each push scaled; SSP never lets a rank run more than s steps ahead; bad
 * pushes and pulls are refused with a reason and change nothing; copy on write protects
 * replies in flight; payloads are checked before use. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_cmp.h"
#include "fl_msg.h"
#include "ps_int.h"
#include "testutil.h"

#define N 5000 /* crosses the apply pass's 2048-float blocks */

static ps_state_t *make_state(int world, fl_ps_consistency_t c, uint32_t s, fl_opt_kind_t k,
                              uint64_t count)
{
    ps_state_opts_t o;
    memset(&o, 0, sizeof o);
    o.count = count;
    o.world = world;
    o.consistency = c;
    o.staleness = s;
    fl_opt_opts_init(&o.opt);
    o.opt.kind = k;
    if (k == FL_OPT_SGD) {
        o.opt.momentum = 0.9;
        o.opt.weight_decay = 0.001;
    }
    fl_lr_sched_init(&o.lr, 0.05);
    o.lr.kind = FL_LR_STEP;
    o.lr.step_size = 2;
    o.lr.gamma = 0.5;
    ps_state_t *st = NULL;
    ck_assert_msg(fl_ps__state_create(&o, &st) == FL_OK, "%s", fl_last_error());
    return st;
}

static fl_opt_t *make_ref_opt(fl_opt_kind_t k, size_t count)
{
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    o.kind = k;
    if (k == FL_OPT_SGD) {
        o.momentum = 0.9;
        o.weight_decay = 0.001;
    }
    fl_opt_t *opt = NULL;
    ck_assert(fl_opt_create(&o, count, &opt) == FL_OK);
    return opt;
}

static double ref_lr(long step)
{
    fl_lr_sched_t s;
    fl_lr_sched_init(&s, 0.05);
    s.kind = FL_LR_STEP;
    s.step_size = 2;
    s.gamma = 0.5;
    return fl_lr_at(&s, step);
}

static void dense_src(ps_src_t *s, const float *g, uint32_t batch)
{
    memset(s, 0, sizeof *s);
    s->kind = PS_SRC_F32;
    s->dense = g;
    s->batch = batch;
    double m = 0;
    for (int i = 0; i < N; i++)
        m = fabs(g[i]) > m ? fabs(g[i]) : m;
    s->maxabs = m;
}

static void push_ok(ps_state_t *st, int rank, uint64_t step, ps_src_t *src, bool *updated)
{
    char why[256] = "";
    ck_assert_msg(fl_ps__state_check_push(st, rank, step, why, sizeof why) == FL_OK, "%s", why);
    ck_assert_msg(fl_ps__state_push(st, rank, step, src, updated) == FL_OK, "%s", fl_last_error());
}

/* Sync, W = 3, SGD with momentum (and Adam): the shard's parameters after each step are the
 * local computation's bits, pushes arriving in a shuffled order each step. */
static void sync_exact(fl_opt_kind_t kind, bool equal_batches)
{
    enum { W = 3, STEPS = 5 };
    uint64_t seed = 7;
    static float init[N], ref[N], g[W][N], avg[N];
    for (int i = 0; i < N; i++)
        init[i] = ref[i] = (float)fl_test_uniform(&seed);
    ps_state_t *st = make_state(W, FL_PS_SYNC, 0, kind, N);
    ck_assert(fl_ps__state_init(st, init, 0) == FL_OK);
    fl_opt_t *opt = make_ref_opt(kind, N);
    uint32_t batch[W] = {32, 32, 32};
    if (!equal_batches)
        batch[0] = 10, batch[1] = 7, batch[2] = 25;
    int mismatches = 0;
    for (int step = 0; step < STEPS; step++) {
        for (int r = 0; r < W; r++)
            for (int i = 0; i < N; i++)
                g[r][i] = (float)fl_test_uniform(&seed) * (float)(r + 1);
        /* The local computation the shard must match. */
        float total = (float)(batch[0] + batch[1] + batch[2]);
        for (int i = 0; i < N; i++) {
            float acc;
            if (equal_batches) {
                acc = g[0][i];
                acc = acc + g[1][i];
                acc = acc + g[2][i];
                avg[i] = acc / 3.0f;
            } else {
                acc = (float)batch[0] * g[0][i];
                acc = acc + (float)batch[1] * g[1][i];
                acc = acc + (float)batch[2] * g[2][i];
                avg[i] = acc / total;
            }
        }
        ck_assert(fl_opt_step(opt, ref, avg, ref_lr(step)) == FL_OK);
        int order[W] = {2, 0, 1};
        if (step % 2)
            order[0] = 1, order[1] = 2, order[2] = 0;
        for (int k = 0; k < W; k++) {
            int r = order[k];
            ps_src_t src;
            dense_src(&src, g[r], batch[r]);
            bool updated;
            push_ok(st, r, (uint64_t)step, &src, &updated);
            ck_assert(updated == (k == W - 1));
        }
        ck_assert_uint_eq(fl_ps__state_version(st), (uint64_t)step + 1);
        ck_assert_uint_eq(fl_ps__state_min_clock(st), (uint64_t)step + 1);
        mismatches += memcmp(fl_ps__params_data(fl_ps__state_params(st)), ref, sizeof ref) != 0;
    }
    ck_assert_int_eq(mismatches, 0);
    fl_opt_destroy(&opt);
    fl_ps__state_destroy(&st);
}

START_TEST(test_sync_sgd_exact)
{
    sync_exact(FL_OPT_SGD, true);
}
END_TEST

START_TEST(test_sync_adam_exact)
{
    sync_exact(FL_OPT_ADAM, true);
}
END_TEST

START_TEST(test_sync_weighted_exact)
{
    sync_exact(FL_OPT_SGD, false);
}
END_TEST

/* One rank: the average is the gradient itself, bit for bit. */
START_TEST(test_sync_single_rank_is_local_training)
{
    static float init[N], ref[N], g[N];
    uint64_t seed = 3;
    for (int i = 0; i < N; i++)
        init[i] = ref[i] = (float)fl_test_uniform(&seed);
    ps_state_t *st = make_state(1, FL_PS_SYNC, 0, FL_OPT_ADAMW, N);
    ck_assert(fl_ps__state_init(st, init, 0) == FL_OK);
    fl_opt_t *opt = make_ref_opt(FL_OPT_ADAMW, N);
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)fl_test_uniform(&seed);
        ck_assert(fl_opt_step(opt, ref, g, ref_lr(step)) == FL_OK);
        ps_src_t src;
        dense_src(&src, g, 17); /* a batch count that is not a power of two */
        bool updated;
        push_ok(st, 0, (uint64_t)step, &src, &updated);
    }
    ck_assert_int_eq(memcmp(fl_ps__params_data(fl_ps__state_params(st)), ref, sizeof ref), 0);
    fl_opt_destroy(&opt);
    fl_ps__state_destroy(&st);
}
END_TEST

static int released;
static void count_release(void *ud)
{
    (void)ud;
    released++;
}

START_TEST(test_sync_pull_waits_for_the_slow_rank)
{
    static float init[N], g[N];
    ps_state_t *st = make_state(3, FL_PS_SYNC, 0, FL_OPT_SGD, N);
    int blocker;
    uint64_t bstep;
    char why[256] = "";
    /* No parameters yet: everyone waits for rank 0. */
    ck_assert_int_eq(fl_ps__state_check_pull(st, 1, 0, true, &blocker, &bstep, why, sizeof why),
                     FL_ETIMEDOUT);
    ck_assert_int_eq(blocker, 0);
    ck_assert_int_eq(fl_ps__state_check_push(st, 1, 0, why, sizeof why), FL_EINVAL);
    ck_assert_msg(strstr(why, "initial parameters") != NULL, "%s", why);
    ck_assert(fl_ps__state_init(st, init, 0) == FL_OK);
    ck_assert_int_eq(fl_ps__state_init(st, init, 0), FL_EINVAL); /* only once */

    released = 0;
    ps_src_t a, b;
    dense_src(&a, g, 1);
    dense_src(&b, g, 1);
    a.release = b.release = count_release;
    bool updated;
    push_ok(st, 0, 0, &a, &updated);
    push_ok(st, 2, 0, &b, &updated);
    ck_assert(!updated);
    ck_assert_int_eq(released, 0); /* held until the step completes */
    /* Rank 0 wants step 1's parameters: rank 1 has not pushed step 0. */
    ck_assert_int_eq(fl_ps__state_check_pull(st, 0, 1, false, &blocker, &bstep, why, sizeof why),
                     FL_ETIMEDOUT);
    ck_assert_int_eq(blocker, 1);
    ck_assert_uint_eq(bstep, 0);
    /* Step 0's parameters are there for anyone. */
    ck_assert_int_eq(fl_ps__state_check_pull(st, 0, 0, false, &blocker, &bstep, why, sizeof why),
                     FL_OK);
    /* A pull ahead of the rank's own pushes could never be answered. */
    ck_assert_int_eq(fl_ps__state_check_pull(st, 1, 1, false, &blocker, &bstep, why, sizeof why),
                     FL_EINVAL);
    ck_assert_msg(strstr(why, "rank 1") != NULL && strstr(why, "(none)") != NULL, "%s", why);
    /* The step pushed last, again, is a retry (acknowledged, ignored); the next step before
     * this one completes, and a future one, are refused and change nothing. */
    ck_assert_int_eq(fl_ps__state_check_push(st, 0, 0, why, sizeof why), PS_PUSH_DUPLICATE);
    ck_assert_int_eq(fl_ps__state_check_push(st, 0, 1, why, sizeof why), FL_EINVAL);
    ck_assert_msg(strstr(why, "staleness bound 0") != NULL, "%s", why);
    ck_assert_int_eq(fl_ps__state_check_push(st, 1, 1, why, sizeof why), FL_EINVAL);
    ck_assert_msg(strstr(why, "staleness bound 0") != NULL, "%s", why);
    ck_assert_uint_eq(fl_ps__state_version(st), 0);
    ck_assert_int_eq(released, 0);

    ps_src_t c;
    dense_src(&c, g, 1);
    c.release = count_release;
    push_ok(st, 1, 0, &c, &updated);
    ck_assert(updated);
    ck_assert_int_eq(released, 3);
    ck_assert_int_eq(fl_ps__state_check_pull(st, 0, 1, false, &blocker, &bstep, why, sizeof why),
                     FL_OK);
    /* Steps before the last one are refused. */
    dense_src(&a, g, 1);
    push_ok(st, 0, 1, &a, &updated);
    ck_assert_int_eq(fl_ps__state_check_push(st, 0, 0, why, sizeof why), FL_EINVAL);
    ck_assert_msg(strstr(why, "already") != NULL, "%s", why);
    fl_ps__state_destroy(&st);
}
END_TEST

/* Async: every push applied on arrival with 1/W, the learning rate of its own step. */
START_TEST(test_async_applies_each_push)
{
    enum { W = 2 };
    static float init[N], ref[N], g[N], scaled[N];
    uint64_t seed = 11;
    for (int i = 0; i < N; i++)
        init[i] = ref[i] = (float)fl_test_uniform(&seed);
    ps_state_t *st = make_state(W, FL_PS_ASYNC, 0, FL_OPT_SGD, N);
    ck_assert(fl_ps__state_init(st, init, 0) == FL_OK);
    fl_opt_t *opt = make_ref_opt(FL_OPT_SGD, N);
    /* rank 0 runs three steps ahead of rank 1: nobody waits. */
    const int ranks[] = {0, 0, 0, 1, 0, 1};
    const uint64_t steps[] = {0, 1, 2, 0, 3, 1};
    for (int p = 0; p < 6; p++) {
        for (int i = 0; i < N; i++) {
            g[i] = (float)fl_test_uniform(&seed);
            scaled[i] = g[i] * 0.5f;
        }
        ck_assert(fl_opt_step(opt, ref, scaled, ref_lr((long)steps[p])) == FL_OK);
        ps_src_t src;
        dense_src(&src, g, 8);
        bool updated;
        push_ok(st, ranks[p], steps[p], &src, &updated);
        ck_assert(updated);
        int blocker;
        uint64_t bs;
        char why[128];
        ck_assert_int_eq(fl_ps__state_check_pull(st, 1, 0, false, &blocker, &bs, why, sizeof why),
                         FL_OK);
    }
    ck_assert_uint_eq(fl_ps__state_version(st), 6);
    ck_assert_int_eq(memcmp(fl_ps__params_data(fl_ps__state_params(st)), ref, sizeof ref), 0);
    /* Going back is refused, the last step again is a retry, jumping ahead is allowed within
     * reason. */
    char why[256];
    ck_assert_int_eq(fl_ps__state_check_push(st, 0, 2, why, sizeof why), FL_EINVAL);
    ck_assert_int_eq(fl_ps__state_check_push(st, 0, 3, why, sizeof why), PS_PUSH_DUPLICATE);
    ck_assert_int_eq(fl_ps__state_check_push(st, 1, 40, why, sizeof why), FL_OK);
    ck_assert_int_eq(fl_ps__state_check_push(st, 1, UINT64_MAX, why, sizeof why), FL_EINVAL);
    ck_assert_int_eq(fl_ps__state_check_push(st, 1, 2 + PS_MAX_STEP_JUMP + 1, why, sizeof why),
                     FL_EINVAL);
    ck_assert_msg(strstr(why, "beyond its last") != NULL, "%s", why);
    fl_opt_destroy(&opt);
    fl_ps__state_destroy(&st);
}
END_TEST

/* SSP with s = 2: a fast rank gets the parameters for step t while the slowest rank has
 * completed t - 2 steps, and is held at exactly t = slowest + 3. */
START_TEST(test_ssp_bound_is_exact)
{
    enum { W = 3, S = 2 };
    static float init[N], g[N];
    ps_state_t *st = make_state(W, FL_PS_SSP, S, FL_OPT_SGD, N);
    ck_assert(fl_ps__state_init(st, init, 0) == FL_OK);
    int blocker;
    uint64_t bs;
    char why[256];
    /* Ranks 1 and 2 complete 4 steps; rank 0 none. */
    for (int r = 1; r < W; r++) {
        for (uint64_t t = 0; t < 4; t++) {
            int rc = fl_ps__state_check_push(st, r, t, why, sizeof why);
            if (t <= S) {
                ck_assert_msg(rc == FL_OK, "%s", why);
                ps_src_t src;
                dense_src(&src, g, 1);
                bool updated;
                ck_assert(fl_ps__state_push(st, r, t, &src, &updated) == FL_OK);
            } else {
                /* Pushing step 3 with rank 0 at 0 completed steps exceeds the bound. */
                ck_assert_int_eq(rc, FL_EINVAL);
                ck_assert_msg(strstr(why, "staleness bound 2") != NULL &&
                                  strstr(why, "slowest rank 0") != NULL,
                              "%s", why);
            }
        }
    }
    /* Ranks 1 and 2 have pushed steps 0..2, their clock is 3. Pulls for step t: allowed while
     * t - 2 <= 0 (rank 0's completed steps). */
    ck_assert_int_eq(fl_ps__state_check_pull(st, 1, 2, false, &blocker, &bs, why, sizeof why),
                     FL_OK);
    ck_assert_int_eq(fl_ps__state_check_pull(st, 1, 3, false, &blocker, &bs, why, sizeof why),
                     FL_ETIMEDOUT);
    ck_assert_int_eq(blocker, 0);
    ck_assert_uint_eq(bs, 0);
    /* Rank 0 completes one step: step 3 opens, step 4 does not. */
    ps_src_t src;
    dense_src(&src, g, 1);
    bool updated;
    push_ok(st, 0, 0, &src, &updated);
    ck_assert_int_eq(fl_ps__state_check_pull(st, 1, 3, false, &blocker, &bs, why, sizeof why),
                     FL_OK);
    ck_assert_int_eq(fl_ps__state_check_push(st, 2, 3, why, sizeof why), FL_OK);
    dense_src(&src, g, 1);
    ck_assert(fl_ps__state_push(st, 2, 3, &src, &updated) == FL_OK);
    ck_assert_int_eq(fl_ps__state_check_pull(st, 2, 4, false, &blocker, &bs, why, sizeof why),
                     FL_ETIMEDOUT);
    ck_assert_int_eq(blocker, 0);
    ck_assert_uint_eq(bs, 1);
    fl_ps__state_destroy(&st);
}
END_TEST

/* Sparse and half-precision sources give what the dense float32 equivalent gives. */
START_TEST(test_sparse_and_half_sources)
{
    enum { W = 3 };
    static float init[N], gd[W][N], a[N];
    uint64_t seed = 5;
    for (int i = 0; i < N; i++)
        init[i] = (float)fl_test_uniform(&seed);
    /* rank 0 sparse (every 7th entry), rank 1 dense float16-exact values, rank 2 bfloat16. */
    static uint32_t idx[N];
    static float val[N];
    size_t k = 0;
    static uint16_t h[N], bh[N];
    for (int i = 0; i < N; i++) {
        float v = (float)fl_test_uniform(&seed);
        gd[0][i] = 0;
        if (i % 7 == 3) {
            gd[0][i] = v;
            idx[k] = (uint32_t)i;
            val[k++] = v;
        }
        h[i] = fl_f32_to_f16((float)fl_test_uniform(&seed));
        gd[1][i] = fl_f16_to_f32(h[i]);
        bh[i] = fl_f32_to_bf16((float)fl_test_uniform(&seed));
        gd[2][i] = fl_bf16_to_f32(bh[i]);
    }
    ps_state_t *mixed = make_state(W, FL_PS_SYNC, 0, FL_OPT_SGD, N);
    ps_state_t *dense = make_state(W, FL_PS_SYNC, 0, FL_OPT_SGD, N);
    ck_assert(fl_ps__state_init(mixed, init, 0) == FL_OK);
    ck_assert(fl_ps__state_init(dense, init, 0) == FL_OK);
    ps_src_t s0 = {.kind = PS_SRC_SPARSE, .idx = idx, .val = val, .k = k, .batch = 4, .maxabs = 1};
    ps_src_t s1 = {.kind = PS_SRC_F16, .dense = h, .batch = 4, .maxabs = 1};
    ps_src_t s2 = {.kind = PS_SRC_BF16, .dense = bh, .batch = 4, .maxabs = 1};
    bool u;
    push_ok(mixed, 0, 0, &s0, &u);
    push_ok(mixed, 1, 0, &s1, &u);
    push_ok(mixed, 2, 0, &s2, &u);
    for (int r = 0; r < W; r++) {
        ps_src_t d;
        dense_src(&d, gd[r], 4);
        push_ok(dense, r, 0, &d, &u);
    }
    memcpy(a, fl_ps__params_data(fl_ps__state_params(mixed)), sizeof a);
    ck_assert_int_eq(memcmp(a, fl_ps__params_data(fl_ps__state_params(dense)), sizeof a), 0);
    fl_ps__state_destroy(&mixed);
    fl_ps__state_destroy(&dense);
}
END_TEST

START_TEST(test_copy_on_write_protects_replies)
{
    static float init[N], g[N];
    for (int i = 0; i < N; i++)
        init[i] = 1.0f, g[i] = 1.0f;
    ps_state_t *st = make_state(1, FL_PS_ASYNC, 0, FL_OPT_SGD, N);
    ck_assert(fl_ps__state_init(st, init, 0) == FL_OK);
    ps_params_t *reply = fl_ps__params_ref(fl_ps__state_params(st)); /* a reply in flight */
    ps_src_t src;
    dense_src(&src, g, 1);
    bool u;
    push_ok(st, 0, 0, &src, &u);
    ck_assert_ptr_ne(fl_ps__state_params(st), reply);
    ck_assert(fl_ps__params_data(reply)[N - 1] == 1.0f); /* what the reply sends is untouched */
    ck_assert(fl_ps__params_data(fl_ps__state_params(st))[N - 1] != 1.0f);
    fl_ps__params_unref(reply); /* freed here (ASan would tell) */
    /* Without a reply in flight, the update is in place. */
    ps_params_t *before = fl_ps__state_params(st);
    dense_src(&src, g, 1);
    push_ok(st, 0, 1, &src, &u);
    ck_assert_ptr_eq(fl_ps__state_params(st), before);
    fl_ps__state_destroy(&st);
}
END_TEST

START_TEST(test_overflow_and_skips)
{
    static float init[N], g[N];
    for (int i = 0; i < N; i++)
        init[i] = 0.5f, g[i] = 3e38f;
    ps_state_t *st = make_state(2, FL_PS_SYNC, 0, FL_OPT_SGD, N);
    ck_assert(fl_ps__state_init(st, init, 0) == FL_OK);
    ps_src_t a, b;
    dense_src(&a, g, 1);
    dense_src(&b, g, 1);
    bool u;
    push_ok(st, 0, 0, &a, &u);
    char why[128];
    ck_assert_int_eq(fl_ps__state_check_push(st, 1, 0, why, sizeof why), FL_OK);
    ck_assert_int_eq(fl_ps__state_push(st, 1, 0, &b, &u), FL_ENONFINITE);
    ck_assert_msg(strstr(fl_last_error(), "overflow") != NULL, "%s", fl_last_error());
    ck_assert_uint_eq(fl_ps__state_skipped(st), 1);
    ck_assert_uint_eq(fl_ps__state_version(st), 1); /* the step is over, without an update */
    ck_assert(fl_ps__params_data(fl_ps__state_params(st))[7] == 0.5f);
    /* Every rank skips (batch 0): no update, the step still ends. */
    dense_src(&a, g, 0);
    dense_src(&b, g, 0);
    push_ok(st, 0, 1, &a, &u);
    push_ok(st, 1, 1, &b, &u);
    ck_assert(u);
    ck_assert_uint_eq(fl_ps__state_version(st), 2);
    ck_assert(fl_ps__params_data(fl_ps__state_params(st))[7] == 0.5f);
    ck_assert_uint_eq(fl_opt_steps(fl_ps__state_opt(st)), 0);
    fl_ps__state_destroy(&st);
}
END_TEST

START_TEST(test_restore_and_refusals)
{
    static float p[N], bad[N];
    ps_state_t *st = make_state(3, FL_PS_SSP, 1, FL_OPT_SGD, N);
    uint64_t clocks[3] = {7, 9, 8};
    bad[17] = NAN;
    ck_assert_int_eq(fl_ps__state_restore(st, bad, NULL, NULL, 0, 5, clocks, 3), FL_ENONFINITE);
    ck_assert(!fl_ps__state_ready(st));
    ck_assert_int_eq(fl_ps__state_restore(st, p, NULL, NULL, 3, 5, clocks, 0), FL_EINVAL);
    ck_assert_int_eq(fl_ps__state_restore(st, p, NULL, NULL, 3, 5, clocks, 3), FL_OK);
    ck_assert_uint_eq(fl_ps__state_version(st), 5);
    ck_assert_uint_eq(fl_ps__state_clock(st, 1), 9);
    ck_assert_uint_eq(fl_ps__state_min_clock(st), 7);
    ck_assert_uint_eq(fl_opt_steps(fl_ps__state_opt(st)), 3);
    fl_ps__state_destroy(&st);
    /* Another number of ranks: every clock restarts at the smallest saved one. */
    st = make_state(2, FL_PS_ASYNC, 0, FL_OPT_SGD, N);
    ck_assert_int_eq(fl_ps__state_restore(st, p, NULL, NULL, 0, 5, clocks, 3), FL_OK);
    ck_assert_uint_eq(fl_ps__state_clock(st, 0), 7);
    ck_assert_uint_eq(fl_ps__state_clock(st, 1), 7);
    fl_ps__state_destroy(&st);
    /* Bad options. */
    ps_state_opts_t o;
    memset(&o, 0, sizeof o);
    fl_opt_opts_init(&o.opt);
    ps_state_t *x = NULL;
    o.world = 0;
    ck_assert_int_eq(fl_ps__state_create(&o, &x), FL_EINVAL);
    o.world = 1;
    o.consistency = (fl_ps_consistency_t)7;
    ck_assert_int_eq(fl_ps__state_create(&o, &x), FL_EINVAL);
    o.consistency = FL_PS_ASYNC;
    o.async_scale = -1;
    ck_assert_int_eq(fl_ps__state_create(&o, &x), FL_EINVAL);
    /* An empty shard is fine and never updates anything. */
    o.async_scale = 0;
    ck_assert_int_eq(fl_ps__state_create(&o, &x), FL_OK);
    ck_assert_int_eq(fl_ps__state_init(x, NULL, 0), FL_OK);
    ps_src_t s = {.kind = PS_SRC_F32, .batch = 1};
    bool u;
    push_ok(x, 0, 0, &s, &u);
    ck_assert_ptr_null(fl_ps__state_opt(x));
    fl_ps__state_destroy(&x);
}
END_TEST

/* ---- payloads ---- */

/* One frame through the decoder. */
static int decode1(fl_cmp_ws_t *ws, const void *data, size_t bytes, uint32_t dtype, uint32_t codec,
                   uint64_t raw, uint64_t count, ps_src_t *s, void **owned)
{
    const void *d[1] = {data};
    size_t b[1] = {bytes};
    fl_msg_frame_t f[1] = {{bytes, dtype, codec, raw}};
    return fl_ps__payload_decode(ws, d, b, f, 1, count, s, owned);
}

START_TEST(test_payload_dense)
{
    fl_cmp_ws_t *ws = NULL;
    ck_assert(fl_cmp_ws_create(&ws) == FL_OK);
    float g[64];
    for (int i = 0; i < 64; i++)
        g[i] = (float)(i - 30);
    ps_src_t s;
    void *owned;
    ck_assert_int_eq(decode1(ws, g, sizeof g, FL_FLOAT32, FL_CODEC_RAW, sizeof g, 64, &s, &owned),
                     FL_OK);
    ck_assert_ptr_eq(s.dense, g); /* no copy */
    ck_assert_ptr_null(owned);
    ck_assert(s.maxabs == 33.0);
    /* Wrong size for the shard, wrong dtype, NaN. */
    ck_assert_int_eq(decode1(ws, g, sizeof g, FL_FLOAT32, FL_CODEC_RAW, sizeof g, 65, &s, &owned),
                     FL_EPROTO);
    ck_assert_msg(strstr(fl_last_error(), "65") != NULL, "%s", fl_last_error());
    ck_assert_int_eq(decode1(ws, g, sizeof g, FL_INT32, FL_CODEC_RAW, sizeof g, 64, &s, &owned),
                     FL_EPROTO);
    g[40] = INFINITY;
    ck_assert_int_eq(decode1(ws, g, sizeof g, FL_FLOAT32, FL_CODEC_RAW, sizeof g, 64, &s, &owned),
                     FL_ENONFINITE);
    ck_assert_msg(strstr(fl_last_error(), "Inf at index 40") != NULL, "%s", fl_last_error());
    g[40] = 1;
    /* lz4: round trip, then a corrupt block. */
    float big[4096];
    for (int i = 0; i < 4096; i++)
        big[i] = (float)(i % 5);
    void *enc;
    size_t len;
    ck_assert_int_eq(fl_ps__payload_lz4(big, 4096, &enc, &len), FL_OK);
    ck_assert_ptr_nonnull(enc);
    ck_assert(len < sizeof big);
    ck_assert_int_eq(decode1(ws, enc, len, FL_FLOAT32, FL_CODEC_LZ4, sizeof big, 4096, &s, &owned),
                     FL_OK);
    ck_assert_ptr_nonnull(owned);
    ck_assert_int_eq(memcmp(s.dense, big, sizeof big), 0);
    free(owned);
    ((uint8_t *)enc)[len / 2] ^= 0xff;
    ((uint8_t *)enc)[1] ^= 0x55;
    int rc = decode1(ws, enc, len, FL_FLOAT32, FL_CODEC_LZ4, sizeof big, 4096, &s, &owned);
    ck_assert(rc == FL_EPROTO || rc == FL_OK); /* a flipped byte may still decode... */
    if (rc == FL_OK)
        free(owned);
    ck_assert_int_eq(decode1(ws, enc, 3, FL_FLOAT32, FL_CODEC_LZ4, sizeof big, 4096, &s, &owned),
                     FL_EPROTO); /* ...a truncated one never */
    ck_assert_ptr_null(owned);
    free(enc);
    /* Random floats do not compress: no encoding. */
    uint64_t seed = 1;
    for (int i = 0; i < 4096; i++)
        big[i] = (float)fl_test_uniform(&seed);
    ck_assert_int_eq(fl_ps__payload_lz4(big, 4096, &enc, &len), FL_OK);
    ck_assert_ptr_null(enc);
    /* float16 NaN. */
    uint16_t h[8] = {0};
    h[5] = 0x7e00;
    ck_assert_int_eq(decode1(ws, h, sizeof h, FL_FLOAT16, FL_CODEC_RAW, sizeof h, 8, &s, &owned),
                     FL_ENONFINITE);
    ck_assert_msg(strstr(fl_last_error(), "NaN at index 5") != NULL, "%s", fl_last_error());
    fl_cmp_ws_destroy(&ws);
}
END_TEST

START_TEST(test_payload_sparse)
{
    fl_cmp_ws_t *ws = NULL;
    ck_assert(fl_cmp_ws_create(&ws) == FL_OK);
    uint32_t idx[3] = {2, 50, 99};
    float val[3] = {1.5f, -7.0f, 0.25f};
    fl_cmp_sparse_opts_t so;
    fl_cmp_sparse_opts_init(&so);
    uint8_t block[256];
    size_t len;
    ck_assert(fl_cmp_sparse_encode(ws, idx, val, 3, 100, &so, block, sizeof block, &len) == FL_OK);
    ps_src_t s;
    void *owned;
    ck_assert_int_eq(decode1(ws, block, len, FL_FLOAT32, FL_CODEC_SPARSE, len, 100, &s, &owned),
                     FL_OK);
    ck_assert_int_eq(s.kind, PS_SRC_SPARSE);
    ck_assert_uint_eq(s.k, 3);
    ck_assert_uint_eq(s.idx[1], 50);
    ck_assert(s.val[1] == -7.0f);
    ck_assert(s.maxabs == 7.0);
    free(owned);
    /* A block for another tensor size (an out-of-range index for this shard). */
    ck_assert_int_eq(decode1(ws, block, len, FL_FLOAT32, FL_CODEC_SPARSE, len, 60, &s, &owned),
                     FL_EPROTO);
    ck_assert_msg(strstr(fl_last_error(), "60") != NULL, "%s", fl_last_error());
    ck_assert_ptr_null(owned);
    /* A NaN value names its index in the shard. */
    val[2] = NAN;
    ck_assert(fl_cmp_sparse_encode(ws, idx, val, 3, 100, &so, block, sizeof block, &len) == FL_OK);
    ck_assert_int_eq(decode1(ws, block, len, FL_FLOAT32, FL_CODEC_SPARSE, len, 100, &s, &owned),
                     FL_ENONFINITE);
    ck_assert_msg(strstr(fl_last_error(), "index 99") != NULL, "%s", fl_last_error());
    ck_assert_ptr_null(owned);
    /* Garbage. */
    memset(block, 0xab, sizeof block);
    ck_assert_int_eq(decode1(ws, block, 100, FL_FLOAT32, FL_CODEC_SPARSE, 100, 100, &s, &owned),
                     FL_EPROTO);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

/* A dense payload in pieces: the pieces are used where they are, and the update is the one a
 * contiguous payload gives; pieces that do not tile the shard are refused. */
START_TEST(test_payload_pieces)
{
    enum { P = 2 * PS_BLOCK, NN = 2 * P + 100 };
    static float g[NN], init[NN];
    for (int i = 0; i < NN; i++) {
        g[i] = (float)(i % 17) - 8.0f;
        init[i] = 1.0f;
    }
    fl_cmp_ws_t *ws = NULL;
    ck_assert(fl_cmp_ws_create(&ws) == FL_OK);
    const void *d[3] = {g, g + P, g + 2 * P};
    size_t b[3] = {P * 4, P * 4, 100 * 4};
    fl_msg_frame_t f[3] = {{P * 4, FL_FLOAT32, FL_CODEC_RAW, P * 4},
                           {P * 4, FL_FLOAT32, FL_CODEC_RAW, P * 4},
                           {400, FL_FLOAT32, FL_CODEC_RAW, 400}};
    ps_src_t s;
    void *owned;
    ck_assert_msg(fl_ps__payload_decode(ws, d, b, f, 3, NN, &s, &owned) == FL_OK, "%s",
                  fl_last_error());
    ck_assert_ptr_null(owned);
    ck_assert_uint_eq(s.chunk_elems, P);
    ck_assert_ptr_eq(ps_src_at(&s, P + 5, 4), g + P + 5);
    ck_assert(s.maxabs == 8.0);
    s.batch = 1;
    ps_state_t *a = make_state(1, FL_PS_SYNC, 0, FL_OPT_SGD, NN);
    ps_state_t *c = make_state(1, FL_PS_SYNC, 0, FL_OPT_SGD, NN);
    ck_assert(fl_ps__state_init(a, init, 0) == FL_OK);
    ck_assert(fl_ps__state_init(c, init, 0) == FL_OK);
    bool u;
    push_ok(a, 0, 0, &s, &u);
    ps_src_t whole;
    memset(&whole, 0, sizeof whole);
    whole.kind = PS_SRC_F32;
    whole.dense = g;
    whole.batch = 1;
    whole.maxabs = 8;
    push_ok(c, 0, 0, &whole, &u);
    ck_assert_int_eq(memcmp(fl_ps__params_data(fl_ps__state_params(a)),
                            fl_ps__params_data(fl_ps__state_params(c)), sizeof g),
                     0);
    fl_ps__state_destroy(&a);
    fl_ps__state_destroy(&c);
    /* A NaN in the last piece names its index in the shard. */
    g[2 * P + 7] = NAN;
    ck_assert_int_eq(fl_ps__payload_decode(ws, d, b, f, 3, NN, &s, &owned), FL_ENONFINITE);
    ck_assert_msg(strstr(fl_last_error(), "index 8199") != NULL, "%s", fl_last_error());
    g[2 * P + 7] = 0;
    /* A middle piece of another size, pieces not on block boundaries, a mixed dtype. */
    f[1].raw_bytes = f[1].bytes = b[1] = P * 4 - 4;
    ck_assert_int_eq(fl_ps__payload_decode(ws, d, b, f, 3, NN, &s, &owned), FL_EPROTO);
    f[1].raw_bytes = f[1].bytes = b[1] = P * 4;
    fl_msg_frame_t odd[2] = {{1000 * 4, FL_FLOAT32, FL_CODEC_RAW, 1000 * 4},
                             {(NN - 1000) * 4, FL_FLOAT32, FL_CODEC_RAW, (NN - 1000) * 4}};
    size_t ob[2] = {1000 * 4, (NN - 1000) * 4};
    ck_assert_int_eq(fl_ps__payload_decode(ws, d, ob, odd, 2, NN, &s, &owned), FL_EPROTO);
    f[2].dtype = FL_FLOAT16;
    ck_assert_int_eq(fl_ps__payload_decode(ws, d, b, f, 3, NN, &s, &owned), FL_EPROTO);
    ck_assert_msg(strstr(fl_last_error(), "frame 2") != NULL, "%s", fl_last_error());
    fl_cmp_ws_destroy(&ws);
    /* The piece size senders use: one frame up to 1 Mi elements, at most 16 pieces beyond. */
    ck_assert_uint_eq(fl_msg_ps_piece(1000), 1000);
    ck_assert_uint_eq(fl_msg_ps_piece(1 << 20), 1 << 20);
    ck_assert_uint_eq(fl_msg_ps_piece((1 << 20) + 1), 1 << 20);
    uint64_t big = (uint64_t)1 << 30;
    ck_assert_uint_le((big + fl_msg_ps_piece(big) - 1) / fl_msg_ps_piece(big), FL_MSG_MAX_FRAMES);
    ck_assert_uint_eq(fl_msg_ps_piece(big) % PS_BLOCK, 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("ps_state");
    TCase *t = tcase_create("consistency");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_sync_sgd_exact);
    tcase_add_test(t, test_sync_adam_exact);
    tcase_add_test(t, test_sync_weighted_exact);
    tcase_add_test(t, test_sync_single_rank_is_local_training);
    tcase_add_test(t, test_sync_pull_waits_for_the_slow_rank);
    tcase_add_test(t, test_async_applies_each_push);
    tcase_add_test(t, test_ssp_bound_is_exact);
    tcase_add_test(t, test_sparse_and_half_sources);
    tcase_add_test(t, test_copy_on_write_protects_replies);
    tcase_add_test(t, test_overflow_and_skips);
    tcase_add_test(t, test_restore_and_refusals);
    suite_add_tcase(s, t);
    t = tcase_create("payload");
    tcase_add_test(t, test_payload_dense);
    tcase_add_test(t, test_payload_sparse);
    tcase_add_test(t, test_payload_pieces);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
