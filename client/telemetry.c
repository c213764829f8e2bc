/* telemetry.c -- protocol v1 client: ring, sender thread, spool, socket.
 *
 * Data flow (one way):
 *   producer --(SPSC ring of preallocated slots, no syscall)--> sender thread
 *   sender: format JSON body, prefix {"seq":N, -> append to spool segment
 *   sender: stream spool bytes from the welcome's last_seq+1 -> socket
 *   sender: read welcome / ack / error / alert -> trim spool, inbox ring
 *
 * Why the spool is a write-ahead log even when the daemon is healthy: one
 * code path for live sending and for resending after a reconnect or a
 * restart, and a process crash loses nothing that had a seq. The writes are
 * page-cache writes of the sender thread (no fsync); segments are deleted
 * once acknowledged, usually before the kernel writes them back.
 *
 * Spool layout: SPOOL_DIR/RUN/seg-<first seq, 20 digits>.log, each holding
 * complete lines with consecutive seqs starting at the number in its name;
 * the newest segment is the one being appended to. An empty newest segment
 * records the next seq when everything else was acknowledged and trimmed.
 * SPOOL_DIR/RUN/lock is flock()ed by the owning process.
 * SPOOL_DIR/RUN/hello.json is the run's hello without its token: what a
 * later client (telemetry_upload_all, the background uploader) needs to
 * upload a run it knows nothing else about. A run that ends with everything
 * acknowledged leaves only an empty newest segment, so "a segment with
 * bytes" means "unacknowledged messages, or a client that died".
 *
 * Not here: metric computation (probe.c), printing (the caller polls).
 */
#include "telemetry.h"
#include "proto.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define TICK_MAX_MS 16            /* sender idle poll: bounds enqueue->spool latency */
#define INBOX_CAP 64
#define OBUF_CAP (256 * 1024)
#define IBUF_CAP (1024 * 1024)    /* daemon lines longer than this are skipped */
#define WBUF_CAP (256 * 1024)
#define EVENT_TEXT_MAX PROTO_MAX_TEXT
#define SEQ_PREFIX_MAX PROTO_SEQ_PREFIX_MAX
#define WELCOME_TIMEOUT_MS 10000
#define CONNECT_TIMEOUT_MS 2000
#define DRAIN_BATCH 256
#define LINE_MAX_BYTES PROTO_MAX_LINE
#define METRICS_MAX PROTO_MAX_METRICS

/* The public header stands alone (it is installed without proto.h). */
_Static_assert(TELEMETRY_NAME_MAX == PROTO_MAX_NAME, "metric name limit");
_Static_assert(TELEMETRY_RUN_MAX == PROTO_MAX_RUN, "run name limit");

enum { MSG_STEP, MSG_EVENT, MSG_END };
enum { C_DOWN, C_CONNECTING, C_HELLO, C_STREAMING, C_STOPPED };

typedef proto_name name_t;

struct telemetry_step {
    telemetry *owner;
    int kind;                 /* MSG_* */
    int64_t step;
    double time;              /* < 0: omitted */
    int n_scalar, n_layer, n_head;
    name_t *scalar_names;     /* (max_scalars) */
    float *scalars;           /* (max_scalars) */
    name_t *layer_names;      /* (max_layer_metrics) */
    float *layers;            /* (max_layer_metrics, L) */
    name_t *head_names;       /* (max_head_metrics) */
    float *heads;             /* (max_head_metrics, L, H) */
    char level[16];           /* event level or end status */
    char *text;               /* event text, malloc()ed, freed by the sender */
};

typedef struct segment {
    uint64_t first;           /* seq of its first line */
    uint64_t size;            /* bytes of complete lines */
} segment;

struct telemetry {
    /* Configuration, immutable after create. */
    char run[TELEMETRY_RUN_MAX + 1];
    int L, H;
    int max_s, max_l, max_h;
    int has_address, is_unix;
    char *unix_path, *host, *port;
    char *hello; size_t hello_len;
    size_t hello_public_len;  /* the hello's bytes before its token */
    char *address, *token;    /* copies, for the background uploader */
    char *root;               /* spool root */
    char *dir;                /* root/run */
    int root_is_tmp;
    int lock_fd;
    uint64_t spool_max, seg_bytes;
    int backoff_min, backoff_max;

    /* Ring: the producer owns head and the open slot, the sender owns tail. */
    size_t cap;
    telemetry_step *slots;
    char *slot_mem;
    _Atomic size_t head, tail;
    _Atomic uint64_t done;    /* slots fully processed (spooled or dropped) */
    telemetry_step *open;

    /* Inbox: the sender (and the uploader, under in_lock) produces,
     * telemetry_poll consumes. */
    telemetry_msg inbox[INBOX_CAP];
    _Atomic size_t in_head, in_tail;
    pthread_mutex_t in_lock;
    int in_lock_init;

    /* Background uploader of the other runs of spool_dir. */
    pthread_t up_thread;
    int up_started;
    atomic_int up_stop, up_done;

    /* Sender thread state. */
    pthread_t thread;
    int thread_started;
    atomic_int stop;
    segment *segs; size_t nsegs, segcap;
    uint64_t spool_total;
    int wfd;                  /* append fd of the newest segment */
    uint64_t next_seq, acked;
    char *fmt; size_t fmtcap; /* body of one line, after SEQ_PREFIX_MAX bytes */
    char *wbuf; size_t wlen;  /* lines waiting for one write() */
    unsigned wbuf_n;
    uint64_t reported_drops;
    int fd, cstate;
    uint64_t next_attempt, deadline;  /* monotonic ns */
    int backoff;
    int stream_was_up;
    char *obuf; size_t olen, ooff;
    int hello_nl;             /* the hello's newline is still in obuf */
    char *ibuf; size_t ilen; int iskip;
    uint64_t rd_first, rd_off; int rd_fd;

    /* Counters (see telemetry_stats). */
    _Atomic uint64_t st_enqueued, st_dropped_queue, st_dropped_spool, st_dropped_oversize, st_spooled,
        st_sent, st_acked, st_next_seq, st_spool_bytes, st_connects,
        st_connect_failures, st_errors, st_inbox_dropped;
    atomic_int st_connected;
};

#define ST_ADD(t, f, n) atomic_fetch_add_explicit(&(t)->f, (uint64_t)(n), memory_order_relaxed)
#define ST_SET(t, f, v) atomic_store_explicit(&(t)->f, (v), memory_order_relaxed)
#define ST_GET(t, f) atomic_load_explicit(&(t)->f, memory_order_relaxed)

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double telemetry_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

/* ---------------------------------------------------------------- numbers */

int telemetry_format_float(char *buf, float v)
{
    return proto_format_float(buf, v);
}

/* ---------------------------------------------------------------- names */

/* Validates and copies a metric name; -1 when invalid. */
static int copy_name(char *dst, const char *name)
{
    size_t n = strnlen(name, TELEMETRY_NAME_MAX + 1);
    if (!proto_valid_name(name, n)) return -1;
    memcpy(dst, name, n + 1);
    return 0;
}

/* A run name is also a directory name: not "." or "..". */
static int valid_run(const char *r)
{
    return proto_valid_run(r, strnlen(r, TELEMETRY_RUN_MAX + 1)) && strcmp(r, ".") && strcmp(r, "..");
}

void telemetry_config_init(telemetry_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
}

const char *telemetry_run_name(const telemetry *t)
{
    return t->run;
}

telemetry_step *telemetry_step_begin(telemetry *t, int64_t step, double time)
{
    size_t h = atomic_load_explicit(&t->head, memory_order_relaxed);
    size_t tl = atomic_load_explicit(&t->tail, memory_order_acquire);
    t->open = NULL;
    if (step < 0) return NULL;
    if (h - tl >= t->cap) {
        ST_ADD(t, st_dropped_queue, 1);
        return NULL;
    }
    telemetry_step *s = &t->slots[h % t->cap];
    s->kind = MSG_STEP;
    s->step = step;
    s->time = isfinite(time) ? time : -1;
    s->n_scalar = s->n_layer = s->n_head = 0;
    t->open = s;
    return s;
}

