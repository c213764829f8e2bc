/* test_http.c: end-to-end tests of entropyd's HTTP API. Starts the real
 * daemon ($ENTROPYD, default build/entropyd) on a temporary data directory
 * and a free port, feeds it runs over its Unix socket in protocol v1, and
 * queries it with libcurl (and a raw socket for the event stream). Expected
 * series are computed here from the values the test sent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

/* ---- the daemon ------------------------------------------------------ */

struct daemon {
    pid_t pid;
    int port;
    char dir[64];
};

static struct daemon D;  /* no token */
static struct daemon DT; /* with --token */

static int start_daemon(struct daemon *d, const char *const *extra) {
    snprintf(d->dir, sizeof d->dir, "/tmp/test_http.XXXXXX");
    if (!mkdtemp(d->dir)) return -1;
    const char *bin = getenv("ENTROPYD");
    if (!bin || !*bin) bin = "build/entropyd";
    int p[2];
    if (pipe(p)) return -1;
    d->pid = fork();
    if (d->pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        const char *argv[32] = {bin,   "--data",          d->dir, "--http", "127.0.0.1:0", "--keepalive-ms",
                                "300", "--stream-events", "64"};
        int n = 9;
        for (int i = 0; extra && extra[i]; i++) argv[n++] = extra[i];
        argv[n] = NULL;
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    FILE *f = fdopen(p[0], "r");
    char line[512];
    d->port = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "http port %d", &d->port) == 1) break;
    fclose(f);
    return d->port > 0 ? 0 : -1;
}

/* Stops the daemon with SIGTERM; returns its exit status (0 expected:
 * a clean shutdown, and no sanitizer report). */
