/* main.c - sigmatrain: the command line and the training loop.
 *
 * Reads as a story: parse flags, build data, model and optimizer (or restore
 * them from a checkpoint), then step: batch -> forward -> backward -> clip ->
 * update (train_step) -> telemetry -> progress / eval / save -> the answer
 * to alerts (respond.h).  Exit status: 0 done, 1 usage or I/O error, 3
 * diverged (NaN/Inf loss or gradient), 4 ranks disagree (MPI), 5 aborted on
 * an alert (--on-alert stop, or rollback with no snapshot left or
 * --max-rollbacks reached).
 *
 * What it is not: the model (model.h), the metrics (probe.h), the
 * telemetry (monitor.h), the alert policy (respond.h), OpenBLAS's quirks
 * (blas.h), the run's JSON description (ckpt.h). */
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "ckpt.h"
#include "data.h"
#include "dist.h"
#include "flags.h"
#include "model.h"
#include "monitor.h"
#include "now.h"
#include "optim.h"
#include "respond.h"
#include "telemetry.h"

#define SYNTH_TOKENS (1u << 21)
#define EXIT_DIVERGED 3
#define EXIT_RANKS_DIFFER 4
#define EXIT_ALERT_ABORTED 5

typedef struct {
    ckpt_meta run; /* everything that defines the run (saved in checkpoints) */
    const char *data_path, *save_path, *resume_path;
    int save_every, eval_every, eval_batches, print_every, threads;
    int continue_on_nan;
    int sgemm_peak; /* --sgemm-peak: measure and exit (for the benchmark) */
    /* telemetry (none without --daemon) */
    const char *daemon, *run_name, *spool_dir, *token;
    int log_every, probe_examples, queue_slots, spool_max_mb, upload_spool, telemetry_ab, end_grace;
    int dist_check_every, dist_bucket_kb; /* MPI build (dist.h) */
    /* the response to firing alerts (--on-alert, respond.h) */
    int on_alert;
    const char *on_alert_rules;
    int rollback_every, rollback_keep, max_rollbacks;
    float rollback_lr_scale;
} options;

/* ---- THE FLAG TABLE --------------------------------------------------------
 * One row a flag (common/flags.h) drives parsing, --help and the --resume
 * check: a flag marked DEFINES names part of the run's definition, which a
 * checkpoint carries (given with --resume it is ignored, with a warning). */
enum { DEFINES = 1 };

#define O(f) offsetof(options, f)
#define R(f) (offsetof(options, run) + offsetof(ckpt_meta, f))
#define C(f) (offsetof(options, run) + offsetof(ckpt_meta, cfg) + offsetof(model_config, f))
#define INT FLAG_INT_ROW
#define ENUM FLAG_ENUM_ROW
#define FLT FLAG_FLOAT_ROW
#define STR FLAG_STR_ROW
#define BOOL FLAG_BOOL_ROW
#define SECTION FLAG_SECTION_ROW
#define BIG (1L << 30)

