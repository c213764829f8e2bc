/* telemetry_int.h -- the client library's inside: the struct every part
 * of it shares and the functions they call in one another.  Not installed;
 * the contract for programs is telemetry.h.
 *
 * The parts (one job a file):
 *   lifecycle.c  configuration, create / destroy / finish, counters, flush
 *   ring.c       the producer's ring of preallocated slots (telemetry_step_*,
 *                telemetry_event) and the sender's end of it (telemetry_ring_drain)
 *   spool.c      the on-disk write-ahead log: segments, framing, recovery,
 *                trimming, renumbering, hello.json
 *   spool_read.c reading it back record by record, naming and skipping
 *                damage (the stream to the daemon, recovery, renumbering)
 *   conn.c       the sender thread: the connection's state machine, the
 *                daemon's lines, streaming the spool
 *   inbox.c      lines for telemetry_poll (from the daemon and the client)
 *   upload.c     uploading other runs' spools (telemetry_upload_all and the
 *                background uploader)
 * The protocol's lines themselves are written and parsed by proto/. */
#ifndef TELEMETRY_INT_H
#define TELEMETRY_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "now.h"
#include "proto.h"
#include "telemetry.h"

#define TICK_MAX_MS 16       /* sender idle poll, unpaced: bounds enqueue->spool latency */
#define SEND_INTERVAL_MS 100 /* telemetry_config.send_interval_ms's default */
#define INBOX_CAP 64
#define OBUF_CAP (256 * 1024)
#define IBUF_CAP (1024 * 1024) /* daemon lines longer than this are skipped */
#define WBUF_CAP (256 * 1024)
#define EVENT_TEXT_MAX PROTO_MAX_TEXT
#define SEQ_PREFIX_MAX PROTO_SEQ_PREFIX_MAX
/* A spool record (spool_read.c): "#LEN CRC " before the payload; LEN <= 10
 * digits, CRC 8 hex digits. A body is formatted BODY_AT bytes into fmt so
 * that the frame and the seq go in front of it without a copy. */
#define FRAME_HDR_MAX 21
#define BODY_AT (FRAME_HDR_MAX + SEQ_PREFIX_MAX)
#define TM_SPOOL_MAGIC "entropyd-spool 2\n"
#define WELCOME_TIMEOUT_MS 10000
#define CONNECT_TIMEOUT_MS 2000
#define CONNECT_SPACING_MS 250 /* at most 4 connection attempts a second, whatever happens */
#define CONNECT_STABLE_MS 5000 /* a connection up this long resets the backoff */
#define DRAIN_BATCH 256
#define METRICS_MAX PROTO_MAX_METRICS

/* The public header stands alone (it is installed without proto.h). */
_Static_assert(TELEMETRY_NAME_MAX == PROTO_MAX_NAME, "metric name limit");
_Static_assert(TELEMETRY_RUN_MAX == PROTO_MAX_RUN, "run name limit");

enum { MSG_STEP, MSG_EVENT, MSG_END };
enum { C_DOWN, C_CONNECTING, C_HELLO, C_STREAMING, C_STOPPED };

typedef proto_name name_t;

struct telemetry_step {
    telemetry *owner;
    int kind; /* MSG_* */
    int64_t step;
    double time; /* < 0: omitted */
    int n_scalar, n_layer, n_head;
    name_t *scalar_names; /* (max_scalars) */
    float *scalars;       /* (max_scalars) */
    name_t *layer_names;  /* (max_layer_metrics) */
    float *layers;        /* (max_layer_metrics, L) */
    name_t *head_names;   /* (max_head_metrics) */
    float *heads;         /* (max_head_metrics, L, H) */
    char level[16];       /* event level or end status */
    char *text;           /* event text, malloc()ed, freed by the sender */
};

typedef struct segment {
    uint64_t first; /* seq of its first record */
    uint64_t size;  /* bytes of complete records (and the magic line) */
} segment;

/* What a line of a segment is (spool_read.c): intact, the version line, or
 * a kind of damage. */
enum {
    TM_INTACT,
    TM_MAGIC,
    DMG_TORN,
    DMG_GARBAGE,
    DMG_LENGTH,
    DMG_CHECKSUM,
    DMG_UTF8,
    DMG_DUPLICATE,
    DMG_REFUSED,
    DMG_MISSING,
    DMG_COUNT
};

/* Reads one segment line by line; buf holds its bytes from base on. */
typedef struct telemetry_rd {
    int fd;
    uint64_t first, size; /* the segment; size: bytes that may be read */
    uint64_t off;         /* the next line's offset */
    int ver;              /* 0 not known yet, 1 bare lines, 2 framed */
    size_t max;           /* the longest line: the run's protocol limit and a frame */
    char *buf;
    size_t cap, len;
    uint64_t base;
} telemetry_rd;

