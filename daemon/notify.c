/* notify.c: the notifier thread. See notify.h. */
#include "notify.h"
#include "now.h"

#include <cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct note {
    int resumed;             /* a firing an earlier daemon already paged: Alertmanager only */
    char *status, *alertname, *run;
    char *body;              /* the webhook payload */
    char *alert;             /* the alert object (for Alertmanager) */
    struct note *next;
};

/* A firing alert as Alertmanager's API takes it, kept for re-sending. */
struct am_alert {
    char fp[40];
    cJSON *obj;              /* {labels, annotations, startsAt[, generatorURL]} */
    struct am_alert *next;
};

struct notify {
    struct notify_config cfg;
    char *webhook, *exec_cmd;
    char external[512];      /* the daemon's URL (guarded by mu: set once HTTP listens) */
    int am_failing;          /* the last POST of the firing set failed (logged once per streak) */
    double log_window;       /* log lines: start (mono s) of the current window, notifier thread only */
    uint64_t log_n, log_suppressed;
    char *am;                /* Alertmanager's .../api/v2/alerts, or NULL */
    struct am_alert *firing; /* notifier thread only */
    double am_next;          /* next re-send (mono) */
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct note *head, *tail;
    int len, stop;
    double stop_deadline;
    struct notify_stats stats;
};

static void note_free(struct note *n) {
    if (!n) return;
    free(n->status);
    free(n->alertname);
    free(n->run);
    free(n->body);
    free(n->alert);
    free(n);
}

static size_t discard(char *p, size_t s, size_t n, void *u) {
    (void)p;
    (void)u;
    return s * n;
}

/* Returns 0 delivered, 1 retry later, -1 give up. */
static int post_once(struct notify *n, const char *url, const char *body, long *status) {
    CURL *c = curl_easy_init();
    if (!c) return 1;
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)n->cfg.timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "entropyd");
    CURLcode rc = curl_easy_perform(c);
    *status = 0;
    if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK) return 1;
    if (*status >= 200 && *status < 300) return 0;
    if (*status >= 500 || *status == 429) return 1;
    return -1;
}

static void run_exec(struct notify *n, const struct note *nt) {
    int pipefd[2] = {-1, -1};
    pid_t pid = -1;
    if (pipe2(pipefd, O_CLOEXEC) < 0 || (pid = fork()) < 0) {
        if (pid < 0 && pipefd[0] >= 0) {
            close(pipefd[0]);
            close(pipefd[1]);
        }
        pthread_mutex_lock(&n->mu);
        n->stats.exec_failed++;
        pthread_mutex_unlock(&n->mu);
        return;
    }
    if (pid == 0) {
        dup2(pipefd[0], 0);
        setenv("ENTROPYD_ALERT_STATUS", nt->status, 1);
        setenv("ENTROPYD_ALERT_NAME", nt->alertname, 1);
        setenv("ENTROPYD_ALERT_RUN", nt->run, 1);
        execl("/bin/sh", "sh", "-c", n->exec_cmd, (char *)NULL);
        _exit(127);
    }
    close(pipefd[0]);
    size_t len = strlen(nt->body), off = 0;
    signal(SIGPIPE, SIG_IGN);
    while (off < len) {
        ssize_t w = write(pipefd[1], nt->body + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    close(pipefd[1]);
    int status = 0;
    double deadline = (now_mono_ms() / 1e3) + 10;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) break;
        if ((now_mono_ms() / 1e3) > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fprintf(stderr, "entropyd: --on-alert command killed after 10 s\n");
            break;
        }
        usleep(10000);
    }
    pthread_mutex_lock(&n->mu);
    n->stats.exec_runs++;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) n->stats.exec_failed++;
    pthread_mutex_unlock(&n->mu);
}

/* POSTs body to url with retries (webhook: am == 0; Alertmanager: am == 1,
 * counted apart). */