static const flag FLAGS[] = {
    SECTION("model:"),
    INT("--layers", C(layers), 1, 256, DEFINES, "N", "blocks (default 4)"),
    INT("--heads", C(heads), 1, 1024, DEFINES, "N", "attention heads (default 4)"),
    INT("--dim", C(dim), 1, 16384, DEFINES, "N", "model width C, divisible by heads (default 128)"),
    INT("--seq-len", R(seq_len), 1, 16384, DEFINES, "N", "context length T (default 128)"),
    ENUM("--norm", C(norm), ckpt_norm_names, DEFINES, "MODE", "pre|post|none LayerNorm placement (default pre)"),
    ENUM("--reparam", C(reparam), ckpt_reparam_names, DEFINES, "MODE", "sigma|none|spectral (default sigma)"),
    ENUM("--gamma-init", C(gamma_init), ckpt_gamma_names, DEFINES, "MODE",
         "sigma|one: gamma starts at sigma(W_init) (W_hat = W) or 1 (default sigma)"),
    SECTION("training:"),
    ENUM("--optimizer", R(optimizer), ckpt_optim_names, DEFINES, "NAME",
         "sgd|momentum|adam|adamw (default adamw; betas 0.9, 0.95)"),
    FLT("--lr", R(lr), DEFINES, "peak learning rate (default 1e-3)"),
    INT("--warmup", R(warmup), 0, BIG, DEFINES, "N", "linear warmup steps, 0 allowed (default 0)"),
    ENUM("--schedule", R(schedule), ckpt_schedule_names, DEFINES, "S",
         "constant|cosine, cosine ends at lr/10 (default cosine)"),
    FLT("--weight-decay", R(weight_decay), DEFINES, "on matrices and embeddings (default 0; AdamW decoupled)"),
    FLT("--clip", R(clip), DEFINES, "global gradient-norm clip, 0 = off (default 1.0)"),
    INT("--batch", R(batch), 1, 1 << 20, DEFINES, "N", "sequences per step (default 16)"),
    INT("--steps", R(steps), 0, BIG, 0, "N", "total steps (default 1000; with --resume: the new total)"),
    {"--seed", FLAG_U64, R(seed), 0, 2147483647, NULL, 0, DEFINES, "N", "init and synthetic data seed (default 1)"},
    INT("--threads", O(threads), 1, 256, 0, "N",
        "worker threads: the batch is split into N shards, each\n"
        "computed by its own thread on single-threaded OpenBLAS (default 2)"),
    STR("--data", O(data_path), "FILE", "train a byte-level model (vocab 256) on FILE; default: synthetic corpus"),
    BOOL("--continue-on-nan", O(continue_on_nan), "report a NaN/Inf step, skip its update and go on (default: exit 3)"),
    SECTION("output:"),
    INT("--eval-every", O(eval_every), 0, BIG, 0, "N",
        "validation loss every N steps, 0 = only at the end (default 100)"),
    INT("--eval-batches", O(eval_batches), 1, 1 << 20, 0, "N", "validation batches per eval (default 8)"),
    INT("--print-every", O(print_every), 1, BIG, 0, "N", "progress line every N steps (default 10)"),
    STR("--save", O(save_path), "PATH",
        "checkpoint at the end (and every --save-every steps);\n\"{step}\" in PATH is replaced by the step number"),
    INT("--save-every", O(save_every), 0, BIG, 0, "N", "(default 0: only at the end)"),
    STR("--resume", O(resume_path), "PATH",
        "continue a run from its checkpoint; the run's definition\n"
        "(model, optimizer, schedule, batch, seed, data) comes from the file"),
    BOOL("--sgemm-peak", O(sgemm_peak),
         "print the sgemm GFLOP/s ceiling for --threads (N concurrent\n"
         "single-threaded calls, and one call on N OpenBLAS threads) and exit"),
    SECTION("telemetry (to entropyd; nothing at all without --daemon):"),
    STR("--daemon", O(daemon), "ADDR", "unix:PATH or tcp:HOST:PORT; the run streams collapse metrics"),
    STR("--run", O(run_name), "NAME", "run name (default: generated, printed at start)"),
    STR("--spool", O(spool_dir), "DIR",
        "on-disk spool (write-ahead log) for unacknowledged messages;\n"
        "default: a private temporary one, removed at exit"),
    INT("--log-every", O(log_every), 1, BIG, 0, "K", "probe and send every K steps (default 1)"),
    INT("--probe-examples", O(probe_examples), 0, 1 << 20, 0, "N",
        "examples of the batch the probe reads (default 4, 0 = all)"),
    INT("--telemetry-queue", O(queue_slots), 16, 1 << 20, 0, "N", "in-memory queue bound, messages (default 256)"),
    INT("--spool-max-mb", O(spool_max_mb), 1, 1 << 20, 0, "N",
        "spool bound in MiB (default 256); beyond it, counted drops"),
    STR("--token", O(token), "T", "daemon token (TCP)"),
    BOOL("--upload-spool", O(upload_spool),
         "send what --spool DIR holds for --run NAME (with the run's\n"
         "--layers/--heads/--seq-len) to --daemon, wait for the acks, exit;\n"
         "without --run: every run in --spool DIR left unacknowledged\n"
         "(a run started on a --spool DIR also uploads those in the background)"),
    INT("--end-grace", O(end_grace), 0, 86400, 0, "S",
        "at the end, keep reconnecting up to S seconds (default 30) until the\n"
        "daemon acknowledged everything; what is left stays in the spool"),
    ENUM("--on-alert", O(on_alert), respond_action_names, 0, "ACTION",
         "warn|checkpoint|rollback|stop on a firing alert from the daemon\n"
         "(default warn: print it); checkpoint: save one now (--save PATH,\n"
         "else SPOOL/RUN-step{step}.ckpt, . without --spool); stop: save one, end the run\n"
         "\"aborted\", exit 5; rollback: restore the newest in-memory snapshot\n"
         "from before the alert's start_step, skip the batches since, go on"),
    STR("--on-alert-rules", O(on_alert_rules), "A,B", "act only on these rules (default: any)"),
    INT("--rollback-every", O(rollback_every), 1, BIG, 0, "N", "in-memory snapshot every N steps (default 50)"),
    INT("--rollback-keep", O(rollback_keep), 1, 1024, 0, "N", "snapshots kept, newest (default 4)"),
    FLT("--rollback-lr-scale", O(rollback_lr_scale), 0, "multiply the learning rate by X at each rollback (default 1)"),
    INT("--max-rollbacks", O(max_rollbacks), 0, BIG, 0, "N",
        "a firing alert after N rollbacks stops the run as stop does (default 3)"),
    INT("--telemetry-ab", O(telemetry_ab), 1, 1 << 20, 0, "N",
        "benchmark: alternate blocks of N steps with and without telemetry\n"
        "and print both step times at the end (bench/telemetry_overhead.sh)"),
    SECTION("distributed (build/sigmatrain-mpi under mpirun; --batch is the global batch):"),
    INT("--dist-check-every", O(dist_check_every), 0, BIG, 0, "K",
        "compare a hash of parameters, power-iteration vectors and\n"
        "optimizer moments across ranks every K steps, 0 = never (default 100)"),
    INT("--dist-bucket-kb", O(dist_bucket_kb), 0, 1 << 20, 0, "N",
        "gradient all-reduce bucket size, 0 = one call (default 0)"),
    FLAG_VERSION_ROW("print the version and exit"),
    FLAG_HELP_ROW("this text (also -h)"),
};
#define NFLAGS FLAG_COUNT(FLAGS)
static const flag_table TABLE = {"sigmatrain", FLAGS, NFLAGS};