/* One line: views into the reader's buffer, valid until its next line. */
typedef struct telemetry_line {
    uint64_t off;        /* its offset in the segment */
    size_t n;            /* its bytes, newline included */
    int kind;            /* TM_INTACT, TM_MAGIC or DMG_* */
    uint64_t seq;        /* intact: its seq */
    const char *raw;     /* the line itself */
    const char *payload; /* intact: the protocol line, without newline */
    size_t plen;
    char why[128]; /* damage: details, or "" */
} telemetry_line;

/* What the stream sends next: a record's payload, or a placeholder. */
typedef struct telemetry_record {
    const char *line; /* without newline */
    size_t len;
    uint64_t seq;
    int placeholder;
} telemetry_record;

#define REFUSED_MAX 16

struct telemetry {
    /* Configuration, immutable after create. */
    char run[TELEMETRY_RUN_MAX + 1];
    int L, H;
    int max_s, max_l, max_h;
    int has_address, is_unix;
    char *unix_path, *tcp_addr; /* tcp_addr: "HOST:PORT", resolved at each connect */
    char *hello;
    size_t hello_len;
    size_t hello_public_len; /* the hello's bytes before its token */
    char *address, *token;   /* copies, for the background uploader */
    char *root;              /* spool root */
    char *dir;               /* root/run */
    int root_is_tmp;
    int lock_fd;
    uint64_t spool_max, seg_bytes;
    int backoff_min, backoff_max;
    int interval_ms; /* send_interval_ms; 0: not paced */

    /* Ring: the producer owns head and the open slot, the sender owns tail. */
    size_t cap;
    telemetry_step *slots;
    char *slot_mem;
    _Atomic size_t head, tail;
    _Atomic uint64_t done; /* slots fully processed (spooled or dropped) */
    telemetry_step *open;
    /* Waking the sender out of a paced sleep (conn.c): wake_fd, an eventfd
     * it polls, is written by the producer once the ring is half full
     * (kicked: once until the sender drains) and by hurry_on; hurry > 0
     * while someone waits for the acks (flush, finish, destroy).
     * woken is set with each write to wake_fd; the sender clears both
     * before it drains the ring, so that a wake-up the drain answered does
     * not cut its next sleep short. asleep is 1 from after a drain of the
     * ring to the end of the paced sleep that follows it: a step enqueued
     * meanwhile waits for a wake-up (the tests read it to know the sender
     * is asleep). */
    int wake_fd;
    atomic_int kicked, hurry, woken, asleep;

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
    segment *segs;
    size_t nsegs, segcap;
    uint64_t spool_total;
    int wfd; /* append fd of the newest segment */
    uint64_t next_seq, acked;
    char *fmt;
    size_t fmtcap; /* body of one line, after BODY_AT bytes */
    char *wbuf;
    size_t wlen; /* lines waiting for one write() */
    unsigned wbuf_n;
    uint64_t reported_drops;
    int fd, cstate;
    uint64_t next_attempt, deadline; /* monotonic ns */
    uint64_t last_attempt, up_since; /* monotonic ns: the last connect, the last welcome */
    uint64_t rng;                    /* reconnect jitter's state */
    int backoff;
    int stream_was_up;
    char *obuf;
    size_t obuf_cap, olen, ooff; /* obuf_cap: OBUF_CAP, more for a larger record */
    int hello_nl;                /* the hello's newline is still in obuf */
    char *ibuf;
    size_t ilen;
    int iskip;
    /* The stream's reader (spool_read.c): rd_expect is the seq it sends
     * next, rd_maxseen the highest intact seq it read since the seek (an
     * intact record at or below it is a duplicate); rd_line is the line
     * read and not yet used (rd_have), rd_rec what peek returned
     * (rd_ready); rd_why the last damage met, for placeholders. */
    telemetry_rd rd;
    int rd_opened, rd_have, rd_ready;
    uint64_t rd_expect, rd_maxseen;
    telemetry_line rd_line;
    telemetry_record rd_rec;
    char rd_why[400];
    char *ph_buf; /* a placeholder line (PH_CAP) */
    /* Damage is named once: the furthest place named (segment, offset). */
    uint64_t dmg_first, dmg_off;
    int dmg_any;
    /* seqs the daemon refused for their content (conn.c): sent as
     * placeholders on the next connection */
    uint64_t refused_seqs[REFUSED_MAX];
    int n_refused;

    /* The daemon refused the hello (conn.c): refusal ("CODE: message") is
     * written by the sender once, before refused is set (release). */
    atomic_int refused;
    char refusal[320];

    /* Counters (see telemetry_stats). */
    _Atomic uint64_t st_enqueued, st_dropped_queue, st_dropped_spool, st_dropped_oversize, st_spooled, st_sent,
        st_acked, st_next_seq, st_spool_bytes, st_connects, st_connect_failures, st_errors, st_inbox_dropped,
        st_damaged; /* damaged records named (not in telemetry_stats: upload.c reads it) */
    atomic_int st_connected;
};

#define ST_ADD(t, f, n) atomic_fetch_add_explicit(&(t)->f, (uint64_t)(n), memory_order_relaxed)
#define ST_SET(t, f, v) atomic_store_explicit(&(t)->f, (v), memory_order_relaxed)
#define ST_GET(t, f) atomic_load_explicit(&(t)->f, memory_order_relaxed)

