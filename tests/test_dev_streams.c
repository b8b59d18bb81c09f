/* The device layer's ordering language, run for every backend (test_dev_streams for cpu and
 * sim, test_dev_streams_gpu for cuda, skipped without a GPU): streams, events, deadlines,
 * sticky errors, peers and refusals; then sim's own checks (an address outside device memory,
 * a full arena, events). */
#include <stdlib.h>
#include <string.h>

#include "fl_dev.h"
#include "devutil.h"

/* ---- ordering: events hand work between streams; waits are bounded ---- */

START_TEST(test_events_order_streams)
{
    /* sim with jitter: without the event, the copy would race the long chain of updates. */
    bench_t b = open_kind(kinds[_i], 200);
    fl_stream_t *s2 = NULL;
    fl_event_t *e = NULL;
    OK(fl_stream_create(b.d, &s2));
    OK(fl_event_create(b.d, &e));
    ck_assert(fl_event_done(e)); /* never recorded */
    size_t n = 1 << 16;
    float *h = calloc(n, sizeof *h);
    float *one = malloc(n * sizeof *one);
    for (size_t i = 0; i < n; i++)
        one[i] = 1.0f;
    fl_dptr_t acc = up(&b, h, n * 4);
    fl_dptr_t ones = up(&b, one, n * 4);
    fl_dptr_t snap;
    OK(fl_dev_alloc(b.d, n * 4, &snap));
    for (int r = 0; r < 20; r++)
        OK(fl_dev_axpy(b.s, acc, ones, n, 1.0f));
    OK(fl_event_record(e, b.s));
    OK(fl_stream_wait(s2, e));
    OK(fl_dev_d2d(s2, snap, acc, n * 4));
    OK(fl_dev_d2h(s2, h, snap, n * 4));
    OK(fl_event_record(e, s2));
    OK(fl_event_sync(e, 10000));
    ck_assert(fl_event_done(e));
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(h[i] == 20.0f, "element %zu = %g: the copy ran before the updates", i,
                      (double)h[i]);
    fl_dptr_t ps[] = {acc, ones, snap};
    for (size_t i = 0; i < 3; i++)
        fl_dev_free(b.d, &ps[i]);
    fl_event_destroy(&e);
    fl_stream_destroy(&s2);
    free(h);
    free(one);
    close_bench(&b);
}
END_TEST

/* Timed events: the time between two records' completions (cuda's cudaEventElapsedTime, the
 * host clock at completion on cpu and sim), for El Che's batch times; refused for an event
 * without timing, never recorded, or of another device. */
START_TEST(test_event_elapsed)
{
    bench_t b = open_kind(kinds[_i], 200);
    fl_event_t *t0 = NULL;
    fl_event_t *t1 = NULL;
    fl_event_t *plain = NULL;
    OK(fl_event_create_timed(b.d, &t0));
    OK(fl_event_create_timed(b.d, &t1));
    OK(fl_event_create(b.d, &plain));
    double ms = -1.0;
    ck_assert_int_eq(fl_event_elapsed_ms(t0, t1, &ms), FL_EINVAL); /* never recorded */
    size_t n = 1 << 16;
    float *h = calloc(n, sizeof *h);
    fl_dptr_t acc = up(&b, h, n * 4);
    OK(fl_event_record(t0, b.s));
    for (int r = 0; r < 20; r++)
        OK(fl_dev_axpy(b.s, acc, acc, n, 1.0f));
    OK(fl_event_record(t1, b.s));
    OK(fl_event_record(plain, b.s));
    OK(fl_event_sync(t1, 10000));
    OK(fl_event_elapsed_ms(t0, t1, &ms));
    ck_assert_msg(ms >= 0.0 && ms < 1e7, "elapsed %g ms", ms); /* end after start */
    OK(fl_event_elapsed_ms(t1, t1, &ms));
    ck_assert(ms == 0.0);
    ck_assert_int_eq(fl_event_elapsed_ms(t0, plain, &ms), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "timing") != NULL, "%s", fl_last_error());
    fl_dev_free(b.d, &acc);
    fl_event_destroy(&t0);
    fl_event_destroy(&t1);
    fl_event_destroy(&plain);
    free(h);
    close_bench(&b);
}
END_TEST

/* ---- between the devices of one host: a peer copy behind another device's event, and the
 *      intra-host reduction's kernel (rows summed in order: the host loop's bits) ---- */

