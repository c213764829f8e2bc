/* model.c - forward and backward of the GPT model in model.h: the
 * parameter and activation layout, the passes over the layers, the
 * shards and their reduction. The kernels themselves (and their gradient
 * conventions) are kernels.[ch]. Activation gradients are overwritten, not
 * added into (kernels.h says why), so one layer's worth of scratch per
 * shard is reused across layers.
 *
 * Parallelism: a batch is split into shards of examples (forward_shard,
 * backward_shard), one per thread, each calling OpenBLAS single-threaded;
 * shards write private parameter gradients that JOB_REDUCE adds up in a fixed
 * order.  The rest of a step (σReparam, clearing, the optimizer through
 * model_parallel) is split over the same threads by ranges. */
#include "model.h"
#include "kernels.h"
#include "now.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- random */

uint32_t model_random_u32(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float random_f32(uint64_t *state) { return (float)(model_random_u32(state) >> 8) / 16777216.0f; }

float model_random_normal(uint64_t *state) {
    float u1 = 1.0f - random_f32(state); /* (0, 1] so the log is finite */
    float u2 = random_f32(state);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

static float truncated_normal(uint64_t *rng, float std) {
    float z;
    do z = model_random_normal(rng);
    while (fabsf(z) > 2.0f);
    return z * std;
}

/* ------------------------------------------------------------ the model */

double model_step_flops(const model_config *c, int B, int T) {
    double C = c->dim, L = c->layers, BT = (double)B * T;
    double lin = BT * 2.0 * (L * 12.0 * C * C + c->vocab * C);
    double att = L * B * 2.0 * 2.0 * (T * (T + 1.0) / 2.0) * C; /* QK^T and AV */
    return 3.0 * (lin + att);
}

/* Fills s[MODEL_NUM_PARAMS] (in floats) and returns their sum. */
static size_t param_sizes(const model_config *cfg, size_t s[MODEL_NUM_PARAMS]) {
    size_t V = cfg->vocab, T = cfg->max_seq, L = cfg->layers, C = cfg->dim;
    s[MODEL_WTE] = V * C;
    s[MODEL_WPE] = T * C;
    s[MODEL_LN1W] = L * C;
    s[MODEL_LN1B] = L * C;
    s[MODEL_QKVW] = L * 3 * C * C;
    s[MODEL_QKVB] = L * 3 * C;
    s[MODEL_ATTPROJW] = L * C * C;
    s[MODEL_ATTPROJB] = L * C;
    s[MODEL_LN2W] = L * C;
    s[MODEL_LN2B] = L * C;
    s[MODEL_FCW] = L * 4 * C * C;
    s[MODEL_FCB] = L * 4 * C;
    s[MODEL_FCPROJW] = L * C * 4 * C;
    s[MODEL_FCPROJB] = L * C;
    s[MODEL_LNFW] = C;
    s[MODEL_LNFB] = C;
    s[MODEL_LMW] = V * C;
    s[MODEL_GAMMA] = 4 * L + 1;
    size_t n = 0;
    for (int i = 0; i < MODEL_NUM_PARAMS; i++) n += s[i];
    return n;
}

int model_config_check(const model_config *c, char *err, size_t errlen) {
    const char *msg = NULL;
    if (c->vocab < 2 || c->vocab > 65536) msg = "vocab must be in [2, 65536]";
    else if (c->max_seq < 1 || c->max_seq > 16384) msg = "seq-len must be in [1, 16384]";
    else if (c->layers < 1 || c->layers > 256) msg = "layers must be in [1, 256]";
    else if (c->heads < 1 || c->dim < 1 || c->dim > 65536) msg = "heads and dim must be positive";
    else if (c->dim % c->heads != 0) msg = "dim must be divisible by heads";
    else if (c->norm < 0 || c->norm > 2) msg = "bad norm mode";
    else if (c->reparam < 0 || c->reparam > 2) msg = "bad reparam mode";
    else if (c->gamma_init < 0 || c->gamma_init > 1) msg = "bad gamma init";
    if (msg) {
        snprintf(err, errlen, "%s", msg);
        return -1;
    }
    return 0;
}

static void carve_params(model_params *p, float *mem, const size_t *s) {
    float **ptrs[MODEL_NUM_PARAMS] = {&p->wte,      &p->wpe,      &p->ln1w, &p->ln1b, &p->qkvw, &p->qkvb,
                                      &p->attprojw, &p->attprojb, &p->ln2w, &p->ln2b, &p->fcw,  &p->fcb,
                                      &p->fcprojw,  &p->fcprojb,  &p->lnfw, &p->lnfb, &p->lmw,  &p->gamma};
    for (int i = 0; i < MODEL_NUM_PARAMS; i++) {
        *ptrs[i] = mem;
        mem += s[i];
    }
}

static size_t carve_acts(model_acts *a, float *mem, const model_config *c, size_t B, size_t T) {
    size_t L = c->layers, C = c->dim, H = c->heads, V = c->vocab, BT = B * T;
    struct {
        float **p;
        size_t n;
    } t[] = {{&a->encoded, BT * C},
             {&a->ln1, L * BT * C},
             {&a->ln1_mean, L * BT},
             {&a->ln1_rstd, L * BT},
             {&a->qkv, L * BT * 3 * C},
             {&a->atty, L * BT * C},
             {&a->att, L * B * H * T * T},
             {&a->residual2, L * BT * C},
             {&a->ln2, L * BT * C},
             {&a->ln2_mean, L * BT},
             {&a->ln2_rstd, L * BT},
             {&a->fch, L * BT * 4 * C},
             {&a->fch_gelu, L * BT * 4 * C},
             {&a->residual3, L * BT * C},
             {&a->lnf, BT * C},
             {&a->lnf_mean, BT},
             {&a->lnf_rstd, BT},
             {&a->probs, BT * V},
             {&a->losses, BT}};
    size_t n = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (mem) *t[i].p = mem + n;
        n += t[i].n;
    }
    return n;
}

/* Jobs of the pool's threads (see run_shard). */
enum { JOB_FORWARD = 1, JOB_BACKWARD, JOB_REDUCE, JOB_REPARAM_FWD, JOB_ZERO };

static double now_seconds(void) { return now_mono_ms() / 1e3; }

/* See backward_shard; >= 11C, so it also holds a power step's work vector
 * (at most 4C floats) while no backward runs. */
static size_t scratch_size(const model_config *c, size_t B, size_t T) { return 11 * B * T * (size_t)c->dim + T * T; }

/* Points each linear at its weight, gradient, gain and u, v vectors. */
static void setup_linears(model *m) {
    const model_config *cfg = &m->cfg;
    int C = cfg->dim;
    float *pi = m->pi_memory;
    for (int i = 0; i < m->num_linear; i++) {
        sreparam_linear *l = &m->lin[i];
        int layer = i / MODEL_LIN_PER_LAYER, k = i % MODEL_LIN_PER_LAYER;
        float *w;
        if (i == m->num_linear - 1) {
            l->out = cfg->vocab;
            l->in = C;
            w = m->params.lmw;
        } else if (k == MODEL_LIN_QKV) {
            l->out = 3 * C;
            l->in = C;
            w = m->params.qkvw + (size_t)layer * 3 * C * C;
        } else if (k == MODEL_LIN_ATTPROJ) {
            l->out = C;
            l->in = C;
            w = m->params.attprojw + (size_t)layer * C * C;
        } else if (k == MODEL_LIN_FC) {
            l->out = 4 * C;
            l->in = C;
            w = m->params.fcw + (size_t)layer * 4 * C * C;
        } else {
            l->out = C;
            l->in = 4 * C;
            w = m->params.fcprojw + (size_t)layer * 4 * C * C;
        }
        l->w = w;
        l->dw = m->grads_memory + (w - m->params_memory);
        l->gamma = m->params.gamma + i;
        l->dgamma = m->grads.gamma + i;
        l->u = pi;
        pi += l->in;
        l->v = pi;
        pi += l->out;
        l->sigma = 1.0f;
        if (cfg->reparam == MODEL_REPARAM_NONE) l->weff = w;
        else if (k == MODEL_LIN_QKV && i != m->num_linear - 1) l->weff = m->qkv_eff + (size_t)layer * 3 * C * C;
    }
}

/* Spreads the linears' σReparam work over the threads: largest first onto
 * the least loaded. */
static void assign_owners(model *m) {
    double load[256] = {0};
    int nt = m->nthreads < 256 ? m->nthreads : 256;
    for (int i = 0; i < m->num_linear; i++) m->lin_owner[i] = -1;
    for (int done = 0; done < m->num_linear; done++) {
        int best = -1;
        for (int i = 0; i < m->num_linear; i++)
            if (m->lin_owner[i] < 0 &&
                (best < 0 || (long)m->lin[i].out * m->lin[i].in > (long)m->lin[best].out * m->lin[best].in))
                best = i;
        int tmin = 0;
        for (int t = 1; t < nt; t++)
            if (load[t] < load[tmin]) tmin = t;
        m->lin_owner[best] = tmin;
        load[tmin] += (double)m->lin[best].out * m->lin[best].in;
    }
}

model *model_create(const model_config *cfg, int B, int T, int threads) {
    char err[128];
    if (model_config_check(cfg, err, sizeof err) != 0 || B < 1 || T < 1 || T > cfg->max_seq) return NULL;
    model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    m->B = B;
    m->T = T;
    m->num_params = param_sizes(cfg, m->param_sizes);
    m->params_memory = calloc(m->num_params, sizeof(float));
    m->grads_memory = calloc(m->num_params, sizeof(float));
    size_t na = carve_acts(&m->acts, NULL, cfg, B, T);
    m->acts_memory = calloc(na, sizeof(float));
    int L = cfg->layers, C = cfg->dim;
    m->num_linear = MODEL_LIN_PER_LAYER * L + 1;
    m->lin = calloc(m->num_linear, sizeof *m->lin);
    m->lin_owner = calloc(m->num_linear, sizeof(int));
    m->gw_route = calloc(m->num_linear, sizeof(int));
    /* u (in) + v (out) per linear: per layer C+3C, C+C, C+4C, 4C+C; head C+V */
    m->pi_size = (size_t)L * (4 + 2 + 5 + 5) * C + C + cfg->vocab;
    m->pi_memory = calloc(m->pi_size, sizeof(float));
    if (!m->params_memory || !m->grads_memory || !m->acts_memory || !m->lin || !m->lin_owner || !m->gw_route ||
        !m->pi_memory)
        goto err;
    carve_params(&m->params, m->params_memory, m->param_sizes);
    carve_params(&m->grads, m->grads_memory, m->param_sizes);
    carve_acts(&m->acts, m->acts_memory, cfg, B, T);
    if (cfg->reparam != MODEL_REPARAM_NONE) {
        m->qkv_eff = calloc(m->param_sizes[MODEL_QKVW], sizeof(float));
        m->qkv_fresh = calloc((size_t)L, sizeof(int));
        if (!m->qkv_eff || !m->qkv_fresh) goto err;
    }
    setup_linears(m);
    if (threads < 1) threads = 1;
    if (threads > B) threads = B;
    m->shards = calloc(threads, sizeof *m->shards);
    if (!m->shards) goto err;
    m->nthreads = threads;
    for (int t = 0; t < threads; t++) {
        model_shard *sh = &m->shards[t];
        int nb = B * (t + 1) / threads - B * t / threads;
        sh->scratch = calloc(scratch_size(cfg, nb, T), sizeof(float));
        sh->grads_memory = t ? calloc(m->num_params, sizeof(float)) : m->grads_memory;
        sh->gw = calloc(m->num_linear, sizeof(double));
        if (!sh->scratch || !sh->grads_memory || !sh->gw) goto err;
        carve_params(&sh->grads, sh->grads_memory, m->param_sizes);
    }
    assign_owners(m);
    openblas_set_num_threads(1);
    m->pool = pool_create(threads);
    if (!m->pool) goto err;
    return m;
err:
    model_destroy(m);
    return NULL;
}

void model_destroy(model *m) {
    if (!m) return;
    pool_destroy(m->pool);
    for (int t = 0; m->shards && t < m->nthreads; t++) {
        model_shard *sh = &m->shards[t];
        free(sh->scratch);
        free(sh->gw);
        if (t) free(sh->grads_memory);
    }
    free(m->shards);
    free(m->params_memory);
    free(m->grads_memory);
    free(m->acts_memory);
    free(m->lin);
    free(m->lin_owner);
    free(m->gw_route);
    free(m->pi_memory);
    free(m->qkv_eff);
    free(m->qkv_fresh);
    free(m);
}

static void random_unit(float *x, int n, uint64_t *rng) {
    double s = 0.0;
    for (int i = 0; i < n; i++) {
        x[i] = model_random_normal(rng);
        s += (double)x[i] * x[i];
    }
    float inv = (float)(1.0 / sqrt(s));
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void model_init(model *m, uint64_t *rng) {
    const model_config *c = &m->cfg;
    model_params *p = &m->params;
    const size_t *s = m->param_sizes;
    float std_res = 0.02f / sqrtf(2.0f * c->layers);
    float *work = m->shards[0].scratch; /* idle outside a backward */
    memset(m->params_memory, 0, m->num_params * sizeof(float));
    struct {
        float *t;
        size_t n;
        float std;
    } w[] = {{p->wte, s[MODEL_WTE], 0.02f},   {p->wpe, s[MODEL_WPE], 0.02f},
             {p->qkvw, s[MODEL_QKVW], 0.02f}, {p->attprojw, s[MODEL_ATTPROJW], std_res},
             {p->fcw, s[MODEL_FCW], 0.02f},   {p->fcprojw, s[MODEL_FCPROJW], std_res},
             {p->lmw, s[MODEL_LMW], 0.02f}};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        for (size_t j = 0; j < w[i].n; j++) w[i].t[j] = truncated_normal(rng, w[i].std);
    for (size_t j = 0; j < s[MODEL_LN1W]; j++) p->ln1w[j] = p->ln2w[j] = 1.0f;
    for (size_t j = 0; j < s[MODEL_LNFW]; j++) p->lnfw[j] = 1.0f;
    for (int i = 0; i < m->num_linear; i++) {
        sreparam_linear *l = &m->lin[i];
        *l->gamma = 1.0f;
        l->sigma = 1.0f;
        if (c->reparam == MODEL_REPARAM_NONE) continue;
        if (c->reparam == MODEL_REPARAM_SIGMA && c->gamma_init == MODEL_GAMMA_SIGMA) {
            double top = sreparam_top_singular(l->w, l->out, l->in, l->u, l->v);
            if (top <= 0.0) { /* LAPACK failure: fall back to a long power iteration */
                random_unit(l->u, l->in, rng);
                for (int k = 0; k < 200; k++) sreparam_power_step(l, work);
                top = l->sigma;
            }
            l->sigma = (float)top;
            *l->gamma = (float)top;
        } else {
            random_unit(l->u, l->in, rng);
            int steps = c->reparam == MODEL_REPARAM_SPECTRAL ? 15 : 1;
            for (int k = 0; k < steps; k++) sreparam_power_step(l, work);
            if (c->reparam == MODEL_REPARAM_SIGMA) random_unit(l->u, l->in, rng);
            /* gamma one: u is a fresh random unit vector (paper pseudocode); v from
             * one step only so that an eval before training has a defined sigma. */
        }
    }
}

static void run_all(model *m, int job);

void model_zero_grad(model *m) {
    run_all(m, JOB_ZERO);
    m->grads_clear = 1;
}

void model_parallel(model *m, model_task fn, void *ctx) { pool_run(m->pool, fn, ctx); }

/* Per-layer activation pointers (offsets between layers use the capacity
 * B x T, contents the forward's B, T), shifted to example b0. */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu,
        *residual3;
} layer_acts;

static layer_acts layer_at(model *m, int l, int b0) {
    size_t BT = (size_t)m->B * m->T, C = m->cfg.dim, H = m->cfg.heads;
    size_t att = (size_t)m->B * H * m->T * m->T;
    size_t r = (size_t)b0 * m->cur_T; /* first row of the shard */
    model_acts *a = &m->acts;
    layer_acts la = {a->ln1 + l * BT * C + r * C,
                     a->ln1_mean + l * BT + r,
                     a->ln1_rstd + l * BT + r,
                     a->qkv + l * BT * 3 * C + r * 3 * C,
                     a->atty + l * BT * C + r * C,
                     a->att + l * att + (size_t)b0 * H * m->cur_T * m->cur_T,
                     a->residual2 + l * BT * C + r * C,
                     a->ln2 + l * BT * C + r * C,
                     a->ln2_mean + l * BT + r,
                     a->ln2_rstd + l * BT + r,
                     a->fch + l * BT * 4 * C + r * 4 * C,
                     a->fch_gelu + l * BT * 4 * C + r * 4 * C,
                     a->residual3 + l * BT * C + r * C};
    return la;
}

static layer_acts layer_of(model *m, int l) { return layer_at(m, l, 0); }

/* The input of block l (the residual stream entering it), from example b0. */
static float *block_input(model *m, int l, int b0) {
    if (l == 0) return m->acts.encoded + (size_t)b0 * m->cur_T * m->cfg.dim;
    layer_acts p = layer_at(m, l - 1, b0);
    return m->cfg.norm == MODEL_NORM_POST ? p.ln2 : p.residual3;
}

/* The matmul alpha of a linear: gamma / sigma, or 1 without σReparam. */
static float scale_of(const model *m, const sreparam_linear *l) {
    return m->cfg.reparam == MODEL_REPARAM_NONE ? 1.0f : sreparam_scale(l);
}

/* Forward of examples [b0, b0 + B); returns the sum of their token losses. */
static double forward_shard(model *m, int b0, int B) {
    const model_config *c = &m->cfg;
    int L = c->layers, C = c->dim, NH = c->heads, V = c->vocab, T = m->cur_T, BT = B * T;
    model_params *p = &m->params;
    size_t r = (size_t)b0 * T;
    float *x = m->acts.encoded + r * C;
    kernel_encoder_forward(x, m->inputs + r, p->wte, p->wpe, B, T, C);
    for (int l = 0; l < L; l++) {
        layer_acts a = layer_at(m, l, b0);
        const sreparam_linear *lin = m->lin + l * MODEL_LIN_PER_LAYER;
        float *ain = x, *min, *skip;
        if (c->norm == MODEL_NORM_PRE) {
            kernel_layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p->ln1w + l * C, p->ln1b + l * C, BT, C);
            ain = a.ln1;
        }
        kernel_matmul_forward(a.qkv, ain, lin[MODEL_LIN_QKV].w, scale_of(m, &lin[MODEL_LIN_QKV]), p->qkvb + l * 3 * C,
                              NULL, BT, C, 3 * C);
        kernel_attention_forward(a.atty, a.att, a.qkv, B, T, C, NH);
        kernel_matmul_forward(a.residual2, a.atty, lin[MODEL_LIN_ATTPROJ].w, scale_of(m, &lin[MODEL_LIN_ATTPROJ]),
                              p->attprojb + l * C, x, BT, C, C);
        if (c->norm == MODEL_NORM_PRE) {
            kernel_layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p->ln2w + l * C, p->ln2b + l * C, BT,
                                     C);
            min = a.ln2;
            skip = a.residual2;
        } else if (c->norm == MODEL_NORM_POST) {
            kernel_layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.residual2, p->ln1w + l * C, p->ln1b + l * C, BT,
                                     C);
            min = skip = a.ln1;
        } else {
            min = skip = a.residual2;
        }
        kernel_matmul_forward(a.fch, min, lin[MODEL_LIN_FC].w, scale_of(m, &lin[MODEL_LIN_FC]), NULL, NULL, BT, C,
                              4 * C);
        kernel_gelu_forward(a.fch_gelu, a.fch, p->fcb + l * 4 * C, BT, 4 * C); /* bias fused */
        kernel_matmul_forward(a.residual3, a.fch_gelu, lin[MODEL_LIN_FCPROJ].w, scale_of(m, &lin[MODEL_LIN_FCPROJ]),
                              p->fcprojb + l * C, skip, BT, 4 * C, C);
        x = a.residual3;
        if (c->norm == MODEL_NORM_POST) {
            kernel_layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual3, p->ln2w + l * C, p->ln2b + l * C, BT,
                                     C);
            x = a.ln2;
        }
    }
    if (c->norm != MODEL_NORM_NONE) {
        float *lnf = m->acts.lnf + r * C;
        kernel_layernorm_forward(lnf, m->acts.lnf_mean + r, m->acts.lnf_rstd + r, x, p->lnfw, p->lnfb, BT, C);
        x = lnf;
    }
    float *probs = m->acts.probs + r * V;
    kernel_matmul_forward(probs, x, m->lin[m->num_linear - 1].w, scale_of(m, &m->lin[m->num_linear - 1]), NULL, NULL,
                          BT, C, V);
    return kernel_softmax_crossentropy_forward(probs, m->acts.losses + r, m->targets ? m->targets + r : NULL, BT, V);
}

