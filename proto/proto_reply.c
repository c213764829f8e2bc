/* proto_reply.c: the parser of what the daemon sends a trainer (welcome,
 * ack, error, alert; schema/protocol.md "Daemon to trainer"), and of an
 * alert line's fields on their own (proto_parse_alert). These lines
 * are rare and small (an ack per commit), so cJSON does: the hot direction,
 * trainer -> daemon, has its own reader (proto_parse.c).
 *
 * Not here: acting on them (the client's sender thread does). */
#include "proto.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static int get_u64(const cJSON *o, const char *k, uint64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || !(v->valuedouble < 18446744073709551616.0)) return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

static int get_i64(const cJSON *o, const char *k, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || fabs(v->valuedouble) > 9.2e18) return 0;
    *out = (int64_t)v->valuedouble;
    return 1;
}

static void get_str(const cJSON *o, const char *k, char *out, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    snprintf(out, cap, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

/* The fields of the alert object j; 0 when a required one is missing. */
static int alert_fields(const cJSON *j, struct proto_alert *a) {
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(j, "transition");
    const cJSON *rule = cJSON_GetObjectItemCaseSensitive(j, "rule");
    if (!cJSON_IsString(tr) || !cJSON_IsString(rule)) return 0;
    if (!get_i64(j, "start_step", &a->start_step) || !get_i64(j, "step", &a->step)) return 0;
    snprintf(a->transition, sizeof a->transition, "%s", tr->valuestring);
    snprintf(a->rule, sizeof a->rule, "%s", rule->valuestring);
    get_str(j, "severity", a->severity, sizeof a->severity);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step_time");
    if (cJSON_IsNumber(st)) {
        a->has_step_time = 1;
        a->step_time = st->valuedouble;
    }
    return 1;
}

int proto_parse_alert(const char *line, size_t len, struct proto_alert *a) {
    memset(a, 0, sizeof *a);
    cJSON *j = cJSON_ParseWithLength(line, len);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    int ok = cJSON_IsObject(j) && cJSON_IsString(t) && !strcmp(t->valuestring, "alert") && alert_fields(j, a);
    cJSON_Delete(j);
    if (!ok) memset(a, 0, sizeof *a);
    return ok ? 0 : -1;
}

int proto_parse_reply(const char *line, size_t len, struct proto_reply *r) {
    memset(r, 0, sizeof *r);
    r->code = -1;
    cJSON *j = cJSON_ParseWithLength(line, len);
    int rc = -1;
    if (!cJSON_IsObject(j)) goto out;
    get_str(j, "type", r->type_name, sizeof r->type_name);
    const char *t = r->type_name;
    if (!strcmp(t, "welcome")) {
        if (!get_u64(j, "last_seq", &r->last_seq)) goto out;
        get_i64(j, "run_id", &r->run_id);
        r->type = PROTO_R_WELCOME;
    } else if (!strcmp(t, "ack")) {
        if (!get_u64(j, "seq", &r->seq)) goto out;
        r->has_seq = 1;
        r->type = PROTO_R_ACK;
    } else if (!strcmp(t, "error")) {
        get_str(j, "code", r->code_name, sizeof r->code_name);
        for (int c = 1; c < PROTO_E_COUNT; c++)
            if (!strcmp(r->code_name, proto_err_name(c))) r->code = c;
        get_str(j, "message", r->message, sizeof r->message);
        r->has_seq = get_u64(j, "seq", &r->seq);
        r->type = PROTO_R_ERROR;
    } else if (!strcmp(t, "alert")) {
        if (!alert_fields(j, &r->alert)) goto out;
        r->type = PROTO_R_ALERT;
    }
    rc = 0;
out:
    if (rc) r->type = PROTO_R_UNKNOWN;
    cJSON_Delete(j);
    return rc;
}