static int stop_daemon(struct daemon *d) {
    if (d->pid <= 0) return -1;
    kill(d->pid, SIGTERM);
    int st;
    waitpid(d->pid, &st, 0);
    d->pid = 0;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", d->dir);
    if (system(cmd)) {}
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- a trainer ------------------------------------------------------- */

struct trainer {
    int fd;
    char buf[1 << 16];
    size_t len;
    int64_t seq;
    int64_t run_id;
};

static int tr_connect(struct trainer *t, const struct daemon *d) {
    memset(t, 0, sizeof *t);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/entropyd.sock", d->dir);
    t->fd = socket(AF_UNIX, SOCK_STREAM, 0);
    return connect(t->fd, (struct sockaddr *)&a, sizeof a);
}

/* Writes n bytes (a whole line, newline included) to the trainer's socket. */
static void tr_write(struct trainer *t, const char *line, size_t n) {
    for (size_t off = 0; off < n;) {
        ssize_t w = write(t->fd, line + off, n - off);
        assert_true(w > 0);
        off += (size_t)w;
    }
}

static void tr_send(struct trainer *t, const char *fmt, ...) {
    char line[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    assert_true(n > 0 && n < (int)sizeof line - 1);
    line[n++] = '\n';
    tr_write(t, line, (size_t)n);
}

/* Reads one reply line (5 s at most) into out. */
static int tr_line(struct trainer *t, char *out, size_t cap) {
    for (;;) {
        char *nl = memchr(t->buf, '\n', t->len);
        if (nl) {
            size_t n = (size_t)(nl - t->buf);
            snprintf(out, cap, "%.*s", (int)n, t->buf);
            memmove(t->buf, nl + 1, t->len - n - 1);
            t->len -= n + 1;
            return 0;
        }
        struct pollfd p = {.fd = t->fd, .events = POLLIN};
        if (poll(&p, 1, 5000) <= 0) return -1;
        ssize_t r = read(t->fd, t->buf + t->len, sizeof t->buf - t->len);
        if (r <= 0) return -1;
        t->len += (size_t)r;
    }
}

static void tr_hello(struct trainer *t, const char *run, int L, int H, const char *token) {
    char tok[128] = "";
    if (token) snprintf(tok, sizeof tok, ",\"token\":\"%s\"", token);
    tr_send(t, "{\"type\":\"hello\",\"protocol\":1,\"run\":\"%s\",\"layers\":%d,\"heads\":%d,\"seq_len\":16%s}", run, L,
            H, tok);
    char line[1024];
    assert_int_equal(tr_line(t, line, sizeof line), 0);
    long long id, last;
    assert_int_equal(sscanf(line, "{\"type\":\"welcome\",\"run_id\":%lld,\"last_seq\":%lld", &id, &last), 2);
    t->run_id = id;
    t->seq = last;
}

/* Waits until every message sent so far is acked (committed). */
static void tr_sync(struct trainer *t) {
    char line[1024];
    for (;;) {
        assert_int_equal(tr_line(t, line, sizeof line), 0);
        long long s;
        if (sscanf(line, "{\"type\":\"ack\",\"seq\":%lld", &s) == 1 && s >= t->seq) return;
    }
}

/* The values the test sends: deterministic, with spikes and non-finite
 * values here and there (null on the wire, NaN in the store). */
static float val(int metric, int64_t step, int cell) {
    if ((step * 7 + cell * 3 + metric) % 101 == 0) return NAN;
    double v = sin(step * 0.01 + cell) + 0.1 * cell + metric;
    if ((step + cell) % 997 == 0) v += 50; /* a spike a sampler would miss */
    return (float)v;
}

static void fmt_val(char *out, size_t cap, float x) {
    if (isnan(x)) snprintf(out, cap, "null");
    else snprintf(out, cap, "%.9g", (double)x);
}

#define L1 2
#define H1 3
#define NSTEPS 6144 /* the last 64- and 512-blocks are full but not rolled up yet */
#define GAP_LO 3000 /* steps [GAP_LO, GAP_HI) are never sent */
#define GAP_HI 3100

static int step_sent(int64_t s) { return s >= 0 && s < NSTEPS && !(s >= GAP_LO && s < GAP_HI); }

static void send_step(struct trainer *t, int64_t s) {
    char line[4096], v[32];
    int n = 0;
    fmt_val(v, sizeof v, val(0, s, 0));
    n += snprintf(line + n, sizeof line - n, "{\"type\":\"step\",\"seq\":%lld,\"step\":%lld,\"scalars\":{\"loss\":%s},",
                  (long long)++t->seq, (long long)s, v);
    n += snprintf(line + n, sizeof line - n, "\"layers\":{\"rank_ratio\":[");
    for (int l = 0; l < L1; l++) {
        fmt_val(v, sizeof v, val(1, s, l));
        n += snprintf(line + n, sizeof line - n, "%s%s", l ? "," : "", v);
    }
    n += snprintf(line + n, sizeof line - n, "]},\"heads\":{\"entropy\":[");
    for (int l = 0; l < L1; l++) {
        n += snprintf(line + n, sizeof line - n, "%s[", l ? "," : "");
        for (int h = 0; h < H1; h++) {
            fmt_val(v, sizeof v, val(2, s, l * H1 + h));
            n += snprintf(line + n, sizeof line - n, "%s%s", h ? "," : "", v);
        }
        n += snprintf(line + n, sizeof line - n, "]");
    }
    snprintf(line + n, sizeof line - n, "]}}");
    tr_send(t, "%s", line);
}

static struct trainer T1; /* run r1, left live */
static int64_t R1;

/* ---- HTTP client ----------------------------------------------------- */

struct resp {
    long status;
    char *body;
    size_t len;
    char ctype[128];
};

static size_t on_data(char *p, size_t sz, size_t n, void *ud) {
    struct resp *r = ud;
    char *b = realloc(r->body, r->len + sz * n + 1);
    assert_non_null(b);
    memcpy(b + r->len, p, sz * n);
    r->body = b;
    r->len += sz * n;
    b[r->len] = 0;
    return sz * n;
}

static void resp_free(struct resp *r) {
    free(r->body);
    memset(r, 0, sizeof *r);
}

/* Requests path on daemon d. auth: an Authorization header value or NULL. */
static struct resp req(const struct daemon *d, const char *method, const char *path, const char *auth) {
    struct resp r = {0};
    char url[2048];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", d->port, path);
    CURL *c = curl_easy_init();
    struct curl_slist *hd = NULL;
    if (auth) {
        char h[256];
        snprintf(h, sizeof h, "Authorization: %s", auth);
        hd = curl_slist_append(hd, h);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
    if (strcmp(method, "HEAD") == 0) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    CURLcode rc = curl_easy_perform(c);
    assert_int_equal(rc, CURLE_OK);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    char *ct = NULL;
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
    if (ct) snprintf(r.ctype, sizeof r.ctype, "%s", ct);
    curl_slist_free_all(hd);
    curl_easy_cleanup(c);
    if (!r.body) r.body = calloc(1, 1);
    return r;
}

static cJSON *get_json(const struct daemon *d, const char *path, long want_status) {
    struct resp r = req(d, "GET", path, NULL);
    if (r.status != want_status) fprintf(stderr, "GET %s -> %ld %s\n", path, r.status, r.body);
    assert_int_equal(r.status, want_status);
    cJSON *j = cJSON_Parse(r.body);
    assert_non_null(j);
    resp_free(&r);
    return j;
}

/* Asserts path answers status with a JSON error object. */
static void expect_error(const struct daemon *d, const char *method, const char *path, long status, const char *code) {
    struct resp r = req(d, method, path, NULL);
    if (r.status != status) fprintf(stderr, "%s %s -> %ld %s\n", method, path, r.status, r.body);
    assert_int_equal(r.status, status);
    cJSON *j = cJSON_Parse(r.body);
    assert_non_null(j);
    cJSON *e = cJSON_GetObjectItem(j, "error");
    assert_non_null(e);
    assert_string_equal(cJSON_GetObjectItem(e, "code")->valuestring, code);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
    cJSON_Delete(j);
    resp_free(&r);
}

/* ---- setup ----------------------------------------------------------- */

static int setup(void **state) {
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_ALL);
    /* test_series_split's widest run (1024 x 512 heads) is over the default cap */
    static const char *const wide[] = {"--max-cells-per-run", "1048576", NULL};
    if (start_daemon(&D, wide)) return -1;
    if (tr_connect(&T1, &D)) return -1;
    tr_hello(&T1, "r1", L1, H1, NULL);
    R1 = T1.run_id;
    for (int64_t s = 0; s < NSTEPS; s++)
        if (step_sent(s)) send_step(&T1, s);
    tr_send(&T1, "{\"type\":\"event\",\"seq\":%lld,\"level\":\"warn\",\"text\":\"hello \\\"events\\\"\"}",
            (long long)++T1.seq);
    tr_sync(&T1);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    close(T1.fd);
    int rc = stop_daemon(&D);
    curl_global_cleanup();
    return rc == 0 ? 0 : -1;
}

/* ---- series exactness ------------------------------------------------ */

/* Checks one series' arrays (min, max, mean, count, nonfinite, and value
 * when it pools several cells) in obj, over the buckets step/end, against
 * values computed from what was sent. cells: the value indices pooled (of
 * a frame of n values), metric index for val(); agg: the answer's "agg". */
static void check_buckets(const char *what, cJSON *step, cJSON *end, cJSON *obj, const char *agg, int metric,
                          const int *cells, int ncells, int64_t from, int64_t to, int points) {
    cJSON *mn = cJSON_GetObjectItem(obj, "min"), *mx = cJSON_GetObjectItem(obj, "max");
    cJSON *mean = cJSON_GetObjectItem(obj, "mean"), *count = cJSON_GetObjectItem(obj, "count");
    cJSON *nonf = cJSON_GetObjectItem(obj, "nonfinite"), *value = cJSON_GetObjectItem(obj, "value");
    int nb = cJSON_GetArraySize(step);
    assert_true(nb >= 1 && nb <= points);
    assert_int_equal(cJSON_GetArraySize(end), nb);
    assert_int_equal(cJSON_GetArraySize(mn), nb);
    assert_int_equal(cJSON_GetArraySize(mx), nb);
    assert_int_equal(cJSON_GetArraySize(mean), nb);
    assert_int_equal(cJSON_GetArraySize(count), nb);
    assert_int_equal(cJSON_GetArraySize(nonf), nb);
    /* value: the agg statistic, there exactly when the series pools cells */
    assert_int_equal(value != NULL, ncells > 1);
    if (value) {
        assert_non_null(agg);
        char *v = cJSON_PrintUnformatted(value), *w = cJSON_PrintUnformatted(cJSON_GetObjectItem(obj, agg));
        assert_string_equal(v, w);
        free(v);
        free(w);
    }
    uint64_t total = 0;
    int64_t prev_end = from - 1;
    for (int i = 0; i < nb; i++) {
        int64_t s0 = (int64_t)cJSON_GetArrayItem(step, i)->valuedouble;
        int64_t s1 = (int64_t)cJSON_GetArrayItem(end, i)->valuedouble;
        assert_true(s0 > prev_end && s0 <= s1 && s1 <= to);
        /* no frame between buckets: empty stretches are the only gaps */
        for (int64_t s = prev_end + 1; s < s0; s++) assert_false(step_sent(s));
        prev_end = s1;
        float emn = 0, emx = 0;
        double esum = 0;
        uint64_t ec = 0, enf = 0;
        for (int64_t s = s0; s <= s1; s++) {
            if (!step_sent(s)) continue;
            for (int k = 0; k < ncells; k++) {
                float x = val(metric, s, cells[k]);
                if (!isfinite(x)) {
                    enf++;
                    continue;
                }
                if (!ec || x < emn) emn = x;
                if (!ec || x > emx) emx = x;
                esum += x;
                ec++;
            }
        }
        total += ec + enf;
        assert_int_equal((uint64_t)cJSON_GetArrayItem(count, i)->valuedouble, ec);
        assert_int_equal((uint64_t)cJSON_GetArrayItem(nonf, i)->valuedouble, enf);
        if (ec) {
            if ((float)cJSON_GetArrayItem(mn, i)->valuedouble != emn ||
                (float)cJSON_GetArrayItem(mx, i)->valuedouble != emx)
                fprintf(stderr, "%s bucket %d [%lld,%lld]: min %g/%g max %g/%g\n", what, i, (long long)s0,
                        (long long)s1, cJSON_GetArrayItem(mn, i)->valuedouble, emn,
                        cJSON_GetArrayItem(mx, i)->valuedouble, emx);
            assert_true((float)cJSON_GetArrayItem(mn, i)->valuedouble == emn);
            assert_true((float)cJSON_GetArrayItem(mx, i)->valuedouble == emx);
            double m = cJSON_GetArrayItem(mean, i)->valuedouble, em = esum / (double)ec;
            assert_true(fabs(m - em) <= 1e-9 * (1 + fabs(em)));
        } else {
            assert_true(cJSON_IsNull(cJSON_GetArrayItem(mn, i)));
        }
    }
    for (int64_t s = prev_end + 1; s <= to; s++) assert_false(step_sent(s));
    /* every value in [from, to] is in exactly one bucket */
    uint64_t want = 0;
    for (int64_t s = from; s <= to; s++) want += step_sent(s) ? (uint64_t)ncells : 0;
    assert_int_equal(total, want);
}

/* The answer's "agg", or NULL when it is null. */
static const char *agg_of(cJSON *j) {
    cJSON *a = cJSON_GetObjectItem(j, "agg");
    return cJSON_IsString(a) ? a->valuestring : NULL;
}

/* Checks one (unsplit) series answer against values computed from what was sent. */
static void check_series(const char *query, int metric, const int *cells, int ncells, int64_t from, int64_t to,
                         int points) {
    char path[512];
    snprintf(path, sizeof path, "/api/runs/%lld/series?%s", (long long)R1, query);
    cJSON *j = get_json(&D, path, 200);
    check_buckets(query, cJSON_GetObjectItem(j, "step"), cJSON_GetObjectItem(j, "end"), j, agg_of(j), metric, cells,
                  ncells, from, to, points);
    cJSON_Delete(j);
}

static void test_series_exact(void **state) {
    (void)state;
    int c0[] = {0};
    int c5[] = {5};
    int l1[] = {3, 4, 5};
    int h2[] = {2, 5};
    int all6[] = {0, 1, 2, 3, 4, 5};
    int lay[] = {0, 1};
    int64_t last = NSTEPS - 1;
    /* widths from raw up to level 3, unaligned edges, the gap, and the tail
     * past the last complete block of each level (5999 is mid-block) */
    check_series("metric=loss", 0, c0, 1, 0, last, 1000);
    check_series("metric=loss&points=10", 0, c0, 1, 0, last, 10);
    check_series("metric=loss&points=150&from=5", 0, c0, 1, 5, last, 150); /* 41-step buckets become 64 */
    check_series("metric=loss&points=1", 0, c0, 1, 0, last, 1);
    check_series("metric=loss&points=3&from=37&to=5990", 0, c0, 1, 37, 5990, 3);
    check_series("metric=loss&points=7&from=100&to=5900", 0, c0, 1, 100, 5900, 7);
    check_series("metric=loss&points=50&from=4000", 0, c0, 1, 4000, last, 50);
    check_series("metric=loss&points=100000", 0, c0, 1, 0, last, 100000);
    check_series("metric=entropy&layer=1&head=2&points=9", 2, c5, 1, 0, last, 9);
    check_series("metric=entropy&layer=1&points=13&agg=max", 2, l1, 3, 0, last, 13);
    check_series("metric=entropy&head=2&points=5&from=513&to=5555", 2, h2, 2, 513, 5555, 5);
    check_series("metric=entropy&points=2&agg=min", 2, all6, 6, 0, last, 2);
    check_series("metric=rank_ratio&points=17", 1, lay, 2, 0, last, 17);
    check_series("metric=rank_ratio&layer=1&points=4&from=2990&to=3200", 1, lay + 1, 1, 2990, 3200, 4);

    /* the spike at step 997 (cell 0 of loss) survives 1-point downsampling */
    char path[256];
    snprintf(path, sizeof path, "/api/runs/%lld/series?metric=loss&points=1", (long long)R1);
    cJSON *j = get_json(&D, path, 200);
    assert_true(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "max"), 0)->valuedouble > 40);
    cJSON_Delete(j);

    /* agg picks `value`: min over heads at full resolution is the per-step min */
    snprintf(path, sizeof path, "/api/runs/%lld/series?metric=entropy&layer=0&from=10&to=12&agg=min", (long long)R1);
    j = get_json(&D, path, 200);
    cJSON *v = cJSON_GetObjectItem(j, "value");
    assert_int_equal(cJSON_GetArraySize(v), 3);
    for (int s = 10; s <= 12; s++) {
        float m = INFINITY;
        for (int h = 0; h < H1; h++)
            if (isfinite(val(2, s, h)) && val(2, s, h) < m) m = val(2, s, h);
        assert_true((float)cJSON_GetArrayItem(v, s - 10)->valuedouble == m);
    }
    cJSON_Delete(j);

    /* the rollups exist, so the answers above came (in part) from them */
    sqlite3 *db;
    char dbp[300];
    snprintf(dbp, sizeof dbp, "%s/entropyd.db", D.dir);
    assert_int_equal(sqlite3_open_v2(dbp, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT count(*) FROM rollups WHERE level = 3", -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_true(sqlite3_column_int(s, 0) >= 3);
    sqlite3_finalize(s);
    sqlite3_close(db);
}

/* Asserts that a and b hold the same array `name` (the same text), or
 * that neither has it. */
static void same_array(const char *what, cJSON *a, cJSON *b, const char *name) {
    cJSON *ia = cJSON_GetObjectItem(a, name), *ib = cJSON_GetObjectItem(b, name);
    if (!ia && !ib) return;
    char *x = cJSON_PrintUnformatted(ia), *y = cJSON_PrintUnformatted(ib);
    if (!x || !y) fprintf(stderr, "%s: %s only in one answer\n", what, name);
    assert_non_null(x);
    assert_non_null(y);
    if (strcmp(x, y)) fprintf(stderr, "%s: %s differs:\n  %.300s\n  %.300s\n", what, name, x, y);
    assert_string_equal(x, y);
    free(x);
    free(y);
}

/* Checks a split answer (query plus split=, and layer= when layer >= 0):
 * its series are the expected cells in order, each is exact against the
 * values sent, and each equals, bucket for bucket, the unsplit answer for
 * its cells (query plus layer= and head=). metric: 1 rank_ratio (a layer
 * metric) or 2 entropy (a head metric). */
static void check_split(const char *query, const char *split, int layer, int metric, int64_t from, int64_t to,
                        int points) {
    char path[512], one[600];
    int by_head = strcmp(split, "head") == 0, H = metric == 2 ? H1 : 1;
    snprintf(path, sizeof path, "/api/runs/%lld/series?%s&split=%s", (long long)R1, query, split);
    if (layer >= 0) snprintf(path + strlen(path), sizeof path - strlen(path), "&layer=%d", layer);
    cJSON *j = get_json(&D, path, 200);
    cJSON *step = cJSON_GetObjectItem(j, "step"), *end = cJSON_GetObjectItem(j, "end");
    cJSON *series = cJSON_GetObjectItem(j, "series");
    assert_string_equal(cJSON_GetObjectItem(j, "split")->valuestring, split);
    assert_null(cJSON_GetObjectItem(j, "min")); /* the arrays are per series */
    int l0 = layer >= 0 ? layer : 0, l1 = layer >= 0 ? layer + 1 : L1;
    int want = by_head ? (l1 - l0) * H : L1;
    assert_int_equal(cJSON_GetArraySize(series), want);
    for (int i = 0; i < want; i++) {
        cJSON *s = cJSON_GetArrayItem(series, i);
        int l = by_head ? l0 + i / H : i, h = by_head ? i % H : -1;
        assert_int_equal((int)cJSON_GetObjectItem(s, "layer")->valuedouble, l);
        if (h >= 0) assert_int_equal((int)cJSON_GetObjectItem(s, "head")->valuedouble, h);
        else assert_true(cJSON_IsNull(cJSON_GetObjectItem(s, "head")));
        int cells[8], nc = 0;
        for (int k = 0; k < H; k++)
            if (h < 0 || k == h) cells[nc++] = l * H + k;
        snprintf(one, sizeof one, "%s series %d", path, i);
        check_buckets(one, step, end, s, agg_of(j), metric, cells, nc, from, to, points);
        /* the same cells asked for alone */
        snprintf(one, sizeof one, "/api/runs/%lld/series?%s&layer=%d", (long long)R1, query, l);
        if (h >= 0) snprintf(one + strlen(one), sizeof one - strlen(one), "&head=%d", h);
        cJSON *o = get_json(&D, one, 200);
        assert_int_equal((int64_t)cJSON_GetObjectItem(o, "width")->valuedouble,
                         (int64_t)cJSON_GetObjectItem(j, "width")->valuedouble);
        static const char *const arrays[] = {"step", "end"};
        for (int k = 0; k < 2; k++) same_array(one, o, j, arrays[k]);
        static const char *const stats[] = {"min", "max", "mean", "count", "nonfinite", "value"};
        for (int k = 0; k < 6; k++) same_array(one, o, s, stats[k]);
        cJSON_Delete(o);
    }
    cJSON_Delete(j);
}

/* Ends the trainer's run, closes its connection and deletes the run. */
static void tr_end_and_delete(struct trainer *t, int64_t id) {
    tr_send(t, "{\"type\":\"end\",\"seq\":%lld,\"status\":\"finished\"}", (long long)++t->seq);
    tr_sync(t);
    close(t->fd);
    char p[64];
    snprintf(p, sizeof p, "/api/runs/%lld", (long long)id);
    struct resp r = req(&D, "DELETE", p, NULL);
    assert_int_equal(r.status, 200);
    resp_free(&r);
}

static void test_series_split(void **state) {
    (void)state;
    int64_t last = NSTEPS - 1;
    /* rollups of several levels, unaligned edges, the gap, full resolution */
    check_split("metric=entropy&points=9", "head", 1, 2, 0, last, 9);
    check_split("metric=entropy&points=13&from=513&to=5555", "head", -1, 2, 513, 5555, 13);
    check_split("metric=entropy&points=100000&from=2990&to=3200", "head", 0, 2, 2990, 3200, 100000);
    check_split("metric=entropy&points=7&agg=max", "layer", -1, 2, 0, last, 7);
    check_split("metric=entropy&points=2&agg=min&from=37&to=5990", "layer", -1, 2, 37, 5990, 2);
    check_split("metric=entropy&points=150&from=5", "layer", -1, 2, 5, last, 150);
    check_split("metric=rank_ratio&points=17", "layer", -1, 1, 0, last, 17);
    check_split("metric=rank_ratio&points=4&from=2990&to=3200", "layer", -1, 1, 2990, 3200, 4);

    /* a range with no frame: every series, with empty arrays */
    char p[256];
    snprintf(p, sizeof p, "/api/runs/%lld/series?metric=entropy&split=head&from=3010&to=3020", (long long)R1);
    cJSON *j = get_json(&D, p, 200);
    cJSON *series = cJSON_GetObjectItem(j, "series");
    assert_int_equal(cJSON_GetArraySize(series), L1 * H1);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "step")), 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(series, 5), "mean")), 0);
    cJSON_Delete(j);

    /* the bound: series x buckets at most 262,144. A run of 16 x 32 heads
     * and 600 steps: 512 series x 600 one-step buckets is too many */
    struct trainer t;
    assert_int_equal(tr_connect(&t, &D), 0);
    tr_hello(&t, "wide", 16, 32, NULL);
    int64_t id = t.run_id;
    for (int s = 0; s < 600; s++) {
        char line[8192];
        int n = snprintf(line, sizeof line, "{\"type\":\"step\",\"seq\":%lld,\"step\":%d,\"heads\":{\"entropy\":[",
                         (long long)++t.seq, s);
        for (int l = 0; l < 16; l++)
            for (int h = 0; h < 32; h++)
                n += snprintf(line + n, sizeof line - n, "%s%d%s",
                              h   ? ","
                              : l ? ",["
                                  : "[",
                              (s + l + h) % 10, h == 31 ? "]" : "");
        snprintf(line + n, sizeof line - n, "]}}");
        tr_send(&t, "%s", line);
    }
    tr_sync(&t);
    snprintf(p, sizeof p, "/api/runs/%lld/series?metric=entropy&split=head&points=1000", (long long)id);
    struct resp r = req(&D, "GET", p, NULL);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "fewer points or one layer"));
    resp_free(&r);
    /* one layer (32 series), or half the buckets (512 x 300), is within it */
    snprintf(p, sizeof p, "/api/runs/%lld/series?metric=entropy&split=head&layer=15&points=1000", (long long)id);
    j = get_json(&D, p, 200);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "series")), 32);
    cJSON_Delete(j);
    snprintf(p, sizeof p, "/api/runs/%lld/series?metric=entropy&split=head&points=300", (long long)id);
    j = get_json(&D, p, 200);
    series = cJSON_GetObjectItem(j, "series");
    assert_int_equal(cJSON_GetArraySize(series), 512);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "step")), 300);
    /* layer 15, head 31: (s + 46) % 10 over steps 2i and 2i + 1 */
    cJSON *s = cJSON_GetArrayItem(series, 511);
    assert_int_equal((int)cJSON_GetObjectItem(s, "layer")->valuedouble, 15);
    assert_int_equal((int)cJSON_GetObjectItem(s, "head")->valuedouble, 31);
    for (int i = 0; i < 300; i++) {
        int a = (2 * i + 46) % 10, b = (2 * i + 47) % 10;
        assert_int_equal((int)cJSON_GetArrayItem(cJSON_GetObjectItem(s, "count"), i)->valuedouble, 2);
        assert_int_equal((int)cJSON_GetArrayItem(cJSON_GetObjectItem(s, "min"), i)->valuedouble, a < b ? a : b);
        assert_int_equal((int)cJSON_GetArrayItem(cJSON_GetObjectItem(s, "max"), i)->valuedouble, a > b ? a : b);
    }
    cJSON_Delete(j);
    snprintf(p, sizeof p, "/api/runs/%lld/series?metric=entropy&split=layer&points=100000", (long long)id);
    j = get_json(&D, p, 200); /* 16 x 600 */
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "series")), 16);
    cJSON_Delete(j);
    tr_end_and_delete(&t, id);

    /* the bound holds for a range with no frame too (each series is still
     * listed): 1024 x 512 heads, one step, asked past it */
    assert_int_equal(tr_connect(&t, &D), 0);
    tr_hello(&t, "widest", 1024, 512, NULL);
    id = t.run_id;
    size_t cap = 64 + (size_t)1024 * 512 * 2 + 1024 * 4, n = 0;
    char *big = malloc(cap);
    assert_non_null(big);
    n +=
        (size_t)snprintf(big, cap, "{\"type\":\"step\",\"seq\":%lld,\"step\":0,\"heads\":{\"e\":[", (long long)++t.seq);
    for (int l = 0; l < 1024; l++) {
        big[n++] = l ? ',' : ' ';
        big[n++] = '[';
        for (int h = 0; h < 512; h++) {
            if (h) big[n++] = ',';
            big[n++] = '1';
        }
        big[n++] = ']';
    }
    n += (size_t)snprintf(big + n, cap - n, "]}}\n");
    tr_write(&t, big, n);
    free(big);
    tr_sync(&t);
    snprintf(p, sizeof p, "/api/runs/%lld/series?metric=e&split=head&from=10&to=20", (long long)id);
    r = req(&D, "GET", p, NULL);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "524288 series"));
    resp_free(&r);
    snprintf(p, sizeof p, "/api/runs/%lld/series?metric=e&split=head&layer=3&from=10&to=20", (long long)id);
    j = get_json(&D, p, 200); /* one layer: 512 empty series */
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "series")), 512);
    cJSON_Delete(j);
    tr_end_and_delete(&t, id);
}