/* Monotonic nanoseconds (deadlines, backoff). */
static inline uint64_t telemetry_now_ns(void) { return (uint64_t)(now_mono_ms() * 1e6); }

/* ---- small helpers every part uses (here, so that no part calls back
 * into lifecycle.c, which stands above them all) */

static inline void telemetry_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

/* Formats into err[0..errlen) when err is not NULL. */
__attribute__((format(printf, 3, 4))) static inline void telemetry_set_err(char *err, size_t errlen, const char *fmt,
                                                                           ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* A run name is also a directory name: not "." or "..". */
static inline int telemetry_valid_run(const char *r) {
    return proto_valid_run(r, strnlen(r, TELEMETRY_RUN_MAX + 1)) && strcmp(r, ".") && strcmp(r, "..");
}

/* Everything enqueued has been processed by the sender and, with an
 * address, acknowledged. */
static inline int telemetry_settled(telemetry *t) {
    uint64_t done = atomic_load_explicit(&t->done, memory_order_acquire);
    if (done != atomic_load_explicit(&t->head, memory_order_relaxed)) return 0;
    if (!t->has_address) return 1;
    return ST_GET(t, st_acked) + 1 >= ST_GET(t, st_next_seq);
}

/* Wakes the sender out of its sleep (one eventfd write). Any thread. */
static inline void telemetry_wake(telemetry *t) {
    uint64_t one = 1;
    if (t->wake_fd < 0) return;
    atomic_store_explicit(&t->woken, 1, memory_order_release);
    while (write(t->wake_fd, &one, sizeof one) < 0 && errno == EINTR) {}
}

/* Library-internal: hidden from libentropyd_telemetry.so's exported symbols
 * (and left out of its version script, which names the public functions). */
#pragma GCC visibility push(hidden)

/* ring.c */
/* What an end may say (live and stale are the daemon's). */
int telemetry_valid_status(const char *s);
/* A non-step message (MSG_EVENT, MSG_END) into the ring; text (may be NULL)
 * is taken over.  TELEMETRY_OK or TELEMETRY_EFULL (counted). */
int telemetry_ring_put(telemetry *t, int kind, const char *level, char *text);
/* Allocates and touches the slots (t->cap 0: a default size).  0 / -1. */
int telemetry_ring_alloc(telemetry *t);
/* The sender: moves up to DRAIN_BATCH messages from the ring into the
 * spool; returns how many. */
int telemetry_ring_drain(telemetry *t);

/* inbox.c: producers are the sender and the uploader (under in_lock) */
void telemetry_inbox_push(telemetry *t, const char *line, size_t len);
/* A note from the client itself, type "client" with a code. */
void telemetry_inbox_note(telemetry *t, const char *code, const char *fmt, ...);

/* spool.c: every function but telemetry_spool_open and telemetry_spool_write_hello runs
 * on the sender thread (or after it stopped) */
char *telemetry_seg_path(const telemetry *t, uint64_t first); /* malloc()ed or NULL */
int telemetry_spool_open(telemetry *t, char *err, size_t errlen);
int telemetry_spool_write_hello(telemetry *t);
int telemetry_spool_rotate(telemetry *t);
void telemetry_spool_unlink(telemetry *t, uint64_t first);
void telemetry_spool_trim(telemetry *t);
int telemetry_spool_add(telemetry *t, char *body, size_t blen);
void telemetry_spool_flush(telemetry *t);
/* spool_read.c */
#define PH_CAP 8192
const char *telemetry_dmg_name(int kind);
/* Opens segment `first` (size bytes readable) for reading from off. 0 / -1. */
int telemetry_rd_open(telemetry_rd *r, const telemetry *t, uint64_t first, uint64_t size, uint64_t off);
/* The next line: 1 with *l filled, 0 at the end of what may be read. */
int telemetry_rd_line(telemetry_rd *r, telemetry_line *l);
void telemetry_rd_close(telemetry_rd *r); /* keeps the buffer */
void telemetry_rd_free(telemetry_rd *r);  /* closes and frees; fd must be -1 or open */
/* Names damage (an inbox note "spool_damage", st_damaged); once: not
 * again, nor anything before it, until the spool is rewritten. */
void telemetry_spool_damage(telemetry *t, uint64_t first, uint64_t off, int kind, const char *why, int once);
/* The stream: seek to seq; peek the next record to send (1, or 0 when
 * there is none now), valid until take, which consumes it. */
void telemetry_spool_seek(telemetry *t, uint64_t seq);
int telemetry_spool_peek(telemetry *t, telemetry_record *out);
void telemetry_spool_take(telemetry *t);
long telemetry_spool_renumber(telemetry *t, uint64_t from);
void telemetry_spool_compact(telemetry *t);
void telemetry_spool_remove(telemetry *t);

/* conn.c, upload.c: the threads' bodies (arg: the telemetry) */
void *telemetry_sender_main(void *arg);
void *telemetry_uploader_main(void *arg);

#pragma GCC visibility pop

#endif
