/* ckpt.c - see ckpt.h for the format.  Fields are written one by one (never
 * a raw struct) so the layout does not depend on padding. */
#include "ckpt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

const char *const ckpt_reparam_names[3] = {"none", "sigma", "spectral"};
const char *const ckpt_norm_names[3] = {"pre", "post", "none"};
const char *const ckpt_gamma_names[2] = {"sigma", "one"};
const char *const ckpt_optim_names[4] = {"sgd", "momentum", "adam", "adamw"};
const char *const ckpt_schedule_names[2] = {"constant", "cosine"};

typedef struct {
    FILE *f;
    int bad;
} io;

static void put(io *w, const void *p, size_t n) {
    if (!w->bad && n && fwrite(p, 1, n, w->f) != n) w->bad = 1;
}
static void get(io *r, void *p, size_t n) {
    if (!r->bad && n && fread(p, 1, n, r->f) != n) r->bad = 1;
}

/* The header, read or written by the same field list. */
static void meta_io(io *s, ckpt_meta *m, void (*op)(io *, void *, size_t)) {
    int32_t *c[8] = {&m->cfg.vocab, &m->cfg.max_seq, &m->cfg.layers,  &m->cfg.heads,
                     &m->cfg.dim,   &m->cfg.norm,    &m->cfg.reparam, &m->cfg.gamma_init};
    for (int i = 0; i < 8; i++) op(s, c[i], 4);
    int32_t *r[7] = {&m->optimizer, &m->schedule, &m->batch, &m->seq_len, &m->warmup, &m->steps, &m->data_kind};
    for (int i = 0; i < 7; i++) op(s, r[i], 4);
    op(s, &m->seed, 8);
    float *fl[6] = {&m->lr, &m->weight_decay, &m->clip, &m->beta1, &m->beta2, &m->eps};
    for (int i = 0; i < 6; i++) op(s, fl[i], 4);
    op(s, &m->data_tokens, 8);
    op(s, &m->data_hash, 8);
    op(s, &m->data_pos, 8);
    op(s, &m->step, 8);
    op(s, &m->rng, 8);
    op(s, &m->optim_t, 8);
    op(s, &m->nan_steps, 8);
}

static void put_v(io *w, void *p, size_t n) { put(w, p, n); }

