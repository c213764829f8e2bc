/* query_db.h: what the query families (query.c, query_series.c,
 * query_export.c) share inside the query module: a read connection with
 * its prepared statements, its read transactions, and the lookups every
 * family starts with. Not for use outside the query module: query.h is
 * the module's contract. */
#ifndef QUERY_DB_H
#define QUERY_DB_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "query.h"

/* The statements every connection prepares once (persistent). */
enum {
    Q_RUN,          /* layers, heads, status of a run */
    Q_METRIC,       /* id, kind of a run's metric */
    Q_STEP_RANGE,   /* min, max step of a metric's frames */
    Q_ROLLUPS,      /* block, nframes, data of a level's block range */
    Q_FRAMES,       /* step, data of a step range */
    Q_FRAME_AT,     /* the last frame <= step */
    Q_COUNT
};

/* One read-only connection; a thread uses it between query_acquire and
 * query_release (the pool, query_db.c). */
struct query {
    sqlite3 *db;
    sqlite3_stmt *stmt[Q_COUNT];
    struct query *next;
};

/* Formats "database error <what>: <sqlite message>" into err; returns
 * QUERY_ERR. */
int query_db_fail(struct query *q, char *err, size_t errlen, const char *what);
/* Starts a read transaction (one committed state for what follows). */
int query_db_begin(struct query *q, char *err, size_t errlen);
/* Ends it if one is open. */
void query_db_end(struct query *q);

/* "scalar", "layer" or "head" for a metric kind 0, 1, 2. */
const char *query_kind_name(int kind);

struct query_runinfo {
    int64_t layers, heads;
    char status[16];
};

/* The run's shape and status; QUERY_NOT_FOUND with a message if none. */
int query_run_get(struct query *q, int64_t id, struct query_runinfo *ri, char *err, size_t errlen);
/* A run's metric id and kind by name; QUERY_NOT_FOUND with a message if none. */
int query_metric_get(struct query *q, int64_t run_id, const char *name, int64_t *id, int *kind, char *err,
                     size_t errlen);

#endif
