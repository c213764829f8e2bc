/* notify.c: the receivers' worker threads and the Alertmanager set. See
 * notify.h.
 *
 * One mutex (mu) guards every queue, the Alertmanager set and the
 * counters; each receiver waits on a condition variable of its own. A
 * worker never holds mu across a request or a child process. */
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

/* A notification for the webhook or the exec hook. */
struct note {
    char *status, *alertname, *run;
    char *body; /* the webhook payload */
    struct note *next;
};

/* A queued receiver: the webhook or the exec hook. */
struct queue {
    struct notify *n;
    void (*deliver)(struct queue *q, const struct note *nt);
    pthread_t th;
    int started;
    pthread_cond_t cv;
    struct note *head, *tail;
    int len;
    struct notify_sink_stats st;
};

/* An alert in Alertmanager's set, keyed by fingerprint. */
struct am_alert {
    char fp[40];
    cJSON *obj;   /* {labels, annotations, startsAt[, generatorURL][, endsAt when resolved]} */
    int resolved; /* 1: sent with its endsAt until a POST carrying it succeeds, then forgotten */
    uint64_t gen; /* am_gen when it last changed */
    struct am_alert *next;
};

struct notify {
    struct notify_config cfg;
    char *webhook, *exec_cmd;
    char *am; /* Alertmanager's .../api/v2/alerts, or NULL */
    pthread_mutex_t mu;
    int stop;
    double stop_deadline; /* mono s: after it, workers give up what they hold */
    char external[512];   /* the daemon's URL (set once HTTP listens) */
    double log_window;    /* log lines: start (mono s) of the current window */
    uint64_t log_n, log_suppressed;
    uint64_t queued; /* transitions posted */
    struct queue hook, exec;
    /* Alertmanager: the set and its worker */
    struct am_alert *am_set;
    uint64_t am_gen;      /* bumped by every change of the set */
    uint64_t am_sent_gen; /* the generation the last successful POST carried */
    int am_nresolved, am_failing;
    double am_next;      /* mono s: next POST (a re-send, or a retry after a failure) */
    double am_last_post; /* mono s: when the last POST began */
    int am_delay_ms;     /* the next retry's backoff */
    pthread_t am_th;
    int am_started;
    pthread_cond_t am_cv;
    struct notify_sink_stats am_st;
    uint64_t am_firing;
};

static double mono_s(void) { return now_mono_ms() / 1e3; }

/* Waits on cv (with n->mu held) until mono time `until` or a signal. */
static void wait_until(struct notify *n, pthread_cond_t *cv, double until) {
    double wait_s = until - mono_s();
    if (wait_s <= 0) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)wait_s;
    ts.tv_nsec += (long)((wait_s - (double)(time_t)wait_s) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, &n->mu, &ts);
}

/* With n->mu held: 1 once shutdown's grace has run out. */
static int past_deadline(const struct notify *n) { return n->stop && mono_s() > n->stop_deadline; }

static void note_free(struct note *nt) {
    if (!nt) return;
    free(nt->status);
    free(nt->alertname);
    free(nt->run);
    free(nt->body);
    free(nt);
}

static size_t discard(char *p, size_t s, size_t n, void *u) {
    (void)p;
    (void)u;
    return s * n;
}

/* One POST. Its timeout is cfg.timeout_ms, cut during shutdown to what is
 * left of the grace (at least 100 ms). Returns 0 delivered, 1 retry later,
 * -1 give up (a 4xx other than 429); *status gets the HTTP status, 0 when
 * there was no answer. */
static int post_once(struct notify *n, const char *url, const char *body, long *status) {
    long timeout = n->cfg.timeout_ms;
    pthread_mutex_lock(&n->mu);
    if (n->stop) {
        long left = (long)((n->stop_deadline - mono_s()) * 1e3);
        if (left < timeout) timeout = left < 100 ? 100 : left;
    }
    pthread_mutex_unlock(&n->mu);
    *status = 0;
    CURL *c = curl_easy_init();
    if (!c) return 1;
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "entropyd");
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK) return 1;
    if (*status >= 200 && *status < 300) return 0;
    if (*status >= 500 || *status == 429) return 1;
    return -1;
}

