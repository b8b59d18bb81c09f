/* Learning-rate schedules: linear warm-up, then constant, step decay or cosine decay, and the
 * linear scaling rule for large global batches. Pure arithmetic on doubles; validating the
 * schedule's fields is the caller's job, degenerate values give a sane constant instead. */
#include "fl_core.h"

#include <math.h>
#include <strings.h>

void fl_lr_sched_init(fl_lr_sched_t *s, double lr)
{
    s->lr = lr;
    s->kind = FL_LR_CONSTANT;
    s->warmup_steps = 0;
    s->total_steps = 0;
    s->step_size = 0;
    s->gamma = 0.1;
    s->min_lr = 0.0;
}

int fl_lr_kind_parse(const char *s, fl_lr_kind_t *out)
{
    static const struct {
        const char *name;
        fl_lr_kind_t kind;
    } names[] = {{"constant", FL_LR_CONSTANT}, {"step", FL_LR_STEP}, {"cosine", FL_LR_COSINE}};
    if (s != NULL) {
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            if (strcasecmp(s, names[i].name) == 0) {
                *out = names[i].kind;
                return FL_OK;
            }
        }
    }
    return fl_fail(FL_EINVAL, "lr schedule '%s' is not one of constant|step|cosine",
                   s ? s : "(null)");
}

/* Degenerate inputs: a negative step counts as step 0, warmup_steps <= 0 means no warm-up,
 * step_size <= 0 no step decay, total_steps <= 0 no cosine decay (constant after warm-up),
 * an unknown kind constant. */
double fl_lr_at(const fl_lr_sched_t *s, long step)
{
    if (step < 0)
        step = 0;
    if (s->warmup_steps > 0 && step < s->warmup_steps)
        return s->lr * (double)(step + 1) / (double)s->warmup_steps;
    const long t = s->warmup_steps > 0 ? step - s->warmup_steps : step;
    switch (s->kind) {
    case FL_LR_STEP:
        if (s->step_size <= 0)
            return s->lr;
        return s->lr * pow(s->gamma, (double)(t / s->step_size));
    case FL_LR_COSINE: {
        if (s->total_steps <= 0)
            return s->lr;
        const long tt = t < s->total_steps ? t : s->total_steps;
        const double c = cos(3.14159265358979323846 * (double)tt / (double)s->total_steps);
        return s->min_lr + (s->lr - s->min_lr) * (1.0 + c) / 2.0;
    }
    case FL_LR_CONSTANT:
    default: return s->lr;
    }
}

/* A non-positive batch size is the caller's validation failure; base_lr comes back unscaled. */
double fl_lr_scaled(double base_lr, long global_batch, long base_batch)
{
    if (global_batch <= 0 || base_batch <= 0)
        return base_lr;
    return base_lr * (double)global_batch / (double)base_batch;
}
