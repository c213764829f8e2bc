/* upload.c -- uploading the spools other clients left unacknowledged: one
 * run at a time, each through a client of its own made from its
 * hello.json (telemetry_upload_all, and the background uploader a client
 * started on a spool directory runs). */
#include "telemetry_int.h"

#include <cJSON.h>
#include <dirent.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 1 when DIR holds a segment with bytes in it. */
static int dir_has_data(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) {
        if (strncmp(e->d_name, "seg-", 4)) continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, 0) == 0 && st.st_size > 0) found = 1;
    }
    closedir(d);
    return found;
}

static char *read_small_file(const char *path, size_t max) {
    FILE *f = fopen(path, "re");
    if (!f) return NULL;
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max, f) : 0;
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

enum { UP_NOTHING, UP_DONE, UP_LEFT, UP_BUSY };

/* Where an upload's damage notes go: the log (one line each), or the inbox
 * of the client whose background uploader runs it. */
typedef struct note_sink {
    FILE *log;
    telemetry *inbox;
} note_sink;

/* Passes on c's "spool_damage" notes (what else a client says is for its
 * own user: the uploader has none). */
static void pass_notes(telemetry *c, const note_sink *to) {
    telemetry_msg m;
    while (telemetry_poll(c, &m)) {
        if (!strcmp(m.type, "client") && strstr(m.line, "\"spool_damage\"")) {
            if (to->inbox) telemetry_inbox_push(to->inbox, m.line, strlen(m.line));
            if (to->log) {
                cJSON *j = cJSON_Parse(m.line);
                const cJSON *msg = cJSON_GetObjectItemCaseSensitive(j, "message");
                fprintf(to->log, "entropyd upload: damaged: %s\n", cJSON_IsString(msg) ? msg->valuestring : m.line);
                cJSON_Delete(j);
            }
        }
        telemetry_msg_free(&m);
    }
}

/* Uploads ROOT/RUN: a client for that run (its shape and meta from
 * hello.json), waiting until everything is acknowledged, timeout_ms passed
 * or *stop is set; its damage notes go to sink, their number to
 * *damaged. Fills msg with what happened. */
static int upload_run(const char *address, const char *root, const char *run, const char *token, int timeout_ms,
                      atomic_int *stop, const note_sink *sink, uint64_t *damaged, char *msg, size_t msglen) {
    size_t n = strlen(root) + strlen(run) + 16;
    char *dir = malloc(n), *hp = malloc(n);
    char *text = NULL, *meta = NULL;
    cJSON *h = NULL;
    telemetry *c = NULL;
    int rc = UP_LEFT;
    if (!dir || !hp) {
        snprintf(msg, msglen, "run %s: out of memory", run);
        goto out;
    }
    snprintf(dir, n, "%s/%s", root, run);
    snprintf(hp, n, "%s/hello.json", dir);
    if (!dir_has_data(dir)) {
        rc = UP_NOTHING;
        goto out;
    }
    text = read_small_file(hp, (2u << 20));
    h = text ? cJSON_Parse(text) : NULL;
    const cJSON *L = cJSON_GetObjectItemCaseSensitive(h, "layers");
    const cJSON *H = cJSON_GetObjectItemCaseSensitive(h, "heads");
    const cJSON *T = cJSON_GetObjectItemCaseSensitive(h, "seq_len");
    const cJSON *M = cJSON_GetObjectItemCaseSensitive(h, "meta");
    if (!cJSON_IsNumber(L) || !cJSON_IsNumber(H) || !cJSON_IsNumber(T)) {
        snprintf(msg, msglen,
                 "run %s: no readable hello.json (spooled by an older client?); "
                 "upload it with its shape given",
                 run);
        goto out;
    }
    if (cJSON_IsObject(M)) meta = cJSON_PrintUnformatted(M);
    telemetry_config cfg;
    telemetry_config_init(&cfg);
    cfg.address = address;
    cfg.run = run;
    cfg.layers = L->valueint;
    cfg.heads = H->valueint;
    cfg.seq_len = T->valueint;
    cfg.noncausal = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(h, "causal"));
    cfg.meta_json = meta;
    cfg.token = token;
    cfg.spool_dir = root;
    cfg.queue_slots = 16;
    cfg.max_scalars = cfg.max_layer_metrics = cfg.max_head_metrics = 1;
    cfg.no_spool_upload = 1;
    cfg.send_interval_ms = -1; /* a backlog, then its acks: nothing to pace */
    char err[256];
    c = telemetry_create(&cfg, err, sizeof err);
    if (!c) {
        int busy = strstr(err, "in use") != NULL;
        snprintf(msg, msglen, "run %s: %s", run, err);
        rc = busy ? UP_BUSY : UP_LEFT;
        goto out;
    }
    uint64_t end = telemetry_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    while (!telemetry_settled(c) && telemetry_now_ns() < end && !(stop && atomic_load(stop))) {
        pass_notes(c, sink);
        telemetry_sleep_ms(10);
    }
    pass_notes(c, sink);
    telemetry_stats st;
    telemetry_get_stats(c, &st);
    uint64_t dmg = ST_GET(c, st_damaged);
    *damaged += dmg;
    rc = telemetry_settled(c) ? UP_DONE : UP_LEFT;
    if (rc == UP_DONE && dmg)
        snprintf(msg, msglen,
                 "run %s: every intact record uploaded, acknowledged up to seq %llu; "
                 "%llu damaged record(s) skipped (named above)",
                 run, (unsigned long long)st.acked, (unsigned long long)dmg);
    else if (rc == UP_DONE)
        snprintf(msg, msglen, "run %s: spool uploaded, acknowledged up to seq %llu", run, (unsigned long long)st.acked);
    else
        snprintf(msg, msglen, "run %s: not all uploaded (acknowledged %llu of %llu%s)", run,
                 (unsigned long long)st.acked, (unsigned long long)(st.next_seq - 1),
                 st.connects ? "" : ", never connected");