START_TEST(test_peer_and_sum_rows)
{
    /* Two devices of the kind (cuda: both on GPU 0, as --gpus 0,0), jitter on sim. */
    fl_dev_opts_t o;
    fl_dev_opts_init(&o);
    o.kind = kinds[_i];
    o.sim_jitter_us = 200;
    fl_dev_t *d1 = NULL;
    bench_t b = open_kind(kinds[_i], 200);
    if (o.kind == FL_DEV_SIM)
        o.id = 1;
    OK(fl_dev_create(&o, &d1));
    fl_stream_t *s1 = NULL;
    fl_event_t *e1 = NULL;
    OK(fl_stream_create(d1, &s1));
    OK(fl_event_create(d1, &e1));
    size_t cols = 1001;
    size_t rows = 3;
    size_t n = cols * rows;
    float *h = randv(n, 11, 5.0);
    float *one = malloc(cols * sizeof *one);
    for (size_t i = 0; i < cols; i++)
        one[i] = 1.0f;
    /* Device 1 writes its row slowly; device 0 copies it behind the event. */
    fl_dptr_t src;
    fl_dptr_t ones;
    OK(fl_dev_alloc(d1, cols * 4, &src));
    OK(fl_dev_alloc(d1, cols * 4, &ones));
    OK(fl_dev_h2d(s1, src, h + cols, cols * 4));
    OK(fl_dev_h2d(s1, ones, one, cols * 4));
    for (int r = 0; r < 8; r++)
        OK(fl_dev_axpy(s1, src, ones, cols, 1.0f));
    OK(fl_event_record(e1, s1));
    fl_dptr_t in = up(&b, h, n * 4);
    OK(fl_stream_wait(b.s, e1));
    OK(fl_dev_peer_copy(b.s, fl_dptr_f32(in, cols), d1, src, cols * 4));
    /* What the rows hold then (h itself stays as the queued copies read it). */
    float *rowv = malloc(n * sizeof *rowv);
    memcpy(rowv, h, n * sizeof *rowv);
    for (size_t i = 0; i < cols; i++)
        for (int r = 0; r < 8; r++)
            rowv[cols + i] += 1.0f;
    fl_dptr_t out;
    OK(fl_dev_alloc(b.d, cols * 4, &out));
    float *got = malloc(cols * sizeof *got);
    float *want = malloc(cols * sizeof *want);
    float alphas[] = {1.0f, 1.0f / 3.0f};
    for (int a = 0; a < 2; a++) {
        OK(fl_dev_sum_rows(b.s, out, in, cols, rows, alphas[a]));
        down(&b, got, out, cols * 4);
        for (size_t i = 0; i < cols; i++) {
            float sum = (rowv[i] + rowv[cols + i]) + rowv[2 * cols + i];
            want[i] = a == 0 ? sum : sum * alphas[a];
            ck_assert_msg(fl_sum_rows(rowv, cols, rows, i, alphas[a]) == want[i], "fl_sum_rows");
        }
        expect_bits("sum of rows", got, want, cols);
    }
    /* One row is a copy; zero columns queue nothing; zero rows are refused. */
    OK(fl_dev_sum_rows(b.s, out, in, cols, 1, 1.0f));
    down(&b, got, out, cols * 4);
    expect_bits("sum of one row", got, rowv, cols);
    OK(fl_dev_sum_rows(b.s, out, in, 0, rows, 1.0f));
    ck_assert_int_eq(fl_dev_sum_rows(b.s, out, in, cols, 0, 1.0f), FL_EINVAL);
    if (kinds[_i] == FL_DEV_SIM) {
        /* The source checked against the peer's memory: device 0's own address is not in it. */
        OK(fl_dev_peer_copy(b.s, out, d1, in, 16));
        ck_assert_int_eq(fl_stream_sync(b.s, 10000), FL_EINVAL);
        ck_assert_msg(strstr(fl_last_error(), "device peer copy") &&
                          strstr(fl_last_error(), "outside device memory of sim:1"),
                      "%s", fl_last_error());
    }
    fl_dev_free(b.d, &in);
    fl_dev_free(b.d, &out);
    fl_dev_free(d1, &src);
    fl_dev_free(d1, &ones);
    fl_event_destroy(&e1);
    fl_stream_destroy(&s1);
    close_bench(&b);
    fl_dev_destroy(&d1);
    free(h);
    free(rowv);
    free(one);
    free(got);
    free(want);
}
END_TEST