static void post_retry(struct notify *n, const char *url, const char *body, int am, const struct note *nt) {
    int delay = n->cfg.backoff_ms;
    for (int attempt = 1;; attempt++) {
        long code;
        int r = post_once(n, url, body, &code);
        pthread_mutex_lock(&n->mu);
        if (am) {
            if (r == 0) n->stats.am_sent++;
            else if (r < 0 || attempt >= n->cfg.retries) n->stats.am_failed++;
        } else {
            if (r == 0) n->stats.sent++;
            else if (r < 0 || attempt >= n->cfg.retries) n->stats.failed++;
        }
        if (r > 0 && attempt < n->cfg.retries) n->stats.retries++;
        int stopping = n->stop && (now_mono_ms() / 1e3) > n->stop_deadline;
        pthread_mutex_unlock(&n->mu);
        if (r == 0) return;
        if (r < 0 || attempt >= n->cfg.retries || stopping) {
            fprintf(stderr, "entropyd: %s %s gave up on %s %s after %d attempt(s) (last HTTP status %ld)\n",
                    am ? "alertmanager" : "webhook", url, nt->alertname, nt->status, attempt, code);
            return;
        }
        /* sleep, but wake for shutdown */
        pthread_mutex_lock(&n->mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += delay / 1000;
        ts.tv_nsec += (long)(delay % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        if (!n->stop) pthread_cond_timedwait(&n->cv, &n->mu, &ts);
        pthread_mutex_unlock(&n->mu);
        if (delay < 30000) delay *= 2;
    }
}

static void rfc3339(double unix_s, char *buf, size_t len) {
    time_t t = (time_t)unix_s;
    struct tm tm;
    gmtime_r(&t, &tm);
    size_t k = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + k, len - k, ".%03dZ", (int)((unix_s - (double)t) * 1000.0));
}

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

void notify_set_external_url(struct notify *n, const char *url) {
    pthread_mutex_lock(&n->mu);
    snprintf(n->external, sizeof n->external, "%s", url ? url : "");
    pthread_mutex_unlock(&n->mu);
}

/* The daemon's URL (externalURL) into buf, "" when unknown. */
static void external_url(struct notify *n, char *buf, size_t len) {
    pthread_mutex_lock(&n->mu);
    snprintf(buf, len, "%s", n->external);
    pthread_mutex_unlock(&n->mu);
}

/* Sets the alert object's generatorURL to the dashboard's page of its run
 * (EXTERNAL/?run=ID), when the daemon's URL is known. */
static void add_generator_url(struct notify *n, cJSON *alert) {
    char ext[512], url[600];
    external_url(n, ext, sizeof ext);
    if (!ext[0]) return;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(alert, "run_id");
    if (cJSON_IsNumber(id)) snprintf(url, sizeof url, "%s/?run=%lld", ext, (long long)id->valuedouble);
    else snprintf(url, sizeof url, "%s", ext);
    cJSON_DeleteItemFromObjectCaseSensitive(alert, "generatorURL");
    cJSON_AddStringToObject(alert, "generatorURL", url);
}

/* One Alertmanager API alert from our alert object; *fp gets its fingerprint. */
static cJSON *am_object(struct notify *n, const char *alert_json, char *fp, size_t fplen) {
    cJSON *a = cJSON_Parse(alert_json);
    if (!a) return NULL;
    add_generator_url(n, a);
    cJSON *o = cJSON_CreateObject();
    static const char *const keys[] = {"labels", "annotations", "startsAt"};
    for (int i = 0; i < 3; i++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(a, keys[i]);
        if (v) cJSON_AddItemToObject(o, keys[i], cJSON_Duplicate(v, 1));
    }
    const char *gen = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(a, "generatorURL"));
    if (gen && *gen) cJSON_AddStringToObject(o, "generatorURL", gen); /* unknown without HTTP */
    const char *f = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(a, "fingerprint"));
    snprintf(fp, fplen, "%s", f ? f : "");
    cJSON *ends = cJSON_GetObjectItemCaseSensitive(a, "endsAt");
    const char *st = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(a, "status"));
    if (st && !strcmp(st, "resolved") && cJSON_IsString(ends))
        cJSON_AddStringToObject(o, "endsAt", ends->valuestring);
    cJSON_Delete(a);
    return o;
}