int telemetry_step_scalar(telemetry_step *s, const char *name, double value)
{
    if (!s || !name) return TELEMETRY_EINVAL;
    if (s->n_scalar == s->owner->max_s) return TELEMETRY_EFULL;
    if (copy_name(s->scalar_names[s->n_scalar], name)) return TELEMETRY_EINVAL;
    s->scalars[s->n_scalar++] = (float)value;
    return TELEMETRY_OK;
}

float *telemetry_step_layer_buf(telemetry_step *s, const char *name)
{
    if (!s || !name || s->n_layer == s->owner->max_l) return NULL;
    if (copy_name(s->layer_names[s->n_layer], name)) return NULL;
    return s->layers + (size_t)s->n_layer++ * (size_t)s->owner->L;
}

float *telemetry_step_heads_buf(telemetry_step *s, const char *name)
{
    if (!s || !name || s->n_head == s->owner->max_h) return NULL;
    if (copy_name(s->head_names[s->n_head], name)) return NULL;
    return s->heads + (size_t)s->n_head++ * (size_t)s->owner->L * (size_t)s->owner->H;
}

int telemetry_step_layer(telemetry_step *s, const char *name, const float *values)
{
    if (!s || !name || !values) return TELEMETRY_EINVAL;
    if (s->n_layer == s->owner->max_l) return TELEMETRY_EFULL;
    float *dst = telemetry_step_layer_buf(s, name);
    if (!dst) return TELEMETRY_EINVAL;
    memcpy(dst, values, (size_t)s->owner->L * sizeof(float));
    return TELEMETRY_OK;
}

int telemetry_step_heads(telemetry_step *s, const char *name, const float *values)
{
    if (!s || !name || !values) return TELEMETRY_EINVAL;
    if (s->n_head == s->owner->max_h) return TELEMETRY_EFULL;
    float *dst = telemetry_step_heads_buf(s, name);
    if (!dst) return TELEMETRY_EINVAL;
    memcpy(dst, values, (size_t)s->owner->L * (size_t)s->owner->H * sizeof(float));
    return TELEMETRY_OK;
}

static void publish(telemetry *t)
{
    size_t h = atomic_load_explicit(&t->head, memory_order_relaxed);
    atomic_store_explicit(&t->head, h + 1, memory_order_release);
    ST_ADD(t, st_enqueued, 1);
    t->open = NULL;
}

int telemetry_step_commit(telemetry *t, telemetry_step *s)
{
    if (!s || s != t->open) return TELEMETRY_EINVAL;
    publish(t);
    return TELEMETRY_OK;
}

static int valid_level(const char *l)
{
    return proto_level_parse(l) >= 0;
}

/* What an end may say (live and stale are the daemon's). */
static int valid_status(const char *s)
{
    return proto_status_parse(s) >= PROTO_FINISHED;
}

/* A non-step message into the ring. text (may be NULL) is taken over. */
static int enqueue_other(telemetry *t, int kind, const char *level, char *text)
{
    size_t h = atomic_load_explicit(&t->head, memory_order_relaxed);
    size_t tl = atomic_load_explicit(&t->tail, memory_order_acquire);
    if (h - tl >= t->cap) {
        free(text);
        ST_ADD(t, st_dropped_queue, 1);
        return TELEMETRY_EFULL;
    }
    telemetry_step *s = &t->slots[h % t->cap];
    s->kind = kind;
    snprintf(s->level, sizeof s->level, "%s", level);
    s->text = text;
    s->time = telemetry_now();
    publish(t);
    return TELEMETRY_OK;
}

int telemetry_event(telemetry *t, const char *level, const char *text)
{
    if (!t || !valid_level(level) || !text) return TELEMETRY_EINVAL;
    size_t n = strnlen(text, EVENT_TEXT_MAX);
    char *copy = malloc(n + 1);
    if (!copy) return TELEMETRY_EFULL;
    memcpy(copy, text, n);
    copy[n] = 0;
    return enqueue_other(t, MSG_EVENT, level, copy);
}

int telemetry_poll(telemetry *t, telemetry_msg *out)
{
    size_t tl = atomic_load_explicit(&t->in_tail, memory_order_relaxed);
    size_t h = atomic_load_explicit(&t->in_head, memory_order_acquire);
    if (tl == h) return 0;
    *out = t->inbox[tl % INBOX_CAP];
    atomic_store_explicit(&t->in_tail, tl + 1, memory_order_release);
    return 1;
}

void telemetry_msg_free(telemetry_msg *m)
{
    if (!m) return;
    free(m->line);
    m->line = NULL;
}

void telemetry_get_stats(const telemetry *tc, telemetry_stats *o)
{
    telemetry *t = (telemetry *)tc; /* atomics are read-only here */
    memset(o, 0, sizeof *o);
    o->enqueued = ST_GET(t, st_enqueued);
    o->dropped_queue = ST_GET(t, st_dropped_queue);
    o->dropped_spool = ST_GET(t, st_dropped_spool);
    o->dropped_oversize = ST_GET(t, st_dropped_oversize);
    o->spooled = ST_GET(t, st_spooled);
    o->sent = ST_GET(t, st_sent);
    o->acked = ST_GET(t, st_acked);
    o->next_seq = ST_GET(t, st_next_seq);
    o->spool_bytes = ST_GET(t, st_spool_bytes);
    o->connects = ST_GET(t, st_connects);
    o->reconnects = o->connects ? o->connects - 1 : 0;
    o->connect_failures = ST_GET(t, st_connect_failures);
    o->errors = ST_GET(t, st_errors);
    o->inbox_dropped = ST_GET(t, st_inbox_dropped);
    o->connected = atomic_load_explicit(&t->st_connected, memory_order_relaxed);
}

/* Everything enqueued has been processed by the sender and, with an
 * address, acknowledged. */
static int settled(telemetry *t)
{
    uint64_t done = atomic_load_explicit(&t->done, memory_order_acquire);
    if (done != atomic_load_explicit(&t->head, memory_order_relaxed)) return 0;
    if (!t->has_address) return 1;
    return ST_GET(t, st_acked) + 1 >= ST_GET(t, st_next_seq);
}

int telemetry_flush(telemetry *t, int timeout_ms)
{
    uint64_t end = now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    for (;;) {
        if (settled(t)) return TELEMETRY_OK;
        if (now_ns() >= end) return TELEMETRY_ETIMEDOUT;
        sleep_ms(1);
    }
}

/* ---------------------------------------------------------------- inbox */