static int is_weight(int t) {
    return t == MODEL_QKVW || t == MODEL_ATTPROJW || t == MODEL_FCW || t == MODEL_FCPROJW || t == MODEL_LMW;
}

/* Tensors a private shard buffer need not clear before a backward: the
 * weights (their one matmul per pass writes them with beta 0) and gamma
 * (its gradient only ever comes from the reduction). */
static int skip_clear(int t) { return t == MODEL_GAMMA || is_weight(t); }

/* Tensors the reduction does not add up by flat ranges: gamma, and with
 * σReparam the weights, which reduce_linear adds up by linear together
 * with the rank-one term of the gradient through sigma. */
static int skip_range_reduce(const model *m, int t) {
    return t == MODEL_GAMMA || (m->cfg.reparam != MODEL_REPARAM_NONE && is_weight(t));
}

/* σReparam's <G, W> for linear i, G = dL/dW_hat, which is never formed
 * (the dW matmuls apply alpha = gamma / sigma themselves).  Two routes:
 *  - by activations (grad_dot): G = dout^T X and dX = alpha dout W, so
 *    <G, W> = <dout W, X> = <dX, X> / alpha, a pass over two activations of
 *    each shard while the shards run in parallel;
 *  - by weights (reduce_linear): the reduced dW is alpha G when the
 *    gradient was cleared before the backward, so <G, W> = <dW, W> / alpha,
 *    read in the pass that reduces dW, and a second pass for the rank-one
 *    term.
 * The first moves 2 (tokens per shard) x in floats, the second about
 * 3 out x in / threads: weights win when 1.5 out < tokens of the batch
 * (narrow models, the LM head), activations at large widths. */