#ifndef DEV_TEST_CUDA
/* Devices of different kinds share no memory and no events. */
START_TEST(test_peer_refusals)
{
    bench_t c = open_kind(FL_DEV_CPU, 0);
    bench_t s = open_kind(FL_DEV_SIM, 0);
    fl_event_t *e = NULL;
    OK(fl_event_create(c.d, &e));
    ck_assert_int_eq(fl_stream_wait(s.s, e), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "an event of cpu") != NULL, "%s", fl_last_error());
    fl_dptr_t p;
    OK(fl_dev_alloc(s.d, 64, &p));
    ck_assert_int_eq(fl_dev_peer_copy(s.s, p, c.d, p, 64), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "another kind") != NULL, "%s", fl_last_error());
    void *host = NULL;
    ck_assert_int_eq(fl_dev_unwrap(s.d, p, &host), FL_EINVAL);
    float x[2];
    fl_dptr_t w;
    OK(fl_dev_wrap(c.d, x, &w));
    OK(fl_dev_unwrap(c.d, w, &host));
    ck_assert_ptr_eq(host, x);
    ck_assert_ptr_null(fl_stream_native(s.s));
    fl_dev_free(s.d, &p);
    fl_event_destroy(&e);
    close_bench(&s);
    close_bench(&c);
}
END_TEST
#endif

/* ---- misuse is refused with a clear error ---- */

START_TEST(test_refusals)
{
    bench_t b = open_kind(kinds[_i], 0);
    fl_dptr_t p;
    OK(fl_dev_alloc(b.d, 64, &p));
    ck_assert_int_eq(fl_dev_relu(b.s, fl_dptr_null(), 4), FL_EINVAL);
    ck_assert(strstr(fl_last_error(), "null") != NULL);
    fl_dev_topk_t *tk = NULL;
    ck_assert_int_eq(fl_dev_topk_create(b.d, 0, &tk), FL_EINVAL);
    OK(fl_dev_topk_create(b.d, 16, &tk));
    ck_assert_int_eq(fl_dev_topk(b.s, tk, p, 17, 1, p, p, p), FL_EINVAL);
    ck_assert(strstr(fl_last_error(), "workspace for 16") != NULL);
    ck_assert_int_eq(fl_dev_ef_sent(b.s, p, fl_dptr_null(), p, p, 1, 16, 7), FL_EINVAL);
    fl_dev_topk_destroy(&tk);
    fl_dev_free(b.d, &p);
    fl_dev_opts_t o;
    fl_dev_opts_init(&o);
    o.kind = kinds[_i];
    o.timeout_ms = 0;
    fl_dev_t *d = NULL;
    ck_assert_int_eq(fl_dev_create(&o, &d), FL_EINVAL);
    ck_assert(strstr(fl_last_error(), "timeout_ms") != NULL);
    close_bench(&b);
}
END_TEST

#ifndef DEV_TEST_CUDA
/* sim checks every address against its arena: an overrun fails the stream, sticky, and says
 * which operation and address; a full arena says how much was asked and is free. */
START_TEST(test_sim_guards)
{
    fl_dev_opts_t o;
    fl_dev_opts_init(&o);
    o.kind = FL_DEV_SIM;
    o.mem_bytes = 1 << 20;
    fl_dev_t *d = NULL;
    OK(fl_dev_create(&o, &d));
    ck_assert_str_eq(fl_dev_name(d), "sim:0");
    fl_stream_t *s = NULL;
    OK(fl_stream_create(d, &s));
    fl_dptr_t p;
    OK(fl_dev_alloc(d, 1000, &p));
    fl_dptr_t q;
    ck_assert_int_eq(fl_dev_alloc(d, 1 << 20, &q), FL_ENOMEM);
    ck_assert_msg(strstr(fl_last_error(), "1048576 bytes asked") != NULL, "%s", fl_last_error());
    OK(fl_dev_relu(s, fl_dptr_at(p, 512), 200)); /* 800 bytes from 512: past the end */
    OK(fl_dev_memset(s, p, 0, 1000));            /* skipped: the stream already failed */
    ck_assert_int_eq(fl_stream_sync(s, 5000), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "ReLU") && strstr(fl_last_error(), "outside device"),
                  "%s", fl_last_error());
    ck_assert_int_eq(fl_stream_sync(s, 5000), FL_EINVAL); /* sticky */
    fl_stream_destroy(&s);
    /* A host buffer passed as device memory is refused too. */
    OK(fl_stream_create(d, &s));
    float host[4] = {0};
    fl_dptr_t fake = {host};
    OK(fl_dev_relu(s, fake, 4));
    ck_assert_int_eq(fl_stream_sync(s, 5000), FL_EINVAL);
    fl_stream_destroy(&s);
    fl_dev_free(d, &p);
    size_t fr;
    size_t tot;
    OK(fl_dev_mem_info(d, &fr, &tot));
    ck_assert_uint_eq(fr, tot);
    fl_dev_destroy(&d);
}
END_TEST
#endif