static void inbox_push_locked(telemetry *t, const char *line, size_t len)
{
    size_t h = atomic_load_explicit(&t->in_head, memory_order_relaxed);
    size_t tl = atomic_load_explicit(&t->in_tail, memory_order_acquire);
    if (h - tl >= INBOX_CAP) { ST_ADD(t, st_inbox_dropped, 1); return; }
    telemetry_msg *m = &t->inbox[h % INBOX_CAP];
    m->line = malloc(len + 1);
    if (!m->line) { ST_ADD(t, st_inbox_dropped, 1); return; }
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
static void inbox_push(telemetry *t, const char *line, size_t len)
{
    pthread_mutex_lock(&t->in_lock);
    inbox_push_locked(t, line, len);
    pthread_mutex_unlock(&t->in_lock);
}

/* A message from the client itself, e.g. when the spool cannot serve the
 * daemon's last_seq. Same shape as a daemon error, type "client". */
static void inbox_note(telemetry *t, const char *code, const char *fmt, ...)
{
    char msg[256], line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int n = snprintf(line, sizeof line, "{\"type\":\"client\",\"code\":\"%s\",\"message\":\"%s\"}",
                     code, msg);
    inbox_push(t, line, (size_t)n);
}

/* ---------------------------------------------------------------- spool */

static char *seg_path(const telemetry *t, uint64_t first)
{
    size_t n = strlen(t->dir) + 40;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/seg-%020llu.log", t->dir, (unsigned long long)first);
    return p;
}

static int seg_push(telemetry *t, uint64_t first, uint64_t size)
{
    if (t->nsegs == t->segcap) {
        size_t nc = t->segcap ? t->segcap * 2 : 16;
        segment *ns = realloc(t->segs, nc * sizeof *ns);
        if (!ns) return -1;
        t->segs = ns;
        t->segcap = nc;
    }
    t->segs[t->nsegs++] = (segment){ first, size };
    return 0;
}

/* Opens a new, empty newest segment named after next_seq. */
static int spool_rotate(telemetry *t)
{
    if (t->wfd >= 0) close(t->wfd);
    t->wfd = -1;
    char *p = seg_path(t, t->next_seq);
    if (!p) return -1;
    t->wfd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    free(p);
    if (t->wfd < 0) return -1;
    if (t->nsegs && t->segs[t->nsegs - 1].first == t->next_seq) return 0; /* reopened */
    return seg_push(t, t->next_seq, 0);
}

static void spool_unlink(telemetry *t, uint64_t first)
{
    char *p = seg_path(t, first);
    if (p) unlink(p);
    free(p);
}

/* Deletes the segments whose every line is acknowledged (never the newest). */
static void spool_trim(telemetry *t)
{
    size_t k = 0;
    while (k + 1 < t->nsegs && t->segs[k + 1].first - 1 <= t->acked) {
        spool_unlink(t, t->segs[k].first);
        t->spool_total -= t->segs[k].size;
        k++;
    }
    if (k) {
        memmove(t->segs, t->segs + k, (t->nsegs - k) * sizeof *t->segs);
        t->nsegs -= k;
    }
    ST_SET(t, st_spool_bytes, t->spool_total);
}

static int cmp_seg(const void *a, const void *b)
{
    const segment *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

static int mkdir_p(const char *path)
{
    char *p = strdup(path);
    if (!p) return -1;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0700) && errno != EEXIST) { free(p); return -1; }
        *s = '/';
    }
    int rc = mkdir(p, 0700) && errno != EEXIST ? -1 : 0;
    free(p);
    return rc;
}

/* Opens the run's spool directory, locks it, and recovers the segments and
 * next_seq: the newest segment is cut after its last complete line (a crash
 * may leave half a line; that line's seq was never sent because the sender
 * only streams bytes it wrote completely). */
static int spool_open(telemetry *t, char *err, size_t errlen)
{
    if (mkdir_p(t->dir)) {
        set_err(err, errlen, "spool: mkdir %s: %s", t->dir, strerror(errno));
        return -1;
    }
    size_t n = strlen(t->dir) + 8;
    char *lp = malloc(n);
    if (!lp) return -1;
    snprintf(lp, n, "%s/lock", t->dir);
    t->lock_fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    free(lp);
    if (t->lock_fd < 0) {
        set_err(err, errlen, "spool: open lock in %s: %s", t->dir, strerror(errno));
        return -1;
    }
    if (flock(t->lock_fd, LOCK_EX | LOCK_NB)) {
        set_err(err, errlen, "spool: %s is in use by another client: %s", t->dir, strerror(errno));
        return -1;
    }
    DIR *d = opendir(t->dir);
    if (!d) {
        set_err(err, errlen, "spool: opendir %s: %s", t->dir, strerror(errno));
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned long long first;
        char tail[8];
        if (strlen(e->d_name) != 28 || sscanf(e->d_name, "seg-%20llu.%3s", &first, tail) != 2 ||
            strcmp(tail, "log") || first == 0)
            continue;
        struct stat st;
        char *p = seg_path(t, first);
        int ok = p && stat(p, &st) == 0;
        free(p);
        if (!ok || seg_push(t, first, (uint64_t)st.st_size)) { closedir(d); goto fail; }
    }
    closedir(d);
    if (t->nsegs == 0) {
        t->next_seq = 1;
        if (spool_rotate(t)) goto fail;
        return 0;
    }
    qsort(t->segs, t->nsegs, sizeof *t->segs, cmp_seg);
    segment *last = &t->segs[t->nsegs - 1];
    char *p = seg_path(t, last->first);
    if (!p) goto fail;
    int fd = open(p, O_RDWR | O_CLOEXEC);
    free(p);
    if (fd < 0) goto fail;
    char buf[65536];
    uint64_t off = 0, good = 0, lines = 0;
    for (;;) {
        ssize_t r = pread(fd, buf, sizeof buf, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        for (ssize_t i = 0; i < r; i++)
            if (buf[i] == '\n') { lines++; good = off + (uint64_t)i + 1; }
        off += (uint64_t)r;
    }
    if (good != off && ftruncate(fd, (off_t)good)) { close(fd); goto fail; }
    close(fd);
    last->size = good;
    t->next_seq = last->first + lines;
    for (size_t i = 0; i < t->nsegs; i++) t->spool_total += t->segs[i].size;
    /* Append to the newest segment again (next_seq names a new one only
     * when rotating). */
    uint64_t keep = t->next_seq;
    t->next_seq = last->first;
    int rc = spool_rotate(t);
    t->next_seq = keep;
    if (rc) goto fail;
    return 0;
fail:
    set_err(err, errlen, "spool: recovering %s: %s", t->dir, strerror(errno));
    return -1;
}

/* Writes len bytes holding n lines (the last n seqs assigned) to the newest
 * segment. On failure the segment is cut back and the seqs are taken back,
 * so numbering stays gapless; the lines count as dropped. */
static int spool_write(telemetry *t, const char *buf, size_t len, unsigned n)
{
    segment *s = &t->segs[t->nsegs - 1];
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(t->wfd, buf + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int torn = off > 0 && ftruncate(t->wfd, (off_t)s->size) != 0;
            t->next_seq -= n;
            ST_SET(t, st_next_seq, t->next_seq);
            ST_ADD(t, st_dropped_spool, n);
            /* A torn tail that cannot be cut must not be followed by more
             * appends: continue in a new segment. */
            if (torn) spool_rotate(t);
            return -1;
        }
        off += (size_t)w;
    }
    s->size += len;
    t->spool_total += len;
    ST_ADD(t, st_spooled, n);
    ST_SET(t, st_spool_bytes, t->spool_total);
    return 0;
}

static void spool_flush(telemetry *t)
{
    if (t->wlen) spool_write(t, t->wbuf, t->wlen, t->wbuf_n);
    t->wlen = 0;
    t->wbuf_n = 0;
}

/* Gives the body (text after the seq, from "\"type\"" to the newline, placed
 * at body with SEQ_PREFIX_MAX free bytes before it) the next seq and appends
 * it, or drops it when the spool bound would be exceeded. Returns 0 when
 * spooled (or buffered for writing), -1 when dropped. */
static int spool_add(telemetry *t, char *body, size_t blen)
{
    for (;;) {
        char pre[SEQ_PREFIX_MAX];
        size_t plen = proto_write_seq_prefix(pre, t->next_seq);
        size_t len = plen + blen;
        if (t->spool_total + t->wlen + len > t->spool_max || t->nsegs == 0) {
            ST_ADD(t, st_dropped_spool, 1);
            return -1;
        }
        segment *s = &t->segs[t->nsegs - 1];
        if (s->size + t->wlen + len > t->seg_bytes && s->size + t->wlen > 0) {
            /* A failed flush takes its seqs back, hence the loop: the line
             * is numbered only once everything before it is settled. */
            spool_flush(t);
            if (t->segs[t->nsegs - 1].size > 0 && spool_rotate(t)) {
                ST_ADD(t, st_dropped_spool, 1);
                return -1;
            }
            continue;
        }
        if (t->wlen && t->wlen + len > WBUF_CAP) {
            spool_flush(t);
            continue;
        }
        char *line = body - plen;
        memcpy(line, pre, plen);
        t->next_seq++;
        ST_SET(t, st_next_seq, t->next_seq);
        if (len > WBUF_CAP) return spool_write(t, line, len, 1);
        memcpy(t->wbuf + t->wlen, line, len);
        t->wlen += len;
        t->wbuf_n++;
        return 0;
    }
}

/* ---------------------------------------------------------------- formatting */

