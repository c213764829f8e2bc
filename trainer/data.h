/* data.h - token streams for training: a built-in synthetic corpus that needs
 * attention to solve, or the bytes of a file (vocab 256).  The stream is split
 * into train (first 90%) and validation (last 10%).  Batches are contiguous
 * windows (llm.c's loader): row b of a batch is tokens pos + b*T .. + T, the
 * targets are the same shifted by one; the train cursor advances by B*T and
 * wraps.  Not a tokenizer. */
#ifndef DATA_H
#define DATA_H

#include <stddef.h>
#include <stdint.h>

/* Vocabulary of the synthetic corpus. */
#define DATA_SYNTH_VOCAB 64

typedef struct {
    uint8_t *tokens; /* (n) owned */
    size_t n;
    size_t split; /* train = [0, split), val = [split, n) */
    int vocab;
    uint64_t pos;  /* train cursor, saved in checkpoints */
    uint64_t hash; /* FNV-1a of the tokens, to check a resumed run uses the same data */
} data;

/* The synthetic corpus of ntokens tokens, deterministic from seed.  A mix of
 * episodes (one token = one symbol):
 *   copy:    COPY s1..sk SEP s1..sk EOS            (k in 2..7, 16 symbols; second half needs attention)
 *   recall:  KV k1 v1 .. kn vn QRY ki vi EOS        (n in 2..4, 8 keys, 16 values; the answer needs attention)
 *   grammar: DET [ADJ] NOUN VERB DET [ADJ] NOUN EOS (verb agrees with the subject's class,
 *            the object's class is fixed by the verb's)
 * Returns NULL when out of memory. */
data *data_synthetic(uint64_t seed, size_t ntokens);

/* The bytes of the file at path.  Returns NULL with a message in err when the
 * file cannot be read or is too small (fewer than 64 bytes). */
data *data_file(const char *path, char *err, size_t errlen);

void data_destroy(data *d);

/* 0 if a B x T batch fits in both splits, else -1 with a message. */
int data_check(const data *d, int B, int T, char *err, size_t errlen);

/* Next training batch: inputs, targets (B*T each); advances d->pos. */
void data_next_train(data *d, int *inputs, int *targets, int B, int T);

/* The k-th validation batch (deterministic, independent of the train cursor). */
void data_val_batch(const data *d, int k, int *inputs, int *targets, int B, int T);

#endif