static void usage(FILE *f) {
    fprintf(f, "usage: sigmatrain [flags]\n"
               "Trains a GPT-style transformer (fp32, OpenBLAS) with or without sigmaReparam.\n");
    flags_usage(&TABLE, f);
}

static void set_defaults(options *o) {
    ckpt_meta *r = &o->run;
    memset(o, 0, sizeof *o);
    r->cfg = (model_config){.vocab = DATA_SYNTH_VOCAB,
                            .max_seq = 128,
                            .layers = 4,
                            .heads = 4,
                            .dim = 128,
                            .norm = MODEL_NORM_PRE,
                            .reparam = MODEL_REPARAM_SIGMA,
                            .gamma_init = MODEL_GAMMA_SIGMA};
    r->optimizer = OPTIM_ADAMW;
    r->schedule = OPTIM_SCHEDULE_COSINE;
    r->batch = 16;
    r->seq_len = 128;
    r->steps = 1000;
    r->seed = 1;
    r->lr = 1e-3f;
    r->clip = 1.0f;
    r->beta1 = 0.9f;
    r->beta2 = 0.95f;
    r->eps = 1e-8f;
    o->eval_every = 100;
    o->eval_batches = 8;
    o->print_every = 10;
    o->threads = 2;
    o->log_every = 1;
    o->end_grace = 30;
    o->probe_examples = PROBE_DEFAULT_EXAMPLES;
    o->dist_check_every = 100;
    o->rollback_every = 50;
    o->rollback_keep = 4;
    o->max_rollbacks = 3;
    o->rollback_lr_scale = 1.0f;
}

/* Combinations of flags that make no sense.  Returns 0 or -1 (printed). */
static int check_args(options *o) {
    ckpt_meta *r = &o->run;
    char bad[160] = "";
    if (r->cfg.dim % r->cfg.heads)
        snprintf(bad, sizeof bad, "--dim %d is not divisible by --heads %d", r->cfg.dim, r->cfg.heads);
    else if (o->save_every && !o->save_path) snprintf(bad, sizeof bad, "--save-every needs --save PATH");
    else if (!o->daemon && (o->run_name || o->spool_dir || o->token || o->upload_spool || o->telemetry_ab))
        snprintf(bad, sizeof bad, "--run, --spool, --token, --upload-spool and --telemetry-ab need --daemon ADDR");
    else if (o->on_alert != RESPOND_ACT_WARN && !o->daemon)
        snprintf(bad, sizeof bad, "--on-alert %s needs --daemon ADDR (alerts come from entropyd)",
                 respond_action_names[o->on_alert]);
    else if (o->upload_spool && !o->spool_dir)
        snprintf(bad, sizeof bad, "--upload-spool needs --spool DIR (and --run NAME for one run)");
    if (bad[0]) {
        fprintf(stderr, "sigmatrain: %s\n", bad);
        return -1;
    }
    r->cfg.max_seq = r->seq_len;
    return 0;
}

/* Fills o from argv through FLAGS; given[i] is set when FLAGS[i] was given.
 * Returns 0 to run, 1 after --help or --version, -1 on a bad flag. */
static int parse_args(int argc, char **argv, options *o, char given[NFLAGS]) {
    set_defaults(o);
    switch (flags_parse(&TABLE, argc, argv, o, given)) {
    case FLAGS_HELP: usage(stdout); return 1;
    case FLAGS_VERSION: printf("sigmatrain %s\n", PROJECT_VERSION); return 1;
    case FLAGS_BAD: return -1;
    default: return check_args(o);
    }
}

/* --resume: the run's definition comes from the checkpoint's header; flags
 * that would change it are ignored with a warning, --steps extends the run.
 * Returns 0 or -1 (printed). */
static int resume_definition(options *o, const char given[NFLAGS]) {
    char err[512];
    int steps = o->run.steps, steps_given = given[flags_find(&TABLE, "--steps") - FLAGS];
    if (ckpt_read_meta(o->resume_path, &o->run, err, sizeof err) != 0) {
        fprintf(stderr, "sigmatrain: resume: %s\n", err);
        return -1;
    }
    if (steps_given) o->run.steps = steps;
    for (int i = 0; i < NFLAGS; i++)
        if (given[i] && (FLAGS[i].marks & DEFINES))
            fprintf(stderr, "sigmatrain: warning: %s is ignored with --resume (the checkpoint defines the run)\n",
                    FLAGS[i].name);
    if ((o->run.data_kind == 1) != (o->data_path != NULL)) {
        fprintf(stderr, "sigmatrain: resume: the checkpoint was trained on %s; %s\n",
                o->run.data_kind ? "a --data file" : "the synthetic corpus",
                o->run.data_kind ? "give the same --data FILE" : "do not give --data");
        return -1;
    }
    return 0;
}

/* ---- THE RUN ---------------------------------------------------------------
 * The optimizer update split over the model's threads: phase 0 sums the
 * squared gradient per thread, phase 1 updates each thread's slice with the
 * clipping factor.  Partial sums are combined in thread order, so results
 * are deterministic for a given --threads. */
typedef struct {
    optim *opt;
    model *m;
    const optim_group *groups;
    int phase;
    float lr, scale;
    double sumsq[256];
} update_task;

