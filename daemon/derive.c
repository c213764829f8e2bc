/* derive.c: entropy_norm from entropy at ingest (see derive.h). */
#include "derive.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double derive_entropy_max(int64_t seq_len, int noncausal) {
    if (seq_len <= 1) return 0;
    double T = (double)seq_len;
    return noncausal ? log(T) : lgamma(T + 1) / T;
}

int derive_step(struct proto_msg *m, int64_t seq_len, int noncausal) {
    if (m->type != PROTO_STEP) return 0;
    uint32_t nhead = 0, ent = UINT32_MAX;
    for (uint32_t i = 0; i < m->nmetrics; i++) {
        const struct proto_metric *pm = &m->metrics[i];
        if (!strcmp(pm->name, "entropy_norm")) return 0; /* sent (the probe's own), or of another kind */
        if (pm->kind != PROTO_HEAD) continue;
        nhead++;
        if (!strcmp(pm->name, "entropy")) ent = i;
    }
    if (ent == UINT32_MAX || nhead >= PROTO_MAX_METRICS) return 0;
    struct proto_metric src = m->metrics[ent];
    uint32_t n = src.rows * src.cols;
    struct proto_metric *metrics = realloc(m->metrics, (m->nmetrics + 1) * sizeof *metrics);
    if (!metrics) return -1;
    m->metrics = metrics; /* a larger array, nmetrics unchanged: still a valid message */
    float *values = realloc(m->values, ((size_t)m->nvalues + n) * sizeof *values);
    if (!values) return -1;
    m->values = values;
    struct proto_metric *out = &m->metrics[m->nmetrics];
    *out = src;
    memcpy(out->name, "entropy_norm", sizeof "entropy_norm");
    out->offset = m->nvalues;
    double max = derive_entropy_max(seq_len, noncausal);
    for (uint32_t j = 0; j < n; j++) values[out->offset + j] = max > 0 ? (float)(values[src.offset + j] / max) : NAN;
    m->nvalues += n;
    m->nmetrics++;
    return 1;
}