/* Runs the exec hook on one note. Returns 0 when it exited 0, -1 otherwise. */
static int run_exec(struct notify *n, const struct note *nt) {
    int pipefd[2] = {-1, -1};
    pid_t pid = -1;
    if (pipe2(pipefd, O_CLOEXEC) < 0 || (pid = fork()) < 0) {
        if (pid < 0 && pipefd[0] >= 0) {
            close(pipefd[0]);
            close(pipefd[1]);
        }
        return -1;
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
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
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
    if (st && !strcmp(st, "resolved") && cJSON_IsString(ends)) cJSON_AddStringToObject(o, "endsAt", ends->valuestring);
    cJSON_Delete(a);
    return o;
}


/* The webhook's delivery: POSTs with retries, backing off between them.
 * Shutdown ends the backoff and the retries: each note left gets one
 * attempt within the grace. */
static void webhook_deliver(struct queue *q, const struct note *nt) {
    struct notify *n = q->n;
    int delay = n->cfg.backoff_ms;
    for (int attempt = 1;; attempt++) {
        long code;
        int r = post_once(n, n->webhook, nt->body, &code);
        pthread_mutex_lock(&n->mu);
        int last = r <= 0 || attempt >= n->cfg.retries || n->stop;
        if (r == 0) q->st.sent++;
        else if (last) q->st.failed++;
        else q->st.retries++;
        double until = mono_s() + delay / 1e3;
        while (!last && !n->stop && mono_s() < until) wait_until(n, &q->cv, until); /* new notes signal cv too */
        pthread_mutex_unlock(&n->mu);
        if (r == 0) return;
        if (last) {
            fprintf(stderr, "entropyd: webhook %s gave up on %s %s after %d attempt(s) (last HTTP status %ld)\n",
                    n->webhook, nt->alertname, nt->status, attempt, code);
            return;
        }
        if (delay < 30000) delay *= 2;
    }
}

static void exec_deliver(struct queue *q, const struct note *nt) {
    int r = run_exec(q->n, nt);
    pthread_mutex_lock(&q->n->mu);
    if (r == 0) q->st.sent++;
    else q->st.failed++;
    pthread_mutex_unlock(&q->n->mu);
}

/* A queued receiver's thread: delivers its notes in order until shutdown
 * and an empty queue, or shutdown's grace running out. */
static void *queue_main(void *arg) {
    struct queue *q = arg;
    struct notify *n = q->n;
    pthread_mutex_lock(&n->mu);
    for (;;) {
        while (!q->head && !n->stop) pthread_cond_wait(&q->cv, &n->mu);
        if (!q->head || past_deadline(n)) break;
        struct note *nt = q->head;
        q->head = nt->next;
        if (!q->head) q->tail = NULL;
        q->len--;
        pthread_mutex_unlock(&n->mu);
        q->deliver(q, nt);
        note_free(nt);
        pthread_mutex_lock(&n->mu);
    }
    pthread_mutex_unlock(&n->mu);
    return NULL;
}

/* With n->mu held: appends nt (taken), dropping the oldest note when the
 * queue is full. */
static void queue_push(struct queue *q, struct note *nt) {
    if (q->len >= q->n->cfg.max_queue) {
        struct note *old = q->head;
        q->head = old->next;
        if (!q->head) q->tail = NULL;
        q->len--;
        q->st.dropped++;
        note_free(old);
    }
    if (q->tail) q->tail->next = nt;
    else q->head = nt;
    q->tail = nt;
    q->len++;
    q->st.queued++;
    pthread_cond_signal(&q->cv);
}

static int queue_start(struct queue *q, struct notify *n, void (*deliver)(struct queue *, const struct note *)) {
    q->n = n;
    q->deliver = deliver;
    if (pthread_create(&q->th, NULL, queue_main, q)) return -1;
    q->started = 1;
    return 0;
}

/* Joins the thread (after stop was set) and drops what it left. */
static void queue_finish(struct queue *q) {
    if (q->started) pthread_join(q->th, NULL);
    q->started = 0;
    while (q->head) {
        struct note *x = q->head->next;
        note_free(q->head);
        q->st.dropped++;
        q->head = x;
    }
    q->tail = NULL;
    q->len = 0;
}

/* The least time between two POSTs of a changing set (s): a flapping rule
 * changes it at every step. */
#define AM_MIN_GAP_S 0.2

/* With n->mu held: the link to the set's entry of fingerprint fp (*link
 * is NULL when there is none: the end of the list, where one is added). */
static struct am_alert **am_find(struct notify *n, const char *fp) {
    struct am_alert **pp = &n->am_set;
    while (*pp && strcmp((*pp)->fp, fp)) pp = &(*pp)->next;
    return pp;
}

static void am_unlink(struct notify *n, struct am_alert **pp) {
    struct am_alert *x = *pp;
    *pp = x->next;
    if (x->resolved) n->am_nresolved--;
    else n->am_firing--;
    cJSON_Delete(x->obj);
    free(x);
}

/* With n->mu held: the transition into the set (o taken). Firing: the
 * alert is (again) in the firing set; resolved: it stays, with its endsAt,
 * until delivered. Past max_queue undelivered resolved alerts, the oldest
 * is forgotten and counted. */
static void am_update(struct notify *n, const char *fp, cJSON *o, int resolved) {
    struct am_alert **pp = am_find(n, fp);
    struct am_alert *x = *pp;
    if (x) {
        if (x->resolved) n->am_nresolved--;
        else n->am_firing--;
        cJSON_Delete(x->obj);
    } else {
        x = calloc(1, sizeof *x);
        if (!x) {
            cJSON_Delete(o);
            n->am_st.dropped++;
            return;
        }
        snprintf(x->fp, sizeof x->fp, "%s", fp);
        *pp = x; /* appended: the set stays in order of first appearance */
    }
    x->obj = o;
    x->resolved = resolved;
    x->gen = ++n->am_gen;
    if (resolved) n->am_nresolved++;
    else n->am_firing++;
    n->am_st.queued++;
    while (n->am_nresolved > n->cfg.max_queue) {
        struct am_alert **oldest = &n->am_set;
        while (!(*oldest)->resolved) oldest = &(*oldest)->next;
        am_unlink(n, oldest);
        n->am_st.dropped++;
    }
    double soon = n->am_last_post + AM_MIN_GAP_S;
    if (n->am_next > soon) n->am_next = soon; /* send now, or AM_MIN_GAP_S after the last POST */
    pthread_cond_signal(&n->am_cv);
}

/* With n->mu held: the POST body for the whole set (firing alerts with
 * endsAt = now + 4 re-send periods, resolved ones with their own), or NULL
 * when the set is empty or out of memory. */
static char *am_body(struct notify *n) {
    if (!n->am_set) return NULL;
    char ends[40];
    rfc3339(wall() + 4.0 * n->cfg.am_resend_s, ends, sizeof ends);
    cJSON *arr = cJSON_CreateArray();
    for (struct am_alert *x = n->am_set; arr && x; x = x->next) {
        cJSON *o = cJSON_Duplicate(x->obj, 1);
        if (!o) continue;
        if (!x->resolved) cJSON_AddStringToObject(o, "endsAt", ends);
        cJSON_AddItemToArray(arr, o);
    }
    char *body = arr ? cJSON_PrintUnformatted(arr) : NULL;
    cJSON_Delete(arr);
    return body;
}

/* With n->mu held: a POST of generation gen succeeded: resolved alerts it
 * carried (not changed since) are delivered and leave the set. */
static void am_delivered(struct notify *n, uint64_t gen) {
    struct am_alert **pp = &n->am_set;
    while (*pp) {
        if ((*pp)->resolved && (*pp)->gen <= gen) am_unlink(n, pp);
        else pp = &(*pp)->next;
    }
    n->am_sent_gen = gen;
}

/* A refused set is a page that never came: logged when the failures begin
 * and when they end, counted on /metrics between. */
static void am_log_streak(struct notify *n, int ok, long code) {
    if (!ok && !n->am_failing)
        fprintf(
            stderr,
            "entropyd: alertmanager %s refused the alerts (HTTP status %ld); retried with backoff "
            "(at most every %d s), failures counted in entropyd_notifications_failed_total{sink=\"alertmanager\"}\n",
            n->am, code, n->cfg.am_resend_s);
    else if (ok && n->am_failing) fprintf(stderr, "entropyd: alertmanager %s takes the alerts again\n", n->am);
    n->am_failing = !ok;
}

/* Alertmanager's thread: POSTs the set when it changed (at most every
 * AM_MIN_GAP_S), when a retry is
 * due and every re-send period while anything fires; at shutdown, one last
 * attempt at what is undelivered, within the grace. */
static void *am_main(void *arg) {
    struct notify *n = arg;
    int last_tried = 0;
    pthread_mutex_lock(&n->mu);
    for (;;) {
        int changed = n->am_gen != n->am_sent_gen;
        if (n->stop && (!changed || last_tried || past_deadline(n))) break;
        if (!changed && !n->am_firing) { /* nothing to say: the timer is off */
            pthread_cond_wait(&n->am_cv, &n->mu);
            continue;
        }
        if (mono_s() < n->am_next && !(n->stop && changed)) {
            wait_until(n, &n->am_cv, n->am_next);
            continue;
        }
        last_tried = n->stop;
        uint64_t gen = n->am_gen;
        n->am_last_post = mono_s();
        char *body = am_body(n);
        pthread_mutex_unlock(&n->mu);
        long code = 0;
        int r = body ? post_once(n, n->am, body, &code) : 0;
        free(body);
        pthread_mutex_lock(&n->mu);
        am_log_streak(n, r == 0, code);
        if (r == 0) {
            n->am_st.sent++;
            am_delivered(n, gen);
            n->am_delay_ms = n->cfg.backoff_ms;
            /* changed while in flight (am_update asked for "now"): again soon */
            n->am_next = n->am_gen != gen ? n->am_last_post + AM_MIN_GAP_S : mono_s() + n->cfg.am_resend_s;
        } else {
            n->am_st.failed++;
            n->am_st.retries++;
            n->am_next = mono_s() + n->am_delay_ms / 1e3;
            n->am_delay_ms *= 2;
            if (n->am_delay_ms > n->cfg.am_resend_s * 1000) n->am_delay_ms = n->cfg.am_resend_s * 1000;
        }
    }
    pthread_mutex_unlock(&n->mu);
    return NULL;
}

/* The log sink, at most NOTIFY_LOG_BURST lines per NOTIFY_LOG_WINDOW_S: a
 * loss flapping between NaN and a number fires and resolves at every step
 * (20,000 lines in a run before); the lines held back are counted in one
 * line when the next window opens, and every transition is in /api/alerts.
 * Called with n->mu held (its window and counts are guarded by it). */
#define NOTIFY_LOG_BURST 20
#define NOTIFY_LOG_WINDOW_S 10.0
static void log_note(struct notify *n, const char *status, const char *alertname, const char *run, int resumed) {
    double now = now_mono_ms() / 1e3;
    if (now - n->log_window >= NOTIFY_LOG_WINDOW_S) {
        if (n->log_suppressed)
            fprintf(stderr,
                    "entropyd: %llu more alert notification(s) in %.0f s not logged (GET /api/alerts has them)\n",
                    (unsigned long long)n->log_suppressed, NOTIFY_LOG_WINDOW_S);
        n->log_window = now;
        n->log_n = n->log_suppressed = 0;
    }
    if (n->log_n++ >= NOTIFY_LOG_BURST) {
        n->log_suppressed++;
        return;
    }
    fprintf(stderr, "entropyd: alert %s%s: %s run=%s\n", status,
            resumed ? " (goes on from before the restart: not sent again)" : "", alertname, run);
}


static char *dupstr(const char *s) { return s ? strdup(s) : NULL; }

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
    if (n->cfg.am_resend_s <= 0) n->cfg.am_resend_s = 60;
    n->am_delay_ms = n->cfg.backoff_ms;
    n->webhook = dupstr(cfg->webhook_url);
    n->exec_cmd = dupstr(cfg->exec_cmd);
    snprintf(n->external, sizeof n->external, "%s", cfg->external_url ? cfg->external_url : "");
    if (cfg->alertmanager_url) {
        size_t k = strlen(cfg->alertmanager_url);
        while (k > 0 && cfg->alertmanager_url[k - 1] == '/') k--;
        if (asprintf(&n->am, "%.*s/api/v2/alerts", (int)k, cfg->alertmanager_url) < 0) n->am = NULL;
    }
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->hook.cv, NULL);
    pthread_cond_init(&n->exec.cv, NULL);
    pthread_cond_init(&n->am_cv, NULL);
    if (cfg->alertmanager_url && (!n->am || (strncmp(n->am, "http://", 7) && strncmp(n->am, "https://", 8)))) {
        snprintf(err, errlen, "--alertmanager wants an http:// or https:// URL, got \"%s\"", cfg->alertmanager_url);
        goto fail;
    }
    if (n->webhook && strncmp(n->webhook, "http://", 7) && strncmp(n->webhook, "https://", 8)) {
        snprintf(err, errlen, "--webhook wants an http:// or https:// URL, got \"%s\"", n->webhook);
        goto fail;
    }
    int rc = 0;
    if (n->webhook && queue_start(&n->hook, n, webhook_deliver)) rc = -1;
    if (!rc && n->exec_cmd && queue_start(&n->exec, n, exec_deliver)) rc = -1;
    if (!rc && n->am) {
        if (pthread_create(&n->am_th, NULL, am_main, n)) rc = -1;
        else n->am_started = 1;
    }
    if (rc) {
        snprintf(err, errlen, "cannot start a notifier thread: %s", strerror(errno));
        goto fail;
    }
    return n;