static void update_slice(void *ctx, int t, int nt) {
    update_task *u = ctx;
    size_t n = u->m->num_params, lo = n * t / nt, hi = n * (t + 1) / nt;
    if (u->phase == 0) u->sumsq[t] = optim_sumsq(u->m->grads_memory, lo, hi);
    else
        optim_update(u->opt, u->m->params_memory, u->m->grads_memory, u->scale, u->groups, MODEL_NUM_PARAMS, u->lr, lo,
                     hi);
}

static void build_groups(const model *m, optim_group *g) {
    size_t off = 0;
    for (int i = 0; i < MODEL_NUM_PARAMS; i++) {
        g[i].offset = off;
        g[i].n = m->param_sizes[i];
        off += g[i].n;
        g[i].decay = i == MODEL_WTE || i == MODEL_WPE || i == MODEL_QKVW || i == MODEL_ATTPROJW || i == MODEL_FCW ||
                     i == MODEL_FCPROJW || i == MODEL_LMW;
        g[i].frozen = i == MODEL_GAMMA && m->cfg.reparam != MODEL_REPARAM_SIGMA;
    }
}

/* Everything one process's training run holds. */
typedef struct {
    options *o;
    ckpt_meta *r; /* &o->run: the run's definition and progress */
    dist *dd;
    data *d;
    model *m;
    optim *opt;
    monitor *mon; /* rank 0 with --daemon, else NULL */
    respond *rs;
    int *in, *tg;     /* (B, T) the global batch */
    int B, T, b0, nb; /* this rank runs rows [b0, b0 + nb) */
    optim_group groups[MODEL_NUM_PARAMS];
    update_task upd;
    double flops;                  /* useful matmul FLOPs of one step */
    float loss, lr, gnorm;         /* of the last step */
    double step_start, comm_start; /* of the last step: clock and dist_comm_seconds */
    /* progress: t0 and tlast move forward by the time of evals and saves */
    double t0, tlast, loss_acc, reparam_eval;
    long done_here, window, finite_in_window;
    char err[512];
} trainer;

typedef enum { STEP_OK, STEP_SKIPPED, STEP_DIVERGED, STEP_DIST_FAILED } step_status;

static double now_s(void) { return now_mono_ms() / 1e3; }

/* The training data (--data FILE or the synthetic corpus), checked against
 * the checkpoint's when resuming.  Returns 0 or -1 (printed). */
static int open_data(trainer *tr) {
    ckpt_meta *r = tr->r;
    const char *path = tr->o->data_path;
    tr->d = path ? data_file(path, tr->err, sizeof tr->err) : data_synthetic(r->seed, SYNTH_TOKENS);
    if (!tr->d) {
        fprintf(stderr, "sigmatrain: %s%s\n", path ? "--data " : "", path ? tr->err : "out of memory");
        return -1;
    }
    r->data_kind = path != NULL;
    r->cfg.vocab = tr->d->vocab;
    if (tr->o->resume_path && (tr->d->hash != r->data_hash || tr->d->n != r->data_tokens)) {
        fprintf(
            stderr,
            "sigmatrain: resume: the data differs from the checkpoint's (%zu tokens, hash %016llx vs %llu, %016llx)\n",
            tr->d->n, (unsigned long long)tr->d->hash, (unsigned long long)r->data_tokens,
            (unsigned long long)r->data_hash);
        return -1;
    }
    r->data_tokens = tr->d->n;
    r->data_hash = tr->d->hash;
    if (data_check(tr->d, r->batch, r->seq_len, tr->err, sizeof tr->err) != 0 ||
        model_config_check(&r->cfg, tr->err, sizeof tr->err) != 0) {
        fprintf(stderr, "sigmatrain: %s\n", tr->err);
        return -1;
    }
    return 0;
}

/* This rank's model shard and the optimizer, initialized or restored from
 * --resume.  Returns 0 or -1 (printed). */
static int build_model(trainer *tr) {
    ckpt_meta *r = tr->r;
    tr->B = r->batch;
    tr->T = r->seq_len;
    if (tr->B < dist_size(tr->dd)) {
        fprintf(stderr, "sigmatrain: --batch %d is smaller than the %d ranks\n", tr->B, dist_size(tr->dd));
        return -1;
    }
    dist_shard(tr->dd, tr->B, &tr->b0, &tr->nb);
    tr->m = model_create(&r->cfg, tr->nb, tr->T, tr->o->threads);
    tr->opt = tr->m ? optim_create(r->optimizer, tr->m->num_params, r->beta1, r->beta2, r->eps, r->weight_decay) : NULL;
    tr->in = malloc(sizeof(int) * tr->B * tr->T);
    tr->tg = malloc(sizeof(int) * tr->B * tr->T);
    if (!tr->m || !tr->opt || !tr->in || !tr->tg) {
        fprintf(stderr, "sigmatrain: out of memory\n");
        return -1;
    }
    if (tr->o->resume_path) {
        int steps = r->steps; /* possibly extended by --steps */
        if (ckpt_load(tr->o->resume_path, r, tr->m, tr->opt, tr->err, sizeof tr->err) != 0) {
            fprintf(stderr, "sigmatrain: resume: %s\n", tr->err);
            return -1;
        }
        r->steps = steps;
        tr->d->pos = r->data_pos;
    } else {
        r->rng = r->seed * 0x9E3779B97F4A7C15ull ^ 0xD1B54A32D192ED03ull;
        if (!r->rng) r->rng = 1;
        model_init(tr->m, &r->rng);
        r->step = 0;
        r->nan_steps = 0;
    }
    build_groups(tr->m, tr->groups);
    tr->upd = (update_task){.opt = tr->opt, .m = tr->m, .groups = tr->groups};
    tr->flops = model_step_flops(&r->cfg, tr->B, tr->T);
    return 0;
}