/* POSTs the firing set (endsAt = now + 4 resend periods), once, no retry:
 * the next re-send is the retry. */
static void am_resend(struct notify *n) {
    n->am_next = (now_mono_ms() / 1e3) + n->cfg.am_resend_s;
    if (!n->firing) return;
    char ends[40];
    rfc3339(wall() + 4.0 * n->cfg.am_resend_s, ends, sizeof ends);
    cJSON *arr = cJSON_CreateArray();
    for (struct am_alert *x = n->firing; x; x = x->next) {
        cJSON *o = cJSON_Duplicate(x->obj, 1);
        cJSON_AddStringToObject(o, "endsAt", ends);
        cJSON_AddItemToArray(arr, o);
    }
    char *body = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    long code = 0;
    int r = body ? post_once(n, n->am, body, &code) : 1;
    free(body);
    pthread_mutex_lock(&n->mu);
    if (r == 0) n->stats.am_sent++;
    else n->stats.am_failed++;
    pthread_mutex_unlock(&n->mu);
    /* a refused firing set is a page that never came: logged when the
     * failures begin and when they end, counted on /metrics between */
    if (r != 0 && !n->am_failing)
        fprintf(stderr, "entropyd: alertmanager %s refused the firing alerts (HTTP status %ld); retried every %d s, "
                        "failures counted in entropyd_notifications_failed_total{sink=\"alertmanager\"}\n",
                n->am, code, n->cfg.am_resend_s);
    else if (r == 0 && n->am_failing)
        fprintf(stderr, "entropyd: alertmanager %s takes the firing alerts again\n", n->am);
    n->am_failing = r != 0;
}

/* The firing set's size on /metrics: the set is the notifier thread's
 * own, its count is read by others. */
static void am_count(struct notify *n, int d) {
    pthread_mutex_lock(&n->mu);
    n->stats.am_firing += (uint64_t)(int64_t)d;
    pthread_mutex_unlock(&n->mu);
}

/* Firing: joins the firing set, which is sent at once; resolved: leaves
 * it and is sent with its endsAt (retried). */
static void am_deliver(struct notify *n, struct note *nt) {
    char fp[40];
    cJSON *o = am_object(n, nt->alert, fp, sizeof fp);
    if (!o) return;
    struct am_alert **pp = &n->firing;
    while (*pp && strcmp((*pp)->fp, fp)) pp = &(*pp)->next;
    if (*pp) { /* leaves the set (re-added below if firing again) */
        struct am_alert *x = *pp;
        *pp = x->next;
        cJSON_Delete(x->obj);
        free(x);
        am_count(n, -1);
    }
    if (!strcmp(nt->status, "firing")) {
        struct am_alert *x = calloc(1, sizeof *x);
        if (!x) { cJSON_Delete(o); return; }
        snprintf(x->fp, sizeof x->fp, "%s", fp);
        x->obj = o;
        x->next = n->firing;
        n->firing = x;
        am_count(n, +1);
        am_resend(n);
        return;
    }
    cJSON *arr = cJSON_CreateArray();
    cJSON_AddItemToArray(arr, o);
    char *body = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    if (body) post_retry(n, n->am, body, 1, nt);
    free(body);
}

/* The log sink, at most NOTIFY_LOG_BURST lines per NOTIFY_LOG_WINDOW_S: a
 * loss flapping between NaN and a number fires and resolves at every step
 * (20,000 lines in a run before); the lines held back are counted in one
 * line when the next window opens, and every transition is in /api/alerts. */
#define NOTIFY_LOG_BURST 20
#define NOTIFY_LOG_WINDOW_S 10.0
static void log_note(struct notify *n, const struct note *nt) {
    double now = now_mono_ms() / 1e3;
    if (now - n->log_window >= NOTIFY_LOG_WINDOW_S) {
        if (n->log_suppressed)
            fprintf(stderr, "entropyd: %llu more alert notification(s) in %.0f s not logged (GET /api/alerts has them)\n",
                    (unsigned long long)n->log_suppressed, NOTIFY_LOG_WINDOW_S);
        n->log_window = now;
        n->log_n = n->log_suppressed = 0;
    }
    if (n->log_n++ >= NOTIFY_LOG_BURST) {
        n->log_suppressed++;
        return;
    }
    fprintf(stderr, "entropyd: alert %s%s: %s run=%s\n", nt->status,
            nt->resumed ? " (goes on from before the restart: not sent again)" : "", nt->alertname, nt->run);
}