static size_t step_body_max(const telemetry *t)
{
    return proto_step_body_max(t->max_s, t->max_l, t->max_h, t->L, t->H);
}

/* Formats the slot's JSON body at t->fmt + SEQ_PREFIX_MAX; returns its length. */
static size_t format_body(telemetry *t, const telemetry_step *s)
{
    char *b = t->fmt + SEQ_PREFIX_MAX;
    if (s->kind == MSG_EVENT)
        return proto_write_event_body(b, proto_level_parse(s->level), s->text, strlen(s->text), s->time);
    if (s->kind == MSG_END) return proto_write_end_body(b, proto_status_parse(s->level));
    struct proto_step_view v = {
        .step = s->step, .time = s->time, .L = t->L, .H = t->H,
        .n_scalar = s->n_scalar, .n_layer = s->n_layer, .n_head = s->n_head,
        .scalar_names = (const proto_name *)s->scalar_names, .scalars = s->scalars,
        .layer_names = (const proto_name *)s->layer_names, .layers = s->layers,
        .head_names = (const proto_name *)s->head_names, .heads = s->heads,
    };
    return proto_write_step_body(b, &v);
}

/* Sends a warn event about losses once the spool has room for it. */
static void report_drops(telemetry *t)
{
    uint64_t q = ST_GET(t, st_dropped_queue), s = ST_GET(t, st_dropped_spool),
             o = ST_GET(t, st_dropped_oversize);
    if (q + s + o == t->reported_drops || t->spool_total + t->wlen + 1024 > t->spool_max) return;
    char text[256];
    int tn = snprintf(text, sizeof text,
                      "telemetry client dropped %llu messages so far (queue full: %llu, spool full: %llu, "
                      "over 4 MiB: %llu)",
                      (unsigned long long)(q + s + o), (unsigned long long)q, (unsigned long long)s,
                      (unsigned long long)o);
    char *b = t->fmt + SEQ_PREFIX_MAX;
    size_t n = proto_write_event_body(b, PROTO_WARN, text, (size_t)tn, telemetry_now());
    if (spool_add(t, b, n) == 0) t->reported_drops = q + s + o;
}

/* Moves up to DRAIN_BATCH messages from the ring into the spool. */
static int drain_ring(telemetry *t)
{
    size_t tl = atomic_load_explicit(&t->tail, memory_order_relaxed);
    size_t h = atomic_load_explicit(&t->head, memory_order_acquire);
    int n = 0;
    if (tl != h) report_drops(t);
    while (tl != h && n < DRAIN_BATCH) {
        telemetry_step *s = &t->slots[tl % t->cap];
        size_t blen = format_body(t, s);
        free(s->text);
        s->text = NULL;
        atomic_store_explicit(&t->tail, ++tl, memory_order_release);
        if (blen + SEQ_PREFIX_MAX > LINE_MAX_BYTES) /* the daemon would refuse it */
            ST_ADD(t, st_dropped_oversize, 1);
        else
            spool_add(t, t->fmt + SEQ_PREFIX_MAX, blen);
        n++;
    }
    spool_flush(t);
    if (n) atomic_fetch_add_explicit(&t->done, (uint64_t)n, memory_order_release);
    return n;
}

/* ---------------------------------------------------------------- connection */

static void disconnect(telemetry *t, int failed_connect)
{
    if (t->fd >= 0) close(t->fd);
    t->fd = -1;
    t->olen = t->ooff = t->ilen = 0;
    t->iskip = 0;
    if (t->rd_fd >= 0) close(t->rd_fd);
    t->rd_fd = -1;
    if (failed_connect) ST_ADD(t, st_connect_failures, 1);
    atomic_store_explicit(&t->st_connected, 0, memory_order_relaxed);
    if (t->cstate != C_STOPPED) t->cstate = C_DOWN;
    t->next_attempt = now_ns() + (uint64_t)t->backoff * 1000000u;
    t->backoff = t->backoff * 2 > t->backoff_max ? t->backoff_max : t->backoff * 2;
}

static void connected(telemetry *t)
{
    t->cstate = C_HELLO;
    t->deadline = now_ns() + (uint64_t)WELCOME_TIMEOUT_MS * 1000000u;
    memcpy(t->obuf, t->hello, t->hello_len);
    t->olen = t->hello_len;
    t->ooff = 0;
    t->hello_nl = 1;
}

static void start_connect(telemetry *t)
{
    int fd = -1, rc;
    if (t->is_unix) {
        struct sockaddr_un sa;
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        memcpy(sa.sun_path, t->unix_path, strlen(t->unix_path));
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) goto fail;
        rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    } else {
        /* getaddrinfo may block on DNS; it runs in the sender thread only. */
        struct addrinfo hints, *ai = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_socktype = SOCK_STREAM;
        if (getaddrinfo(t->host, t->port, &hints, &ai) || !ai) goto fail;
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) { freeaddrinfo(ai); goto fail; }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        freeaddrinfo(ai);
    }
    t->fd = fd;
    if (rc == 0) { connected(t); return; }
    if (errno == EINPROGRESS) {
        t->cstate = C_CONNECTING;
        t->deadline = now_ns() + (uint64_t)CONNECT_TIMEOUT_MS * 1000000u;
        return;
    }
    disconnect(t, 1);
    return;
fail:
    if (fd >= 0) close(fd);
    disconnect(t, 1);
}