static void print_header(const trainer *tr) {
    const ckpt_meta *r = tr->r;
    const options *o = tr->o;
    int n = dist_size(tr->dd);
    printf("sigmatrain: L=%d H=%d C=%d T=%d B=%d vocab=%d params=%zu | reparam=%s gamma-init=%s norm=%s | "
           "%s lr=%g warmup=%d schedule=%s wd=%g clip=%g | steps=%d seed=%llu threads=%d blas=%s | data=%s%s\n",
           r->cfg.layers, r->cfg.heads, r->cfg.dim, tr->T, tr->B, r->cfg.vocab, tr->m->num_params,
           ckpt_reparam_names[r->cfg.reparam], ckpt_gamma_names[r->cfg.gamma_init], ckpt_norm_names[r->cfg.norm],
           ckpt_optim_names[r->optimizer], r->lr, r->warmup, ckpt_schedule_names[r->schedule], r->weight_decay, r->clip,
           r->steps, (unsigned long long)r->seed, o->threads, blas_core_name(),
           o->data_path ? o->data_path : "synthetic", o->resume_path ? " (resumed)" : "");
    if (o->resume_path) printf("resumed from %s at step %lld\n", o->resume_path, (long long)r->step);
    if (n > 1)
        printf("dist: %d ranks (MPI), %d-%d rows of each batch of %d per rank, all-reduce bucket %s, "
               "checksum every %d steps\n",
               n, tr->B / n, (tr->B + n - 1) / n, tr->B, o->dist_bucket_kb ? "set" : "whole buffer",
               o->dist_check_every);
}

/* dist_on_failure's callback (the watcher thread, while the training
 * thread is blocked in a collective): end the run as failed. */
static void end_run_failed(void *mon) { monitor_destroy(mon, "failed"); }

/* --daemon on rank 0 (one run: rank 0 streams).  Returns 0 or -1 (printed). */
static int start_telemetry(trainer *tr) {
    const options *o = tr->o;
    int ranks = dist_size(tr->dd);
    ckpt_run_facts facts = {.trainer_version = PROJECT_VERSION " (built " __DATE__ " " __TIME__ ")",
                            .data_path = o->data_path,
                            .resumed_from = o->resume_path,
                            .params = tr->m->num_params,
                            .threads = o->threads,
                            .log_every = o->log_every,
                            .probe_examples = o->probe_examples};
    char *meta = ckpt_meta_json(tr->r, &facts);
    monitor_config mc = {.address = o->daemon,
                         .run = o->run_name,
                         .spool_dir = o->spool_dir,
                         .token = o->token,
                         .meta_json = meta,
                         .log_every = o->log_every,
                         .end_grace_ms = o->end_grace ? o->end_grace * 1000 : -1,
                         .queue_slots = (size_t)o->queue_slots,
                         .spool_max_bytes = (size_t)o->spool_max_mb << 20,
                         .probe = {.examples = o->probe_examples},
                         .tokens_per_step = (long)tr->B * tr->T,
                         .ab_block = o->log_every == 1 ? o->telemetry_ab : 0,
                         .ab_max_steps = tr->r->steps,
                         .extra_scalars = ranks > 1 ? 3 * ranks : 0};
    tr->mon = meta ? monitor_create(&mc, tr->m, tr->err, sizeof tr->err) : NULL;
    free(meta);
    if (!tr->mon) {
        fprintf(stderr, "sigmatrain: telemetry: %s\n", meta ? tr->err : "out of memory");
        return -1;
    }
    dist_on_failure(tr->dd, end_run_failed, tr->mon); /* a peer died while we waited on it */
    printf("telemetry: run %s -> %s (spool %s, log every %d, probe on %d examples)\n", monitor_run_name(tr->mon),
           o->daemon, o->spool_dir ? o->spool_dir : "private, temporary", o->log_every,
           o->probe_examples && o->probe_examples < tr->B ? o->probe_examples : tr->B);
    return 0;
}

/* One step r->step + 1: batch -> forward -> [probe] -> backward ->
 * all-reduce -> clip -> update.  A NaN/Inf loss or gradient norm skips the
 * update: STEP_SKIPPED with --continue-on-nan, else STEP_DIVERGED (both
 * printed); STEP_DIST_FAILED leaves the message in tr->err. */