fail:
    notify_destroy(n, 0);
    return NULL;
}

void notify_destroy(struct notify *n, int wait_ms) {
    if (!n) return;
    pthread_mutex_lock(&n->mu);
    n->stop = 1;
    n->stop_deadline = mono_s() + wait_ms / 1000.0;
    pthread_cond_broadcast(&n->hook.cv);
    pthread_cond_broadcast(&n->exec.cv);
    pthread_cond_broadcast(&n->am_cv);
    pthread_mutex_unlock(&n->mu);
    queue_finish(&n->hook);
    queue_finish(&n->exec);
    if (n->am_started) pthread_join(n->am_th, NULL);
    while (n->am_set) {
        if (n->am_set->resolved || n->am_set->gen > n->am_sent_gen) n->am_st.dropped++;
        am_unlink(n, &n->am_set);
    }
    pthread_cond_destroy(&n->hook.cv);
    pthread_cond_destroy(&n->exec.cv);
    pthread_cond_destroy(&n->am_cv);
    pthread_mutex_destroy(&n->mu);
    free(n->webhook);
    free(n->exec_cmd);
    free(n->am);
    free(n);
}

/* The Alertmanager webhook payload for one alert group. */
static char *payload(struct notify *n, const char *status, const char *alertname, const char *run,
                     const char *alert_json) {
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


/* A note for a queued receiver (malloc'd), or NULL out of memory. */
static struct note *note_new(struct notify *n, const char *status, const char *alertname, const char *run,
                             const char *alert_json) {
    struct note *nt = calloc(1, sizeof *nt);
    if (!nt) return NULL;
    nt->status = dupstr(status);
    nt->alertname = dupstr(alertname);
    nt->run = dupstr(run);
    nt->body = payload(n, status, alertname, run, alert_json);
    if (!nt->status || !nt->alertname || !nt->run || !nt->body) {
        note_free(nt);
        return NULL;
    }
    return nt;
}

int notify_post(struct notify *n, const char *status, const char *alertname, const char *run, const char *alert_json,
                int resumed) {
    int rc = 0;
    /* built before taking mu: they read the external URL under it */
    struct note *hook = NULL, *exec = NULL;
    cJSON *am = NULL;
    char fp[40] = "";
    if (n->webhook && !resumed && !(hook = note_new(n, status, alertname, run, alert_json))) rc = -1;
    if (n->exec_cmd && !resumed && !(exec = note_new(n, status, alertname, run, alert_json))) rc = -1;
    if (n->am && !(am = am_object(n, alert_json, fp, sizeof fp))) rc = -1;
    pthread_mutex_lock(&n->mu);
    n->queued++;
    if (n->cfg.log) log_note(n, status, alertname, run, resumed);
    if (hook) queue_push(&n->hook, hook);
    else if (n->webhook && !resumed) n->hook.st.dropped++;
    if (exec) queue_push(&n->exec, exec);
    else if (n->exec_cmd && !resumed) n->exec.st.dropped++;
    if (am) am_update(n, fp, am, !strcmp(status, "resolved"));
    else if (n->am) n->am_st.dropped++;
    pthread_mutex_unlock(&n->mu);
    return rc;
}

void notify_get_stats(struct notify *n, struct notify_stats *out) {
    pthread_mutex_lock(&n->mu);
    memset(out, 0, sizeof *out);
    out->queued = n->queued;
    out->webhook = n->hook.st;
    out->webhook.pending = (uint64_t)n->hook.len;
    out->exec = n->exec.st;
    out->exec.pending = (uint64_t)n->exec.len;
    out->alertmanager = n->am_st;
    for (struct am_alert *x = n->am_set; x; x = x->next) out->alertmanager.pending += x->gen > n->am_sent_gen;
    out->am_firing = (uint64_t)n->am_firing;
    pthread_mutex_unlock(&n->mu);
}
