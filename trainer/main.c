/* main.c - sigmatrain: the command line and the training loop.
 *
 * Reads as a story: parse flags, build data, model and optimizer (or restore
 * them from a checkpoint), then step: batch -> forward -> backward -> clip ->
 * update -> [telemetry] -> progress / eval / save.  Exit status: 0 done,
 * 1 usage or I/O error, 3 diverged (NaN/Inf loss or gradient), 4 ranks
 * disagree (MPI), 5 aborted on an alert (--on-alert stop, or rollback with no
 * snapshot left or --max-rollbacks reached). */
#include <cblas.h>
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif
#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "data.h"
#include "dist.h"
#include "model.h"
#include "monitor.h"
#include "telemetry.h"
#include "optim.h"
#include "rollback.h"

#include <cjson/cJSON.h>


#define SYNTH_TOKENS (1u << 21)

typedef struct {
    ckpt_meta run;            /* everything that defines the run (saved in checkpoints) */
    const char *data_path;
    const char *save_path;
    const char *resume_path;
    int save_every, eval_every, eval_batches, print_every, threads;
    int continue_on_nan;
    int sgemm_peak;           /* --sgemm-peak: measure and exit (for the benchmark) */
    /* telemetry (none without --daemon) */
    const char *daemon, *run_name, *spool_dir, *token;
    int log_every, probe_examples, queue_slots, spool_max_mb, upload_spool, telemetry_ab, end_grace;
    int dist_check_every, dist_bucket_kb; /* MPI build (dist.h) */
    /* the response to firing alerts (--on-alert) */
    int on_alert;             /* ON_ALERT_* */
    const char *on_alert_rules; /* comma-separated rule names, NULL: any */
    int rollback_every, rollback_keep, max_rollbacks;
    float rollback_lr_scale;
} options;

enum { ON_ALERT_WARN, ON_ALERT_CHECKPOINT, ON_ALERT_ROLLBACK, ON_ALERT_STOP };
#define EXIT_ALERT_ABORTED 5

static void usage(FILE *f)
{
    fprintf(f,
"usage: sigmatrain [flags]\n"
"Trains a GPT-style transformer (fp32, OpenBLAS) with or without sigmaReparam.\n"
"model:\n"
"  --layers N            blocks (default 4)\n"
"  --heads N             attention heads (default 4)\n"
"  --dim N               model width C, divisible by heads (default 128)\n"
"  --seq-len N           context length T (default 128)\n"
"  --norm MODE           pre|post|none LayerNorm placement (default pre)\n"
"  --reparam MODE        sigma|none|spectral (default sigma)\n"
"  --gamma-init MODE     sigma|one: gamma starts at sigma(W_init) (W_hat = W) or 1 (default sigma)\n"
"training:\n"
"  --optimizer NAME      sgd|momentum|adam|adamw (default adamw; betas 0.9, 0.95)\n"
"  --lr X                peak learning rate (default 1e-3)\n"
"  --warmup N            linear warmup steps, 0 allowed (default 0)\n"
"  --schedule S          constant|cosine, cosine ends at lr/10 (default cosine)\n"
"  --weight-decay X      on matrices and embeddings (default 0; AdamW decoupled)\n"
"  --clip X              global gradient-norm clip, 0 = off (default 1.0)\n"
"  --batch N             sequences per step (default 16)\n"
"  --steps N             total steps (default 1000)\n"
"  --seed N              init and synthetic data seed (default 1)\n"
"  --threads N           worker threads: the batch is split into N shards, each\n"
"                        computed by its own thread on single-threaded OpenBLAS (default 2)\n"
"  --data FILE           train a byte-level model (vocab 256) on FILE; default: synthetic corpus\n"
"  --continue-on-nan     report a NaN/Inf step, skip its update and go on (default: exit 3)\n"
"output:\n"
"  --eval-every N        validation loss every N steps, 0 = only at the end (default 100)\n"
"  --eval-batches N      validation batches per eval (default 8)\n"
"  --print-every N       progress line every N steps (default 10)\n"
"  --save PATH           checkpoint at the end (and every --save-every steps);\n"
"                        \"{step}\" in PATH is replaced by the step number\n"
"  --save-every N        (default 0: only at the end)\n"
"  --resume PATH         continue a run from its checkpoint; the run's definition\n"
"                        (model, optimizer, schedule, batch, seed, data) comes from the file\n"
"  --sgemm-peak          print the sgemm GFLOP/s ceiling for --threads (N concurrent\n"
"                        single-threaded calls, and one call on N OpenBLAS threads) and exit\n"
"telemetry (to entropyd; nothing at all without --daemon):\n"
"  --daemon ADDR         unix:PATH or tcp:HOST:PORT; the run streams collapse metrics\n"
"  --run NAME            run name (default: generated, printed at start)\n"
"  --spool DIR           on-disk spool (write-ahead log) for unacknowledged messages;\n"
"                        default: a private temporary one, removed at exit\n"
"  --log-every K         probe and send every K steps (default 1)\n"
"  --probe-examples N    examples of the batch the probe reads (default 4, 0 = all)\n"
"  --telemetry-queue N   in-memory queue bound, messages (default 256)\n"
"  --spool-max-mb N      spool bound in MiB (default 256); beyond it, counted drops\n"
"  --token T             daemon token (TCP)\n"
"  --upload-spool        send what --spool DIR holds for --run NAME (with the run's\n"
"                        --layers/--heads/--seq-len) to --daemon, wait for the acks, exit;\n"
"                        without --run: every run in --spool DIR left unacknowledged\n"
"                        (a run started on a --spool DIR also uploads those in the background)\n"
"  --end-grace S         at the end, keep reconnecting up to S seconds (default 30) until the\n"
"                        daemon acknowledged everything; what is left stays in the spool\n"
"  --on-alert ACTION     warn|checkpoint|rollback|stop on a firing alert from the daemon\n"
"                        (default warn: print it); checkpoint: save one now (--save PATH,\n"
"                        else SPOOL/RUN-step{step}.ckpt, . without --spool); stop: save one, end the run\n"
"                        \"aborted\", exit 5; rollback: restore the newest in-memory snapshot\n"
"                        from before the alert's start_step, skip the batches since, go on\n"
"  --on-alert-rules A,B  act only on these rules (default: any)\n"
"  --rollback-every N    in-memory snapshot every N steps (default 50)\n"
"  --rollback-keep N     snapshots kept, newest (default 4)\n"
"  --rollback-lr-scale X multiply the learning rate by X at each rollback (default 1)\n"
"  --max-rollbacks N     a firing alert after N rollbacks stops the run as stop does (default 3)\n"
"  --telemetry-ab N      benchmark: alternate blocks of N steps with and without telemetry\n"
"                        and print both step times at the end (bench/telemetry_overhead.sh)\n"
"distributed (build/sigmatrain-mpi under mpirun; --batch is the global batch):\n"
"  --dist-check-every K  compare a hash of parameters, power-iteration vectors and\n"
"                        optimizer moments across ranks every K steps, 0 = never (default 100)\n"
"  --dist-bucket-kb N    gradient all-reduce bucket size, 0 = one call (default 0)\n"
"  --version, --help\n");
}