static void deliver(struct notify *n, struct note *nt) {
    if (n->cfg.log) log_note(n, nt);
    /* Alertmanager deduplicates by labels and wants the firing set re-sent;
     * a webhook or a hook would page twice */
    if (n->am) am_deliver(n, nt);
    if (nt->resumed) return;
    if (n->exec_cmd) run_exec(n, nt);
    if (n->webhook) post_retry(n, n->webhook, nt->body, 0, nt);
}

static void *notify_main(void *arg) {
    struct notify *n = arg;
    for (;;) {
        pthread_mutex_lock(&n->mu);
        while (!n->head && !n->stop) {
            if (!n->firing) {
                pthread_cond_wait(&n->cv, &n->mu);
                continue;
            }
            if ((now_mono_ms() / 1e3) >= n->am_next) break; /* time to re-send the firing set */
            double wait_s = n->am_next - (now_mono_ms() / 1e3);
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += (time_t)wait_s;
            ts.tv_nsec += (long)((wait_s - (double)(time_t)wait_s) * 1e9);
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&n->cv, &n->mu, &ts);
        }
        if (!n->head && !n->stop) { /* re-send time */
            pthread_mutex_unlock(&n->mu);
            am_resend(n);
            continue;
        }
        if (!n->head || (n->stop && (now_mono_ms() / 1e3) > n->stop_deadline)) {
            pthread_mutex_unlock(&n->mu);
            break;
        }
        struct note *nt = n->head;
        n->head = nt->next;
        if (!n->head) n->tail = NULL;
        n->len--;
        pthread_mutex_unlock(&n->mu);
        deliver(n, nt);
        note_free(nt);
    }
    return NULL;
}

static char *dupstr(const char *s) {
    return s ? strdup(s) : NULL;
}

struct notify *notify_create(const struct notify_config *cfg, char *err, size_t errlen) {
    struct notify *n = calloc(1, sizeof *n);
    if (!n) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    n->cfg = *cfg;
    if (n->cfg.max_queue <= 0) n->cfg.max_queue = 1000;
    if (n->cfg.retries <= 0) n->cfg.retries = 6;
    if (n->cfg.timeout_ms <= 0) n->cfg.timeout_ms = 5000;
    if (n->cfg.backoff_ms <= 0) n->cfg.backoff_ms = 500;
    n->webhook = dupstr(cfg->webhook_url);
    n->exec_cmd = dupstr(cfg->exec_cmd);
    snprintf(n->external, sizeof n->external, "%s", cfg->external_url ? cfg->external_url : "");
    if (n->cfg.am_resend_s <= 0) n->cfg.am_resend_s = 60;
    if (cfg->alertmanager_url) {
        size_t k = strlen(cfg->alertmanager_url);
        while (k > 0 && cfg->alertmanager_url[k - 1] == '/') k--;
        if (asprintf(&n->am, "%.*s/api/v2/alerts", (int)k, cfg->alertmanager_url) < 0) n->am = NULL;
    }
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    if (cfg->alertmanager_url && (!n->am || (strncmp(n->am, "http://", 7) && strncmp(n->am, "https://", 8)))) {
        snprintf(err, errlen, "--alertmanager wants an http:// or https:// URL, got \"%s\"", cfg->alertmanager_url);
        notify_destroy(n, 0);
        return NULL;
    }
    if (n->webhook && strncmp(n->webhook, "http://", 7) && strncmp(n->webhook, "https://", 8)) {
        snprintf(err, errlen, "--webhook wants an http:// or https:// URL, got \"%s\"", n->webhook);
        notify_destroy(n, 0);
        return NULL;
    }
    int rc = pthread_create(&n->th, NULL, notify_main, n);
    if (rc) {
        snprintf(err, errlen, "cannot start notifier thread: %s", strerror(rc));
        notify_destroy(n, 0);
        return NULL;
    }
    n->started = 1;
    return n;
}