static step_status train_step(trainer *tr) {
    ckpt_meta *r = tr->r;
    model *m = tr->m;
    long step = (long)r->step;
    int B = tr->B, T = tr->T, b0 = tr->b0, nb = tr->nb;
    tr->step_start = now_s();
    tr->comm_start = dist_comm_seconds(tr->dd);
    data_next_train(tr->d, tr->in, tr->tg, B, T);
    double loss = model_forward(m, tr->in + b0 * T, tr->tg + b0 * T, nb, T, 1);
    /* every rank must agree on a bad step: the global mean */
    if (dist_sum(tr->dd, &loss, 1, (double)nb / B, tr->err, sizeof tr->err) != 0) return STEP_DIST_FAILED;
    tr->loss = (float)loss;
    if (monitor_wants(tr->mon, step + 1)) monitor_probe(tr->mon, m);
    tr->lr = optim_lr(r->lr, (int)step, r->warmup, r->steps, r->schedule);
    int bad = !isfinite(tr->loss);
    if (!bad) {
        model_zero_grad(m);
        model_backward(m);
        if (dist_allreduce_grads(tr->dd, m->grads_memory, m->num_params, (float)nb / B, tr->err, sizeof tr->err) != 0)
            return STEP_DIST_FAILED;
        tr->upd.phase = 0;
        model_parallel(m, update_slice, &tr->upd);
        double ss = 0.0;
        for (int t = 0; t < m->nthreads; t++) ss += tr->upd.sumsq[t];
        tr->upd.scale = optim_clip_scale(ss, r->clip, &tr->gnorm);
        bad = !isfinite(tr->gnorm);
    }
    if (!bad) {
        optim_begin_step(tr->opt);
        tr->upd.phase = 1;
        tr->upd.lr = tr->lr;
        model_parallel(m, update_slice, &tr->upd);
    }
    r->step = step + 1;
    r->data_pos = tr->d->pos;
    r->optim_t = tr->opt->t;
    if (!bad) return STEP_OK;
    r->nan_steps++;
    int loss_bad = !isfinite(tr->loss);
    fprintf(stderr, "sigmatrain: step %ld: %s is %s (diverged)%s\n", step + 1, loss_bad ? "loss" : "gradient norm",
            isnan(loss_bad ? tr->loss : tr->gnorm) ? "NaN" : "Inf",
            tr->o->continue_on_nan ? "; skipping the update (--continue-on-nan)" : "");
    return tr->o->continue_on_nan ? STEP_SKIPPED : STEP_DIVERGED;
}

/* MPI: every --dist-check-every steps, are the ranks still identical?  And
 * with --daemon, this step's per-rank figures for the monitor.  Returns 0,
 * EXIT_RANKS_DIFFER (printed), or 1 with the message in tr->err. */
static int check_ranks(trainer *tr) {
    const options *o = tr->o;
    ckpt_meta *r = tr->r;
    if (o->dist_check_every && r->step % o->dist_check_every == 0) {
        const void *bufs[3] = {tr->m->params_memory, tr->m->pi_memory, tr->opt->state};
        size_t bytes[3] = {tr->m->num_params * sizeof(float), tr->m->pi_size * sizeof(float),
                           tr->opt->state_n * sizeof(float)};
        int rc = dist_check_same(tr->dd, bufs, bytes, 3, tr->err, sizeof tr->err);
        if (rc > 0) {
            fprintf(stderr, "sigmatrain: step %lld: %s\n", (long long)r->step, tr->err);
            return EXIT_RANKS_DIFFER;
        }
        if (rc < 0) return 1;
    }
    if (o->daemon && dist_size(tr->dd) > 1 && r->step % o->log_every == 0) {
        int ns;
        const char *const *names;
        const float *vals;
        if (dist_rank_stats(tr->dd, (double)tr->nb * tr->T, now_s() - tr->step_start,
                            dist_comm_seconds(tr->dd) - tr->comm_start, &ns, &names, &vals, tr->err,
                            sizeof tr->err) != 0)
            return 1;
        monitor_extra_scalars(tr->mon, ns, names, vals);
    }
    return 0;
}