out:
    telemetry_destroy(c, NULL, 0);
    cJSON_Delete(h);
    free(meta);
    free(text);
    free(dir);
    free(hp);
    return rc;
}

/* Calls fn for every subdirectory name of root except skip, in name order. */
static int for_each_run(const char *root, const char *skip, int (*fn)(void *, const char *), void *arg) {
    struct dirent **names = NULL;
    int n = scandir(root, &names, NULL, alphasort);
    if (n < 0) return -1;
    int stop = 0;
    for (int i = 0; i < n; i++) {
        const char *r = names[i]->d_name;
        if (!stop && telemetry_valid_run(r) && strcmp(r, ".") && strcmp(r, "..") && !(skip && !strcmp(r, skip)) &&
            names[i]->d_type == DT_DIR)
            stop = fn(arg, r);
        free(names[i]);
    }
    free(names);
    return 0;
}

static int uploader_one(void *arg, const char *run) {
    telemetry *t = arg;
    char msg[400];
    if (atomic_load(&t->up_stop)) return 1;
    note_sink sink = {NULL, t};
    uint64_t damaged = 0;
    int rc =
        upload_run(t->address, t->root, run, t->token, 24 * 3600 * 1000, &t->up_stop, &sink, &damaged, msg, sizeof msg);
    if (rc == UP_DONE) telemetry_inbox_note(t, "uploaded", "%s", msg);
    else if (rc == UP_LEFT) telemetry_inbox_note(t, "upload_failed", "%s", msg);
    return atomic_load(&t->up_stop);
}

void *telemetry_uploader_main(void *arg) {
    telemetry *t = arg;
    for_each_run(t->root, t->run, uploader_one, t);
    atomic_store(&t->up_done, 1);
    return NULL;
}

typedef struct upload_all_ctx {
    const char *address, *root, *token, *only;
    int timeout_ms;
    FILE *log;
    telemetry_upload_result res;
} upload_all_ctx;

static int upload_all_one(void *arg, const char *run) {
    upload_all_ctx *u = arg;
    char msg[400];
    if (u->only && strcmp(run, u->only)) return 0;
    note_sink sink = {u->log, NULL};
    int rc =
        upload_run(u->address, u->root, run, u->token, u->timeout_ms, NULL, &sink, &u->res.damaged, msg, sizeof msg);
    if (rc == UP_LEFT || rc == UP_BUSY) u->res.runs_left++;
    if (rc == UP_DONE) u->res.runs_uploaded++;
    if (u->log && rc != UP_NOTHING) fprintf(u->log, "entropyd upload: %s\n", msg);
    return 0;
}

int telemetry_upload_spool(const char *address, const char *spool_dir, const char *run, const char *token,
                           int timeout_ms, FILE *log, telemetry_upload_result *out, char *err, size_t errlen) {
    if (out) memset(out, 0, sizeof *out);
    if (!address || !spool_dir) {
        telemetry_set_err(err, errlen, "uploading needs an address and a spool directory");
        return -1;
    }
    upload_all_ctx u = {address, spool_dir, token, run, timeout_ms, log, {0, 0, 0}};
    if (for_each_run(spool_dir, NULL, upload_all_one, &u)) {
        telemetry_set_err(err, errlen, "spool %s: %s", spool_dir, strerror(errno));
        return -1;
    }
    if (out) *out = u.res;
    return u.res.runs_left;
}

int telemetry_upload_all(const char *address, const char *spool_dir, const char *token, int timeout_ms, FILE *log,
                         char *err, size_t errlen) {
    return telemetry_upload_spool(address, spool_dir, NULL, token, timeout_ms, log, NULL, err, errlen);
}