/* Asserts GET /api/runs/R1/<route><q> answers status with a JSON error. */
static void route_error(const char *route, const char *q, long status, const char *code) {
    char p[256];
    snprintf(p, sizeof p, "/api/runs/%lld/%s%s", (long long)R1, route, q);
    expect_error(&D, "GET", p, status, code);
}

/* ---- the collapse timeline: a split series' minima, compactly ---- */

/* The 16-bit code at index i of a timeline answer's base64 "min". */
static unsigned tl_code(const char *b64, size_t i) {
    unsigned char b[2];
    for (int k = 0; k < 2; k++) {
        size_t byte = 2 * i + (size_t)k, q = byte / 3 * 4, r = byte % 3;
        uint32_t v = 0;
        for (int c = 0; c < 4; c++) {
            const char *A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            const char *p = b64[q + (size_t)c] == '=' ? A : strchr(A, b64[q + (size_t)c]);
            v = v << 6 | (uint32_t)(p - A);
        }
        b[k] = (unsigned char)(v >> (16 - 8 * r) & 255);
    }
    return b[0] | (unsigned)b[1] << 8;
}

/* Checks GET .../timeline?<query> against the split series it stands
 * for (<series>: the same range and points with split=): the same
 * buckets, and each row's decoded minima within a quantum of the series'
 * min (or its value, for a pooled series). */
