/* What the training loops print as they go: a step's metrics line (--metrics, one JSON object
 * a line) and rank 0's progress line, and the line of an epoch's evaluation. Each loop (the
 * synchronous step, the parameter server's push and pull, --policy async's averaging) has its
 * own fields; they are written here only, so the lines that tools parse stay one format. */
#include "train_int.h"

#include <stdio.h>

/* "42% ETA 1m23s" for a job `done` (0..1) of the way, this run having started at `start` and
 * run elapsed_s. */
static void eta_text(char *out, size_t cap, double done, double start, double elapsed_s)
{
    if (done < 0.0)
        done = 0.0;
    if (done > 1.0)
        done = 1.0;
    double run = done - start; /* this run's share (a resumed run started at `start`) */
    if (run <= 1e-9 || elapsed_s <= 0.0) {
        snprintf(out, cap, "%.0f%% ETA unknown", 100.0 * done);
        return;
    }
    double left = elapsed_s * (1.0 - done) / run;
    long s = (long)(left + 0.5);
    if (s >= 3600)
        snprintf(out, cap, "%.0f%% ETA %ldh%02ldm", 100.0 * done, s / 3600, s / 60 % 60);
    else if (s >= 60)
        snprintf(out, cap, "%.0f%% ETA %ldm%02lds", 100.0 * done, s / 60, s % 60);
    else
        snprintf(out, cap, "%.0f%% ETA %lds", 100.0 * done, s);
}

/* What the exchange sent, without "ratio 0.0x" when nothing was sent. */
static void sent_text(char *out, size_t cap, uint64_t sent, uint64_t raw)
{
    if (sent == 0)
        snprintf(out, cap, "nothing exchanged");
    else
        snprintf(out, cap, "sent %.1f MiB (%.1fx less than dense)", (double)sent / 1048576.0,
                 (double)raw / (double)sent);
}

static void metrics_line(const fl_wk_report_t *r)
{
    switch (r->loop) {
    case FL_WK_LOOP_SYNC:
        fprintf(r->metrics,
                "{\"rank\":%d,\"epoch\":%d,\"step\":%ld,\"loss\":%.6f,\"acc\":%.5f,"
                "\"lr\":%.6g,\"density\":%.6g,\"compute_ms\":%.3f,\"exposed_comm_ms\":"
                "%.3f,\"bytes_sent\":%llu,\"raw_bytes\":%llu,\"divergence\":%.6g}\n",
                r->rank, r->epoch, r->step, r->loss, r->acc, r->lr, r->density, r->compute_ms,
                r->exchange_ms, (unsigned long long)r->sent, (unsigned long long)r->raw,
                r->divergence);
        break;
    case FL_WK_LOOP_PS:
        fprintf(r->metrics,
                "{\"rank\":%d,\"epoch\":%d,\"step\":%ld,\"loss\":%.6f,\"acc\":%.5f,"
                "\"density\":%.6g,\"compute_ms\":%.3f,\"exchange_ms\":%.3f}\n",
                r->rank, r->epoch, r->step, r->loss, r->acc, r->density, r->compute_ms,
                r->exchange_ms);
        break;
    case FL_WK_LOOP_ASYNC:
        fprintf(r->metrics,
                "{\"rank\":%d,\"epoch\":%d,\"step\":%ld,\"loss\":%.6f,\"acc\":%.5f,"
                "\"job_batches\":%.0f,\"exchange_ms\":%.3f,\"wait_ms\":%.3f,"
                "\"divergence\":%.6g}\n",
                r->rank, r->epoch, r->step, r->loss, r->acc, r->job_batches, r->exchange_ms,
                r->wait_ms, r->divergence);
        break;
    }
}

static void progress_line(const fl_wk_report_t *r)
{
    const fl_wk_progress_t *p = &r->p;
    char eta[64];
    char sent[96];
    char of[32] = "";
    eta_text(eta, sizeof eta, p->done, p->start, p->elapsed_s);
    sent_text(sent, sizeof sent, r->sent, r->raw);
    if (p->of > 0)
        snprintf(of, sizeof of, "/%ld", p->of);
    switch (r->loop) {
    case FL_WK_LOOP_SYNC:
        printf("epoch %d/%d step %ld%s (%s) loss %.4f acc %.1f%% %.0f samples/s compute "
               "%.1f ms exchange %.1f ms (exposed %.1f ms) %s\n",
               r->epoch + 1, r->epochs, p->at, of, eta, p->loss, 100.0 * p->acc, p->samples_per_s,
               p->compute_ms, p->exchange_ms, p->exposed_ms, sent);
        break;
    case FL_WK_LOOP_PS:
        printf("epoch %d/%d step %ld%s (%s) loss %.4f acc %.1f%% %.0f samples/s compute "
               "%.1f ms push+pull %.1f ms %s\n",
               r->epoch + 1, r->epochs, p->at, of, eta, p->loss, 100.0 * p->acc, p->samples_per_s,
               p->compute_ms, p->exchange_ms, sent);
        break;
    case FL_WK_LOOP_ASYNC:
        printf("epoch %d/%d averaging %ld loss %.4f acc %.1f%% %.0f samples/s exchange %.1f ms "
               "(hidden: the devices go on) divergence %.4f\n",
               r->epoch + 1, r->epochs, p->at, r->loss, 100.0 * r->acc, p->samples_per_s,
               p->exchange_ms, r->divergence);
        break;
    }
    fflush(stdout);
}

int fl_wk_report_open(const fl_wk_train_opts_t *o, int rank, int world, FILE **out)
{
    *out = NULL;
    if (o->metrics_path == NULL)
        return FL_OK;
    char path[1024];
    if (world > 1)
        snprintf(path, sizeof path, "%s.rank%d", o->metrics_path, rank);
    else
        snprintf(path, sizeof path, "%s", o->metrics_path);
    *out = fopen(path, "w");
    if (*out == NULL)
        return fl_fail(FL_EIO, "--metrics: cannot write %s", path);
    return FL_OK;
}

void fl_wk_report_step(const fl_wk_report_t *r)
{
    if (r->metrics != NULL)
        metrics_line(r);
    if (r->progress)
        progress_line(r);
}

void fl_wk_report_epoch(int epoch, int epochs, const fl_wk_train_result_t *res, double secs)
{
    printf("epoch %d/%d done: train loss %.4f, test loss %.4f, test accuracy %.2f%% (%.1f s)\n",
           epoch + 1, epochs, res->train_loss, res->test_loss, 100.0 * res->test_acc, secs);
    fflush(stdout);
}