static int parse_enum(const char *flag, const char *v, const char *const *names, int n, int *out)
{
    for (int i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0) { *out = i; return 0; }
    fprintf(stderr, "sigmatrain: %s: unknown value '%s' (one of:", flag, v);
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", names[i]);
    fprintf(stderr, ")\n");
    return -1;
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "sigmatrain: %s: expected an integer in [%d, %d], got '%s'\n", flag, lo, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_float(const char *flag, const char *v, float lo, float *out)
{
    char *end;
    errno = 0;
    float x = strtof(v, &end);
    if (errno || *end || end == v || !isfinite(x) || x < lo) {
        fprintf(stderr, "sigmatrain: %s: expected a number >= %g, got '%s'\n", flag, lo, v);
        return -1;
    }
    *out = x;
    return 0;
}

static const char *const REPARAM_NAMES[] = {"none", "sigma", "spectral"};
static const char *const NORM_NAMES[] = {"pre", "post", "none"};
static const char *const GAMMA_NAMES[] = {"sigma", "one"};
static const char *const OPT_NAMES[] = {"sgd", "momentum", "adam", "adamw"};
static const char *const SCHED_NAMES[] = {"constant", "cosine"};
static const char *const ON_ALERT_NAMES[] = {"warn", "checkpoint", "rollback", "stop"};

/* Returns 0 to run, 1 after --help, -1 on a bad flag. */
static int parse_args(int argc, char **argv, options *o)
{
    ckpt_meta *r = &o->run;
    memset(o, 0, sizeof *o);
    r->cfg = (model_config){.vocab = DATA_SYNTH_VOCAB, .max_seq = 128, .layers = 4, .heads = 4,
                            .dim = 128, .norm = MODEL_NORM_PRE, .reparam = MODEL_REPARAM_SIGMA,
                            .gamma_init = MODEL_GAMMA_SIGMA};
    r->optimizer = OPTIM_ADAMW;
    r->schedule = OPTIM_SCHEDULE_COSINE;
    r->batch = 16;
    r->seq_len = 128;
    r->warmup = 0;
    r->steps = 1000;
    r->seed = 1;
    r->lr = 1e-3f;
    r->weight_decay = 0.0f;
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
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { usage(stdout); return 1; }
        if (strcmp(a, "--version") == 0) { printf("sigmatrain %s\n", PROJECT_VERSION); return 1; }
        if (strcmp(a, "--continue-on-nan") == 0) { o->continue_on_nan = 1; continue; }
        if (strcmp(a, "--sgemm-peak") == 0) { o->sgemm_peak = 1; continue; }
        if (strcmp(a, "--upload-spool") == 0) { o->upload_spool = 1; continue; }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "sigmatrain: unexpected argument '%s' (see --help)\n", a);
            return -1;
        }
        const char *v = NULL;
        const char *eq = strchr(a, '=');
        char name[64];
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        if (nl >= sizeof name) nl = sizeof name - 1;
        memcpy(name, a, nl);
        name[nl] = 0;
        if (eq) v = eq + 1;
        else if (i + 1 < argc) v = argv[++i];
        else { fprintf(stderr, "sigmatrain: %s needs a value (see --help)\n", name); return -1; }
        int rc;
        float lo0 = 0.0f;
        if (!strcmp(name, "--layers")) rc = parse_int(name, v, 1, 256, &r->cfg.layers);
        else if (!strcmp(name, "--heads")) rc = parse_int(name, v, 1, 1024, &r->cfg.heads);
        else if (!strcmp(name, "--dim")) rc = parse_int(name, v, 1, 16384, &r->cfg.dim);
        else if (!strcmp(name, "--seq-len")) rc = parse_int(name, v, 1, 16384, &r->seq_len);
        else if (!strcmp(name, "--batch")) rc = parse_int(name, v, 1, 1 << 20, &r->batch);
        else if (!strcmp(name, "--steps")) rc = parse_int(name, v, 0, 1 << 30, &r->steps);
        else if (!strcmp(name, "--warmup")) rc = parse_int(name, v, 0, 1 << 30, &r->warmup);
        else if (!strcmp(name, "--threads")) rc = parse_int(name, v, 1, 256, &o->threads);
        else if (!strcmp(name, "--eval-every")) rc = parse_int(name, v, 0, 1 << 30, &o->eval_every);
        else if (!strcmp(name, "--eval-batches")) rc = parse_int(name, v, 1, 1 << 20, &o->eval_batches);
        else if (!strcmp(name, "--print-every")) rc = parse_int(name, v, 1, 1 << 30, &o->print_every);
        else if (!strcmp(name, "--save-every")) rc = parse_int(name, v, 0, 1 << 30, &o->save_every);
        else if (!strcmp(name, "--seed")) {
            int s; rc = parse_int(name, v, 0, 2147483647, &s); r->seed = (uint64_t)s;
        }
        else if (!strcmp(name, "--lr")) rc = parse_float(name, v, lo0, &r->lr);
        else if (!strcmp(name, "--weight-decay")) rc = parse_float(name, v, lo0, &r->weight_decay);
        else if (!strcmp(name, "--clip")) rc = parse_float(name, v, lo0, &r->clip);
        else if (!strcmp(name, "--reparam")) rc = parse_enum(name, v, REPARAM_NAMES, 3, &r->cfg.reparam);
        else if (!strcmp(name, "--norm")) rc = parse_enum(name, v, NORM_NAMES, 3, &r->cfg.norm);
        else if (!strcmp(name, "--gamma-init")) rc = parse_enum(name, v, GAMMA_NAMES, 2, &r->cfg.gamma_init);
        else if (!strcmp(name, "--optimizer")) rc = parse_enum(name, v, OPT_NAMES, 4, &r->optimizer);
        else if (!strcmp(name, "--schedule")) rc = parse_enum(name, v, SCHED_NAMES, 2, &r->schedule);
        else if (!strcmp(name, "--data")) { o->data_path = v; rc = 0; }
        else if (!strcmp(name, "--save")) { o->save_path = v; rc = 0; }
        else if (!strcmp(name, "--resume")) { o->resume_path = v; rc = 0; }
        else if (!strcmp(name, "--daemon")) { o->daemon = v; rc = 0; }
        else if (!strcmp(name, "--run")) { o->run_name = v; rc = 0; }
        else if (!strcmp(name, "--spool")) { o->spool_dir = v; rc = 0; }
        else if (!strcmp(name, "--token")) { o->token = v; rc = 0; }
        else if (!strcmp(name, "--log-every")) rc = parse_int(name, v, 1, 1 << 30, &o->log_every);
        else if (!strcmp(name, "--probe-examples")) rc = parse_int(name, v, 0, 1 << 20, &o->probe_examples);
        else if (!strcmp(name, "--telemetry-queue")) rc = parse_int(name, v, 16, 1 << 20, &o->queue_slots);
        else if (!strcmp(name, "--dist-check-every")) rc = parse_int(name, v, 0, 1 << 30, &o->dist_check_every);
        else if (!strcmp(name, "--dist-bucket-kb")) rc = parse_int(name, v, 0, 1 << 20, &o->dist_bucket_kb);
        else if (!strcmp(name, "--spool-max-mb")) rc = parse_int(name, v, 1, 1 << 20, &o->spool_max_mb);
        else if (!strcmp(name, "--end-grace")) rc = parse_int(name, v, 0, 86400, &o->end_grace);
        else if (!strcmp(name, "--telemetry-ab")) rc = parse_int(name, v, 1, 1 << 20, &o->telemetry_ab);
        else if (!strcmp(name, "--on-alert")) rc = parse_enum(name, v, ON_ALERT_NAMES, 4, &o->on_alert);
        else if (!strcmp(name, "--on-alert-rules")) { o->on_alert_rules = v; rc = 0; }
        else if (!strcmp(name, "--rollback-every")) rc = parse_int(name, v, 1, 1 << 30, &o->rollback_every);
        else if (!strcmp(name, "--rollback-keep")) rc = parse_int(name, v, 1, 1024, &o->rollback_keep);
        else if (!strcmp(name, "--max-rollbacks")) rc = parse_int(name, v, 0, 1 << 30, &o->max_rollbacks);
        else if (!strcmp(name, "--rollback-lr-scale")) rc = parse_float(name, v, lo0, &o->rollback_lr_scale);
        else { fprintf(stderr, "sigmatrain: unknown flag '%s' (see --help)\n", name); return -1; }
        if (rc) return -1;
    }
    if (r->cfg.dim % r->cfg.heads) {
        fprintf(stderr, "sigmatrain: --dim %d is not divisible by --heads %d\n", r->cfg.dim, r->cfg.heads);
        return -1;
    }
    if (o->save_every && !o->save_path) {
        fprintf(stderr, "sigmatrain: --save-every needs --save PATH\n");
        return -1;
    }
    if (!o->daemon && (o->run_name || o->spool_dir || o->token || o->upload_spool || o->telemetry_ab)) {
        fprintf(stderr, "sigmatrain: --run, --spool, --token, --upload-spool and --telemetry-ab need --daemon ADDR\n");
        return -1;
    }
    if (o->on_alert != ON_ALERT_WARN && !o->daemon) {
        fprintf(stderr, "sigmatrain: --on-alert %s needs --daemon ADDR (alerts come from entropyd)\n",
                ON_ALERT_NAMES[o->on_alert]);
        return -1;
    }
    if (o->upload_spool && !o->spool_dir) {
        fprintf(stderr, "sigmatrain: --upload-spool needs --spool DIR (and --run NAME for one run)\n");
        return -1;
    }
    r->cfg.max_seq = r->seq_len;
    return 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* OpenBLAS 0.3.21's DYNAMIC_ARCH does not know recent Xeons and falls back to
 * its generic "Prescott" kernels, 3-5x slower.  The core type is read once at
 * library load, so the only fix from inside the program is to set
 * OPENBLAS_CORETYPE and exec ourselves again.  A user's own setting wins. */
