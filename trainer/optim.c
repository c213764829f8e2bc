/* optim.c - see optim.h. */
#include "optim.h"

#include <math.h>
#include <stdlib.h>

optim *optim_create(int kind, size_t n, float beta1, float beta2, float eps, float weight_decay) {
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
        if (!o->state) {
            free(o);
            return NULL;
        }
    }
    return o;
}

void optim_destroy(optim *o) {
    if (!o) return;
    free(o->state);
    free(o);
}

void optim_begin_step(optim *o) { o->t++; }

void optim_update(optim *o, float *params, const float *grads, float grad_scale, const optim_group *groups, int ngroups,
                  float lr, size_t lo, size_t hi) {
    float b1 = o->beta1, b2 = o->beta2, eps = o->eps, k = grad_scale;
    float c1 = 1.0f - powf(b1, (float)o->t), c2 = 1.0f - powf(b2, (float)o->t);
    for (int gi = 0; gi < ngroups; gi++) {
        const optim_group *g = &groups[gi];
        size_t a = g->offset > lo ? g->offset : lo;
        size_t e = g->offset + g->n < hi ? g->offset + g->n : hi;
        if (g->frozen || a >= e) continue;
        float wd = g->decay ? o->weight_decay : 0.0f;
        float *restrict p = params + a;
        const float *restrict gr = grads + a;
        float *restrict m = o->state ? o->state + a : NULL;
        float *restrict v = o->kind >= OPTIM_ADAM ? o->state + o->n + a : NULL;
        size_t n = e - a;
        switch (o->kind) {
        case OPTIM_SGD:
            for (size_t i = 0; i < n; i++) p[i] -= lr * (k * gr[i] + wd * p[i]);
            break;
        case OPTIM_MOMENTUM:
            for (size_t i = 0; i < n; i++) {
                m[i] = b1 * m[i] + k * gr[i] + wd * p[i];
                p[i] -= lr * m[i];
            }
            break;
        case OPTIM_ADAM:
            for (size_t i = 0; i < n; i++) {
                float gg = k * gr[i] + wd * p[i];
                m[i] = b1 * m[i] + (1.0f - b1) * gg;
                v[i] = b2 * v[i] + (1.0f - b2) * gg * gg;
                p[i] -= lr * ((m[i] / c1) / (sqrtf(v[i] / c2) + eps));
            }
            break;
        case OPTIM_ADAMW:
            for (size_t i = 0; i < n; i++) {
                float gg = k * gr[i];
                m[i] = b1 * m[i] + (1.0f - b1) * gg;
                v[i] = b2 * v[i] + (1.0f - b2) * gg * gg;
                p[i] -= lr * ((m[i] / c1) / (sqrtf(v[i] / c2) + eps) + wd * p[i]);
            }
            break;
        }
    }
}

void optim_step(optim *o, float *params, const float *grads, const optim_group *groups, int ngroups, float lr) {
    optim_begin_step(o);
    optim_update(o, params, grads, 1.0f, groups, ngroups, lr, 0, o->n);
}

double optim_sumsq(const float *grads, size_t lo, size_t hi) {
    /* 8 partial sums so the loop vectorizes; double so 1e6 terms stay exact enough */
    double acc[8] = {0};
    size_t i = lo;
    for (; i + 8 <= hi; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)grads[i + k] * grads[i + k];
    double s = 0.0;
    for (int k = 0; k < 8; k++) s += acc[k];
    for (; i < hi; i++) s += (double)grads[i] * grads[i];
    return s;
}

float optim_clip_scale(double sumsq, float max_norm, float *norm) {
    *norm = (float)sqrt(sumsq);
    if (!isfinite(*norm)) return 1.0f;
    if (max_norm > 0.0f && *norm > max_norm) return max_norm / *norm;
    return 1.0f;
}

float optim_clip(float *grads, size_t n, float max_norm) {
    float norm;
    float k = optim_clip_scale(optim_sumsq(grads, 0, n), max_norm, &norm);
    if (k != 1.0f)
        for (size_t i = 0; i < n; i++) grads[i] *= k;
    return norm;
}

float optim_lr(float lr, int step, int warmup, int total, int schedule) {
    if (warmup > 0 && step < warmup) return lr * (float)(step + 1) / (float)warmup;
    if (schedule == OPTIM_SCHEDULE_CONSTANT) return lr;
    int span = total - warmup - 1;
    if (span <= 0) return lr;
    double r = (double)(step - warmup) / span;
    if (r > 1.0) r = 1.0;
    double minlr = lr * 0.1;
    return (float)(minlr + 0.5 * (lr - minlr) * (1.0 + cos(3.14159265358979 * r)));
}