static double gw_weights_below = 1.5; /* model_set_gw_weights_below */

static int gw_by_weights(const model *m, int i) {
    const sreparam_linear *l = &m->lin[i];
    return m->grads_clear && sreparam_scale(l) != 0.0f && gw_weights_below * l->out < (double)m->cur_B * m->cur_T;
}

/* The activation route for linear i from this shard's examples.  With
 * gamma = 0 dX is zero, and dout W is formed again in dinp for the product. */
static void grad_dot(model *m, model_shard *sh, int i, float *dinp, const float *dout, const float *inp, int N) {
    if (m->cfg.reparam == MODEL_REPARAM_NONE || m->gw_route[i]) return;
    double t0 = now_seconds();
    const sreparam_linear *l = &m->lin[i];
    float a = sreparam_scale(l);
    if (a == 0.0f) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, l->in, l->out, 1.0f, dout, l->out, l->w, l->in, 0.0f,
                    dinp, l->in);
        sh->gw[i] = kernel_dot_double(dinp, inp, (long)N * l->in);
        memset(dinp, 0, sizeof(float) * (size_t)N * l->in);
    } else {
        sh->gw[i] = kernel_dot_double(dinp, inp, (long)N * l->in) / a;
    }
    sh->reparam_seconds += now_seconds() - t0;
}

