/* metrics.h: what GET /metrics says of the daemon beyond the HTTP server's
 * own figures: each module's counters (its X_metrics, beside its stats),
 * the database's size, and the runs' latest values (query_prometheus).
 * It gathers; it keeps no state and counts nothing itself. Not the route
 * (http_api.c). */
#ifndef METRICS_H
#define METRICS_H

#include <stddef.h>

#include "alerter.h"
#include "ingest.h"
#include "query.h"
#include "remote_write.h"
#include "stream.h"
#include "strbuf.h"
#include "writer.h"

/* Where the figures come from; every pointer is borrowed, and NULL leaves
 * that module's figures out (pool NULL: no database figures). */
struct metrics_sources {
    struct alerter *alerter;
    struct ingest *ingest;
    struct writer *writer;
    struct stream *stream;
    struct remote_write *remote_write;
    struct query_pool *pool;
    int heads;     /* also export per-head latest values */
    double keep_s; /* export ended runs this long after their end; 0: 3600, < 0: not at all */
};

/* http_config.metrics: appends the figures of sources (a struct
 * metrics_sources) to b as Prometheus text. Returns 0, or 503 when no
 * database connection could be had and 500 when a query failed, with a
 * message in err (b then holds part of the answer: the caller frees it). */
int metrics_write(void *sources, struct strbuf *b, char *err, size_t errlen);

#endif
