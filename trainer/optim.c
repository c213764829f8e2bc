/* optim.c - see optim.h. */
#include "optim.h"

#include <math.h>
#include <stdlib.h>

optim *optim_create(int kind, size_t n, float beta1, float beta2, float eps, float weight_decay)
{
    if (kind < OPTIM_SGD || kind > OPTIM_ADAMW) return NULL;
    optim *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->kind = kind;
    o->beta1 = beta1;
    o->beta2 = beta2;
    o->eps = eps;
    o->weight_decay = weight_decay;
    o->n = n;
    o->state_n = kind == OPTIM_SGD ? 0 : kind == OPTIM_MOMENTUM ? n : 2 * n;
    if (o->state_n) {
        o->state = calloc(o->state_n, sizeof(float));
        if (!o->state) { free(o); return NULL; }
    }
    return o;
}

void optim_destroy(optim *o)
{
    if (!o) return;
    free(o->state);
    free(o);
}

void optim_step(optim *o, float *params, const float *grads, const optim_group *groups,
                int ngroups, float lr)
{
    o->t++;
    float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
    float c1 = 1.0f - powf(b1, (float)o->t), c2 = 1.0f - powf(b2, (float)o->t);
    for (int gi = 0; gi < ngroups; gi++) {
        const optim_group *g = &groups[gi];
        if (g->frozen) continue;
        float wd = g->decay ? o->weight_decay : 0.0f;
        float *p = params + g->offset;
        const float *gr = grads + g->offset;
        float *m = o->state ? o->state + g->offset : NULL;
        float *v = o->kind >= OPTIM_ADAM ? o->state + o->n + g->offset : NULL;
        size_t n = g->n;
        switch (o->kind) {
        case OPTIM_SGD:
            for (size_t i = 0; i < n; i++) p[i] -= lr * (gr[i] + wd * p[i]);
            break;
        case OPTIM_MOMENTUM:
            for (size_t i = 0; i < n; i++) {
                m[i] = b1 * m[i] + gr[i] + wd * p[i];
                p[i] -= lr * m[i];
            }
            break;
        case OPTIM_ADAM:
        case OPTIM_ADAMW: {
            int decoupled = o->kind == OPTIM_ADAMW;
            for (size_t i = 0; i < n; i++) {
                float gg = decoupled ? gr[i] : gr[i] + wd * p[i];
                m[i] = b1 * m[i] + (1.0f - b1) * gg;
                v[i] = b2 * v[i] + (1.0f - b2) * gg * gg;
                float mh = m[i] / c1, vh = v[i] / c2;
                p[i] -= lr * (mh / (sqrtf(vh) + eps) + (decoupled ? wd * p[i] : 0.0f));
            }
            break;
        }
        }
    }
}

float optim_clip(float *grads, size_t n, float max_norm)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)grads[i] * grads[i];
    float norm = (float)sqrt(s);
    if (!isfinite(norm)) return norm;
    if (max_norm > 0.0f && norm > max_norm) {
        float k = max_norm / norm;
        for (size_t i = 0; i < n; i++) grads[i] *= k;
    }
    return norm;
}

float optim_lr(float lr, int step, int warmup, int total, int schedule)
{
    if (warmup > 0 && step < warmup) return lr * (float)(step + 1) / (float)warmup;
    if (schedule == OPTIM_SCHEDULE_CONSTANT) return lr;
    int span = total - warmup - 1;
    if (span <= 0) return lr;
    double r = (double)(step - warmup) / span;
    if (r > 1.0) r = 1.0;
    double minlr = lr * 0.1;
    return (float)(minlr + 0.5 * (lr - minlr) * (1.0 + cos(3.14159265358979 * r)));
}