static void check_timeline(const char *query, const char *series, int rows_want) {
    char path[512];
    snprintf(path, sizeof path, "/api/runs/%lld/timeline?%s", (long long)R1, query);
    cJSON *t = get_json(&D, path, 200);
    snprintf(path, sizeof path, "/api/runs/%lld/series?%s", (long long)R1, series);
    cJSON *s = get_json(&D, path, 200);
    same_array(query, t, s, "step");
    same_array(query, t, s, "end");
    cJSON *sr = cJSON_GetObjectItem(s, "series"), *cells = cJSON_GetObjectItem(t, "cells");
    int rows = cJSON_GetArraySize(cells), nb = cJSON_GetArraySize(cJSON_GetObjectItem(t, "step"));
    assert_int_equal(rows, rows_want);
    assert_int_equal(rows, cJSON_GetArraySize(sr));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(t, "time")), nb);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(t, "end_time")), nb);
    const char *b64 = cJSON_GetObjectItem(t, "min")->valuestring;
    assert_int_equal(strlen(b64), (size_t)(4 * ((2 * rows * nb + 2) / 3)));
    double lo = cJSON_GetObjectItem(t, "lo")->valuedouble, hi = cJSON_GetObjectItem(t, "hi")->valuedouble;
    double q = (hi - lo) / 65534;
    for (int r = 0; r < rows; r++) {
        cJSON *one = cJSON_GetArrayItem(sr, r), *c = cJSON_GetArrayItem(cells, r);
        assert_int_equal((int)cJSON_GetArrayItem(c, 0)->valuedouble,
                         (int)cJSON_GetObjectItem(one, "layer")->valuedouble);
        cJSON *m =
            cJSON_GetObjectItem(one, "value") ? cJSON_GetObjectItem(one, "value") : cJSON_GetObjectItem(one, "min");
        for (int i = 0; i < nb; i++) {
            unsigned code = tl_code(b64, (size_t)r * (size_t)nb + (size_t)i);
            cJSON *v = cJSON_GetArrayItem(m, i);
            if (cJSON_IsNull(v)) {
                assert_int_equal(code, 65535);
                continue;
            }
            double got = lo + code * q;
            if (fabs(got - v->valuedouble) > q * 0.51 + 1e-9)
                fail_msg("%s row %d bucket %d: %g, series %g", query, r, i, got, v->valuedouble);
        }
    }
    cJSON_Delete(s);
    cJSON_Delete(t);
}