/* Backward of linear i: kernel_matmul_backward into this shard's dW (shard 0 adds
 * into the model's gradient, the others overwrite their private copy),
 * then its share of <G, W>. */
static void linear_backward(model *m, model_shard *sh, int i, float *dinp, float *dbias, const float *dout,
                            const float *inp, int N) {
    const sreparam_linear *l = &m->lin[i];
    float *dw = sh->grads_memory + (l->dw - m->grads_memory);
    kernel_matmul_backward(dinp, dw, dbias, dout, inp, l->w, scale_of(m, l), N, l->in, l->out,
                           sh == &m->shards[0] ? 1.0f : 0.0f);
    grad_dot(m, sh, i, dinp, dout, inp, N);
}

/* Post-norm's backward through out = LN(inp), the stream's gradient in
 * *dx: d(inp) goes into *dtmp (cleared first: the kernel adds into it),
 * and the two swap, so that *dx holds d(inp). */
static void post_norm_backward(float **dx, float **dtmp, float *dw, float *db, const float *inp, const float *w,
                               const float *mean, const float *rstd, int BT, int C) {
    memset(*dtmp, 0, sizeof(float) * (size_t)BT * C);
    kernel_layernorm_backward(*dtmp, dw, db, *dx, inp, w, mean, rstd, BT, C);
    float *t = *dx;
    *dx = *dtmp;
    *dtmp = t;
}