#ifndef DEV_TEST_CUDA
/* sim's events as CUDA's: a failure on the recording stream reaches the streams waiting for
 * it; a record moved to another stream does not release the waits of the first one early; an
 * event destroyed with a wait still queued on another stream is kept until the wait ran. */
START_TEST(test_sim_events)
{
    bench_t b = open_kind(FL_DEV_SIM, 300);
    fl_stream_t *s2 = NULL;
    fl_stream_t *s3 = NULL;
    fl_event_t *e = NULL;
    OK(fl_stream_create(b.d, &s2));
    OK(fl_stream_create(b.d, &s3));
    OK(fl_event_create(b.d, &e));
    size_t n = 1 << 14;
    float *h = calloc(n, sizeof *h);
    float *one = malloc(n * sizeof *one);
    for (size_t i = 0; i < n; i++)
        one[i] = 1.0f;
    fl_dptr_t acc = up(&b, h, n * 4);
    fl_dptr_t ones = up(&b, one, n * 4);
    OK(fl_stream_sync(b.s, 10000));
    for (int r = 0; r < 30; r++)
        OK(fl_dev_axpy(b.s, acc, ones, n, 1.0f));
    OK(fl_event_record(e, b.s));
    OK(fl_stream_wait(s2, e));
    OK(fl_dev_d2h(s2, h, acc, n * 4));
    OK(fl_event_record(e, s3)); /* moved to an idle stream at once */
    OK(fl_stream_sync(s2, 10000));
    ck_assert_msg(h[0] == 30.0f && h[n - 1] == 30.0f, "the wait passed early: %g", (double)h[0]);

    /* A failure on the recording stream. */
    float host[4] = {0};
    fl_dptr_t fake = {host};
    OK(fl_dev_relu(s3, fake, 4));
    OK(fl_event_record(e, s3));
    OK(fl_stream_wait(s2, e));
    OK(fl_dev_memset(s2, acc, 0, 4));
    ck_assert_int_eq(fl_stream_sync(s2, 10000), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "outside device memory") != NULL, "%s", fl_last_error());

    /* Destroyed with a wait queued behind other work on another stream. */
    fl_stream_t *s4 = NULL;
    OK(fl_stream_create(b.d, &s4));
    for (int r = 0; r < 10; r++)
        OK(fl_dev_axpy(s4, acc, ones, n, 1.0f));
    OK(fl_event_record(e, b.s));
    OK(fl_stream_wait(s4, e));
    fl_event_destroy(&e);
    OK(fl_stream_sync(s4, 10000));
    fl_stream_destroy(&s4);
    fl_stream_destroy(&s2);
    fl_stream_destroy(&s3);
    fl_dev_free(b.d, &acc);
    fl_dev_free(b.d, &ones);
    free(h);
    free(one);
    close_bench(&b);
}
END_TEST
#endif

Suite *dev_streams_suite(void);
Suite *dev_streams_suite(void)
{
    Suite *s = suite_create("dev_streams");
    TCase *t = tcase_create("conformance");
    tcase_set_timeout(t, 120);
    tcase_add_loop_test(t, test_events_order_streams, 0, NKINDS);
    tcase_add_loop_test(t, test_event_elapsed, 0, NKINDS);
    tcase_add_loop_test(t, test_refusals, 0, NKINDS);
    tcase_add_loop_test(t, test_peer_and_sum_rows, 0, NKINDS);
#ifndef DEV_TEST_CUDA
    tcase_add_test(t, test_peer_refusals);
    tcase_add_test(t, test_sim_guards);
    tcase_add_test(t, test_sim_events);
#endif
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return dev_test_main(dev_streams_suite);
}