static void fix_openblas_coretype(char **argv)
{
    if (getenv("OPENBLAS_CORETYPE")) return;
    const char *core = openblas_get_corename();
    if (!core || strcmp(core, "Prescott") != 0) return;
    const char *want = NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bf16")) want = "Cooperlake";
    else if (__builtin_cpu_supports("avx512f")) want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2")) want = "Haswell";
    if (!want) return;
    setenv("OPENBLAS_CORETYPE", want, 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the slow kernels */
}

typedef struct {
    const float *a, *b;
    float *c;
    int n, reps;
    double seconds;
} gemm_job;

static void *gemm_worker(void *arg)
{
    gemm_job *j = arg;
    double t = now_s();
    for (int r = 0; r < j->reps; r++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->n, j->n, j->n, 1.0f, j->a, j->n,
                    j->b, j->n, 0.0f, j->c, j->n);
    j->seconds = now_s() - t;
    return NULL;
}

/* OpenBLAS sgemm GFLOP/s on 1024^3, best of several: (a) one call with
 * `threads` OpenBLAS threads, (b) `threads` concurrent single-threaded calls
 * (how the trainer uses it).  *multi and *single get each; returns the max. */
static double sgemm_peak(int threads, double *multi, double *concurrent)
{
    int n = 1024;
    size_t nn = (size_t)n * n;
    float *a = malloc(sizeof(float) * nn), *b = malloc(sizeof(float) * nn);
    float *c = malloc(sizeof(float) * nn * (size_t)threads);
    gemm_job jobs[256];
    pthread_t th[256];
    *multi = *concurrent = 0.0;
    if (!a || !b || !c || threads > 256) { free(a); free(b); free(c); return 0.0; }
    for (size_t i = 0; i < nn; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.1f; }
    openblas_set_num_threads(threads);
    for (int rep = 0; rep < 8; rep++) {
        gemm_job j = {a, b, c, n, 1, 0.0};
        gemm_worker(&j);
        double g = 2.0 * n * n * n / j.seconds / 1e9;
        if (g > *multi) *multi = g;
    }
    openblas_set_num_threads(1);
    for (int rep = 0; rep < 3; rep++) {
        double t = now_s();
        for (int k = 0; k < threads; k++) {
            jobs[k] = (gemm_job){a, b, c + nn * k, n, 3, 0.0};
            if (pthread_create(&th[k], NULL, gemm_worker, &jobs[k]) != 0) { threads = k; break; }
        }
        for (int k = 0; k < threads; k++) pthread_join(th[k], NULL);
        t = now_s() - t;
        double g = threads * 3 * 2.0 * n * n * n / t / 1e9;
        if (g > *concurrent) *concurrent = g;
    }
    free(a); free(b); free(c);
    return *multi > *concurrent ? *multi : *concurrent;
}

/* Useful matmul FLOPs of one training step (forward + backward = 3x
 * forward); causal attention counts only the T(T+1)/2 visible pairs, so the
 * figure does not flatter the blocked kernel, which computes a bit more. */
static double step_flops(const model_config *c, int B, int T)
{
    double C = c->dim, L = c->layers, BT = (double)B * T;
    double lin = BT * 2.0 * (L * 12.0 * C * C + c->vocab * C);
    double att = L * B * 2.0 * 2.0 * (T * (T + 1.0) / 2.0) * C; /* QK^T and AV */
    return 3.0 * (lin + att);
}

static void save_path_for(char *out, size_t n, const char *path, long step)
{
    const char *p = strstr(path, "{step}");
    if (!p) { snprintf(out, n, "%s", path); return; }
    snprintf(out, n, "%.*s%ld%s", (int)(p - path), path, step, p + 6);
}

/* Each rank runs its rows of every validation batch; the mean is summed
 * across ranks (NaN if that fails: the next step's collective reports it). */
static float evaluate(model *m, const data *d, int *in, int *tg, int B, int T, int batches, dist *dd)
{
    double s = 0.0;
    int b0, nb;
    char err[256];
    dist_shard(dd, B, &b0, &nb);
    for (int k = 0; k < batches; k++) {
        data_val_batch(d, k, in, tg, B, T);
        s += model_forward(m, in + b0 * T, tg + b0 * T, nb, T, 0);
    }
    if (dist_sum(dd, &s, 1, (double)nb / B, err, sizeof err) != 0) return NAN;
    return (float)(s / batches);
}

static void fmt_eta(char *buf, size_t n, double secs)
{
    long s = secs > 0 && secs < 1e9 ? (long)secs : 0;
    snprintf(buf, n, "%02ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
}

/* ---- TELEMETRY HOOK -------------------------------------------------------
 * Called once per completed training step, after the optimizer update.  The
 * probe itself ran right after this step's forward (monitor_probe in the
 * loop), because the update changes the parameters the metrics describe
 * (biases, and the weights themselves with --reparam none).  Here the step
 * is only enqueued (no syscall) and the daemon's lines are polled.  An eval
 * at this step keeps the step open for its eval_loss (monitor_eval).
 * mon is NULL without --daemon: nothing at all happens. */
static void telemetry_on_step(monitor *mon, long step, float loss, float lr, float grad_norm,
                              int eval_follows)
{
    if (mon) monitor_step(mon, step, loss, lr, grad_norm, eval_follows);
}

/* dist_on_failure's callback (the watcher thread, while the training
 * thread is blocked in a collective): end the run as failed. */
static void end_run_failed(void *mon)
{
    monitor_finish(mon, "failed");
}

/* ---- THE RESPONSE TO ALERTS (--on-alert) ----------------------------------- */
enum { ALERT_GO_ON, ALERT_ROLLED_BACK, ALERT_STOP, ALERT_ERROR, ALERT_DIST_FAILED };

static int rule_selected(const char *rules, const char *rule)
{
    if (!rules) return 1;
    size_t n = strlen(rule);
    for (const char *p = rules; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, rule, n) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

/* Saves the run's state now: to --save PATH ({step} replaced), else to
 * SPOOL/RUN-step{step}.ckpt (the current directory without --spool). */
static int save_on_alert(const options *o, monitor *mon, const ckpt_meta *r, const model *m,
                         const optim *opt)
{
    char path[4096], err[512];
    if (o->save_path) save_path_for(path, sizeof path, o->save_path, (long)r->step);
    else snprintf(path, sizeof path, "%s/%s-step%lld.ckpt", o->spool_dir ? o->spool_dir : ".",
                  monitor_run_name(mon), (long long)r->step);
    if (ckpt_save(path, r, m, opt, err, sizeof err) != 0) {
        fprintf(stderr, "sigmatrain: save: %s\n", err);
        return -1;
    }
    printf("saved %s\n", path);
    return 0;
}

/* The next firing alert the run answers (--on-alert-rules), from the
 * daemon's lines received so far; one whose condition began after the
 * run's step (the abandoned branch of a rollback) is passed over (monitor.h
 * drops those that began after the restored step).  mon is NULL on ranks
 * other than 0: they hear nothing. */
static int take_alert(const options *o, monitor *mon, const ckpt_meta *r, monitor_alert *al)
{
    while (mon && monitor_next_alert(mon, al))
        if (rule_selected(o->on_alert_rules, al->rule) && al->start_step <= r->step) return 1;
    return 0;
}

/* Answers at most one firing alert per step (--on-alert).  Under MPI rank 0
 * takes it and broadcasts its start step, and every rank carries out the
 * same answer on its identical state: the same snapshot restored, the same
 * lr, the same stop; rank 0 alone prints, sends the event and saves.  After
 * a rollback r (step, optimizer, lr) and the model are at the snapshot, the
 * data cursor is not: the batches of the abandoned steps are not seen
 * again.  ALERT_DIST_FAILED leaves a message in err. */
static int handle_alerts(const options *o, monitor *mon, dist *dd, rollback *rb, int *rollbacks,
                         ckpt_meta *r, model *m, optim *opt, char *err, size_t errlen)
{
    monitor_alert al = {.rule = ""};
    long msg[2] = {take_alert(o, mon, r, &al), 0};
    msg[1] = msg[0] ? al.start_step : 0;
    if (dist_bcast_longs(dd, msg, 2, err, errlen) != 0) return ALERT_DIST_FAILED;
    if (!msg[0]) return ALERT_GO_ON;
    al.start_step = msg[1];
    int lead = dist_rank(dd) == 0;
    char text[512];
    if (o->on_alert == ON_ALERT_CHECKPOINT) {
        if (lead && save_on_alert(o, mon, r, m, opt) != 0) return ALERT_ERROR;
        snprintf(text, sizeof text, "checkpoint at step %lld (alert %s)", (long long)r->step, al.rule);
        monitor_event(mon, "info", text);
        return ALERT_GO_ON;
    }
    long from = (long)r->step, to = -1;
    const char *why = "--on-alert stop";
    if (o->on_alert == ON_ALERT_ROLLBACK) {
        if (*rollbacks >= o->max_rollbacks) why = "--max-rollbacks reached";
        else if ((to = rollback_restore(rb, al.start_step, r, m, opt)) < 0)
            why = "no snapshot from before the alert's start";
    }
    if (to < 0) {
        snprintf(text, sizeof text, "stopping at step %ld (alert %s, started at step %ld): %s",
                 from, al.rule, al.start_step, why);
        printf("%s\n", text);
        monitor_event(mon, "warn", text);
        if (lead && save_on_alert(o, mon, r, m, opt) != 0) return ALERT_ERROR;
        return ALERT_STOP;
    }
    (*rollbacks)++;
    r->lr *= o->rollback_lr_scale;
    snprintf(text, sizeof text,
             "rollback from step %ld to step %ld (alert %s, started at step %ld); lr now %g; "
             "rollback %d of at most %d", from, to, al.rule, al.start_step, r->lr, *rollbacks,
             o->max_rollbacks);
    printf("%s\n", text);
    monitor_event(mon, "warn", text);
    monitor_rolled_back(mon, to); /* alerts about the abandoned steps no longer count */
    return ALERT_ROLLED_BACK;
}

/* A float as the short decimal it was given as (0.001, not 0.0010000000474974513). */
static double tidy(float x)
{
    char b[32];
    snprintf(b, sizeof b, "%.7g", x);
    return strtod(b, NULL);
}

/* The hello's meta: everything that defines the run, plus where and when. */
static char *run_meta_json(const options *o, const model *m, const char *resumed)
{
    const ckpt_meta *r = &o->run;
    cJSON *j = cJSON_CreateObject(), *mo = cJSON_AddObjectToObject(j, "model"),
          *op = cJSON_AddObjectToObject(j, "optimizer"), *da = cJSON_AddObjectToObject(j, "data"),
          *pr = cJSON_AddObjectToObject(j, "probe");
    cJSON_AddStringToObject(j, "trainer", "sigmatrain");
    cJSON_AddStringToObject(j, "version", PROJECT_VERSION " (built " __DATE__ " " __TIME__ ")");
    cJSON_AddNumberToObject(mo, "layers", r->cfg.layers);
    cJSON_AddNumberToObject(mo, "heads", r->cfg.heads);
    cJSON_AddNumberToObject(mo, "dim", r->cfg.dim);
    cJSON_AddNumberToObject(mo, "seq_len", r->seq_len);
    cJSON_AddNumberToObject(mo, "vocab", r->cfg.vocab);
    cJSON_AddNumberToObject(mo, "params", (double)m->num_params);
    cJSON_AddStringToObject(j, "reparam", REPARAM_NAMES[r->cfg.reparam]);
    cJSON_AddStringToObject(j, "gamma_init", GAMMA_NAMES[r->cfg.gamma_init]);
    cJSON_AddStringToObject(j, "norm", NORM_NAMES[r->cfg.norm]);
    cJSON_AddStringToObject(op, "name", OPT_NAMES[r->optimizer]);
    cJSON_AddNumberToObject(op, "lr", tidy(r->lr));
    cJSON_AddNumberToObject(op, "beta1", tidy(r->beta1));
    cJSON_AddNumberToObject(op, "beta2", tidy(r->beta2));
    cJSON_AddNumberToObject(op, "eps", tidy(r->eps));
    cJSON_AddNumberToObject(op, "weight_decay", tidy(r->weight_decay));
    cJSON_AddNumberToObject(op, "clip", tidy(r->clip));
    cJSON_AddNumberToObject(op, "warmup", r->warmup);
    cJSON_AddStringToObject(op, "schedule", SCHED_NAMES[r->schedule]);
    cJSON_AddNumberToObject(op, "batch", r->batch);
    cJSON_AddNumberToObject(op, "steps", r->steps);
    cJSON_AddNumberToObject(j, "seed", (double)r->seed);
    cJSON_AddStringToObject(da, "kind", r->data_kind ? "file" : "synthetic");
    if (o->data_path) cJSON_AddStringToObject(da, "path", o->data_path);
    cJSON_AddNumberToObject(da, "tokens", (double)r->data_tokens);
    char hash[24];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)r->data_hash);
    cJSON_AddStringToObject(da, "hash", hash);
    cJSON_AddNumberToObject(pr, "log_every", o->log_every);
    cJSON_AddNumberToObject(pr, "examples", o->probe_examples);
    cJSON_AddNumberToObject(j, "threads", o->threads);
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    cJSON_AddStringToObject(j, "host", host);
    time_t now = time(NULL);
    struct tm tm;
    char when[32];
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    cJSON_AddStringToObject(j, "start_time", when);
    if (resumed) {
        cJSON_AddStringToObject(j, "resumed_from", resumed);
        cJSON_AddNumberToObject(j, "resumed_at_step", (double)r->step);
    }
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return text;
}
/* --------------------------------------------------------------------------- */

/* The optimizer update split over the model's threads: phase 0 sums the
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

static void update_slice(void *ctx, int t, int nt)
{
    update_task *u = ctx;
    size_t n = u->m->num_params, lo = n * t / nt, hi = n * (t + 1) / nt;
    if (u->phase == 0) u->sumsq[t] = optim_sumsq(u->m->grads_memory, lo, hi);
    else optim_update(u->opt, u->m->params_memory, u->m->grads_memory, u->scale, u->groups,
                      MODEL_NUM_PARAMS, u->lr, lo, hi);
}

static void build_groups(const model *m, optim_group *g)
{
    size_t off = 0;
    for (int i = 0; i < MODEL_NUM_PARAMS; i++) {
        g[i].offset = off;
        g[i].n = m->param_sizes[i];
        off += g[i].n;
        g[i].decay = i == MODEL_WTE || i == MODEL_WPE || i == MODEL_QKVW || i == MODEL_ATTPROJW ||
                     i == MODEL_FCW || i == MODEL_FCPROJW || i == MODEL_LMW;
        g[i].frozen = i == MODEL_GAMMA && m->cfg.reparam != MODEL_REPARAM_SIGMA;
    }
}

int main(int argc, char **argv)
{
    fix_openblas_coretype(argv);
#if defined(__SSE2__)
    /* Collapsed attention drives probabilities and their gradients into
     * denormal floats, which x86 handles in microcode: a collapsing run
     * trained 3-10x slower (26.3 s vs 4.0 s for 200 steps, same losses).
     * Flush them to zero (FTZ | DAZ); the worker threads created later
     * inherit this thread's MXCSR. */
    _mm_setcsr(_mm_getcsr() | 0x8040);
#endif
    options o;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : 1;
    if (o.sgemm_peak) {
        double multi, conc, peak = sgemm_peak(o.threads, &multi, &conc);
        printf("sgemm_peak_gflops %.1f threads %d core %s (one call on %d OpenBLAS threads %.1f, "
               "%d concurrent single-threaded calls %.1f)\n", peak, o.threads,
               openblas_get_corename(), o.threads, multi, o.threads, conc);
        return 0;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    char err[512];
    if (o.upload_spool && !o.run_name) {
        int left = telemetry_upload_all(o.daemon, o.spool_dir, o.token, 60000, stdout, err, sizeof err);
        if (left < 0) fprintf(stderr, "sigmatrain: --upload-spool: %s\n", err);
        else printf("upload: %s\n", left ? "some runs are not fully acknowledged (still spooled)" : "every run acknowledged");
        return left == 0 ? 0 : 1;
    }
    if (o.upload_spool) {
        monitor_config uc = {.address = o.daemon, .run = o.run_name, .spool_dir = o.spool_dir,
                             .token = o.token, .log = stdout};
        int rc = monitor_upload(&uc, o.run.cfg.layers, o.run.cfg.heads, o.run.seq_len, 60000, err, sizeof err);
        if (rc < 0) fprintf(stderr, "sigmatrain: --upload-spool: %s\n", err);
        return rc == 0 ? 0 : 1;
    }
    /* MPI (build/sigmatrain-mpi) or a job of one; see dist.h */
    dist *dd = dist_create(&argc, &argv, (size_t)o.dist_bucket_kb * 256, err, sizeof err);
    if (!dd) { fprintf(stderr, "sigmatrain: %s\n", err); return 1; }
    if (dist_rank(dd) > 0 && !freopen("/dev/null", "w", stdout)) /* rank 0 prints progress */
        fprintf(stderr, "sigmatrain: /dev/null: %s\n", strerror(errno));
    monitor *mon = NULL;
    ckpt_meta *r = &o.run;
    int status = 1;
    data *d = NULL;
    model *m = NULL;
    optim *opt = NULL;
    int *in = NULL, *tg = NULL;
    rollback *rb = NULL;
    int rollbacks = 0;

    if (o.resume_path) {
        int keep_steps = r->steps;
        int steps_given = 0;
        for (int i = 1; i < argc; i++) steps_given |= strncmp(argv[i], "--steps", 7) == 0;
        if (ckpt_read_meta(o.resume_path, r, err, sizeof err) != 0) {
            fprintf(stderr, "sigmatrain: resume: %s\n", err);
            goto out;
        }
        if (steps_given) r->steps = keep_steps;
        static const char *const defining[] = {
            "--layers", "--heads", "--dim", "--seq-len", "--norm", "--reparam", "--gamma-init",
            "--optimizer", "--lr", "--warmup", "--schedule", "--weight-decay", "--clip",
            "--batch", "--seed"};
        for (int i = 1; i < argc; i++)
            for (size_t k = 0; k < sizeof defining / sizeof defining[0]; k++) {
                size_t n = strlen(defining[k]);
                if (strncmp(argv[i], defining[k], n) == 0 && (argv[i][n] == 0 || argv[i][n] == '='))
                    fprintf(stderr, "sigmatrain: warning: %s is ignored with --resume (the checkpoint defines the run)\n",
                            defining[k]);
            }
        if ((r->data_kind == 1) != (o.data_path != NULL)) {
            fprintf(stderr, "sigmatrain: resume: the checkpoint was trained on %s; %s\n",
                    r->data_kind ? "a --data file" : "the synthetic corpus",
                    r->data_kind ? "give the same --data FILE" : "do not give --data");
            goto out;
        }
    }
    /* data */
    if (o.data_path) {
        d = data_file(o.data_path, err, sizeof err);
        if (!d) { fprintf(stderr, "sigmatrain: --data %s\n", err); goto out; }
        r->data_kind = 1;
    } else {
        d = data_synthetic(r->seed, SYNTH_TOKENS);
        if (!d) { fprintf(stderr, "sigmatrain: out of memory\n"); goto out; }
        r->data_kind = 0;
    }
    r->cfg.vocab = d->vocab;
    if (o.resume_path && (d->hash != r->data_hash || d->n != r->data_tokens)) {
        fprintf(stderr, "sigmatrain: resume: the data differs from the checkpoint's (%zu tokens, hash %016llx vs %llu, %016llx)\n",
                d->n, (unsigned long long)d->hash, (unsigned long long)r->data_tokens,
                (unsigned long long)r->data_hash);
        goto out;
    }
    r->data_tokens = d->n;
    r->data_hash = d->hash;
    if (data_check(d, r->batch, r->seq_len, err, sizeof err) != 0) {
        fprintf(stderr, "sigmatrain: %s\n", err);
        goto out;
    }
    if (model_config_check(&r->cfg, err, sizeof err) != 0) {
        fprintf(stderr, "sigmatrain: %s\n", err);
        goto out;
    }
    int B = r->batch, T = r->seq_len, b0, nb; /* this rank runs rows [b0, b0 + nb) */
    if (B < dist_size(dd)) {
        fprintf(stderr, "sigmatrain: --batch %d is smaller than the %d ranks\n", B, dist_size(dd));
        goto out;
    }
    dist_shard(dd, B, &b0, &nb);
    m = model_create(&r->cfg, nb, T, o.threads);
    opt = m ? optim_create(r->optimizer, m->num_params, r->beta1, r->beta2, r->eps, r->weight_decay) : NULL;
    in = malloc(sizeof(int) * B * T);
    tg = malloc(sizeof(int) * B * T);
    if (!m || !opt || !in || !tg) { fprintf(stderr, "sigmatrain: out of memory\n"); goto out; }
    if (o.resume_path) {
        int steps = r->steps; /* possibly extended by --steps */
        if (ckpt_load(o.resume_path, r, m, opt, err, sizeof err) != 0) {
            fprintf(stderr, "sigmatrain: resume: %s\n", err);
            goto out;
        }
        r->steps = steps;
        d->pos = r->data_pos;
    } else {
        r->rng = r->seed * 0x9E3779B97F4A7C15ull ^ 0xD1B54A32D192ED03ull;
        if (!r->rng) r->rng = 1;
        model_init(m, &r->rng);
        r->step = 0;
        r->nan_steps = 0;
    }
    optim_group groups[MODEL_NUM_PARAMS];
    build_groups(m, groups);
    static update_task upd; /* static: 2 KB of partial sums off the stack */
    upd.opt = opt;
    upd.m = m;
    upd.groups = groups;

    printf("sigmatrain: L=%d H=%d C=%d T=%d B=%d vocab=%d params=%zu | reparam=%s gamma-init=%s norm=%s | "
           "%s lr=%g warmup=%d schedule=%s wd=%g clip=%g | steps=%d seed=%llu threads=%d blas=%s | data=%s%s\n",
           r->cfg.layers, r->cfg.heads, r->cfg.dim, T, B, r->cfg.vocab, m->num_params,
           REPARAM_NAMES[r->cfg.reparam], GAMMA_NAMES[r->cfg.gamma_init], NORM_NAMES[r->cfg.norm],
           OPT_NAMES[r->optimizer], r->lr, r->warmup, SCHED_NAMES[r->schedule], r->weight_decay,
           r->clip, r->steps, (unsigned long long)r->seed, o.threads, openblas_get_corename(),
           o.data_path ? o.data_path : "synthetic", o.resume_path ? " (resumed)" : "");
    if (o.resume_path) printf("resumed from %s at step %lld\n", o.resume_path, (long long)r->step);
    if (dist_size(dd) > 1)
        printf("dist: %d ranks (MPI), %d-%d rows of each batch of %d per rank, all-reduce bucket %s, "
               "checksum every %d steps\n", dist_size(dd), B / dist_size(dd), (B + dist_size(dd) - 1) / dist_size(dd),
               B, o.dist_bucket_kb ? "set" : "whole buffer", o.dist_check_every);
    if (o.daemon && dist_rank(dd) == 0) { /* one run: rank 0 streams */
        char *meta = run_meta_json(&o, m, o.resume_path);
        monitor_config mc = {.address = o.daemon, .run = o.run_name, .spool_dir = o.spool_dir,
                             .token = o.token, .meta_json = meta, .log_every = o.log_every,
                             .end_grace_ms = o.end_grace ? o.end_grace * 1000 : -1,
                             .queue_slots = (size_t)o.queue_slots,
                             .spool_max_bytes = (size_t)o.spool_max_mb << 20,
                             .probe = {.examples = o.probe_examples},
                             .tokens_per_step = (long)B * T,
                             .ab_block = o.log_every == 1 ? o.telemetry_ab : 0,
                             .ab_max_steps = r->steps,
                             .extra_scalars = dist_size(dd) > 1 ? 3 * dist_size(dd) : 0};
        mon = monitor_create(&mc, m, err, sizeof err);
        free(meta);
        if (!mon) { fprintf(stderr, "sigmatrain: telemetry: %s\n", err); goto out; }
        dist_on_failure(dd, end_run_failed, mon); /* a peer died while we waited on it */
        printf("telemetry: run %s -> %s (spool %s, log every %d, probe on %d examples)\n",
               monitor_run_name(mon), o.daemon, o.spool_dir ? o.spool_dir : "private, temporary",
               o.log_every, o.probe_examples && o.probe_examples < B ? o.probe_examples : B);
    }

    if (o.on_alert == ON_ALERT_ROLLBACK) {
        rb = rollback_create(o.rollback_keep);
        if (!rb || rollback_take(rb, r, m, opt) != 0) { fprintf(stderr, "sigmatrain: out of memory\n"); goto out; }
    }

    double t0 = now_s(), tlast = t0, flops = step_flops(&r->cfg, B, T);
    long start = (long)r->step, done_here = 0, window = 0, finite_in_window = 0;
    float loss = NAN, lr = 0.0f, gnorm = 0.0f, val = NAN;
    double loss_acc = 0.0, reparam_eval = 0.0;
    for (long step = start; step < r->steps; step++) {
        double tstep = now_s(), comm0 = dist_comm_seconds(dd);
        data_next_train(d, in, tg, B, T);
        loss = model_forward(m, in + b0 * T, tg + b0 * T, nb, T, 1);
        double gl = loss; /* every rank must agree on a bad step: the global mean */
        if (dist_sum(dd, &gl, 1, (double)nb / B, err, sizeof err) != 0) goto dist_failed;
        loss = (float)gl;
        if (monitor_wants(mon, step + 1)) monitor_probe(mon, m);
        lr = optim_lr(r->lr, (int)step, r->warmup, r->steps, r->schedule);
        int bad = !isfinite(loss);
        if (!bad) {
            model_zero_grad(m);
            model_backward(m);
            if (dist_allreduce_grads(dd, m->grads_memory, m->num_params, (float)nb / B, err, sizeof err) != 0)
                goto dist_failed;
            upd.phase = 0;
            model_parallel(m, update_slice, &upd);
            double ss = 0.0;
            for (int t = 0; t < m->nthreads; t++) ss += upd.sumsq[t];
            upd.scale = optim_clip_scale(ss, r->clip, &gnorm);
            bad = !isfinite(gnorm);
        }
        if (bad) {
            r->nan_steps++;
            fprintf(stderr, "sigmatrain: step %ld: %s is %s (diverged)%s\n", step + 1,
                    isfinite(loss) ? "gradient norm" : "loss",
                    isnan(isfinite(loss) ? gnorm : loss) ? "NaN" : "Inf",
                    o.continue_on_nan ? "; skipping the update (--continue-on-nan)" : "");
            if (!o.continue_on_nan) {
                printf("summary: diverged at step %ld, loss %g\n", step + 1, loss);
                status = 3;
                goto out;
            }
        } else {
            optim_begin_step(opt);
            upd.phase = 1;
            upd.lr = lr;
            model_parallel(m, update_slice, &upd);
        }
        r->step = step + 1;
        r->data_pos = d->pos;
        r->optim_t = opt->t;
        done_here++;
        window++;
        if (isfinite(loss)) { loss_acc += loss; finite_in_window++; }
        if (o.dist_check_every && r->step % o.dist_check_every == 0) {
            const void *bufs[3] = {m->params_memory, m->pi_memory, opt->state};
            size_t bytes[3] = {m->num_params * sizeof(float), m->pi_size * sizeof(float),
                               opt->state_n * sizeof(float)};
            int rc = dist_check_same(dd, bufs, bytes, 3, err, sizeof err);
            if (rc > 0) {
                fprintf(stderr, "sigmatrain: step %lld: %s\n", (long long)r->step, err);
                status = 4;
                goto out;
            }
            if (rc < 0) goto dist_failed;
        }
        if (o.daemon && dist_size(dd) > 1 && r->step % o.log_every == 0) { /* per-rank figures */
            int ns;
            const char *const *names;
            const float *vals;
            if (dist_rank_stats(dd, (double)nb * T, now_s() - tstep, dist_comm_seconds(dd) - comm0,
                                &ns, &names, &vals, err, sizeof err) != 0)
                goto dist_failed;
            if (mon) monitor_extra_scalars(mon, ns, names, vals);
        }

        telemetry_on_step(mon, step + 1, loss, lr, gnorm,
                          (o.eval_every && r->step % o.eval_every == 0) || r->step == r->steps);

        if (r->step % o.print_every == 0 || r->step == r->steps) {
            double t = now_s();
            double tps = (double)window * B * T / (t - tlast);
            char eta[32];
            fmt_eta(eta, sizeof eta, (r->steps - r->step) * (t - t0) / done_here);
            printf("step %6lld/%d | loss %.4f | lr %.3e | gnorm %.3f | %.0f tok/s | %.1f GFLOP/s | eta %s\n",
                   (long long)r->step, r->steps,
                   finite_in_window ? loss_acc / finite_in_window : (double)NAN, lr, gnorm,
                   tps, tps / (B * T) * flops / 1e9, eta);
            tlast = t;
            window = 0;
            finite_in_window = 0;
            loss_acc = 0.0;
        }
        if (o.eval_every && r->step % o.eval_every == 0 && r->step < r->steps) {
            double te = now_s(), re = m->reparam_seconds;
            val = evaluate(m, d, in, tg, B, T, o.eval_batches, dd);
            reparam_eval += m->reparam_seconds - re;
            printf("eval step %lld | val loss %.4f\n", (long long)r->step, val);
            monitor_eval(mon, (long)r->step, val);
            tlast += now_s() - te; /* keep evals out of tokens/s */
            t0 += now_s() - te;
        }
        if (o.save_every && r->step % o.save_every == 0 && r->step < r->steps && dist_rank(dd) == 0) {
            char path[4096];
            save_path_for(path, sizeof path, o.save_path, (long)r->step);
            double ts = now_s();
            if (ckpt_save(path, r, m, opt, err, sizeof err) != 0) {
                fprintf(stderr, "sigmatrain: save: %s\n", err);
                goto out;
            }
            tlast += now_s() - ts;
            t0 += now_s() - ts;
        }
        if (rb && r->step % o.rollback_every == 0 && rollback_take(rb, r, m, opt) != 0) {
            fprintf(stderr, "sigmatrain: out of memory\n");
            goto out;
        }
        if (o.on_alert != ON_ALERT_WARN) { /* every rank: rank 0 decides, all act */
            int act = handle_alerts(&o, mon, dd, rb, &rollbacks, r, m, opt, err, sizeof err);
            if (act == ALERT_DIST_FAILED) goto dist_failed;
            if (act == ALERT_ERROR) goto out;
            if (act == ALERT_STOP) { status = EXIT_ALERT_ABORTED; goto out; }
            if (act == ALERT_ROLLED_BACK) {
                r->data_pos = d->pos; /* skip the batches of the abandoned steps */
                step = (long)r->step - 1; /* the loop's step++ makes it r->step */
                window = 0;
                finite_in_window = 0;
                loss_acc = 0.0;
            }
        }
    }
    double elapsed = now_s() - t0;
    double reparam_train = m->reparam_seconds - reparam_eval;
    val = evaluate(m, d, in, tg, B, T, o.eval_batches, dd);
    printf("eval step %lld | val loss %.4f\n", (long long)r->step, val);
    monitor_eval(mon, (long)r->step, val);
    if (o.save_path && dist_rank(dd) == 0) { /* ranks are identical (checked) */
        char path[4096];
        save_path_for(path, sizeof path, o.save_path, (long)r->step);
        if (ckpt_save(path, r, m, opt, err, sizeof err) != 0) {
            fprintf(stderr, "sigmatrain: save: %s\n", err);
            goto out;
        }
        printf("saved %s\n", path);
    }
    double tps = done_here ? (double)done_here * B * T / elapsed : 0.0;
    printf("summary: steps %lld | last train loss %.4f | val loss %.4f | nan steps %lld | "
           "%.1f s | %.0f tok/s | %.1f GFLOP/s | sreparam %.2f%% of step time\n",
           (long long)r->step, loss, val, (long long)r->nan_steps, elapsed, tps,
           tps / (B * T) * flops / 1e9, elapsed > 0 ? 100.0 * reparam_train / elapsed : 0.0);
    if (dist_size(dd) > 1)
        printf("dist: gradient all-reduce %.2f ms/step, %.1f%% of training time (%ld calls, %zu floats each)\n",
               dist_comm_calls(dd) ? 1e3 * dist_comm_seconds(dd) / dist_comm_calls(dd) : 0.0,
               elapsed > 0 ? 100.0 * dist_comm_seconds(dd) / elapsed : 0.0, dist_comm_calls(dd), m->num_params);
    status = isfinite(val) ? 0 : 3;
    goto out;
dist_failed:
    fprintf(stderr, "sigmatrain: rank %d: %s\n", dist_rank(dd), err);
    status = 1;
out:
    monitor_finish(mon, status == 0 ? "finished" : status == EXIT_ALERT_ABORTED ? "aborted" : "failed");
    rollback_destroy(rb);
    free(in);
    free(tg);
    optim_destroy(opt);
    model_destroy(m);
    data_destroy(d);
    dist_destroy(dd, status == 1); /* 1: other ranks may wait in a collective: abort them */
    return status;
}