/* Backward of one block (layer l) of examples [b0, b0 + B): dx holds
 * d(block output) on entry and d(block input) on return; dtmp, da, datty,
 * dqkv, dfch_gelu, datt are scratch (see backward_shard).  Returns the
 * buffer that now holds d(block input) (dx or dtmp: post-norm swaps). */
static float *block_backward(model *m, model_shard *sh, int l, int b0, int B, float *dx, float *dtmp, float *s) {
    const model_config *c = &m->cfg;
    int C = c->dim, NH = c->heads, T = m->cur_T, BT = B * T;
    long BTC = (long)BT * C;
    model_params *p = &m->params, *g = &sh->grads;
    float *da = s + 2 * BTC, *datty = s + 3 * BTC, *dqkv = s + 4 * BTC, *dfch_gelu = s + 7 * BTC;
    float *datt = s + 11 * BTC;
    layer_acts a = layer_at(m, l, b0);
    int li = l * MODEL_LIN_PER_LAYER;
    float *xin = block_input(m, l, b0);
    float *min = c->norm == MODEL_NORM_PRE ? a.ln2 : c->norm == MODEL_NORM_POST ? a.ln1 : a.residual2;
    float *ain = c->norm == MODEL_NORM_PRE ? a.ln1 : xin;
    if (c->norm == MODEL_NORM_POST) /* out = LN2(r3) */
        post_norm_backward(&dx, &dtmp, g->ln2w + l * C, g->ln2b + l * C, a.residual3, p->ln2w + l * C, a.ln2_mean,
                           a.ln2_rstd, BT, C);
    /* dx = d(residual3); MLP branch */
    linear_backward(m, sh, li + MODEL_LIN_FCPROJ, dfch_gelu, g->fcprojb + l * C, dx, a.fch_gelu, BT);
    kernel_gelu_backward(dfch_gelu, a.fch, (long)BT * 4 * C); /* now d(fc pre-activation) */
    linear_backward(m, sh, li + MODEL_LIN_FC, da, g->fcb + l * 4 * C, dfch_gelu, min, BT);
    if (c->norm == MODEL_NORM_PRE) {
        kernel_layernorm_backward(dx, g->ln2w + l * C, g->ln2b + l * C, da, a.residual2, p->ln2w + l * C, a.ln2_mean,
                                  a.ln2_rstd, BT, C);
    } else if (c->norm == MODEL_NORM_POST) { /* n = LN1(r2) feeds both skip and MLP */
        kernel_add_into(dx, da, BTC);
        post_norm_backward(&dx, &dtmp, g->ln1w + l * C, g->ln1b + l * C, a.residual2, p->ln1w + l * C, a.ln1_mean,
                           a.ln1_rstd, BT, C);
    } else {
        kernel_add_into(dx, da, BTC);
    }
    /* dx = d(residual2); attention branch */
    linear_backward(m, sh, li + MODEL_LIN_ATTPROJ, datty, g->attprojb + l * C, dx, a.atty, BT);
    kernel_attention_backward(dqkv, datt, datty, a.qkv, a.att, B, T, C, NH);
    linear_backward(m, sh, li + MODEL_LIN_QKV, da, g->qkvb + l * 3 * C, dqkv, ain, BT);
    if (c->norm == MODEL_NORM_PRE)
        kernel_layernorm_backward(dx, g->ln1w + l * C, g->ln1b + l * C, da, xin, p->ln1w + l * C, a.ln1_mean,
                                  a.ln1_rstd, BT, C);
    else kernel_add_into(dx, da, BTC);
    return dx;
}

