/* alert_json.c: a transition as JSON: the Alertmanager alert object
 * (labels, annotations with their placeholders filled, startsAt, endsAt,
 * fingerprint) with entropyd's fields beside (alert.h,
 * alert_transition_json). No engine state: it reads the transition only. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alert.h"

const char *alert_reason_name(int reason) {
    return reason == ALERT_REASON_RUN_ENDED ? "run_ended" : reason == ALERT_REASON_RUN_DELETED ? "run_deleted" : NULL;
}

static void iso8601(double t, char *buf, size_t n) {
    if (t <= 0) {
        snprintf(buf, n, "0001-01-01T00:00:00Z"); /* Alertmanager's "no end" */
        return;
    }
    /* rounded, not truncated: a time stored as %.3f and read back prints the same */
    long long all_ms = llround(t * 1000);
    time_t s = (time_t)(all_ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    int ms = (int)(all_ms % 1000);
    snprintf(buf, n, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, ms);
}

static void cells_text(const struct alert_transition *t, char *buf, size_t n) {
    size_t off = 0;
    buf[0] = 0;
    for (int i = 0; i < t->ncells && off + 32 < n; i++) {
        if (i == 12) {
            snprintf(buf + off, n - off, " and %d more", t->ncells_total - 12);
            return;
        }
        const struct alert_cell *c = &t->cells[i];
        if (c->head >= 0)
            off += (size_t)snprintf(buf + off, n - off, "%slayer %d head %d", i ? ", " : "", c->layer, c->head);
        else if (c->layer >= 0) off += (size_t)snprintf(buf + off, n - off, "%slayer %d", i ? ", " : "", c->layer);
        else
            off +=
                (size_t)snprintf(buf + off, n - off, "%s%s", i ? ", " : "", t->rule->metric ? t->rule->metric : "run");
    }
}

/* Replaces {run} {rule} {metric} {step} {value} {cells} in a template. */
static char *expand(const char *tpl, const struct alert_transition *t) {
    char cells[640], step[32], value[32];
    cells_text(t, cells, sizeof cells);
    snprintf(step, sizeof step, "%lld", (long long)t->step);
    snprintf(value, sizeof value, "%.4g", t->value);
    const char *keys[] = {"{run}", "{rule}", "{metric}", "{step}", "{value}", "{cells}"};
    const char *vals[] = {t->run_name, t->rule->name, t->rule->metric ? t->rule->metric : "", step, value, cells};
    size_t cap = strlen(tpl) + 1;
    for (const char *p = tpl; *p; p++)
        if (*p == '{') cap += sizeof cells + 64;
    char *out = malloc(cap), *o = out;
    if (!out) return NULL;
    for (const char *p = tpl; *p;) {
        int hit = 0;
        for (int k = 0; k < 6 && !hit; k++) {
            size_t kl = strlen(keys[k]);
            if (strncmp(p, keys[k], kl) == 0) {
                size_t vl = strlen(vals[k]);
                memcpy(o, vals[k], vl);
                o += vl;
                p += kl;
                hit = 1;
            }
        }
        if (!hit) *o++ = *p++;
    }
    *o = 0;
    return out;
}

char *alert_transition_json(const struct alert_transition *t) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    char buf[64];
    cJSON_AddStringToObject(o, "status", t->state == ALERT_RESOLVED ? "resolved" : "firing");
    cJSON_AddStringToObject(o, "transition",
                            t->state == ALERT_FIRING     ? "firing"
                            : t->state == ALERT_RESOLVED ? "resolved"
                                                         : "update");
    cJSON *labels = cJSON_AddObjectToObject(o, "labels");
    cJSON_AddStringToObject(labels, "alertname", t->rule->name);
    cJSON_AddStringToObject(labels, "run", t->run_name);
    cJSON_AddStringToObject(labels, "severity", t->rule->severity);
    if (t->rule->metric) cJSON_AddStringToObject(labels, "metric", t->rule->metric);
    for (int i = 0; i < t->rule->nlabels; i++)
        cJSON_AddStringToObject(labels, t->rule->labels[i].key, t->rule->labels[i].value);
    cJSON *ann = cJSON_AddObjectToObject(o, "annotations");
    for (int i = 0; i < t->rule->nannotations; i++) {
        char *v = expand(t->rule->annotations[i].value, t);
        cJSON_AddStringToObject(ann, t->rule->annotations[i].key, v ? v : "");
        free(v);
    }
    /* an end that is not a recovery says so, also to Alertmanager (which
     * keeps labels and annotations only) */
    const char *reason = t->state == ALERT_RESOLVED ? alert_reason_name(t->reason) : NULL;
    if (reason) cJSON_AddStringToObject(ann, "reason", reason);
    if (reason) cJSON_AddStringToObject(o, "reason", reason);
    iso8601(t->starts_at, buf, sizeof buf);
    cJSON_AddStringToObject(o, "startsAt", buf);
    iso8601(t->state == ALERT_RESOLVED ? t->ends_at : 0, buf, sizeof buf);
    cJSON_AddStringToObject(o, "endsAt", buf);
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)t->fingerprint);
    cJSON_AddStringToObject(o, "fingerprint", buf);
    cJSON_AddStringToObject(o, "generatorURL", "");
    cJSON_AddNumberToObject(o, "run_id", (double)t->run_id);
    cJSON_AddNumberToObject(o, "step", (double)t->step);
    cJSON_AddNumberToObject(o, "start_step", (double)t->start_step);
    if (isfinite(t->value)) cJSON_AddNumberToObject(o, "value", t->value);
    else cJSON_AddNullToObject(o, "value");
    cJSON_AddNumberToObject(o, "ncells", t->ncells_total);
    cJSON *cells = cJSON_AddArrayToObject(o, "cells");
    for (int i = 0; i < t->ncells; i++) {
        cJSON *c = cJSON_CreateObject();
        if (t->cells[i].layer >= 0) cJSON_AddNumberToObject(c, "layer", t->cells[i].layer);
        if (t->cells[i].head >= 0) cJSON_AddNumberToObject(c, "head", t->cells[i].head);
        if (isfinite(t->cells[i].value)) cJSON_AddNumberToObject(c, "value", t->cells[i].value);
        else cJSON_AddNullToObject(c, "value");
        cJSON_AddItemToArray(cells, c);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
