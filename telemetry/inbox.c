/* inbox.c -- the lines telemetry_poll hands to the caller: the daemon's
 * (welcome, error, alert) and the client's own notes.  Two producers (the
 * sender, the uploader) under in_lock; the consumer is lock-free. */
#include "telemetry_int.h"

#include <cJSON.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void inbox_push_locked(telemetry *t, const char *line, size_t len) {
    size_t h = atomic_load_explicit(&t->in_head, memory_order_relaxed);
    size_t tl = atomic_load_explicit(&t->in_tail, memory_order_acquire);
    if (h - tl >= INBOX_CAP) {
        ST_ADD(t, st_inbox_dropped, 1);
        return;
    }
    telemetry_msg *m = &t->inbox[h % INBOX_CAP];
    m->line = malloc(len + 1);
    if (!m->line) {
        ST_ADD(t, st_inbox_dropped, 1);
        return;
    }
    memcpy(m->line, line, len);
    m->line[len] = 0;
    m->type[0] = 0;
    cJSON *j = cJSON_ParseWithLength(line, len);
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (cJSON_IsString(ty)) snprintf(m->type, sizeof m->type, "%s", ty->valuestring);
    cJSON_Delete(j);
    atomic_store_explicit(&t->in_head, h + 1, memory_order_release);
}

/* Two producers (sender, uploader): the lock is theirs only; the consumer
 * (telemetry_poll) stays lock-free. */
void telemetry_inbox_push(telemetry *t, const char *line, size_t len) {
    pthread_mutex_lock(&t->in_lock);
    inbox_push_locked(t, line, len);
    pthread_mutex_unlock(&t->in_lock);
}

/* A message from the client itself, e.g. when the spool cannot serve the
 * daemon's last_seq. Same shape as a daemon error, type "client". */
void telemetry_inbox_note(telemetry *t, const char *code, const char *fmt, ...) {
    char msg[256], line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int n = snprintf(line, sizeof line, "{\"type\":\"client\",\"code\":\"%s\",\"message\":\"%s\"}", code, msg);
    telemetry_inbox_push(t, line, (size_t)n);
}

int telemetry_poll(telemetry *t, telemetry_msg *out) {
    size_t tl = atomic_load_explicit(&t->in_tail, memory_order_relaxed);
    size_t h = atomic_load_explicit(&t->in_head, memory_order_acquire);
    if (tl == h) return 0;
    *out = t->inbox[tl % INBOX_CAP];
    atomic_store_explicit(&t->in_tail, tl + 1, memory_order_release);
    return 1;
}

void telemetry_msg_free(telemetry_msg *m) {
    if (!m) return;
    free(m->line);
    m->line = NULL;
}