/* Backward of examples [b0, b0 + B) into shard sh's gradient buffers. */
static void backward_shard(model *m, model_shard *sh, int b0, int B) {
    const model_config *c = &m->cfg;
    int L = c->layers, C = c->dim, V = c->vocab, T = m->cur_T, BT = B * T;
    long BTC = (long)BT * C;
    size_t r = (size_t)b0 * T;
    model_params *p = &m->params, *g = &sh->grads;
    /* scratch: dx, dtmp, da, datty (BT, C) each, dqkv (BT, 3C), dfch_gelu
     * (BT, 4C), datt (T, T) */
    float *s = sh->scratch, *dx = s, *dtmp = s + BTC;
    if (sh != &m->shards[0]) { /* private buffer: clear what this pass adds into */
        size_t off = 0;
        for (int t = 0; t < MODEL_NUM_PARAMS; t++) {
            if (!skip_clear(t)) memset(sh->grads_memory + off, 0, sizeof(float) * m->param_sizes[t]);
            off += m->param_sizes[t];
        }
    }
    float *probs = m->acts.probs + r * V;
    kernel_crossentropy_backward(probs, m->targets + r, BT, V, 1.0f / ((float)m->cur_B * T));
    float *xlast = block_input(m, L, b0);
    int hi = m->num_linear - 1;
    if (c->norm != MODEL_NORM_NONE) {
        linear_backward(m, sh, hi, dtmp, NULL, probs, m->acts.lnf + r * C, BT);
        memset(dx, 0, sizeof(float) * BTC);
        kernel_layernorm_backward(dx, g->lnfw, g->lnfb, dtmp, xlast, p->lnfw, m->acts.lnf_mean + r,
                                  m->acts.lnf_rstd + r, BT, C);
    } else {
        linear_backward(m, sh, hi, dx, NULL, probs, xlast, BT);
    }
    for (int l = L - 1; l >= 0; l--) {
        float *out = block_backward(m, sh, l, b0, B, dx, dtmp, s);
        if (out != dx) {
            dtmp = dx;
            dx = out;
        }
    }
    kernel_encoder_backward(g->wte, g->wpe, dx, m->inputs + r, B, T, C);
}

