/* fuzz_http_params: libFuzzer harness for the parsing entropyd does on an
 * HTTP request target (daemon/http_api.c, http_guard.c, http_static.c,
 * daemon/stream.c). Built and run by
 * `make fuzz` and scripts/run-fuzz.sh; not a unit test.
 *
 * The parsers are static, so this file includes http.c, http_api.c,
 * http_guard.c and http_static.c (the cmocka habit, house style) rather
 * than widening their header. libmicrohttpd splits
 * the target at '?', splits the query at '&' and '=', and percent-decodes
 * each piece with MHD_http_unescape; this harness does the same with that
 * very function, then runs everything the server does with the pieces before a
 * database is touched: route matching and run ids (match), the allowed-
 * parameter check of every route (param_check), integer parameters with
 * each route's bounds (parse_i64), word parameters (agg, split: choice),
 * the token comparison (net_equal_ct), static file paths (static_path, which must
 * never yield a ".." segment, a backslash or an absolute path) and content
 * types, and the Last-Event-ID parser of the SSE ring (stream_client_open,
 * on a real ring holding a few events).
 *
 * Input: the request target, e.g. "/api/runs/3/series?metric=e&layer=1".
 * If those files rename one of these static functions this file must follow. */
#include "../../daemon/http.c"
#include "../../daemon/http_api.c"
#include "../../daemon/http_guard.c"
#include "../../daemon/http_static.c"

static void check(int cond, const char *what) {
    if (!cond) {
        fprintf(stderr, "fuzz_http_params: contract broken: %s\n", what);
        abort();
    }
}

static struct stream *ring;

static void check_static_path(const char *path) {
    char rel[1024];
    memset(rel, 'x', sizeof rel);
    if (static_path(path, rel, sizeof rel)) return;
    check(memchr(rel, 0, sizeof rel) != NULL, "static path NUL-terminated");
    check(rel[0] != '/', "static path is relative");
    check(strchr(rel, '\\') == NULL, "no backslash in a static path");
    for (const char *seg = rel; seg;) {
        const char *end = strchr(seg, '/');
        size_t n = end ? (size_t)(end - seg) : strlen(seg);
        check(!(n == 2 && seg[0] == '.' && seg[1] == '.'), "no .. segment in a static path");
        seg = end ? end + 1 : NULL;
    }
    (void)content_type(rel);
}

/* The integer parameters and their bounds, as the handlers use them. */
static const struct {
    const char *name;
    int64_t lo, hi;
} ints[] = {{"layer", 0, 1 << 20},    {"head", 0, 1 << 20},           {"from", 0, INT64_MAX / 2},
            {"to", 0, INT64_MAX / 2}, {"points", 1, HTTP_MAX_POINTS}, {"step", 0, INT64_MAX},
            {"after", 0, INT64_MAX},  {"limit", 1, HTTP_MAX_EVENTS},  {"run", 1, INT64_MAX}};

/* The word-valued parameters and their words (http_api.c's tables). */
static const struct {
    const char *name;
    const char *const *words;
} choices[] = {{"agg", agg_names}, {"split", split_names}};

static void check_param(const char *key, const char *value) {
    for (const struct route *rt = routes; rt->path; rt++) {
        struct params p = {.allowed = rt->params};
        enum MHD_Result r = param_check(&p, MHD_GET_ARGUMENT_KIND, key, value);
        check((r == MHD_YES) == (p.unknown == NULL), "param_check agrees with its verdict");
    }
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (strcmp(key, ints[i].name) != 0) continue;
        int64_t v = -12345;
        if (parse_i64(value, ints[i].lo, ints[i].hi, &v) == 0)
            check(v >= ints[i].lo && v <= ints[i].hi, "an accepted integer is in its bounds");
    }
    for (size_t i = 0; i < sizeof choices / sizeof choices[0]; i++) {
        if (strcmp(key, choices[i].name) != 0) continue;
        int k = choice(value, choices[i].words);
        check(k == -1 || (k >= 0 && *choices[i].words[k] && strcmp(choices[i].words[k], value) == 0),
              "an accepted choice is one of its words");
    }
    if (strcmp(key, "token") == 0) {
        check(net_equal_ct(value, value), "a token equals itself");
        check(!net_equal_ct(value, "s3cret") || strcmp(value, "s3cret") == 0, "net_equal_ct is equality");
    }
    if (strcmp(key, "last_event_id") == 0) {
        struct stream_client *sc = stream_client_open(ring, 0, value);
        stream_client_close(sc);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 64 * 1024) return 0;
    if (!ring) {
        char err[128];
        struct stream_config cfg = {.max_events = 8, .max_bytes = 4096, .keepalive_ms = 1000};
        ring = stream_create(&cfg, err, sizeof err);
        if (!ring) abort();
        for (int i = 0; i < 12; i++) stream_publish(ring, "run", i % 3, "{\"run\":1}", 9); /* some evicted */
    }
    char *target = malloc(size + 1);
    if (!target) return 0;
    memcpy(target, data, size);
    target[size] = 0; /* MHD hands over NUL-terminated strings */
    char *q = strchr(target, '?');
    if (q) {
        *q++ = 0;
        (void)query_problem(q); /* the raw query checks: any input, no over-read */
    }
    MHD_http_unescape(target);
    for (const struct route *rt = routes; rt->path; rt++) {
        int64_t id = 0;
        char name[PROTO_MAX_RUN + 1];
        int m = match(rt->path, target, &id, name, sizeof name);
        check(m >= -1 && m <= 2, "match returns -1, 0, 1 or 2");
        if (m == 1 && strstr(rt->path, "{id}")) check(id >= 1, "a matched run id is positive");
        if (m == 2)
            check(strstr(rt->path, "{id}") && name[0] && strlen(name) < sizeof name && !strchr(name, '/'),
                  "a matched run name is one non-empty path segment");
    }
    check_static_path(target);
    for (char *kv = q; kv && *kv;) {
        char *amp = strchr(kv, '&');
        if (amp) *amp = 0;
        char *eq = strchr(kv, '=');
        if (eq) *eq++ = 0;
        MHD_http_unescape(kv);
        if (eq) MHD_http_unescape(eq);
        check_param(kv, eq ? eq : "");
        kv = amp ? amp + 1 : NULL;
    }
    free(target);
    return 0;
}
