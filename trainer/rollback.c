/* rollback.c - in-memory run snapshots (see rollback.h). */
#include "rollback.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int used;
    ckpt_meta meta;
    float *params, *state, *sigma, *pi;
    size_t np, ns, nl, npi;
} snapshot;

struct rollback {
    int keep;
    snapshot *s;
};

rollback *rollback_create(int keep) {
    if (keep < 1) keep = 1;
    rollback *rb = calloc(1, sizeof *rb);
    if (!rb) return NULL;
    rb->keep = keep;
    rb->s = calloc((size_t)keep, sizeof *rb->s);
    if (!rb->s) {
        free(rb);
        return NULL;
    }
    return rb;
}

void rollback_destroy(rollback *rb) {
    if (!rb) return;
    for (int i = 0; i < rb->keep; i++) {
        free(rb->s[i].params);
        free(rb->s[i].state);
        free(rb->s[i].sigma);
        free(rb->s[i].pi);
    }
    free(rb->s);
    free(rb);
}

static int copy_in(float **dst, size_t *have, const float *src, size_t n) {
    if (*have != n || (!*dst && n)) {
        free(*dst);
        *dst = n ? malloc(n * sizeof(float)) : NULL;
        *have = 0;
        if (n && !*dst) return -1;
        *have = n;
    }
    if (n) memcpy(*dst, src, n * sizeof(float));
    return 0;
}

int rollback_take(rollback *rb, const ckpt_meta *r, const model *m, const optim *o) {
    snapshot *s = NULL;
    for (int i = 0; i < rb->keep && !s; i++)
        if (!rb->s[i].used) s = &rb->s[i];
    if (!s) { /* all used: the oldest */
        s = &rb->s[0];
        for (int i = 1; i < rb->keep; i++)
            if (rb->s[i].meta.step < s->meta.step) s = &rb->s[i];
    }
    s->used = 0;
    if (copy_in(&s->params, &s->np, m->params_memory, m->num_params) != 0 ||
        copy_in(&s->state, &s->ns, o->state, o->state_n) != 0 ||
        copy_in(&s->pi, &s->npi, m->pi_memory, m->pi_size) != 0)
        return -1;
    size_t nl = (size_t)m->num_linear;
    if (s->nl != nl || !s->sigma) {
        free(s->sigma);
        s->sigma = malloc((nl ? nl : 1) * sizeof(float));
        s->nl = 0;
        if (!s->sigma) return -1;
        s->nl = nl;
    }
    for (size_t i = 0; i < nl; i++) s->sigma[i] = m->lin[i].sigma;
    s->meta = *r;
    s->meta.optim_t = o->t;
    s->used = 1;
    return 0;
}

long rollback_restore(rollback *rb, long before_step, ckpt_meta *r, model *m, optim *o) {
    snapshot *best = NULL;
    for (int i = 0; i < rb->keep; i++) {
        snapshot *s = &rb->s[i];
        if (s->used && s->meta.step < before_step && (!best || s->meta.step > best->meta.step)) best = s;
    }
    if (!best || best->np != m->num_params || best->ns != o->state_n || best->npi != m->pi_size ||
        best->nl != (size_t)m->num_linear)
        return -1;
    memcpy(m->params_memory, best->params, best->np * sizeof(float));
    if (best->ns) memcpy(o->state, best->state, best->ns * sizeof(float));
    if (best->npi) memcpy(m->pi_memory, best->pi, best->npi * sizeof(float));
    for (size_t i = 0; i < best->nl; i++) m->lin[i].sigma = best->sigma[i];
    r->step = best->meta.step;
    r->rng = best->meta.rng;
    r->optim_t = best->meta.optim_t;
    r->nan_steps = best->meta.nan_steps;
    r->data_pos = best->meta.data_pos;
    o->t = best->meta.optim_t;
    for (int i = 0; i < rb->keep; i++)
        if (rb->s[i].used && rb->s[i].meta.step > best->meta.step) rb->s[i].used = 0;
    return (long)best->meta.step;
}