/* ---- the pool's jobs: data parallel over the examples of a batch --------
 * Each shard runs the whole forward/backward of its examples with
 * single-threaded OpenBLAS calls; see model.h for why. */

static void shard_range(const model *m, int t, int *b0, int *nb) {
    int B = m->cur_B, n = m->nthreads < B ? m->nthreads : B;
    if (t >= n) {
        *b0 = 0;
        *nb = 0;
        return;
    }
    *b0 = B * t / n;
    *nb = B * (t + 1) / n - *b0;
}

/* The weight route's first pass: adds the other shards' dW into the
 * model's and returns <dW, W> / alpha = <G, W>. */
static double reduce_dot(model *m, int i) {
    sreparam_linear *l = &m->lin[i];
    size_t off = (size_t)(l->dw - m->grads_memory);
    double gw = 0.0;
    for (int o = 0; o < l->out; o++) {
        float *restrict d = l->dw + (long)o * l->in;
        for (int k = 1; k < m->nthreads; k++)
            if (!m->shards[k].idle) kernel_add_into(d, m->shards[k].grads_memory + off + (long)o * l->in, l->in);
        gw += kernel_dot_double(d, l->w + (long)o * l->in, l->in);
    }
    return gw / sreparam_scale(l);
}

/* Linear i's weight gradient, with σReparam: adds the other shards' dW into
 * the model's and applies the rank-one term -c v u^T of the gradient
 * through sigma (sreparam_grad_sigma has the formula; the shards' matmuls
 * already applied gamma / sigma to G).  By activations the two share one
 * pass, row by row; by weights the reduction is reduce_dot's. */
static void reduce_linear(model *m, int i, model_shard *self) {
    sreparam_linear *l = &m->lin[i];
    size_t off = (size_t)(l->dw - m->grads_memory);
    double gw = 0.0, t0 = now_seconds();
    int others = 0;
    for (int k = 0; k < m->nthreads; k++)
        if (!m->shards[k].idle) {
            gw += m->shards[k].gw[i];
            others += k > 0;
        }
    if (m->gw_route[i]) {
        gw = reduce_dot(m, i);
        others = 0;
    }
    float c = sreparam_grad_sigma(l, gw, m->cfg.reparam == MODEL_REPARAM_SIGMA);
    for (int o = 0; o < l->out; o++) {
        float *restrict d = l->dw + (long)o * l->in;
        const float *restrict u = l->u;
        float cv = c * l->v[o];
        int first = 1;
        for (int k = 1; others && k < m->nthreads; k++) { /* none left by weights */
            if (m->shards[k].idle) continue;
            const float *restrict src = m->shards[k].grads_memory + off + (long)o * l->in;
            if (first)
                for (int j = 0; j < l->in; j++) d[j] += src[j] - cv * u[j];
            else
                for (int j = 0; j < l->in; j++) d[j] += src[j];
            first = 0;
        }
        if (first)
            for (int j = 0; j < l->in; j++) d[j] -= cv * u[j];
    }
    /* Counted as σReparam's: the weight route's two passes (the first one
     * reduces too: an overstatement), and the rank-one pass when alone; not
     * the fused pass, which is the plain model's reduction plus an FMA. */
    if (!others) self->reparam_seconds += now_seconds() - t0;
}

