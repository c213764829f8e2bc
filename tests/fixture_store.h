/* fixture_store.h: the fixture of the tests that drive the store on a real
 * database (test_store.c, test_writer.c): a new database in a fresh
 * temporary directory, reading what was written back through a second,
 * read-only SQLite connection, and building the metrics of a step message.
 * Header-only (static inline); include it after <cmocka.h>, whose
 * assertions these helpers use: a helper that cannot do its work fails the
 * test. */
#ifndef FIXTURE_STORE_H
#define FIXTURE_STORE_H

#include <sqlite3.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "fixture_frames.h"
#include "proto.h"
#include "store.h"

/* ------------------------------------------------------------ a temporary database */

struct tmp_db {
    char dir[64];     /* the temporary directory */
    char path[128];   /* the database file in it, dir/test.db */
    struct store *st; /* the store open on it */
};

/* Makes a fresh directory from the mkdtemp template tmpl (e.g.
 * "/tmp/tstore-XXXXXX") and opens the store on a new database in it.
 * Returns 0, or -1 with the reason on stderr. What d holds belongs to the
 * caller until tmp_db_close. */
static inline int tmp_db_open(struct tmp_db *d, const char *tmpl) {
    snprintf(d->dir, sizeof d->dir, "%s", tmpl);
    if (!mkdtemp(d->dir)) {
        perror("mkdtemp");
        return -1;
    }
    snprintf(d->path, sizeof d->path, "%s/test.db", d->dir);
    char err[256];
    d->st = store_open(d->path, err, sizeof err);
    if (!d->st) {
        fprintf(stderr, "store_open: %s\n", err);
        return -1;
    }
    return 0;
}

/* Closes the store and removes the directory with the database. */
static inline void tmp_db_close(struct tmp_db *d) {
    store_close(d->st);
    d->st = NULL;
    rmtree(d->dir);
}

/* ------------------------------------------------------------ reading the database */

/* A read-only connection to the database at path, for the caller to close
 * (sqlite3_close); its `frames` holds every frame (shadow_frames). */
static inline sqlite3 *ro_open(const char *path) {
    sqlite3 *db;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    shadow_frames(db);
    return db;
}

/* The query fmt, formatted by sqlite3_vmprintf with ap, prepared on a
 * read-only connection of its own to path (fails the test, naming the SQL,
 * when it does not prepare). The caller steps the statement and gives it to
 * q_done, which finalizes it and closes that connection. */
static inline sqlite3_stmt *q_prepare(const char *path, const char *fmt, va_list ap) {
    char *sql = sqlite3_vmprintf(fmt, ap);
    sqlite3 *db = ro_open(path);
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
    sqlite3_free(sql);
    return s;
}

static inline void q_done(sqlite3_stmt *s) {
    sqlite3 *db = sqlite3_db_handle(s);
    sqlite3_finalize(s);
    sqlite3_close(db);
}

/* The first column of the first row of a formatted query as int64;
 * INT64_MIN when there is no row or it is NULL. */
static inline int64_t qi(const char *path, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sqlite3_stmt *s = q_prepare(path, fmt, ap);
    va_end(ap);
    int64_t v = INT64_MIN;
    if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL) v = sqlite3_column_int64(s, 0);
    q_done(s);
    return v;
}

/* The same as text: a malloc'ed copy, the caller's to free; NULL when there
 * is no row or it is NULL. */
static inline char *qs(const char *path, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sqlite3_stmt *s = q_prepare(path, fmt, ap);
    va_end(ap);
    char *v = NULL;
    if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL)
        v = strdup((const char *)sqlite3_column_text(s, 0));
    q_done(s);
    return v;
}

/* ------------------------------------------------------------ building messages */

/* Appends metric name (kind, rows x cols) with the values v to the message:
 * the metric array and the value array of m grow (realloc), and belong to m
 * (proto_msg_free releases them); v is copied. */
static inline void msg_add(struct proto_msg *m, const char *name, int kind, uint32_t rows, uint32_t cols,
                           const float *v) {
    m->metrics = realloc(m->metrics, (m->nmetrics + 1) * sizeof *m->metrics);
    assert_non_null(m->metrics);
    struct proto_metric *mt = &m->metrics[m->nmetrics++];
    memset(mt, 0, sizeof *mt);
    snprintf(mt->name, sizeof mt->name, "%s", name);
    mt->kind = kind;
    mt->rows = rows;
    mt->cols = cols;
    mt->offset = m->nvalues;
    uint32_t n = rows * cols;
    m->values = realloc(m->values, (m->nvalues + n) * sizeof *m->values);
    assert_non_null(m->values);
    memcpy(m->values + m->nvalues, v, n * sizeof *v);
    m->nvalues += n;
}

#endif