static void test_timeline(void **state) {
    (void)state;
    check_timeline("metric=entropy&points=9", "metric=entropy&points=9&split=head", L1 * H1);
    check_timeline("metric=entropy&points=40&from=513&to=5555&layer=1",
                   "metric=entropy&points=40&from=513&to=5555&split=head&layer=1", H1);
    check_timeline("metric=entropy&points=30&rows=layer", "metric=entropy&points=30&split=layer&agg=min", L1);
    check_timeline("metric=entropy&points=5000&from=2990&to=3200",
                   "metric=entropy&points=5000&from=2990&to=3200&split=head", L1 * H1);
    check_timeline("metric=rank_ratio&points=17", "metric=rank_ratio&points=17&split=layer", L1);
#define TE(q, st, code) route_error("timeline", q, st, code)
    TE("", 400, "bad_request");
    TE("?metric=loss", 400, "bad_request");
    TE("?metric=entropy&rows=layer&layer=0", 400, "bad_request");
    TE("?metric=rank_ratio&layer=0", 400, "bad_request");
    TE("?metric=entropy&layer=99", 400, "bad_request");
    TE("?metric=entropy&rows=cells", 400, "bad_request");
    TE("?metric=entropy&from=9&to=3", 400, "bad_request");
    TE("?metric=nosuch", 404, "not_found");
#undef TE
    expect_error(&D, "GET", "/api/runs/999999/timeline?metric=entropy", 404, "not_found");
}

static void test_series_errors(void **state) {
    (void)state;
    char p[256];
#define E(q, st, code) route_error("series", q, st, code)
    E("", 400, "bad_request");
    E("?metric=loss&points=0", 400, "bad_request");
    E("?metric=loss&points=100001", 400, "bad_request");
    E("?metric=loss&points=12x", 400, "bad_request");
    E("?metric=loss&from=-1", 400, "bad_request");
    E("?metric=loss&from=10&to=5", 400, "bad_request");
    E("?metric=loss&agg=median", 400, "bad_request");
    E("?metric=loss&bogus=1", 400, "bad_request");
    E("?metric=loss&layer=0", 400, "bad_request");
    E("?metric=rank_ratio&head=0", 400, "bad_request");
    E("?metric=entropy&layer=2", 400, "bad_request");
    E("?metric=entropy&head=3", 400, "bad_request");
    E("?metric=nosuch", 404, "not_found");
    /* split: head metrics by head, head and layer metrics by layer; no
     * axis that the split already spreads over */
    E("?metric=entropy&split=row", 400, "bad_request");
    E("?metric=entropy&split=", 400, "bad_request");
    E("?metric=loss&split=head", 400, "bad_request");
    E("?metric=loss&split=layer", 400, "bad_request");
    E("?metric=rank_ratio&split=head", 400, "bad_request");
    E("?metric=entropy&split=head&head=0", 400, "bad_request");
    E("?metric=entropy&split=head&layer=1&head=2", 400, "bad_request");
    E("?metric=entropy&split=layer&layer=0", 400, "bad_request");
    E("?metric=entropy&split=layer&head=0", 400, "bad_request");
    E("?metric=rank_ratio&split=layer&layer=1", 400, "bad_request");
    E("?metric=entropy&split=head&layer=2", 400, "bad_request");
    E("?metric=nosuch&split=head", 404, "not_found");
#undef E
    expect_error(&D, "GET", "/api/runs/999/series?metric=loss", 404, "not_found");
    expect_error(&D, "GET", "/api/runs/abc/series?metric=loss", 400, "bad_request");
    /* a range with no frame is an empty answer, not an error */
    snprintf(p, sizeof p, "/api/runs/%lld/series?metric=loss&from=3010&to=3020", (long long)R1);
    cJSON *j = get_json(&D, p, 200);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "step")), 0);
    cJSON_Delete(j);
}

/* ---- the other endpoints --------------------------------------------- */