/* Gradients of shards 1.. into shard 0, in a fixed order. */
static void reduce_job(model *m, int t) {
    size_t off = 0, lo, hi;
    for (int p = 0; p < MODEL_NUM_PARAMS; p++) {
        size_t n = m->param_sizes[p];
        if (!skip_range_reduce(m, p)) {
            pool_split(t, m->nthreads, n, &lo, &hi);
            for (int k = 1; k < m->nthreads; k++)
                if (!m->shards[k].idle)
                    kernel_add_into(m->grads_memory + off + lo, m->shards[k].grads_memory + off + lo, (long)(hi - lo));
        }
        off += n;
    }
    for (int i = 0; m->cfg.reparam != MODEL_REPARAM_NONE && i < m->num_linear; i++)
        if (m->lin_owner[i] == t) reduce_linear(m, i, &m->shards[t]);
}

static void run_shard(void *ctx, int t, int nthreads) {
    model *m = ctx;
    int b0, nb;
    shard_range(m, t, &b0, &nb);
    model_shard *sh = &m->shards[t];
    size_t lo, hi;
    switch (m->job) {
    case JOB_FORWARD: sh->loss_sum = nb ? forward_shard(m, b0, nb) : 0.0; break;
    case JOB_BACKWARD:
        sh->reparam_seconds = 0.0;
        if (nb) backward_shard(m, sh, b0, nb);
        else sh->idle = 1;
        break;
    case JOB_REDUCE: reduce_job(m, t); break;
    case JOB_REPARAM_FWD: /* this thread's linears (balanced by size at create) */
        for (int i = 0; i < m->num_linear; i++) {
            if (m->lin_owner[i] != t) continue;
            sreparam_linear *l = &m->lin[i];
            if (m->train) sreparam_power_step(l, sh->scratch);
            else l->sigma = sreparam_sigma(l);
        }
        break;
    case JOB_ZERO:
        pool_split(t, nthreads, m->num_params, &lo, &hi);
        memset(m->grads_memory + lo, 0, (hi - lo) * sizeof(float));
        break;
    }
}

/* Runs a job on every shard (shard 0 on this thread) and waits for all. */
static void run_all(model *m, int job) {
    m->job = job;
    if (job == JOB_FORWARD || job == JOB_BACKWARD)
        for (int t = 0; t < m->nthreads; t++) m->shards[t].idle = 0;
    pool_run(m->pool, run_shard, m);
}

float model_forward(model *m, const int *inputs, const int *targets, int B, int T, int train) {
    const model_config *c = &m->cfg;
    m->cur_B = B;
    m->cur_T = T;
    m->inputs = inputs;
    m->targets = targets;
    if (c->reparam != MODEL_REPARAM_NONE) {
        double t0 = now_seconds();
        m->train = train;
        run_all(m, JOB_REPARAM_FWD);
        memset(m->qkv_fresh, 0, sizeof(int) * (size_t)c->layers);
        m->reparam_seconds += now_seconds() - t0;
    }
    run_all(m, JOB_FORWARD);
    double total = 0.0;
    for (int t = 0; t < m->nthreads; t++) total += m->shards[t].loss_sum;
    m->mean_loss = targets ? (float)(total / ((double)B * T)) : -1.0f;
    return m->mean_loss;
}

/* The slowest shard's σReparam time of the last job. */
static double worst_reparam(const model *m) {
    double worst = 0.0;
    for (int t = 0; t < m->nthreads; t++)
        if (m->shards[t].reparam_seconds > worst) worst = m->shards[t].reparam_seconds;
    return worst;
}

void model_backward(model *m) {
    for (int i = 0; m->cfg.reparam != MODEL_REPARAM_NONE && i < m->num_linear; i++)
        m->gw_route[i] = gw_by_weights(m, i);
    m->grads_clear = 0;
    run_all(m, JOB_BACKWARD);
    m->reparam_seconds += worst_reparam(m);
    if (m->nthreads > 1 || m->cfg.reparam != MODEL_REPARAM_NONE) {
        for (int t = 0; t < m->nthreads; t++) m->shards[t].reparam_seconds = 0.0;
        run_all(m, JOB_REDUCE);
        m->reparam_seconds += worst_reparam(m);
    }
}

float *model_attention(model *m, int layer) { return layer_of(m, layer).att; }
float *model_qkv(model *m, int layer) { return layer_of(m, layer).qkv; }

float *model_attn_input(model *m, int layer) {
    return m->cfg.norm == MODEL_NORM_PRE ? layer_of(m, layer).ln1 : block_input(m, layer, 0);
}

const float *model_qkv_weight(model *m, int layer) {
    sreparam_linear *l = &m->lin[layer * MODEL_LIN_PER_LAYER + MODEL_LIN_QKV];
    if (m->cfg.reparam != MODEL_REPARAM_NONE && !m->qkv_fresh[layer]) {
        sreparam_forward(l);
        m->qkv_fresh[layer] = 1;
    }
    return l->weff;
}

void model_set_gw_weights_below(double ratio) { gw_weights_below = ratio; }

int model_linear_index(const model *m, int layer, int which) {
    if (layer >= m->cfg.layers) return m->num_linear - 1;
    return layer * MODEL_LIN_PER_LAYER + which;
}

const sreparam_linear *model_linear(const model *m, int index) { return &m->lin[index]; }