int ckpt_save(const char *path, const ckpt_meta *meta, const model *m, const optim *o, char *err, size_t errlen) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        snprintf(err, errlen, "%s: path too long", path);
        return -1;
    }
    io w = {fopen(tmp, "wb"), 0};
    if (!w.f) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    uint32_t magic = CKPT_MAGIC, version = CKPT_VERSION;
    ckpt_meta mm = *meta;
    put(&w, &magic, 4);
    put(&w, &version, 4);
    meta_io(&w, &mm, put_v);
    uint64_t n = m->num_params;
    put(&w, &n, 8);
    put(&w, m->params_memory, n * sizeof(float));
    uint64_t sn = o ? o->state_n : 0;
    put(&w, &sn, 8);
    if (sn) put(&w, o->state, sn * sizeof(float));
    uint32_t nl = (uint32_t)m->num_linear;
    put(&w, &nl, 4);
    for (int i = 0; i < m->num_linear; i++) put(&w, &m->lin[i].sigma, 4);
    uint64_t ps = m->pi_size;
    put(&w, &ps, 8);
    put(&w, m->pi_memory, ps * sizeof(float));
    put(&w, &magic, 4);
    int bad = w.bad;
    if (fclose(w.f) != 0) bad = 1;
    if (bad) {
        snprintf(err, errlen, "%s: write failed: %s", tmp, strerror(errno));
        remove(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        snprintf(err, errlen, "%s: rename: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

static void get_v(io *r, void *p, size_t n) { get(r, p, n); }

static int open_meta(const char *path, io *r, ckpt_meta *meta, char *err, size_t errlen) {
    r->f = fopen(path, "rb");
    r->bad = 0;
    if (!r->f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    uint32_t magic = 0, version = 0;
    get(r, &magic, 4);
    get(r, &version, 4);
    if (r->bad || magic != CKPT_MAGIC) {
        snprintf(err, errlen, "%s: not a sigmatrain checkpoint", path);
        return -1;
    }
    if (version != CKPT_VERSION) {
        snprintf(err, errlen, "%s: checkpoint version %u, this build reads %u", path, version, CKPT_VERSION);
        return -1;
    }
    meta_io(r, meta, get_v);
    if (r->bad) {
        snprintf(err, errlen, "%s: truncated header", path);
        return -1;
    }
    return 0;
}

int ckpt_read_meta(const char *path, ckpt_meta *meta, char *err, size_t errlen) {
    io r;
    int rc = open_meta(path, &r, meta, err, errlen);
    if (r.f) fclose(r.f);
    return rc;
}

int ckpt_load(const char *path, ckpt_meta *meta, model *m, optim *o, char *err, size_t errlen) {
    io r;
    int rc = -1;
    if (open_meta(path, &r, meta, err, errlen) != 0) goto out;
    uint64_t n = 0, sn = 0, ps = 0;
    uint32_t nl = 0, magic = 0;
    get(&r, &n, 8);
    if (r.bad || n != m->num_params) {
        snprintf(err, errlen, "%s: parameter count mismatch", path);
        goto out;
    }
    get(&r, m->params_memory, n * sizeof(float));
    get(&r, &sn, 8);
    if (r.bad || sn != (o ? o->state_n : 0)) {
        snprintf(err, errlen, "%s: optimizer state mismatch", path);
        goto out;
    }
    if (sn) get(&r, o->state, sn * sizeof(float));
    get(&r, &nl, 4);
    if (r.bad || (int)nl != m->num_linear) {
        snprintf(err, errlen, "%s: linear count mismatch", path);
        goto out;
    }
    for (int i = 0; i < m->num_linear; i++) get(&r, &m->lin[i].sigma, 4);
    get(&r, &ps, 8);
    if (r.bad || ps != m->pi_size) {
        snprintf(err, errlen, "%s: power-iteration size mismatch", path);
        goto out;
    }
    get(&r, m->pi_memory, ps * sizeof(float));
    get(&r, &magic, 4);
    if (r.bad || magic != CKPT_MAGIC) {
        snprintf(err, errlen, "%s: truncated", path);
        goto out;
    }
    if (o) o->t = meta->optim_t;
    rc = 0;
out:
    if (r.f) fclose(r.f);
    return rc;
}

void ckpt_path(char *out, size_t n, const char *pattern, long step) {
    const char *p = strstr(pattern, "{step}");
    if (!p) snprintf(out, n, "%s", pattern);
    else snprintf(out, n, "%.*s%ld%s", (int)(p - pattern), pattern, step, p + 6);
}

/* A float as the short decimal it was given as (0.001, not 0.0010000000474974513). */
static double tidy(float x) {
    char b[32];
    snprintf(b, sizeof b, "%.7g", x);
    return strtod(b, NULL);
}

static void add_optimizer(cJSON *op, const ckpt_meta *r) {
    cJSON_AddStringToObject(op, "name", ckpt_optim_names[r->optimizer]);
    cJSON_AddNumberToObject(op, "lr", tidy(r->lr));
    cJSON_AddNumberToObject(op, "beta1", tidy(r->beta1));
    cJSON_AddNumberToObject(op, "beta2", tidy(r->beta2));
    cJSON_AddNumberToObject(op, "eps", tidy(r->eps));
    cJSON_AddNumberToObject(op, "weight_decay", tidy(r->weight_decay));
    cJSON_AddNumberToObject(op, "clip", tidy(r->clip));
    cJSON_AddNumberToObject(op, "warmup", r->warmup);
    cJSON_AddStringToObject(op, "schedule", ckpt_schedule_names[r->schedule]);
    cJSON_AddNumberToObject(op, "batch", r->batch);
    cJSON_AddNumberToObject(op, "steps", r->steps);
}

/* host and start_time: where and when */
static void add_where_when(cJSON *j) {
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    cJSON_AddStringToObject(j, "host", host);
    time_t now = time(NULL);
    struct tm tm;
    char when[32];
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    cJSON_AddStringToObject(j, "start_time", when);
}

char *ckpt_meta_json(const ckpt_meta *r, const ckpt_run_facts *f) {
    cJSON *j = cJSON_CreateObject(), *mo = cJSON_AddObjectToObject(j, "model"),
          *op = cJSON_AddObjectToObject(j, "optimizer"), *da = cJSON_AddObjectToObject(j, "data"),
          *pr = cJSON_AddObjectToObject(j, "probe");
    char *text = NULL;
    if (!mo || !op || !da || !pr) goto out;
    cJSON_AddStringToObject(j, "trainer", "sigmatrain");
    cJSON_AddStringToObject(j, "version", f->trainer_version);
    cJSON_AddNumberToObject(mo, "layers", r->cfg.layers);
    cJSON_AddNumberToObject(mo, "heads", r->cfg.heads);
    cJSON_AddNumberToObject(mo, "dim", r->cfg.dim);
    cJSON_AddNumberToObject(mo, "seq_len", r->seq_len);
    cJSON_AddNumberToObject(mo, "vocab", r->cfg.vocab);
    cJSON_AddNumberToObject(mo, "params", (double)f->params);
    cJSON_AddStringToObject(j, "reparam", ckpt_reparam_names[r->cfg.reparam]);
    cJSON_AddStringToObject(j, "gamma_init", ckpt_gamma_names[r->cfg.gamma_init]);
    cJSON_AddStringToObject(j, "norm", ckpt_norm_names[r->cfg.norm]);
    add_optimizer(op, r);
    cJSON_AddNumberToObject(j, "seed", (double)r->seed);
    cJSON_AddStringToObject(da, "kind", r->data_kind ? "file" : "synthetic");
    if (f->data_path) cJSON_AddStringToObject(da, "path", f->data_path);
    cJSON_AddNumberToObject(da, "tokens", (double)r->data_tokens);
    char hash[24];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)r->data_hash);
    cJSON_AddStringToObject(da, "hash", hash);
    cJSON_AddNumberToObject(pr, "log_every", f->log_every);
    cJSON_AddNumberToObject(pr, "examples", f->probe_examples);
    cJSON_AddNumberToObject(j, "threads", f->threads);
    add_where_when(j);
    if (f->resumed_from) {
        cJSON_AddStringToObject(j, "resumed_from", f->resumed_from);
        cJSON_AddNumberToObject(j, "resumed_at_step", (double)r->step);
    }
    text = cJSON_PrintUnformatted(j);
out:
    cJSON_Delete(j);
    return text;
}