static void test_runs(void **state) {
    (void)state;
    cJSON *j = get_json(&D, "/api/runs", 200);
    assert_true(cJSON_IsArray(j));
    cJSON *r = NULL, *it;
    cJSON_ArrayForEach(it, j) if (strcmp(cJSON_GetObjectItem(it, "name")->valuestring, "r1") == 0) r = it;
    assert_non_null(r);
    assert_int_equal((int64_t)cJSON_GetObjectItem(r, "id")->valuedouble, R1);
    assert_string_equal(cJSON_GetObjectItem(r, "status")->valuestring, "live");
    assert_int_equal((int)cJSON_GetObjectItem(r, "last_step")->valuedouble, NSTEPS - 1);
    assert_int_equal((int64_t)cJSON_GetObjectItem(r, "last_seq")->valuedouble, T1.seq);
    assert_int_equal((int)cJSON_GetObjectItem(r, "layers")->valuedouble, L1);
    assert_int_equal((int)cJSON_GetObjectItem(r, "heads")->valuedouble, H1);
    assert_true(cJSON_IsObject(cJSON_GetObjectItem(r, "meta")));
    assert_non_null(cJSON_GetObjectItem(r, "alerts_firing"));
    cJSON_Delete(j);
    j = get_json(&D, "/api/runs?status=finished", 200);
    cJSON_ArrayForEach(it, j) assert_string_equal(cJSON_GetObjectItem(it, "status")->valuestring, "finished");
    cJSON_Delete(j);
    expect_error(&D, "GET", "/api/runs?status=sleeping", 400, "bad_request");
    expect_error(&D, "GET", "/api/runs?limit=0", 400, "bad_request");
    expect_error(&D, "GET", "/api/runs?sort=colour", 400, "bad_request");
    expect_error(&D, "GET", "/api/runs?limit=5&cursor=zzz", 400, "bad_request");
    expect_error(&D, "GET", "/api/runs?meta.a..b=1", 400, "bad_request");
    expect_error(&D, "GET", "/api/runs/by-name/", 400, "bad_request");
    expect_error(&D, "GET", "/api/runs/by-name/nobody", 404, "not_found");
    expect_error(&D, "POST", "/api/runs", 405, "method_not_allowed");
    expect_error(&D, "GET", "/api/nothing", 404, "not_found");

    char p[128];
    snprintf(p, sizeof p, "/api/runs/%lld", (long long)R1);
    j = get_json(&D, p, 200);
    cJSON *m = cJSON_GetObjectItem(j, "metrics");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "scalars"), 0)->valuestring, "loss");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "layers"), 0)->valuestring, "rank_ratio");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "heads"), 0)->valuestring, "entropy");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "heads"), 1)->valuestring, "entropy_norm");
    assert_int_equal((int)cJSON_GetObjectItem(j, "first_step")->valuedouble, 0);
    /* loss, rank_ratio and entropy: the rules reading sigma_qk, max_logit,
     * entropy_bound cannot run, entropy_collapse can (entropy_norm derived) */
    cJSON *off = cJSON_GetObjectItem(j, "rules_unavailable"), *o;
    int risk = 0, collapse = 0;
    cJSON_ArrayForEach(o, off) {
        const char *rule = cJSON_GetObjectItem(o, "rule")->valuestring;
        if (!strcmp(rule, "collapse_risk_sigma_qk")) {
            risk = 1;
            assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "missing")), 1);
            assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "missing"), 0)->valuestring,
                                "head metric sigma_qk");
        }
        collapse |= !strcmp(rule, "entropy_collapse") || !strcmp(rule, "loss_spike");
    }
    assert_true(risk);
    assert_false(collapse);
    cJSON_Delete(j);
    expect_error(&D, "GET", "/api/runs/999", 404, "not_found");
    expect_error(&D, "GET", "/api/runs/0", 400, "bad_request");
    expect_error(&D, "GET", "/api/runs/12abc", 400, "bad_request");
}

static void test_frame(void **state) {
    (void)state;
    char p[256];
    snprintf(p, sizeof p, "/api/runs/%lld/frame?metric=entropy", (long long)R1);
    cJSON *j = get_json(&D, p, 200);
    assert_int_equal((int)cJSON_GetObjectItem(j, "step")->valuedouble, NSTEPS - 1);
    cJSON *v = cJSON_GetObjectItem(j, "values");
    assert_int_equal(cJSON_GetArraySize(v), L1);
    for (int l = 0; l < L1; l++)
        for (int h = 0; h < H1; h++) {
            cJSON *x = cJSON_GetArrayItem(cJSON_GetArrayItem(v, l), h);
            float want = val(2, NSTEPS - 1, l * H1 + h);
            if (isnan(want)) assert_true(cJSON_IsNull(x));
            else assert_true((float)x->valuedouble == want);
        }
    cJSON_Delete(j);
    /* in the gap: the last step before it */
    snprintf(p, sizeof p, "/api/runs/%lld/frame?metric=rank_ratio&step=3050", (long long)R1);
    j = get_json(&D, p, 200);
    assert_int_equal((int)cJSON_GetObjectItem(j, "step")->valuedouble, GAP_LO - 1);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "values")), L1);
    cJSON_Delete(j);
    snprintf(p, sizeof p, "/api/runs/%lld/frame?metric=loss&step=10", (long long)R1);
    j = get_json(&D, p, 200);
    assert_true((float)cJSON_GetArrayItem(cJSON_GetObjectItem(j, "values"), 0)->valuedouble == val(0, 10, 0));
    cJSON_Delete(j);
    snprintf(p, sizeof p, "/api/runs/%lld/frame", (long long)R1);
    expect_error(&D, "GET", p, 400, "bad_request");
    snprintf(p, sizeof p, "/api/runs/%lld/frame?metric=loss&step=x", (long long)R1);
    expect_error(&D, "GET", p, 400, "bad_request");
    snprintf(p, sizeof p, "/api/runs/%lld/frame?metric=nosuch", (long long)R1);
    expect_error(&D, "GET", p, 404, "not_found");
    expect_error(&D, "GET", "/api/runs/999/frame?metric=loss", 404, "not_found");
}

static void test_events(void **state) {
    (void)state;
    char p[256];
    snprintf(p, sizeof p, "/api/runs/%lld/events", (long long)R1);
    cJSON *j = get_json(&D, p, 200);
    cJSON *ev = cJSON_GetObjectItem(j, "events"), *e, *found = NULL;
    cJSON_ArrayForEach(e, ev) if (strcmp(cJSON_GetObjectItem(e, "text")->valuestring, "hello \"events\"") == 0) found =
        e;
    assert_non_null(found);
    assert_string_equal(cJSON_GetObjectItem(found, "level")->valuestring, "warn");
    assert_int_equal((int64_t)cJSON_GetObjectItem(found, "seq")->valuedouble, T1.seq);
    int64_t id = (int64_t)cJSON_GetObjectItem(found, "id")->valuedouble;
    cJSON_Delete(j);
    snprintf(p, sizeof p, "/api/runs/%lld/events?after=%lld", (long long)R1, (long long)id);
    j = get_json(&D, p, 200);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "events")), 0);
    cJSON_Delete(j);
    snprintf(p, sizeof p, "/api/runs/%lld/events?limit=0", (long long)R1);
    expect_error(&D, "GET", p, 400, "bad_request");
    expect_error(&D, "GET", "/api/runs/999/events", 404, "not_found");
}

static void test_export(void **state) {
    (void)state;
    char p[256];
    int frames = 0;
    for (int s = 0; s < NSTEPS; s++) frames += step_sent(s);
    snprintf(p, sizeof p, "/api/runs/%lld/export?format=csv", (long long)R1);
    struct resp r = req(&D, "GET", p, NULL);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.ctype, "text/csv");
    int lines = 0;
    for (size_t i = 0; i < r.len; i++) lines += r.body[i] == '\n';
    /* loss, rank_ratio, entropy, and the entropy_norm ingest derives from it */
    assert_int_equal(lines, 1 + frames * (1 + L1 + 2 * L1 * H1));
    assert_memory_equal(r.body, "metric,kind,step,time,layer,head,value\n", 39);
    /* one known value: entropy layer 1 head 2 at step 5 */
    char want[128], v[32];
    fmt_val(v, sizeof v, val(2, 5, 5));
    snprintf(want, sizeof want, "\nentropy,head,5,");
    char *at = strstr(r.body, want);
    assert_non_null(at);
    char *line = NULL;
    for (char *q = at; q && strncmp(q, want, strlen(want)) == 0; q = strchr(q + 1, '\n')) {
        if (strstr(q, ",1,2,") && strstr(q, ",1,2,") < strchr(q + 1, '\n')) {
            line = q + 1;
            break;
        }
    }
    assert_non_null(line);
    char *comma = strstr(line, ",1,2,") + 5;
    if (strcmp(v, "null") == 0) assert_true(*comma == '\n');
    else assert_true(strtof(comma, NULL) == val(2, 5, 5));
    resp_free(&r);

    snprintf(p, sizeof p, "/api/runs/%lld/export?format=jsonl", (long long)R1);
    r = req(&D, "GET", p, NULL);
    assert_int_equal(r.status, 200);
    lines = 0;
    char *save, *ln = strtok_r(r.body, "\n", &save);
    for (; ln; ln = strtok_r(NULL, "\n", &save)) {
        lines++;
        if (lines % 1000 == 1) { /* every line is one JSON object */
            cJSON *o = cJSON_Parse(ln);
            assert_non_null(o);
            assert_non_null(cJSON_GetObjectItem(o, "values"));
            cJSON_Delete(o);
        }
    }
    assert_int_equal(lines, frames * 4);
    resp_free(&r);
    snprintf(p, sizeof p, "/api/runs/%lld/export?format=xml", (long long)R1);
    expect_error(&D, "GET", p, 400, "bad_request");
    expect_error(&D, "GET", "/api/runs/999/export", 404, "not_found");
}

