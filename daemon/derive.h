/* derive.h: metrics the daemon computes from what a trainer sent.
 *
 * A trainer that sends only the head metric `entropy` (the shortest
 * example, most C users) still gets every built-in collapse rule and the
 * verdict, which read `entropy_norm`: ingest adds `entropy_norm` to such a
 * step before the writer sees it, so the store, the alerter, the verdict,
 * the series and the live stream all see one step with both metrics.
 *
 * What it is not: a second probe. `entropy` is already a mean over rows, so
 * the probe's per-row normalisation cannot be undone; docs/metrics.md says
 * how the derived value relates to the probe's. */
#ifndef DERIVE_H
#define DERIVE_H

#include <stdint.h>

#include "proto.h"

/* The largest mean row entropy a head can have (nats), the divisor of the
 * derived entropy_norm: causal rows i = 0..T-1 attend i + 1 positions, so
 * (1/T) sum_i log(i + 1) = lgamma(T + 1) / T; full (noncausal) attention
 * rows all attend T, so log T. 0 for seq_len <= 1 (no row can spread). */
double derive_entropy_max(int64_t seq_len, int noncausal);

/* When step m carries head metric "entropy" and no metric "entropy_norm",
 * appends head metric "entropy_norm" = entropy / derive_entropy_max
 * (NaN where entropy is NaN, and everywhere when the divisor is 0), with
 * the entropy's shape. m must be a parsed step (proto_parse); its metrics
 * and values arrays are grown with realloc and stay owned by m. Returns 1
 * when the metric was added, 0 when there was nothing to derive (not a
 * step, no entropy, entropy_norm already sent, or the step already holds
 * PROTO_MAX_METRICS head metrics), -1 when out of memory (m unchanged). */
int derive_step(struct proto_msg *m, int64_t seq_len, int noncausal);

#endif
