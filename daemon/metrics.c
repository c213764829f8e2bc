/* metrics.c: the text of GET /metrics beyond the HTTP server's figures,
 * gathered from each module's X_metrics. See metrics.h. */
#include "metrics.h"

#include "integrity.h"
#include "now.h"

int metrics_write(void *sources, struct strbuf *b, char *err, size_t errlen) {
    const struct metrics_sources *s = sources;
    if (s->alerter) alerter_metrics(s->alerter, b);
    if (s->ingest) ingest_metrics(s->ingest, b);
    if (s->writer) writer_metrics(s->writer, b);
    if (s->stream) stream_metrics(s->stream, b);
    strbuf_prom(b, "entropyd_integrity_errors_total", "counter",
                "Damaged stored rows met (a checksum mismatch, a row that does not decode, SQLite's SQLITE_CORRUPT).",
                (double)integrity_errors());
    remote_write_metrics(s->remote_write, b);
    if (!s->pool) return 0;
    struct query *q = query_acquire(s->pool, err, errlen);
    if (!q) return 503;
    int64_t dbb = query_db_bytes(q), walb = query_wal_bytes(q);
    strbuf_prom(b, "entropyd_db_bytes", "gauge", "Size of the database on disk: its file and its WAL.",
                (double)(dbb < 0 || walb < 0 ? -1 : dbb + walb));
    strbuf_prom(b, "entropyd_wal_bytes", "gauge", "Size of the database's WAL file.", (double)walb);
    int rc = query_prometheus(q, s->heads, now_wall(), s->keep_s == 0 ? 3600 : s->keep_s, b, err, errlen);
    query_release(s->pool, q);
    return rc == QUERY_OK ? 0 : 500;
}