static void test_metrics_healthz(void **state) {
    (void)state;
    struct resp r = req(&D, "GET", "/metrics", NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.ctype, "text/plain"));
    char want[256], v[32];
    snprintf(v, sizeof v, "%.9g", (double)val(0, NSTEPS - 1, 0));
    snprintf(want, sizeof want, "entropyd_scalar{run=\"r1\",metric=\"loss\"} %s\n", v);
    assert_non_null(strstr(r.body, want));
    snprintf(v, sizeof v, "%.9g", (double)val(1, NSTEPS - 1, 1));
    snprintf(want, sizeof want, "entropyd_layer{run=\"r1\",metric=\"rank_ratio\",layer=\"1\"} %s\n", v);
    assert_non_null(strstr(r.body, want));
    assert_null(strstr(r.body, "entropyd_head{")); /* only with --metrics-heads */
    assert_non_null(strstr(r.body, "# TYPE entropyd_commit_seconds histogram"));
    assert_non_null(strstr(r.body, "entropyd_commit_seconds_bucket{le=\"+Inf\"}"));
    assert_non_null(strstr(r.body, "entropyd_errors_total{code=\"seq_gap\"} 0"));
    assert_non_null(strstr(r.body, "entropyd_db_bytes "));
    unsigned long long lines = 0;
    char *l = strstr(r.body, "\nentropyd_lines_total ");
    assert_non_null(l);
    sscanf(l, "\nentropyd_lines_total %llu", &lines);
    assert_true(lines >= NSTEPS - (GAP_HI - GAP_LO));
    resp_free(&r);
    cJSON *j = get_json(&D, "/healthz", 200);
    assert_string_equal(cJSON_GetObjectItem(j, "status")->valuestring, "ok");
    cJSON_Delete(j);
    expect_error(&D, "GET", "/metrics?x=1", 400, "bad_request");
}

static void test_delete(void **state) {
    (void)state;
    struct trainer t;
    assert_int_equal(tr_connect(&t, &D), 0);
    tr_hello(&t, "doomed", 1, 1, NULL);
    int64_t id = t.run_id;
    tr_send(&t, "{\"type\":\"step\",\"seq\":%lld,\"step\":0,\"scalars\":{\"x\":1}}", (long long)++t.seq);
    tr_sync(&t);
    char p[128];
    snprintf(p, sizeof p, "/api/runs/%lld", (long long)id);
    expect_error(&D, "DELETE", p, 409, "conflict"); /* live */
    tr_send(&t, "{\"type\":\"end\",\"seq\":%lld,\"status\":\"finished\"}", (long long)++t.seq);
    tr_sync(&t);
    close(t.fd);
    struct resp r = req(&D, "DELETE", p, NULL);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    expect_error(&D, "GET", p, 404, "not_found");
    expect_error(&D, "DELETE", p, 404, "not_found");
    expect_error(&D, "DELETE", "/api/runs/x", 400, "bad_request");
    snprintf(p, sizeof p, "/api/runs/%lld/series?metric=x", (long long)id);
    expect_error(&D, "GET", p, 404, "not_found");
    /* a request body is refused, whatever the route */
    CURL *c = curl_easy_init();
    char url[128];
    struct resp rb = {0};
    snprintf(url, sizeof url, "http://127.0.0.1:%d/api/runs", D.port);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{\"name\":\"x\"}");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &rb);
    assert_int_equal(curl_easy_perform(c), CURLE_OK);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &rb.status);
    curl_easy_cleanup(c);
    assert_int_equal(rb.status, 413);
    assert_non_null(strstr(rb.body, "\"payload_too_large\""));
    resp_free(&rb);
    /* methods a route does not have */
    snprintf(p, sizeof p, "/api/runs/%lld", (long long)R1);
    expect_error(&D, "PUT", p, 405, "method_not_allowed");
}

static void test_static(void **state) {
    (void)state;
    /* the embedded copy: index.html at / when web/ has one */
    struct resp r = req(&D, "GET", "/", NULL);
    assert_true(r.status == 200 || r.status == 404);
    if (r.status == 200) assert_non_null(strstr(r.ctype, "text/html"));
    resp_free(&r);
    r = req(&D, "GET", "/../../etc/passwd", NULL);
    assert_true(r.status == 400 || r.status == 404);
    resp_free(&r);
}

/* ---- SSE ------------------------------------------------------------- */

struct sse {
    int fd;
    char *buf;
    size_t len, cap;
};

static void sse_open(struct sse *s, const struct daemon *d, const char *path, const char *last_id, const char *auth) {
    memset(s, 0, sizeof *s);
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)d->port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(s->fd, (struct sockaddr *)&a, sizeof a), 0);
    char rq[1024];
    int n = snprintf(rq, sizeof rq, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n%s%s%s%s%s\r\n", path,
                     last_id ? "Last-Event-ID: " : "", last_id ? last_id : "", last_id ? "\r\n" : "", auth ? auth : "",
                     auth ? "\r\n" : "");
    assert_int_equal(write(s->fd, rq, (size_t)n), n);
}

/* Reads until `needle` appears after offset `from` (or ms pass). Returns
 * a pointer just past it into s->buf, or NULL. */
static char *sse_wait(struct sse *s, size_t from, const char *needle, int ms) {
    for (;;) {
        if (s->buf && s->len > from) {
            char *f = strstr(s->buf + from, needle);
            if (f) return f + strlen(needle);
        }
        struct pollfd p = {.fd = s->fd, .events = POLLIN};
        if (poll(&p, 1, ms) <= 0) return NULL;
        if (s->cap - s->len < 65536) {
            s->cap = s->cap ? s->cap * 2 : 1 << 17;
            s->buf = realloc(s->buf, s->cap);
        }
        ssize_t r = read(s->fd, s->buf + s->len, s->cap - s->len - 1);
        if (r <= 0) return NULL;
        s->len += (size_t)r;
        s->buf[s->len] = 0;
    }
}

static void sse_close(struct sse *s) {
    close(s->fd);
    free(s->buf);
}

/* The step events of a run in the stream text: their ids and steps. */
static int sse_steps(const char *text, int64_t run, char ids[][64], int64_t *steps, int max) {
    int n = 0;
    for (const char *p = strstr(text, "id: "); p && n < max; p = strstr(p + 1, "id: ")) {
        char id[64], ev[32];
        long long r, st;
        if (sscanf(p, "id: %63s\nevent: %31s\ndata: {\"run\":%lld,\"step\":%lld", id, ev, &r, &st) == 4 &&
            strcmp(ev, "step") == 0 && r == run) {
            snprintf(ids[n], 64, "%s", id);
            steps[n++] = st;
        }
    }
    return n;
}