static void fmt_eta(char *buf, size_t n, double secs) {
    long s = secs > 0 && secs < 1e9 ? (long)secs : 0;
    snprintf(buf, n, "%02ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
}

/* Counts the step and prints the progress line every --print-every steps. */
static void progress(trainer *tr) {
    const ckpt_meta *r = tr->r;
    tr->done_here++;
    tr->window++;
    if (isfinite(tr->loss)) {
        tr->loss_acc += tr->loss;
        tr->finite_in_window++;
    }
    if (r->step % tr->o->print_every != 0 && r->step != r->steps) return;
    double t = now_s();
    double tps = (double)tr->window * tr->B * tr->T / (t - tr->tlast);
    char eta[32];
    fmt_eta(eta, sizeof eta, (r->steps - r->step) * (t - tr->t0) / tr->done_here);
    printf("step %6lld/%d | loss %.4f | lr %.3e | gnorm %.3f | %.0f tok/s | %.1f GFLOP/s | eta %s\n",
           (long long)r->step, r->steps, tr->finite_in_window ? tr->loss_acc / tr->finite_in_window : (double)NAN,
           tr->lr, tr->gnorm, tps, tps / (tr->B * tr->T) * tr->flops / 1e9, eta);
    tr->tlast = t;
    tr->window = tr->finite_in_window = 0;
    tr->loss_acc = 0.0;
}

/* Each rank runs its rows of every validation batch; the mean is summed
 * across ranks (NaN if that fails: the next step's collective reports it). */
static float evaluate(trainer *tr) {
    double s = 0.0;
    char err[256];
    for (int k = 0; k < tr->o->eval_batches; k++) {
        data_val_batch(tr->d, k, tr->in, tr->tg, tr->B, tr->T);
        s += model_forward(tr->m, tr->in + tr->b0 * tr->T, tr->tg + tr->b0 * tr->T, tr->nb, tr->T, 0);
    }
    if (dist_sum(tr->dd, &s, 1, (double)tr->nb / tr->B, err, sizeof err) != 0) return NAN;
    return (float)(s / tr->o->eval_batches);
}

/* A validation loss, printed and sent; its time is kept out of tokens/s. */
static float eval_now(trainer *tr) {
    double te = now_s(), re = tr->m->reparam_seconds;
    float val = evaluate(tr);
    tr->reparam_eval += tr->m->reparam_seconds - re;
    printf("eval step %lld | val loss %.4f\n", (long long)tr->r->step, val);
    monitor_eval(tr->mon, (long)tr->r->step, val);
    tr->tlast += now_s() - te;
    tr->t0 += now_s() - te;
    return val;
}

/* A checkpoint at --save PATH (rank 0: the ranks are identical, checked).
 * Returns 0 or -1 (printed). */
static int save_now(trainer *tr, int announce) {
    char path[4096];
    if (dist_rank(tr->dd) != 0) return 0;
    ckpt_path(path, sizeof path, tr->o->save_path, (long)tr->r->step);
    if (ckpt_save(path, tr->r, tr->m, tr->opt, tr->err, sizeof tr->err) != 0) {
        fprintf(stderr, "sigmatrain: save: %s\n", tr->err);
        return -1;
    }
    if (announce) printf("saved %s\n", path);
    return 0;
}

/* Everything after a completed step: rank checks, telemetry, progress,
 * eval, save, the answer to alerts.  Returns -1 to go on, else the exit
 * status (1 with a message in tr->err after a failed collective: *dist_err). */
static int after_step(trainer *tr, int *dist_err) {
    const options *o = tr->o;
    ckpt_meta *r = tr->r;
    int last = r->step == r->steps, eval_due = o->eval_every && r->step % o->eval_every == 0;
    int rc = check_ranks(tr);
    if (rc) {
        *dist_err = rc == 1;
        return rc;
    }
    monitor_step(tr->mon, (long)r->step, tr->loss, tr->lr, tr->gnorm, eval_due || last);
    progress(tr);
    if (eval_due && !last) eval_now(tr);
    if (o->save_every && r->step % o->save_every == 0 && !last) {
        double ts = now_s();
        if (save_now(tr, 0) != 0) return 1;
        tr->tlast += now_s() - ts;
        tr->t0 += now_s() - ts;
    }
    switch (respond_after_step(tr->rs, tr->mon, tr->dd, r, tr->m, tr->opt, tr->err, sizeof tr->err)) {
    case RESPOND_DIST_FAILED: *dist_err = 1; return 1;
    case RESPOND_ERROR: return 1;
    case RESPOND_STOP: return EXIT_ALERT_ABORTED;
    case RESPOND_ROLLED_BACK: /* the data cursor stays: the abandoned batches are skipped */
        r->data_pos = tr->d->pos;
        tr->window = tr->finite_in_window = 0;
        tr->loss_acc = 0.0;
        return -1;
    case RESPOND_GO_ON: return -1;
    }
    return -1;
}

/* The end of training: the last eval, the checkpoint, the summary.
 * Returns the exit status. */
static int finish(trainer *tr) {
    const ckpt_meta *r = tr->r;
    double elapsed = now_s() - tr->t0;
    double reparam_train = tr->m->reparam_seconds - tr->reparam_eval;
    float val = eval_now(tr);
    if (tr->o->save_path && save_now(tr, 1) != 0) return 1;
    double tps = tr->done_here ? (double)tr->done_here * tr->B * tr->T / elapsed : 0.0;
    printf("summary: steps %lld | last train loss %.4f | val loss %.4f | nan steps %lld | "
           "%.1f s | %.0f tok/s | %.1f GFLOP/s | sreparam %.2f%% of step time\n",
           (long long)r->step, tr->loss, val, (long long)r->nan_steps, elapsed, tps,
           tps / (tr->B * tr->T) * tr->flops / 1e9, elapsed > 0 ? 100.0 * reparam_train / elapsed : 0.0);
    dist *dd = tr->dd;
    if (dist_size(dd) > 1)
        printf("dist: gradient all-reduce %.2f ms/step, %.1f%% of training time (%ld calls, %zu floats each)\n",
               dist_comm_calls(dd) ? 1e3 * dist_comm_seconds(dd) / dist_comm_calls(dd) : 0.0,
               elapsed > 0 ? 100.0 * dist_comm_seconds(dd) / elapsed : 0.0, dist_comm_calls(dd), tr->m->num_params);
    return isfinite(val) ? 0 : EXIT_DIVERGED;
}

static int print_sgemm_peak(int threads) {
    double multi, conc, peak = blas_sgemm_peak(threads, &multi, &conc);
    printf("sgemm_peak_gflops %.1f threads %d core %s (one call on %d OpenBLAS threads %.1f, "
           "%d concurrent single-threaded calls %.1f)\n",
           peak, threads, blas_core_name(), threads, multi, threads, conc);
    return peak > 0 ? 0 : 1;
}

/* --upload-spool: one run (--run) or every run left in --spool DIR, through
 * the client library (which names damaged records and skips them); a run
 * spooled before hello.json existed is uploaded with the shape flags.
 * Exit status (docs/metrics.md): 0 everything delivered, 6 every intact
 * record delivered but some were damaged (named), 1 something left. */
static int upload_spool(const options *o) {
    char err[512], hp[4096];
    snprintf(hp, sizeof hp, "%s/%s/hello.json", o->spool_dir, o->run_name ? o->run_name : "");
    if (o->run_name && access(hp, R_OK) != 0) {
        monitor_config uc = {
            .address = o->daemon, .run = o->run_name, .spool_dir = o->spool_dir, .token = o->token, .log = stdout};
        int rc = monitor_upload(&uc, o->run.cfg.layers, o->run.cfg.heads, o->run.seq_len, 60000, err, sizeof err);
        if (rc < 0) fprintf(stderr, "sigmatrain: --upload-spool: %s\n", err);
        return rc == 0 ? 0 : 1;
    }
    telemetry_upload_result res;
    int left =
        telemetry_upload_spool(o->daemon, o->spool_dir, o->run_name, o->token, 60000, stdout, &res, err, sizeof err);
    if (left < 0) {
        fprintf(stderr, "sigmatrain: --upload-spool: %s\n", err);
        return 1;
    }
    printf("upload: %s", left ? "some runs are not fully acknowledged (still spooled)" : "every run acknowledged");
    if (res.damaged) printf("; %llu damaged spool record(s) skipped, named above", (unsigned long long)res.damaged);
    printf("\n");
    return left ? 1 : res.damaged ? 6 : 0;
}

/* Collapsed attention drives probabilities and their gradients into
 * denormal floats, which x86 handles in microcode: a collapsing run trained
 * 3-10x slower (26.3 s vs 4.0 s for 200 steps, same losses).  Flush them to
 * zero (FTZ | DAZ); the worker threads created later inherit this thread's
 * MXCSR. */
static void flush_denormals(void) {
#if defined(__SSE2__)
    _mm_setcsr(_mm_getcsr() | 0x8040);
#endif
}

int main(int argc, char **argv) {
    blas_fix_coretype(argv);
    flush_denormals();
    options o;
    char given[NFLAGS];
    int status = parse_args(argc, argv, &o, given);
    if (status) return status > 0 ? 0 : 1;
    if (o.sgemm_peak) return print_sgemm_peak(o.threads);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (o.upload_spool) return upload_spool(&o);

    trainer *tr = calloc(1, sizeof *tr);
    if (!tr) {
        fprintf(stderr, "sigmatrain: out of memory\n");
        return 1;
    }
    tr->o = &o;
    tr->r = &o.run;
    /* MPI (build/sigmatrain-mpi) or a job of one; see dist.h */
    tr->dd = dist_create(&argc, &argv, (size_t)o.dist_bucket_kb * 256, tr->err, sizeof tr->err);
    if (!tr->dd) {
        fprintf(stderr, "sigmatrain: %s\n", tr->err);
        free(tr);
        return 1;
    }
    if (dist_rank(tr->dd) > 0 && !freopen("/dev/null", "w", stdout)) /* rank 0 prints progress */
        fprintf(stderr, "sigmatrain: /dev/null: %s\n", strerror(errno));
    status = 1;
    int dist_err = 0;
    if (o.resume_path && resume_definition(&o, given) != 0) goto out;
    if (open_data(tr) != 0 || build_model(tr) != 0) goto out;
    print_header(tr);
    if (o.daemon && dist_rank(tr->dd) == 0 && start_telemetry(tr) != 0) goto out;
    respond_config rc = {.action = o.on_alert,
                         .rules = o.on_alert_rules,
                         .save_path = o.save_path,
                         .spool_dir = o.spool_dir,
                         .rollback_every = o.rollback_every,
                         .rollback_keep = o.rollback_keep,
                         .max_rollbacks = o.max_rollbacks,
                         .lr_scale = o.rollback_lr_scale};
    tr->rs = respond_create(&rc, tr->r, tr->m, tr->opt);
    if (!tr->rs) {
        fprintf(stderr, "sigmatrain: out of memory\n");
        goto out;
    }

    tr->t0 = tr->tlast = now_s();
    status = -1;
    while (status < 0 && o.run.step < o.run.steps) {
        step_status s = train_step(tr);
        if (s == STEP_DIST_FAILED) {
            status = 1;
            dist_err = 1;
            break;
        }
        if (s == STEP_DIVERGED) {
            printf("summary: diverged at step %lld, loss %g\n", (long long)o.run.step, tr->loss);
            status = EXIT_DIVERGED;
            break;
        }
        status = after_step(tr, &dist_err);
    }
    if (status < 0) status = finish(tr);
out:
    if (dist_err) fprintf(stderr, "sigmatrain: rank %d: %s\n", dist_rank(tr->dd), tr->err);
    monitor_destroy(tr->mon, status == 0 ? "finished" : status == EXIT_ALERT_ABORTED ? "aborted" : "failed");
    respond_destroy(tr->rs);
    free(tr->in);
    free(tr->tg);
    optim_destroy(tr->opt);
    model_destroy(tr->m);
    data_destroy(tr->d);
    dist_destroy(tr->dd, status == 1); /* 1: other ranks may wait in a collective: abort them */
    free(tr);
    return status;
}
