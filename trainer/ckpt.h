/* ckpt.h - sigmatrain checkpoints: everything needed to continue a run
 * exactly as if it had not stopped.
 *
 * File layout (little-endian, as written by x86-64; no padding):
 *   u32 magic "SGTR" (0x52544753), u32 version (1)
 *   model config: 8 x i32 (vocab, max_seq, layers, heads, dim, norm, reparam, gamma_init)
 *   run config: i32 optimizer, schedule, batch, seq_len, warmup, steps, data_kind;
 *               u64 seed; f32 lr, weight_decay, clip, beta1, beta2, eps
 *   data: u64 tokens, u64 FNV-1a hash, u64 train cursor
 *   state: i64 step (completed), u64 rng, i64 optimizer t, i64 nan_steps
 *   u64 num_params, f32 params[num_params]
 *   u64 state_n, f32 optimizer state[state_n] (Adam: m then v)
 *   u32 num_linear, f32 sigma[num_linear], u64 pi_size, f32 u/v vectors[pi_size]
 *   u32 magic again (detects truncation)
 * Saving writes PATH.tmp and renames it over PATH, so a crash never leaves a
 * half-written checkpoint under the final name. */
#ifndef CKPT_H
#define CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "optim.h"

#define CKPT_MAGIC 0x52544753u
#define CKPT_VERSION 1u

typedef struct {
    model_config cfg;
    int32_t optimizer, schedule, batch, seq_len, warmup, steps, data_kind; /* data_kind: 0 synthetic, 1 file */
    uint64_t seed;
    float lr, weight_decay, clip, beta1, beta2, eps;
    uint64_t data_tokens, data_hash, data_pos;
    int64_t step;
    uint64_t rng;
    int64_t optim_t;
    int64_t nan_steps;
} ckpt_meta;

/* Writes a checkpoint.  Returns 0, or -1 with "path: reason" in err. */
int ckpt_save(const char *path, const ckpt_meta *meta, const model *m, const optim *o, char *err, size_t errlen);

/* Reads only the header (to size the model before ckpt_load). 0 / -1 + err. */
int ckpt_read_meta(const char *path, ckpt_meta *meta, char *err, size_t errlen);

/* Reads a whole checkpoint into a model and optimizer created from its meta.
 * Fails (-1, err) on a bad magic/version, a size mismatch or truncation. */
int ckpt_load(const char *path, ckpt_meta *meta, model *m, optim *o, char *err, size_t errlen);

/* The names of the run's enumerated settings, indexed by their values
 * (model.h's MODEL_REPARAM_*, MODEL_NORM_*, MODEL_GAMMA_*, optim.h's OPTIM_*
 * and OPTIM_SCHEDULE_*): what the command line takes and the meta shows. */
extern const char *const ckpt_reparam_names[3];
extern const char *const ckpt_norm_names[3];
extern const char *const ckpt_gamma_names[2];
extern const char *const ckpt_optim_names[4];
extern const char *const ckpt_schedule_names[2];

/* Writes into out (n bytes, truncated to fit) the checkpoint path for step:
 * pattern with its first "{step}" replaced by the step number. */
void ckpt_path(char *out, size_t n, const char *pattern, long step);

/* What a run's description needs beyond its ckpt_meta. */
typedef struct {
    const char *trainer_version; /* e.g. "0.5.0 (built ...)" */
    const char *data_path;       /* --data FILE, or NULL */
    const char *resumed_from;    /* the checkpoint resumed, or NULL */
    size_t params;               /* the model's parameter count */
    int threads, log_every, probe_examples;
} ckpt_run_facts;

/* The run described as a JSON object (the hello's meta, schema/protocol.md):
 * model, optimizer, data, seed, reparam, the facts, host and start time.
 * Returns text from malloc() (the caller frees it), or NULL when out of
 * memory. */
char *ckpt_meta_json(const ckpt_meta *r, const ckpt_run_facts *f);

#endif