static void test_stream_resume(void **state) {
    (void)state;
    struct trainer t;
    assert_int_equal(tr_connect(&t, &D), 0);
    tr_hello(&t, "streamed", 2, 2, NULL);
    char path[64];
    snprintf(path, sizeof path, "/api/stream?run=%lld", (long long)t.run_id);
    struct sse s;
    sse_open(&s, &D, path, NULL, NULL);
    assert_non_null(sse_wait(&s, 0, "entropyd stream", 3000));
    for (int st = 0; st < 5; st++)
        tr_send(
            &t,
            "{\"type\":\"step\",\"seq\":%lld,\"step\":%d,\"scalars\":{\"loss\":%d},\"heads\":{\"entropy\":[[1,2],[3,null]]}}",
            (long long)++t.seq, st, st);
    tr_sync(&t);
    assert_non_null(sse_wait(&s, 0, "\"step\":4,", 3000));
    char ids[64][64];
    int64_t steps[64];
    assert_int_equal(sse_steps(s.buf, t.run_id, ids, steps, 64), 5);
    for (int i = 0; i < 5; i++) assert_int_equal(steps[i], i);
    /* the per-layer entropy summary: min and mean over the finite heads */
    assert_non_null(strstr(s.buf, "\"entropy\":{\"min\":[1,3],\"mean\":[1.5,3]}"));
    assert_non_null(strstr(s.buf, "\"scalars\":{\"loss\":4}"));
    char resume[64];
    snprintf(resume, sizeof resume, "%s", ids[1]);
    sse_close(&s);

    /* away: three more steps, then resume after the second one */
    for (int st = 5; st < 8; st++)
        tr_send(&t, "{\"type\":\"step\",\"seq\":%lld,\"step\":%d,\"scalars\":{\"loss\":%d}}", (long long)++t.seq, st,
                st);
    tr_sync(&t);
    sse_open(&s, &D, path, resume, NULL);
    assert_non_null(sse_wait(&s, 0, "\"step\":7,", 3000));
    int n = sse_steps(s.buf, t.run_id, ids, steps, 64);
    assert_int_equal(n, 6);
    for (int i = 0; i < n; i++) assert_int_equal(steps[i], i + 2); /* 2..7: no gap, no repeat */
    assert_null(strstr(s.buf, "event: reset"));
    /* keep-alive comments flow on an idle stream (every 300 ms here) */
    assert_non_null(sse_wait(&s, 0, ": keep-alive", 2000));
    sse_close(&s);

    /* too far back: the ring holds 64 events; 100 more push ids[0] out */
    for (int st = 8; st < 108; st++)
        tr_send(&t, "{\"type\":\"step\",\"seq\":%lld,\"step\":%d,\"scalars\":{\"loss\":1}}", (long long)++t.seq, st);
    tr_sync(&t);
    sse_open(&s, &D, path, resume, NULL);
    assert_non_null(sse_wait(&s, 0, "event: reset", 3000));
    tr_send(&t, "{\"type\":\"step\",\"seq\":%lld,\"step\":108,\"scalars\":{\"loss\":1}}", (long long)++t.seq);
    tr_sync(&t);
    assert_non_null(sse_wait(&s, 0, "\"step\":108,", 3000));
    n = sse_steps(s.buf, t.run_id, ids, steps, 64);
    assert_int_equal(n, 1); /* after a reset: live events only */
    sse_close(&s);
    /* an id from another daemon's life resets too */
    sse_open(&s, &D, path, "12345-6", NULL);
    assert_non_null(sse_wait(&s, 0, "event: reset", 3000));
    sse_close(&s);

    /* run events: status changes */
    sse_open(&s, &D, path, NULL, NULL);
    assert_non_null(sse_wait(&s, 0, "entropyd stream", 3000));
    tr_send(&t, "{\"type\":\"end\",\"seq\":%lld,\"status\":\"failed\"}", (long long)++t.seq);
    tr_sync(&t);
    assert_non_null(sse_wait(&s, 0, "event: run\ndata: {", 3000));
    assert_non_null(sse_wait(&s, 0, "\"status\":\"failed\"}", 3000));
    sse_close(&s);
    close(t.fd);
    expect_error(&D, "GET", "/api/stream?run=x", 400, "bad_request");
}

/* ---- auth ------------------------------------------------------------ */

static void test_auth(void **state) {
    (void)state;
    char root[] = "/tmp/test_http_web.XXXXXX";
    assert_non_null(mkdtemp(root));
    char f[300];
    snprintf(f, sizeof f, "%s/index.html", root);
    FILE *fp = fopen(f, "w");
    fputs("<!doctype html><title>entropyd</title>", fp);
    fclose(fp);
    snprintf(f, sizeof f, "%s/../test_http_secret.txt", root);
    const char *extra[] = {"--token", "s3cret", "--web-root", root, "--metrics-heads", NULL};
    assert_int_equal(start_daemon(&DT, extra), 0);

    expect_error(&DT, "GET", "/api/runs", 401, "unauthorized");
    expect_error(&DT, "GET", "/metrics", 401, "unauthorized");
    expect_error(&DT, "GET", "/api/stream", 401, "unauthorized");
    struct resp r = req(&DT, "GET", "/api/runs", "Bearer wrong");
    assert_int_equal(r.status, 401);
    resp_free(&r);
    r = req(&DT, "GET", "/api/runs", "Bearer s3cret");
    assert_int_equal(r.status, 200);
    resp_free(&r);
    r = req(&DT, "GET", "/api/runs?token=s3cret", NULL);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    r = req(&DT, "GET", "/healthz", NULL);
    assert_int_equal(r.status, 200);
    resp_free(&r);

    /* trainers need the token too; with it, per-head values reach /metrics */
    struct trainer t;
    assert_int_equal(tr_connect(&t, &DT), 0);
    tr_hello(&t, "auth", 1, 2, "s3cret");
    tr_send(&t, "{\"type\":\"step\",\"seq\":%lld,\"step\":0,\"heads\":{\"entropy\":[[0.5,0.25]]}}", (long long)++t.seq);
    tr_sync(&t);
    r = req(&DT, "GET", "/metrics", "Bearer s3cret");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "entropyd_head{run=\"auth\",metric=\"entropy\",layer=\"0\",head=\"1\"} 0.25\n"));
    resp_free(&r);
    struct sse s;
    sse_open(&s, &DT, "/api/stream", NULL, "Authorization: Bearer s3cret");
    assert_non_null(sse_wait(&s, 0, "200 OK", 3000));
    sse_close(&s);
    close(t.fd);

    /* static files from --web-root, no token needed; nothing outside it */
    r = req(&DT, "GET", "/", NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.ctype, "text/html"));
    assert_non_null(strstr(r.body, "<title>entropyd</title>"));
    resp_free(&r);
    r = req(&DT, "HEAD", "/index.html", NULL);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    fp = fopen(f, "w");
    fputs("secret", fp);
    fclose(fp);
    const char *bad[] = {"/../test_http_secret.txt", "/%2e%2e/test_http_secret.txt", "/..%2ftest_http_secret.txt",
                         "/a/../../test_http_secret.txt", "/nosuch.js"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = req(&DT, "GET", bad[i], NULL);
        if (r.status == 200) fprintf(stderr, "%s served: %s\n", bad[i], r.body);
        assert_true(r.status == 400 || r.status == 404);
        assert_false(strcmp(r.body, "secret") == 0);
        resp_free(&r);
    }
    snprintf(f, sizeof f, "%s/link.txt", root);
    char target[300];
    snprintf(target, sizeof target, "%s/../test_http_secret.txt", root);
    assert_int_equal(symlink(target, f), 0);
    r = req(&DT, "GET", "/link.txt", NULL);
    assert_int_equal(r.status, 404);
    resp_free(&r);
    expect_error(&DT, "DELETE", "/index.html", 405, "method_not_allowed");

    assert_int_equal(stop_daemon(&DT), 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s /tmp/test_http_secret.txt", root);
    if (system(cmd)) {}
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_series_exact),
        cmocka_unit_test(test_series_split),
        cmocka_unit_test(test_timeline),
        cmocka_unit_test(test_series_errors),
        cmocka_unit_test(test_runs),
        cmocka_unit_test(test_frame),
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_export),
        cmocka_unit_test(test_metrics_healthz),
        cmocka_unit_test(test_delete),
        cmocka_unit_test(test_static),
        cmocka_unit_test(test_stream_resume),
        cmocka_unit_test(test_auth),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