void notify_destroy(struct notify *n, int wait_ms) {
    if (!n) return;
    if (n->started) {
        pthread_mutex_lock(&n->mu);
        n->stop = 1;
        n->stop_deadline = (now_mono_ms() / 1e3) + wait_ms / 1000.0;
        pthread_cond_broadcast(&n->cv);
        pthread_mutex_unlock(&n->mu);
        pthread_join(n->th, NULL);
    }
    while (n->head) {
        struct note *x = n->head->next;
        note_free(n->head);
        n->stats.dropped++;
        n->head = x;
    }
    pthread_cond_destroy(&n->cv);
    pthread_mutex_destroy(&n->mu);
    while (n->firing) {
        struct am_alert *x = n->firing->next;
        cJSON_Delete(n->firing->obj);
        free(n->firing);
        n->firing = x;
    }
    free(n->webhook);
    free(n->exec_cmd);
    free(n->am);
    free(n);
}

/* The Alertmanager webhook payload for one alert group. */
static char *payload(struct notify *n, const char *status, const char *alertname, const char *run, const char *alert_json) {
    cJSON *alert = cJSON_Parse(alert_json);
    if (!alert) return NULL;
    cJSON *o = cJSON_CreateObject();
    char key[600];
    snprintf(key, sizeof key, "{}:{alertname=\"%.250s\", run=\"%.250s\"}", alertname, run);
    cJSON_AddStringToObject(o, "version", "4");
    cJSON_AddStringToObject(o, "groupKey", key);
    cJSON_AddNumberToObject(o, "truncatedAlerts", 0);
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddStringToObject(o, "receiver", "entropyd");
    cJSON *gl = cJSON_AddObjectToObject(o, "groupLabels");
    cJSON_AddStringToObject(gl, "alertname", alertname);
    cJSON_AddStringToObject(gl, "run", run);
    cJSON *labels = cJSON_GetObjectItemCaseSensitive(alert, "labels");
    cJSON *ann = cJSON_GetObjectItemCaseSensitive(alert, "annotations");
    cJSON_AddItemToObject(o, "commonLabels", labels ? cJSON_Duplicate(labels, 1) : cJSON_CreateObject());
    cJSON_AddItemToObject(o, "commonAnnotations", ann ? cJSON_Duplicate(ann, 1) : cJSON_CreateObject());
    char ext[512];
    external_url(n, ext, sizeof ext);
    cJSON_AddStringToObject(o, "externalURL", ext);
    add_generator_url(n, alert);
    cJSON *arr = cJSON_AddArrayToObject(o, "alerts");
    cJSON_AddItemToArray(arr, alert);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

int notify_post(struct notify *n, const char *status, const char *alertname, const char *run, const char *alert_json,
                int resumed) {
    struct note *nt = calloc(1, sizeof *nt);
    if (!nt) return -1;
    nt->resumed = resumed;
    nt->status = dupstr(status);
    nt->alertname = dupstr(alertname);
    nt->run = dupstr(run);
    nt->body = payload(n, status, alertname, run, alert_json);
    nt->alert = dupstr(alert_json);
    if (!nt->status || !nt->alertname || !nt->run || !nt->body || !nt->alert) {
        note_free(nt);
        return -1;
    }
    pthread_mutex_lock(&n->mu);
    if (n->len >= n->cfg.max_queue) {
        struct note *old = n->head;
        n->head = old->next;
        if (!n->head) n->tail = NULL;
        n->len--;
        n->stats.dropped++;
        note_free(old);
    }
    if (n->tail) n->tail->next = nt;
    else n->head = nt;
    n->tail = nt;
    n->len++;
    n->stats.queued++;
    pthread_cond_signal(&n->cv);
    pthread_mutex_unlock(&n->mu);
    return 0;
}

void notify_get_stats(struct notify *n, struct notify_stats *out) {
    pthread_mutex_lock(&n->mu);
    *out = n->stats;
    pthread_mutex_unlock(&n->mu);
}
