/* store_alerts.c: what the alert engine writes: alert episodes and their
 * transitions, the run's verdict and its summary row. Not the alert rules
 * or their evaluation (alert.c), nor the reads (query.c). The contract is
 * store.h. */
#include "store.h"
#include "store_int.h"

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int store_alert_transition(struct store *st, const struct store_alert *a, int64_t *alert_id) {
    sqlite3_stmt *s = NULL;
    int ret = -1;
    int64_t id = 0;
    /* the open episode of this group, if any (also one left by an earlier daemon) */
    if (sqlite3_prepare_v2(st->db,
                           "SELECT id FROM alerts WHERE run_id = ?1 AND rule = ?2 AND state = 'firing' "
                           "ORDER BY id DESC LIMIT 1",
                           -1, &s, NULL) != SQLITE_OK)
        goto dberr;
    sqlite3_bind_int64(s, 1, a->run_id);
    sqlite3_bind_text(s, 2, a->rule, -1, SQLITE_STATIC);
    if (sqlite3_step(s) == SQLITE_ROW) id = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    s = NULL;
    int resolved = strcmp(a->transition, "resolved") == 0;
    if (!id) {
        if (resolved) {
            ret = 0;
            goto out;
        } /* nothing open: never a resolved without a firing */
        if (sqlite3_prepare_v2(
                st->db,
                "INSERT INTO alerts(run_id, rule, severity, fingerprint, state, starts_at, "
                "start_step, last_step, value, cells, payload) VALUES (?1, ?2, ?3, ?4, 'firing', ?5, ?6, "
                "?7, ?8, ?9, ?10)",
                -1, &s, NULL) != SQLITE_OK)
            goto dberr;
        sqlite3_bind_int64(s, 1, a->run_id);
        sqlite3_bind_text(s, 2, a->rule, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, a->severity, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 4, a->fingerprint, -1, SQLITE_STATIC);
        sqlite3_bind_double(s, 5, a->starts_at);
        sqlite3_bind_int64(s, 6, a->start_step);
        sqlite3_bind_int64(s, 7, a->step);
        if (isfinite(a->value)) sqlite3_bind_double(s, 8, a->value);
        else sqlite3_bind_null(s, 8);
        sqlite3_bind_text(s, 9, a->cells_json, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 10, a->payload, -1, SQLITE_STATIC);
        if (sqlite3_step(s) != SQLITE_DONE) goto dberr;
        id = sqlite3_last_insert_rowid(st->db);
    } else {
        if (sqlite3_prepare_v2(st->db,
                               "UPDATE alerts SET state = ?2, ends_at = ?3, last_step = ?4, value = ?5, "
                               "cells = ?6, payload = ?7, reason = ?8 WHERE id = ?1",
                               -1, &s, NULL) != SQLITE_OK)
            goto dberr;
        sqlite3_bind_int64(s, 1, id);
        sqlite3_bind_text(s, 2, resolved ? "resolved" : "firing", -1, SQLITE_STATIC);
        if (resolved) sqlite3_bind_double(s, 3, a->ends_at);
        else sqlite3_bind_null(s, 3);
        sqlite3_bind_int64(s, 4, a->step);
        if (isfinite(a->value)) sqlite3_bind_double(s, 5, a->value);
        else sqlite3_bind_null(s, 5);
        sqlite3_bind_text(s, 6, a->cells_json, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 7, a->payload, -1, SQLITE_STATIC);
        if (resolved && a->reason) sqlite3_bind_text(s, 8, a->reason, -1, SQLITE_STATIC);
        else sqlite3_bind_null(s, 8);
        if (sqlite3_step(s) != SQLITE_DONE) goto dberr;
    }
    sqlite3_finalize(s);
    s = NULL;
    if (sqlite3_prepare_v2(st->db,
                           "INSERT INTO alert_transitions(alert_id, time, step, transition, value, cells) "
                           "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                           -1, &s, NULL) != SQLITE_OK)
        goto dberr;
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_double(s, 2, a->time);
    sqlite3_bind_int64(s, 3, a->step);
    sqlite3_bind_text(s, 4, a->transition, -1, SQLITE_STATIC);
    if (isfinite(a->value)) sqlite3_bind_double(s, 5, a->value);
    else sqlite3_bind_null(s, 5);
    sqlite3_bind_text(s, 6, a->cells_json, -1, SQLITE_STATIC);
    if (sqlite3_step(s) != SQLITE_DONE) goto dberr;
    if (alert_id) *alert_id = id;
    ret = 0;
    goto out;
dberr:
    store_db_err(st, "writing alert");
out:
    sqlite3_finalize(s);
    return ret;
}

int store_alerts_close_run(struct store *st, int64_t run_id, double now) {
    sqlite3_stmt *s = st->stmt[S_ALERTS_CLOSE_RUN];
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_double(s, 2, now);
    return store_step_done(st, s, "closing the run's alerts");
}

int store_run_is_live(struct store *st, int64_t run_id) {
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(st->db, "SELECT status = 'live' FROM runs WHERE id = ?1", -1, &s, NULL) != SQLITE_OK)
        return -1;
    sqlite3_bind_int64(s, 1, run_id);
    int rc = sqlite3_step(s);
    int v = rc == SQLITE_ROW ? sqlite3_column_int(s, 0) != 0 : rc == SQLITE_DONE ? 0 : -1;
    sqlite3_finalize(s);
    return v;
}

/* ---- run summary and verdict (schema/005_runs.sql) ---- */

int store_run_verdict(struct store *st, int64_t run_id, const char *verdict, int64_t since_step, const char *heads_json,
                      const char *rule, const char *evidence_json) {
    sqlite3_stmt *s = st->stmt[S_RUN_VERDICT];
    sqlite3_bind_int64(s, 1, run_id);
    sqlite3_bind_text(s, 2, verdict, -1, SQLITE_STATIC);
    if (since_step >= 0) sqlite3_bind_int64(s, 3, since_step);
    else sqlite3_bind_null(s, 3);
    sqlite3_bind_text(s, 4, heads_json ? heads_json : "[]", -1, SQLITE_STATIC);
    if (rule) sqlite3_bind_text(s, 5, rule, -1, SQLITE_STATIC);
    else sqlite3_bind_null(s, 5);
    if (evidence_json) sqlite3_bind_text(s, 6, evidence_json, -1, SQLITE_STATIC);
    else sqlite3_bind_null(s, 6);
    int failed = store_step_done(st, s, "writing the verdict");
    sqlite3_clear_bindings(s); /* the strings are the caller's */
    return failed ? -1 : 0;
}

int store_run_summary_step(struct store *st, int64_t run_id, const struct proto_msg *msg) {
    double loss = NAN, ent = NAN;
    int has_loss = 0;
    for (uint32_t i = 0; i < msg->nmetrics; i++) {
        const struct proto_metric *pm = &msg->metrics[i];
        if (pm->kind == PROTO_SCALAR && !strcmp(pm->name, "loss")) {
            loss = msg->values[pm->offset];
            has_loss = 1;
        } else if (pm->kind == PROTO_HEAD && !strcmp(pm->name, "entropy_norm")) {
            const float *v = msg->values + pm->offset;
            for (uint32_t k = 0; k < pm->rows * pm->cols; k++)
                if (isfinite(v[k]) && !(v[k] >= ent)) ent = v[k];
        }
    }
    if (!has_loss && isnan(ent)) return 0;
    if (!st->summary_stmt &&
        sqlite3_prepare_v3(st->db,
                           "INSERT INTO run_summary(run_id, last_loss, min_entropy) VALUES (?1, ?2, ?3) "
                           "ON CONFLICT(run_id) DO UPDATE SET "
                           "last_loss = CASE WHEN ?4 THEN excluded.last_loss ELSE last_loss END, "
                           "min_entropy = CASE WHEN excluded.min_entropy IS NULL THEN min_entropy "
                           "WHEN min_entropy IS NULL OR excluded.min_entropy < min_entropy THEN excluded.min_entropy "
                           "ELSE min_entropy END",
                           -1, SQLITE_PREPARE_PERSISTENT, &st->summary_stmt, NULL) != SQLITE_OK)
        return store_db_err(st, "preparing the run summary");
    sqlite3_stmt *s = st->summary_stmt;
    sqlite3_bind_int64(s, 1, run_id);
    if (has_loss && isfinite(loss)) sqlite3_bind_double(s, 2, loss);
    else sqlite3_bind_null(s, 2); /* a NaN loss is stored as NULL: the verdict says diverged */
    if (isfinite(ent)) sqlite3_bind_double(s, 3, ent);
    else sqlite3_bind_null(s, 3);
    sqlite3_bind_int(s, 4, has_loss);
    return store_step_done(st, s, "writing the run summary");
}