/* Positions the spool reader on the line with seq `seq`. */
static void reader_seek(telemetry *t, uint64_t seq)
{
    if (t->rd_fd >= 0) close(t->rd_fd);
    t->rd_fd = -1;
    t->rd_first = seq;
    t->rd_off = 0;
    if (t->nsegs == 0) return;
    size_t i = t->nsegs - 1;
    while (i > 0 && t->segs[i].first > seq) i--;
    t->rd_first = t->segs[i].first;
    t->rd_off = 0;
    uint64_t skip = seq - t->segs[i].first;
    if (skip == 0) return;
    char *p = seg_path(t, t->rd_first);
    t->rd_fd = p ? open(p, O_RDONLY | O_CLOEXEC) : -1;
    free(p);
    if (t->rd_fd < 0) { t->rd_off = t->segs[i].size; return; }
    char buf[65536];
    while (t->rd_off < t->segs[i].size) {
        uint64_t want = t->segs[i].size - t->rd_off;
        ssize_t r = pread(t->rd_fd, buf, want < sizeof buf ? want : sizeof buf, (off_t)t->rd_off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        for (ssize_t k = 0; k < r; k++) {
            if (buf[k] == '\n' && --skip == 0) { t->rd_off += (uint64_t)k + 1; return; }
        }
        t->rd_off += (uint64_t)r;
    }
}

/* Rewrites every unacknowledged spool line with consecutive seqs from
 * `from` into one new segment. Used when the daemon already holds more of
 * the run than the spool knows (the spool was lost, or the run name reused):
 * lines we numbered at or below its last_seq were never stored (the daemon
 * took them for duplicates), so they get new numbers instead of being lost.
 * Returns the number of lines renumbered, -1 on I/O failure. */
static long spool_renumber(telemetry *t, uint64_t from)
{
    size_t pn = strlen(t->dir) + 20;
    char *tmp = malloc(pn);
    if (!tmp) return -1;
    snprintf(tmp, pn, "%s/renumber.tmp", t->dir);
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    uint64_t seq = from, size = 0;
    long n = 0;
    char *buf = NULL;
    if (out < 0) goto fail;
    for (size_t i = 0; i < t->nsegs; i++) {
        segment *sg = &t->segs[i];
        char *p = seg_path(t, sg->first);
        int fd = p ? open(p, O_RDONLY | O_CLOEXEC) : -1;
        free(p);
        if (fd < 0) goto fail;
        free(buf);
        buf = malloc(sg->size + 1);
        ssize_t r = buf ? pread(fd, buf, sg->size, 0) : -1;
        close(fd);
        if (r != (ssize_t)sg->size) goto fail;
        uint64_t old = sg->first;
        for (char *line = buf, *end = buf + sg->size; line < end; old++) {
            char *nl = memchr(line, '\n', (size_t)(end - line));
            char *body = memchr(line, ',', (size_t)(end - line));
            if (!nl || !body || body > nl) break;
            body++;
            if (old > t->acked) {
                char pre[SEQ_PREFIX_MAX];
                size_t plen = proto_write_seq_prefix(pre, seq++);
                size_t blen = (size_t)(nl + 1 - body);
                if (write(out, pre, plen) != (ssize_t)plen ||
                    write(out, body, blen) != (ssize_t)blen)
                    goto fail;
                size += plen + blen;
                n++;
            }
            line = nl + 1;
        }
    }
    free(buf);
    buf = NULL;
    close(out);
    out = -1;
    char *dst = seg_path(t, from);
    if (!dst || rename(tmp, dst)) { free(dst); goto fail; }
    free(dst);
    free(tmp);
    for (size_t i = 0; i < t->nsegs; i++)
        if (t->segs[i].first != from) spool_unlink(t, t->segs[i].first);
    t->nsegs = 0;
    seg_push(t, from, size); /* capacity exists: nsegs was >= 1 */
    t->spool_total = size;
    t->next_seq = seq;
    ST_SET(t, st_next_seq, t->next_seq);
    ST_SET(t, st_spool_bytes, t->spool_total);
    if (t->wfd >= 0) close(t->wfd);
    t->next_seq = from;
    spool_rotate(t); /* reopens seg-FROM for appending */
    t->next_seq = seq;
    return n;
fail:
    if (out >= 0) close(out);
    unlink(tmp);
    free(tmp);
    free(buf);
    return -1;
}

static void on_welcome(telemetry *t, uint64_t last)
{
    if (last >= t->next_seq) {
        uint64_t was = t->next_seq - 1;
        long n = spool_renumber(t, last + 1);
        if (n >= 0) {
            inbox_note(t, "seq_reset",
                       "daemon has seq %llu, spool was at %llu; %ld unsent messages renumbered from %llu",
                       (unsigned long long)last, (unsigned long long)was, n,
                       (unsigned long long)last + 1);
        } else {
            /* Cannot rewrite: continue after the daemon, losing the spool. */
            for (size_t i = 0; i < t->nsegs; i++) spool_unlink(t, t->segs[i].first);
            t->nsegs = 0;
            t->spool_total = 0;
            t->next_seq = last + 1;
            ST_SET(t, st_next_seq, t->next_seq);
            spool_rotate(t);
            inbox_note(t, "spool_error", "renumbering the spool failed (%s); unsent messages dropped",
                       strerror(errno));
        }
    } else if (t->nsegs && last + 1 < t->segs[0].first) {
        /* Messages the daemon never committed are gone from the spool (the
         * daemon lost data it had acknowledged): it would answer seq_gap to
         * everything. Stop; the spool keeps the rest. */
        inbox_note(t, "seq_lost", "daemon expects seq %llu but the spool starts at %llu; stopped",
                   (unsigned long long)last + 1, (unsigned long long)t->segs[0].first);
        t->cstate = C_STOPPED;
        disconnect(t, 0);
        return;
    }
    if (last > t->acked) t->acked = last;
    ST_SET(t, st_acked, t->acked);
    spool_trim(t);
    reader_seek(t, last + 1);
    t->cstate = C_STREAMING;
    t->backoff = t->backoff_min;
    ST_ADD(t, st_connects, 1);
    atomic_store_explicit(&t->st_connected, 1, memory_order_relaxed);
}

static void handle_line(telemetry *t, const char *line, size_t len)
{
    struct proto_reply r;
    proto_parse_reply(line, len, &r);
    if (r.type == PROTO_R_WELCOME) {
        if (t->cstate == C_HELLO) {
            inbox_push(t, line, len);
            on_welcome(t, r.last_seq);
        }
    } else if (r.type == PROTO_R_ACK) {
        if (r.seq > t->acked && r.seq < t->next_seq) {
            t->acked = r.seq;
            ST_SET(t, st_acked, t->acked);
            spool_trim(t);
        }
    } else if (strcmp(r.type_name, "ack") && strcmp(r.type_name, "welcome")) {
        if (r.type == PROTO_R_ERROR) ST_ADD(t, st_errors, 1);
        inbox_push(t, line, len);
        if (r.code == PROTO_E_SEQ_GAP) {
            /* A new hello makes the daemon state where to resume. */
            t->backoff = t->backoff_min;
            disconnect(t, 0);
            t->next_attempt = 0;
        } else if (r.code == PROTO_E_SUPERSEDED) {
            /* Another client owns the run now; fighting it helps no one. */
            t->cstate = C_STOPPED;
            disconnect(t, 0);
        }
    }
}

static void do_read(telemetry *t)
{
    for (;;) {
        ssize_t r = recv(t->fd, t->ibuf + t->ilen, IBUF_CAP - t->ilen, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r <= 0) { disconnect(t, 0); return; }
        t->ilen += (size_t)r;
        size_t start = 0;
        for (size_t i = t->ilen - (size_t)r; i < t->ilen; i++) {
            if (t->ibuf[i] != '\n') continue;
            size_t n = i - start;
            if (n && t->ibuf[i - 1] == '\r') n--;
            if (!t->iskip && n) handle_line(t, t->ibuf + start, n);
            t->iskip = 0;
            start = i + 1;
            if (t->fd < 0) return; /* the line closed the connection */
        }
        memmove(t->ibuf, t->ibuf + start, t->ilen - start);
        t->ilen -= start;
        if (t->ilen == IBUF_CAP) { t->iskip = 1; t->ilen = 0; }
    }
}

static void count_sent(telemetry *t, const char *p, size_t n)
{
    uint64_t nl = 0;
    const char *e = p + n;
    while ((p = memchr(p, '\n', (size_t)(e - p)))) { nl++; p++; }
    if (nl && t->hello_nl) { nl--; t->hello_nl = 0; }
    if (nl) ST_ADD(t, st_sent, nl);
}

static void do_write(telemetry *t)
{
    while (t->ooff < t->olen) {
        ssize_t w = send(t->fd, t->obuf + t->ooff, t->olen - t->ooff, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (w <= 0) { disconnect(t, 0); return; }
        count_sent(t, t->obuf + t->ooff, (size_t)w);
        t->ooff += (size_t)w;
    }
    t->olen = t->ooff = 0;
}

/* Refills the output buffer from the spool reader. */
static void fill_obuf(telemetry *t)
{
    if (t->ooff == t->olen) t->olen = t->ooff = 0;
    while (t->olen < OBUF_CAP) {
        size_t i = 0;
        while (i < t->nsegs && t->segs[i].first < t->rd_first) i++;
        if (i == t->nsegs) return;
        if (t->segs[i].first != t->rd_first) { /* ours was trimmed: go on */
            if (t->rd_fd >= 0) close(t->rd_fd);
            t->rd_fd = -1;
            t->rd_first = t->segs[i].first;
            t->rd_off = 0;
        }
        segment *s = &t->segs[i];
        if (t->rd_off >= s->size) {
            if (i + 1 == t->nsegs) return;
            if (t->rd_fd >= 0) close(t->rd_fd);
            t->rd_fd = -1;
            t->rd_first = t->segs[i + 1].first;
            t->rd_off = 0;
            continue;
        }
        if (t->rd_fd < 0) {
            char *p = seg_path(t, t->rd_first);
            t->rd_fd = p ? open(p, O_RDONLY | O_CLOEXEC) : -1;
            free(p);
            if (t->rd_fd < 0) { t->rd_off = s->size; continue; } /* lost: skip */
        }
        uint64_t want = s->size - t->rd_off, room = OBUF_CAP - t->olen;
        ssize_t r = pread(t->rd_fd, t->obuf + t->olen, want < room ? want : room, (off_t)t->rd_off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { t->rd_off = s->size; continue; }
        t->olen += (size_t)r;
        t->rd_off += (uint64_t)r;
    }
}

static void *sender_main(void *arg)
{
    telemetry *t = arg;
    int idle = 1;
    while (!atomic_load_explicit(&t->stop, memory_order_acquire)) {
        /* The producer never wakes us (that would be a syscall on its hot
         * path): poll the ring, more slowly the longer it stays empty, so an
         * idle client wakes ~60 times a second and a busy one sees new
         * messages within a millisecond or two. */
        int busy = drain_ring(t);
        int timeout = busy ? 0 : idle;
        idle = busy ? 1 : (idle * 2 > TICK_MAX_MS ? TICK_MAX_MS : idle * 2);
        uint64_t now = now_ns();
        if (t->has_address) {
            if (t->cstate == C_DOWN && now >= t->next_attempt) start_connect(t);
            if ((t->cstate == C_HELLO || t->cstate == C_CONNECTING) && now > t->deadline)
                disconnect(t, t->cstate == C_CONNECTING);
            if (t->cstate == C_STREAMING) fill_obuf(t);
        }
        if (t->fd < 0) {
            if (timeout) sleep_ms(timeout);
            continue;
        }
        struct pollfd pf = { t->fd, POLLIN, 0 };
        if (t->cstate == C_CONNECTING || t->olen > t->ooff) pf.events |= POLLOUT;
        int pr = poll(&pf, 1, timeout);
        if (pr <= 0) continue;
        if (t->cstate == C_CONNECTING) {
            int e = 0;
            socklen_t el = sizeof e;
            if (getsockopt(t->fd, SOL_SOCKET, SO_ERROR, &e, &el) || e) disconnect(t, 1);
            else if (pf.revents & (POLLOUT | POLLERR | POLLHUP)) connected(t);
            continue;
        }
        if (pf.revents & (POLLIN | POLLHUP | POLLERR)) do_read(t);
        if (t->fd >= 0 && (pf.revents & POLLOUT)) do_write(t);
    }
    /* Whatever is still in the ring goes to the spool for a later client. */
    while (drain_ring(t)) {}
    return NULL;
}

/* ---------------------------------------------------------------- spool upload */

/* SPOOL_DIR/RUN/hello.json: the hello without token, replaced atomically. */
static int write_hello_file(telemetry *t)
{
    size_t n = strlen(t->dir) + 24;
    char *tmp = malloc(n), *fin = malloc(n);
    int rc = -1, fd = -1;
    if (!tmp || !fin) goto out;
    snprintf(tmp, n, "%s/hello.json.tmp", t->dir);
    snprintf(fin, n, "%s/hello.json", t->dir);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) goto out;
    const char tail[] = "}\n";
    if (write(fd, t->hello, t->hello_public_len) != (ssize_t)t->hello_public_len ||
        write(fd, tail, 2) != 2)
        goto out;
    if (close(fd)) { fd = -1; goto out; }
    fd = -1;
    rc = rename(tmp, fin);
out:
    if (fd >= 0) close(fd);
    if (rc && tmp) unlink(tmp);
    free(tmp);
    free(fin);
    return rc;
}

/* After the sender stopped: when the daemon acknowledged everything, the
 * segments go and one empty segment named after next_seq keeps the
 * numbering, so the directory says "nothing to upload". */
static void spool_compact(telemetry *t)
{
    if (!t->has_address || t->acked + 1 < t->next_seq || !t->nsegs) return;
    if (t->nsegs == 1 && t->segs[0].first == t->next_seq && t->segs[0].size == 0) return;
    size_t n = t->nsegs;
    segment *old = malloc(n * sizeof *old);
    if (!old) return;
    memcpy(old, t->segs, n * sizeof *old);
    t->nsegs = 0;
    t->spool_total = 0;
    if (spool_rotate(t) == 0)
        for (size_t i = 0; i < n; i++)
            if (old[i].first != t->next_seq) spool_unlink(t, old[i].first);
    free(old);
}

/* 1 when DIR holds a segment with bytes in it. */
static int dir_has_data(const char *dir)
{
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

static char *read_small_file(const char *path, size_t max)
{
    FILE *f = fopen(path, "re");
    if (!f) return NULL;
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max, f) : 0;
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

enum { UP_NOTHING, UP_DONE, UP_LEFT, UP_BUSY };

/* Uploads ROOT/RUN: a client for that run (its shape and meta from
 * hello.json), waiting until everything is acknowledged, timeout_ms passed
 * or *stop is set. Fills msg with what happened. */
static int upload_run(const char *address, const char *root, const char *run, const char *token,
                      int timeout_ms, atomic_int *stop, char *msg, size_t msglen)
{
    size_t n = strlen(root) + strlen(run) + 16;
    char *dir = malloc(n), *hp = malloc(n);
    char *text = NULL, *meta = NULL;
    cJSON *h = NULL;
    telemetry *c = NULL;
    int rc = UP_LEFT;
    if (!dir || !hp) { snprintf(msg, msglen, "run %s: out of memory", run); goto out; }
    snprintf(dir, n, "%s/%s", root, run);
    snprintf(hp, n, "%s/hello.json", dir);
    if (!dir_has_data(dir)) { rc = UP_NOTHING; goto out; }
    text = read_small_file(hp, (2u << 20));
    h = text ? cJSON_Parse(text) : NULL;
    const cJSON *L = cJSON_GetObjectItemCaseSensitive(h, "layers");
    const cJSON *H = cJSON_GetObjectItemCaseSensitive(h, "heads");
    const cJSON *T = cJSON_GetObjectItemCaseSensitive(h, "seq_len");
    const cJSON *M = cJSON_GetObjectItemCaseSensitive(h, "meta");
    if (!cJSON_IsNumber(L) || !cJSON_IsNumber(H) || !cJSON_IsNumber(T)) {
        snprintf(msg, msglen, "run %s: no readable hello.json (spooled by an older client?); "
                 "upload it with its shape given", run);
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
    cfg.meta_json = meta;
    cfg.token = token;
    cfg.spool_dir = root;
    cfg.queue_slots = 16;
    cfg.max_scalars = cfg.max_layer_metrics = cfg.max_head_metrics = 1;
    cfg.no_spool_upload = 1;
    char err[256];
    c = telemetry_create(&cfg, err, sizeof err);
    if (!c) {
        int busy = strstr(err, "in use") != NULL;
        snprintf(msg, msglen, "run %s: %s", run, err);
        rc = busy ? UP_BUSY : UP_LEFT;
        goto out;
    }
    uint64_t end = now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    while (!settled(c) && now_ns() < end && !(stop && atomic_load(stop))) sleep_ms(10);
    telemetry_stats st;
    telemetry_get_stats(c, &st);
    rc = settled(c) ? UP_DONE : UP_LEFT;
    if (rc == UP_DONE)
        snprintf(msg, msglen, "run %s: spool uploaded, acknowledged up to seq %llu", run,
                 (unsigned long long)st.acked);
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
static int for_each_run(const char *root, const char *skip, int (*fn)(void *, const char *),
                        void *arg)
{
    struct dirent **names = NULL;
    int n = scandir(root, &names, NULL, alphasort);
    if (n < 0) return -1;
    int stop = 0;
    for (int i = 0; i < n; i++) {
        const char *r = names[i]->d_name;
        if (!stop && valid_run(r) && strcmp(r, ".") && strcmp(r, "..") &&
            !(skip && !strcmp(r, skip)) && names[i]->d_type == DT_DIR)
            stop = fn(arg, r);
        free(names[i]);
    }
    free(names);
    return 0;
}

static int uploader_one(void *arg, const char *run)
{
    telemetry *t = arg;
    char msg[400];
    if (atomic_load(&t->up_stop)) return 1;
    int rc = upload_run(t->address, t->root, run, t->token, 24 * 3600 * 1000, &t->up_stop, msg,
                        sizeof msg);
    if (rc == UP_DONE) inbox_note(t, "uploaded", "%s", msg);
    else if (rc == UP_LEFT) inbox_note(t, "upload_failed", "%s", msg);
    return atomic_load(&t->up_stop);
}

static void *uploader_main(void *arg)
{
    telemetry *t = arg;
    for_each_run(t->root, t->run, uploader_one, t);
    atomic_store(&t->up_done, 1);
    return NULL;
}

typedef struct upload_all_ctx {
    const char *address, *root, *token;
    int timeout_ms, left;
    FILE *log;
} upload_all_ctx;

static int upload_all_one(void *arg, const char *run)
{
    upload_all_ctx *u = arg;
    char msg[400];
    int rc = upload_run(u->address, u->root, run, u->token, u->timeout_ms, NULL, msg, sizeof msg);
    if (rc == UP_LEFT) u->left++;
    if (u->log && rc != UP_NOTHING) fprintf(u->log, "entropyd upload: %s\n", msg);
    return 0;
}

int telemetry_upload_all(const char *address, const char *spool_dir, const char *token,
                         int timeout_ms, FILE *log, char *err, size_t errlen)
{
    if (!address || !spool_dir) {
        set_err(err, errlen, "uploading needs an address and a spool directory");
        return -1;
    }
    upload_all_ctx u = { address, spool_dir, token, timeout_ms, 0, log };
    if (for_each_run(spool_dir, NULL, upload_all_one, &u)) {
        set_err(err, errlen, "spool %s: %s", spool_dir, strerror(errno));
        return -1;
    }
    return u.left;
}

int telemetry_finish(telemetry *t, const char *status, int grace_ms, FILE *progress)
{
    if (!t) return TELEMETRY_OK;
    if (status && !valid_status(status)) return TELEMETRY_EINVAL;
    if (grace_ms < 0) grace_ms = 30000;
    uint64_t start = now_ns(), end = start + (uint64_t)grace_ms * 1000000u;
    if (status && t->thread_started) {
        while (enqueue_other(t, MSG_END, status, NULL) == TELEMETRY_EFULL && now_ns() < end) {
            atomic_fetch_sub_explicit(&t->st_dropped_queue, 1, memory_order_relaxed);
            sleep_ms(1);
        }
    }
    uint64_t next_line = start + 1000000000u;
    /* the background uploads of other runs get the same grace period */
    while (t->thread_started && (!settled(t) || (t->up_started && !atomic_load(&t->up_done))) &&
           now_ns() < end) {
        sleep_ms(5);
        uint64_t now = now_ns();
        if (progress && now >= next_line) {
            telemetry_stats st;
            telemetry_get_stats(t, &st);
            fprintf(progress,
                    "entropyd client: run %s: %llu of %llu messages acknowledged, %s%s; "
                    "waiting up to %.0f s more for the daemon\n",
                    t->run, (unsigned long long)st.acked, (unsigned long long)(st.next_seq - 1),
                    st.connected ? "connected" : "reconnecting",
                    settled(t) ? ", uploading other runs of the spool" : "", (double)(end - now) / 1e9);
            fflush(progress);
            next_line = now + 1000000000u;
        }
    }
    int rc = settled(t) ? TELEMETRY_OK : TELEMETRY_ETIMEDOUT;
    if (progress && rc != TELEMETRY_OK) {
        telemetry_stats st;
        telemetry_get_stats(t, &st);
        fprintf(progress,
                "entropyd client: run %s: %llu of %llu messages acknowledged after the %.0f s grace "
                "period; the rest stays in the spool (the next client on this spool directory "
                "uploads it)\n",
                t->run, (unsigned long long)st.acked, (unsigned long long)(st.next_seq - 1),
                grace_ms / 1e3);
    }
    int rc2 = telemetry_destroy(t, NULL, 0);
    return rc == TELEMETRY_OK ? rc2 : rc;
}

/* ---------------------------------------------------------------- lifecycle */

static int parse_address(telemetry *t, const char *a, char *err, size_t errlen)
{
    if (!strncmp(a, "unix:", 5)) {
        size_t n = strlen(a + 5);
        if (n == 0 || n >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
            set_err(err, errlen, "address %s: bad unix socket path length", a);
            return -1;
        }
        t->is_unix = 1;
        t->unix_path = strdup(a + 5);
        return t->unix_path ? 0 : -1;
    }
    if (!strncmp(a, "tcp:", 4)) {
        const char *hp = a + 4, *colon = strrchr(hp, ':');
        if (!colon || colon == hp || !colon[1]) goto bad;
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (*end || port < 1 || port > 65535) goto bad;
        const char *h = hp, *he = colon;
        if (*h == '[' && he[-1] == ']') { h++; he--; }
        t->host = strndup(h, (size_t)(he - h));
        t->port = strdup(colon + 1);
        return t->host && t->port ? 0 : -1;
    }
bad:
    set_err(err, errlen, "address %s: expected unix:PATH or tcp:HOST:PORT", a);
    return -1;
}

static int build_hello(telemetry *t, const telemetry_config *c, char *err, size_t errlen)
{
    char *meta = NULL;
    if (c->meta_json) {
        cJSON *m = cJSON_Parse(c->meta_json);
        if (!cJSON_IsObject(m)) {
            cJSON_Delete(m);
            set_err(err, errlen, "meta_json is not a JSON object");
            return -1;
        }
        meta = cJSON_PrintUnformatted(m); /* one line, whatever the input */
        cJSON_Delete(m);
        if (!meta) return -1;
    }
    size_t cap = 256 + strlen(t->run) + (meta ? strlen(meta) : 0) + 6 * (c->token ? strlen(c->token) : 0);
    t->hello = malloc(cap);
    if (!t->hello) { free(meta); return -1; }
    t->hello_len = proto_write_hello(t->hello, cap, t->run, t->L, t->H, c->seq_len, meta, c->token,
                                     &t->hello_public_len);
    free(meta);
    if (t->hello_len == 0 || t->hello_len > OBUF_CAP) {
        set_err(err, errlen, "hello too long (meta over %d bytes)", OBUF_CAP);
        return -1;
    }
    return 0;
}

/* Carves every slot's arrays out of one allocation. */
static int alloc_slots(telemetry *t)
{
    size_t L = (size_t)t->L, LH = L * (size_t)t->H;
    size_t per = (size_t)t->max_s * (sizeof(name_t) + sizeof(float)) +
                 (size_t)t->max_l * (sizeof(name_t) + L * sizeof(float)) +
                 (size_t)t->max_h * (sizeof(name_t) + LH * sizeof(float));
    per = (per + 63) & ~(size_t)63;
    if (t->cap == 0) { /* default: 256 slots, or fewer within 64 MiB (big models) */
        t->cap = ((size_t)64 << 20) / per;
        if (t->cap > 256) t->cap = 256;
        if (t->cap < 16) t->cap = 16;
    }
    t->slots = calloc(t->cap, sizeof *t->slots);
    t->slot_mem = malloc(per * t->cap);
    if (!t->slots || !t->slot_mem) return -1;
    /* Touch every page now, so the hot path never takes a page fault.
     * (Not memset to 0: compilers turn malloc + memset(0) into calloc,
     * which leaves fresh mmap()ed pages untouched.) */
    for (size_t off = 0; off < per * t->cap; off += 4096) ((volatile char *)t->slot_mem)[off] = 1;
    for (size_t i = 0; i < t->cap; i++) {
        telemetry_step *s = &t->slots[i];
        char *m = t->slot_mem + i * per;
        s->owner = t;
        /* floats first: the 65-byte names would misalign them */
        s->scalars = (float *)m; m += (size_t)t->max_s * sizeof(float);
        s->layers = (float *)m; m += (size_t)t->max_l * L * sizeof(float);
        s->heads = (float *)m; m += (size_t)t->max_h * LH * sizeof(float);
        s->scalar_names = (name_t *)m; m += (size_t)t->max_s * sizeof(name_t);
        s->layer_names = (name_t *)m; m += (size_t)t->max_l * sizeof(name_t);
        s->head_names = (name_t *)m;
    }
    return 0;
}

telemetry *telemetry_create(const telemetry_config *c, char *err, size_t errlen)
{
    telemetry *t = calloc(1, sizeof *t);
    if (!t) { set_err(err, errlen, "out of memory"); return NULL; }
    t->lock_fd = t->wfd = t->fd = t->rd_fd = -1;
    if (pthread_mutex_init(&t->in_lock, NULL)) { free(t); set_err(err, errlen, "mutex"); return NULL; }
    t->in_lock_init = 1;
    if (c->layers < 1 || c->layers > 4096 || c->heads < 1 || c->heads > 4096 ||
        (long)c->layers * c->heads > 1048576 || c->seq_len < 1) {
        set_err(err, errlen, "bad shape: layers %d heads %d seq_len %d", c->layers, c->heads,
                c->seq_len);
        goto err;
    }
    t->L = c->layers;
    t->H = c->heads;
    t->max_s = c->max_scalars > 0 ? c->max_scalars : 64;
    t->max_l = c->max_layer_metrics > 0 ? c->max_layer_metrics : 32;
    t->max_h = c->max_head_metrics > 0 ? c->max_head_metrics : 16;
    if (t->max_s > METRICS_MAX || t->max_l > METRICS_MAX || t->max_h > METRICS_MAX) {
        set_err(err, errlen, "at most %d metrics of a kind per step (protocol v1)", METRICS_MAX);
        goto err;
    }
    t->cap = c->queue_slots; /* 0: sized by alloc_slots */
    t->spool_max = c->spool_max_bytes ? c->spool_max_bytes : (uint64_t)256 << 20;
    t->seg_bytes = t->spool_max / 8;
    if (t->seg_bytes < 4096) t->seg_bytes = 4096;
    if (t->seg_bytes > (16u << 20)) t->seg_bytes = 16u << 20;
    t->backoff_min = c->backoff_min_ms > 0 ? c->backoff_min_ms : 50;
    t->backoff_max = c->backoff_max_ms > 0 ? c->backoff_max_ms : 2000;
    if (t->backoff_max < t->backoff_min) t->backoff_max = t->backoff_min;
    t->backoff = t->backoff_min;

    if (c->run) {
        if (!valid_run(c->run)) {
            set_err(err, errlen, "bad run name \"%s\": 1..128 of [A-Za-z0-9._:@+-]", c->run);
            goto err;
        }
        snprintf(t->run, sizeof t->run, "%s", c->run);
    } else {
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        unsigned rnd = (unsigned)(now_ns() ^ ((uint64_t)getpid() << 16)) & 0xffffu;
        snprintf(t->run, sizeof t->run, "run-%04d%02d%02d-%02d%02d%02d-%d-%04x", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)getpid(), rnd);
    }
    if (c->address) {
        t->has_address = 1;
        if (parse_address(t, c->address, err, errlen)) goto err;
        t->address = strdup(c->address);
        if (!t->address) { set_err(err, errlen, "out of memory"); goto err; }
    }
    if (c->token && !(t->token = strdup(c->token))) { set_err(err, errlen, "out of memory"); goto err; }
    if (build_hello(t, c, err, errlen)) goto err;

    if (c->spool_dir) {
        t->root = strdup(c->spool_dir);
    } else {
        const char *tmp = getenv("TMPDIR");
        size_t n = strlen(tmp ? tmp : "/tmp") + 32;
        t->root = malloc(n);
        if (t->root) {
            snprintf(t->root, n, "%s/telemetry-XXXXXX", tmp ? tmp : "/tmp");
            if (!mkdtemp(t->root)) {
                set_err(err, errlen, "mkdtemp %s: %s", t->root, strerror(errno));
                goto err;
            }
            t->root_is_tmp = 1;
        }
    }
    if (!t->root) { set_err(err, errlen, "out of memory"); goto err; }
    size_t dn = strlen(t->root) + strlen(t->run) + 2;
    t->dir = malloc(dn);
    if (!t->dir) { set_err(err, errlen, "out of memory"); goto err; }
    snprintf(t->dir, dn, "%s/%s", t->root, t->run);
    if (spool_open(t, err, errlen)) goto err;
    if (!t->root_is_tmp && write_hello_file(t)) {
        set_err(err, errlen, "spool: writing %s/hello.json: %s", t->dir, strerror(errno));
        goto err;
    }
    ST_SET(t, st_next_seq, t->next_seq);
    ST_SET(t, st_spool_bytes, t->spool_total);
    /* Nothing older than the spool's first line can still be unacknowledged. */
    t->acked = t->segs[0].first - 1;
    ST_SET(t, st_acked, t->acked);

    size_t body = step_body_max(t);
    if (body < 6 * EVENT_TEXT_MAX + 256) body = 6 * EVENT_TEXT_MAX + 256;
    t->fmtcap = SEQ_PREFIX_MAX + body;
    t->fmt = malloc(t->fmtcap);
    t->wbuf = malloc(WBUF_CAP);
    t->obuf = malloc(OBUF_CAP);
    t->ibuf = malloc(IBUF_CAP);
    if (!t->fmt || !t->wbuf || !t->obuf || !t->ibuf || alloc_slots(t)) {
        set_err(err, errlen, "out of memory");
        goto err;
    }

    /* The sender takes no signals: they belong to the program. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&t->thread, NULL, sender_main, t);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        set_err(err, errlen, "pthread_create: %s", strerror(rc));
        goto err;
    }
    t->thread_started = 1;
    if (t->has_address && !t->root_is_tmp && !c->no_spool_upload) {
        pthread_sigmask(SIG_SETMASK, &all, &old);
        rc = pthread_create(&t->up_thread, NULL, uploader_main, t);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc) {
            set_err(err, errlen, "pthread_create: %s", strerror(rc));
            goto err;
        }
        t->up_started = 1;
    }
    return t;
err:
    telemetry_destroy(t, NULL, 0);
    return NULL;
}

static void remove_tmp_spool(telemetry *t)
{
    for (size_t i = 0; i < t->nsegs; i++) spool_unlink(t, t->segs[i].first);
    size_t n = strlen(t->dir) + 8;
    char *p = malloc(n);
    if (p) {
        snprintf(p, n, "%s/lock", t->dir);
        unlink(p);
    }
    free(p);
    rmdir(t->dir);
    rmdir(t->root);
}

int telemetry_destroy(telemetry *t, const char *status, int timeout_ms)
{
    if (!t) return TELEMETRY_OK;
    if (status && !valid_status(status)) return TELEMETRY_EINVAL;
    int rc = TELEMETRY_OK;
    if (t->thread_started) {
        uint64_t end = now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
        if (status) {
            /* The end must not be lost to a momentarily full ring. */
            while (enqueue_other(t, MSG_END, status, NULL) == TELEMETRY_EFULL && now_ns() < end) {
                atomic_fetch_sub_explicit(&t->st_dropped_queue, 1, memory_order_relaxed);
                sleep_ms(1);
            }
        }
        uint64_t left = now_ns() < end ? (end - now_ns()) / 1000000u : 0;
        rc = telemetry_flush(t, (int)left);
    }
    if (t->up_started) {
        atomic_store_explicit(&t->up_stop, 1, memory_order_release);
        pthread_join(t->up_thread, NULL);
    }
    if (t->thread_started) {
        atomic_store_explicit(&t->stop, 1, memory_order_release);
        pthread_join(t->thread, NULL);
        if (!t->root_is_tmp && settled(t)) spool_compact(t);
    }
    telemetry_msg m;
    while (t->thread_started && telemetry_poll(t, &m)) telemetry_msg_free(&m);
    if (t->fd >= 0) close(t->fd);
    if (t->rd_fd >= 0) close(t->rd_fd);
    if (t->wfd >= 0) close(t->wfd);
    if (t->root_is_tmp && t->dir) remove_tmp_spool(t);
    if (t->lock_fd >= 0) close(t->lock_fd);
    for (size_t i = 0; t->slots && i < t->cap; i++) free(t->slots[i].text);
    free(t->slots);
    free(t->slot_mem);
    free(t->segs);
    free(t->fmt);
    free(t->wbuf);
    free(t->obuf);
    free(t->ibuf);
    free(t->hello);
    free(t->unix_path);
    free(t->address);
    free(t->token);
    if (t->in_lock_init) pthread_mutex_destroy(&t->in_lock);
    free(t->host);
    free(t->port);
    free(t->root);
    free(t->dir);
    free(t);
    return rc;
}
