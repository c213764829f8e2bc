/* spool_read.c -- reading the spool back, record by record, surviving its
 * damage: the sender's stream from the welcome's last_seq + 1
 * (telemetry_spool_seek, telemetry_spool_peek, telemetry_spool_take), and the reader that
 * spool.c's recovery and renumbering use (telemetry_rd_*).
 *
 * Formats (docs/client.md, "The spool"): a version-2 segment starts with
 * the line TM_SPOOL_MAGIC and holds records "#LEN CRC PAYLOAD\n" (LEN the
 * payload's bytes in decimal, CRC its CRC32C in 8 hex digits, PAYLOAD one
 * protocol line without its newline, {"seq":N,...}); a version-1 segment
 * (clients before the framing) holds bare protocol lines, checked by
 * parsing them as the daemon does (a changed digit there cannot be seen).
 * A segment's version is that of its first recognizable line.
 *
 * Damage: a line that is not an intact record (torn, garbage, bad length,
 * bad checksum, invalid UTF-8) or an intact record whose seq was already
 * read (duplicate) is skipped and named once (an inbox note "spool_damage"
 * with the file and byte offset; counted in st_damaged). The seqs stay
 * gapless on the wire: a seq with no intact record (its record damaged, or
 * refused by the daemon) is sent as a warn event saying so, so the daemon
 * never answers seq_gap to what follows and every intact record after the
 * damage is delivered.
 *
 * What it is not: the writer (spool.c), the socket (conn.c). */
#include "telemetry_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c.h"

#define RBUF_MIN (64 * 1024)

static const char *const dmg_names[DMG_COUNT] = {
    [DMG_TORN] = "torn record (cut short)",
    [DMG_GARBAGE] = "garbage (not a record)",
    [DMG_LENGTH] = "bad length",
    [DMG_CHECKSUM] = "bad checksum",
    [DMG_UTF8] = "invalid UTF-8",
    [DMG_DUPLICATE] = "duplicate seq",
    [DMG_REFUSED] = "refused by the daemon",
    [DMG_MISSING] = "missing seqs",
};

const char *telemetry_dmg_name(int kind) { return kind >= 0 && kind < DMG_COUNT ? dmg_names[kind] : "damage"; }

/* ---- the reader of one segment */

void telemetry_rd_close(telemetry_rd *r) {
    if (r->fd >= 0) close(r->fd);
    r->fd = -1;
    r->len = 0;
    r->base = 0;
}

void telemetry_rd_free(telemetry_rd *r) {
    telemetry_rd_close(r);
    free(r->buf);
    r->buf = NULL;
    r->cap = 0;
}

int telemetry_rd_open(telemetry_rd *r, const telemetry *t, uint64_t first, uint64_t size, uint64_t off) {
    telemetry_rd_close(r);
    char *p = telemetry_seg_path(t, first);
    r->fd = p ? open(p, O_RDONLY | O_CLOEXEC) : -1;
    free(p);
    r->first = first;
    r->size = size;
    r->off = off;
    r->base = off;
    r->ver = 0;
    r->max = proto_line_max((int64_t)t->L * t->H) + FRAME_HDR_MAX + 1;
    return r->fd >= 0 ? 0 : -1;
}

/* Makes buf hold the segment's bytes from r->off on, at least want of them
 * (or to the segment's end). 0, or -1 on a read error or no memory. */
static int rd_fill(telemetry_rd *r, size_t want) {
    if (r->off < r->base || r->off > r->base + r->len) {
        r->base = r->off;
        r->len = 0;
    }
    size_t skip = (size_t)(r->off - r->base);
    if (skip) {
        memmove(r->buf, r->buf + skip, r->len - skip);
        r->len -= skip;
        r->base = r->off;
    }
    uint64_t left = r->size - r->off;
    if (want > left) want = (size_t)left;
    if (want > r->cap) {
        size_t nc = r->cap ? r->cap : RBUF_MIN;
        while (nc < want) nc *= 2;
        if (nc > r->max) nc = r->max;
        char *nb = realloc(r->buf, nc);
        if (!nb) return -1;
        r->buf = nb;
        r->cap = nc;
    }
    /* read what the buffer takes, not only what is wanted: fewer preads */
    while (r->len < r->cap && r->base + r->len < r->size) {
        uint64_t room = r->cap - r->len, rest = r->size - (r->base + r->len);
        ssize_t n = pread(r->fd, r->buf + r->len, room < rest ? room : rest, (off_t)(r->base + r->len));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        r->len += (size_t)n;
    }
    return 0;
}

static int valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        int k = proto_utf8_len((const unsigned char *)s + i, n - i);
        if (!k) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* The seq of a payload that begins {"seq":DIGITS, (0 when it does not). */
static uint64_t payload_seq(const char *p, size_t n) {
    static const char pre[] = "{\"seq\":";
    size_t k = sizeof pre - 1, i = k;
    if (n < k + 2 || memcmp(p, pre, k)) return 0;
    uint64_t v = 0;
    while (i < n && i < k + 20 && p[i] >= '0' && p[i] <= '9') v = v * 10 + (uint64_t)(p[i++] - '0');
    return i > k && i < n && p[i] == ',' ? v : 0;
}

/* Classifies a version-2 line (without its newline; nl: it had one). */
static void classify_v2(const char *s, size_t n, int nl, telemetry_line *l) {
    char *end;
    if (n < 2 || s[0] != '#' || s[1] < '0' || s[1] > '9') {
        l->kind = valid_utf8(s, n) ? DMG_GARBAGE : DMG_UTF8;
        return;
    }
    errno = 0;
    unsigned long long len = strtoull(s + 1, &end, 10);
    size_t h = (size_t)(end - s);
    if (errno || h + 10 > n || *end != ' ' || end[9] != ' ') {
        l->kind = !nl ? DMG_TORN : valid_utf8(s, n) ? DMG_GARBAGE : DMG_UTF8;
        return;
    }
    uint32_t crc = 0;
    for (int i = 1; i <= 8; i++) {
        int c = end[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) {
            l->kind = DMG_GARBAGE;
            return;
        }
        crc = crc << 4 | (uint32_t)d;
    }
    const char *p = end + 10;
    size_t plen = n - (h + 10);
    if (plen != len) {
        l->kind = plen < len && !nl ? DMG_TORN : DMG_LENGTH;
        snprintf(l->why, sizeof l->why, "%zu payload bytes, %llu said", plen, len);
        return;
    }
    if (proto_crc32c(0, p, plen) != crc) {
        l->kind = DMG_CHECKSUM;
        if (!valid_utf8(p, plen)) snprintf(l->why, sizeof l->why, "and invalid UTF-8");
        return;
    }
    l->seq = payload_seq(p, plen);
    if (!l->seq) {
        l->kind = DMG_GARBAGE;
        snprintf(l->why, sizeof l->why, "no seq");
        return;
    }
    l->kind = TM_INTACT;
    l->payload = p;
    l->plen = plen;
}

/* Classifies a version-1 line: the daemon's own parser says. */
static void classify_v1(const char *s, size_t n, int nl, size_t max, telemetry_line *l) {
    if (!nl) {
        l->kind = DMG_TORN;
        return;
    }
    struct proto_msg m = {0};
    int code = proto_parse_max(s, n, max, &m, l->why, sizeof l->why);
    if (code == PROTO_OK && (m.type == PROTO_HELLO || !m.has_seq || m.seq < 1)) {
        code = PROTO_E_BAD_TYPE;
        snprintf(l->why, sizeof l->why, "not a numbered message");
    }
    if (code == PROTO_OK) {
        l->kind = TM_INTACT;
        l->seq = (uint64_t)m.seq;
        l->payload = s;
        l->plen = n;
        l->why[0] = 0;
    } else {
        l->kind = valid_utf8(s, n) ? DMG_GARBAGE : DMG_UTF8;
    }
    proto_msg_free(&m);
}

int telemetry_rd_line(telemetry_rd *r, telemetry_line *l) {
    memset(l, 0, sizeof *l);
    if (r->fd < 0 || r->off >= r->size) return 0;
    l->off = r->off;
    size_t scanned = 0;
    const char *nl = NULL;
    for (;;) {
        size_t want = scanned ? scanned * 2 : RBUF_MIN;
        if (want > r->max) want = r->max;
        if (rd_fill(r, want)) {
            l->kind = DMG_GARBAGE;
            snprintf(l->why, sizeof l->why, "unreadable: %s", strerror(errno));
            l->n = (size_t)(r->size - r->off);
            r->off = r->size;
            return 1;
        }
        size_t have = r->len;
        nl = memchr(r->buf + scanned, '\n', have - scanned);
        if (nl || r->base + have >= r->size || have >= r->max) break;
        scanned = have;
    }
    const char *s = r->buf;
    size_t n = nl ? (size_t)(nl - s) : r->len;
    l->n = n + (nl != NULL);
    r->off += l->n;
    l->raw = s;
    if (!nl && n == r->max) {
        l->kind = DMG_GARBAGE;
        snprintf(l->why, sizeof l->why, "over %zu bytes without a newline", r->max);
        return 1;
    }
    size_t ml = sizeof TM_SPOOL_MAGIC - 1;
    if (nl && n + 1 == ml && !memcmp(s, TM_SPOOL_MAGIC, ml)) {
        r->ver = 2;
        l->kind = TM_MAGIC;
        return 1;
    }
    int ver = r->ver ? r->ver : n && s[0] == '#' ? 2 : n && s[0] == '{' ? 1 : 0;
    if (ver == 1) classify_v1(s, n, nl != NULL, r->max, l);
    else classify_v2(s, n, nl != NULL, l);
    if (l->kind == TM_INTACT && !r->ver) r->ver = ver;
    return 1;
}

/* ---- naming damage */

void telemetry_spool_damage(telemetry *t, uint64_t first, uint64_t off, int kind, const char *why, int once) {
    char text[400], esc[6 * 200];
    char *p = telemetry_seg_path(t, first);
    snprintf(text, sizeof text, "run %s: %s byte %llu: %s%s%s", t->run, p ? p : "?", (unsigned long long)off,
             telemetry_dmg_name(kind), why && *why ? ": " : "", why ? why : "");
    free(p);
    snprintf(t->rd_why, sizeof t->rd_why, "%s", text); /* for the placeholders, even when not named again */
    /* named once: a reconnect reads the same damage again */
    if (!once) goto name;
    if (t->dmg_any && (first < t->dmg_first || (first == t->dmg_first && off < t->dmg_off))) return;
    t->dmg_first = first;
    t->dmg_off = off + 1;
    t->dmg_any = 1;
name:
    ST_ADD(t, st_damaged, 1);
    size_t tl = strlen(text);
    if (tl > 200) tl = 200;
    size_t en = proto_json_escape(esc, text, tl);
    esc[en] = 0;
    telemetry_inbox_note(t, "spool_damage", "%s", esc);
}

/* ---- the sender's stream */

void telemetry_spool_seek(telemetry *t, uint64_t seq) {
    telemetry_rd_close(&t->rd);
    t->rd_have = 0;
    t->rd_ready = 0;
    t->rd_expect = seq;
    t->rd_maxseen = 0;
    t->rd_why[0] = 0;
    if (t->nsegs == 0) return;
    size_t i = t->nsegs - 1;
    while (i > 0 && t->segs[i].first > seq) i--;
    t->rd.first = t->segs[i].first;
    t->rd.off = 0;
    t->rd_opened = 0;
}

/* 1 when seq was refused by the daemon for its content (conn.c). */
static int refused_seq(const telemetry *t, uint64_t seq) {
    for (int i = 0; i < t->n_refused; i++)
        if (t->refused_seqs[i] == seq) return 1;
    return 0;
}

/* The placeholder for rd_expect: a warn event naming the damage. */
static void placeholder(telemetry *t, const char *why) {
    char text[600];
    int n = snprintf(text, sizeof text,
                     "entropyd client: seq %llu has no intact record in the spool (%s); "
                     "sent as this event so that the records after it are taken",
                     (unsigned long long)t->rd_expect, why && *why ? why : "missing");
    char pre[PROTO_SEQ_PREFIX_MAX];
    size_t pl = proto_write_seq_prefix(pre, t->rd_expect);
    memcpy(t->ph_buf, pre, pl);
    size_t bl = proto_write_event_body(t->ph_buf + pl, PROTO_WARN, text, (size_t)n, now_wall());
    t->rd_rec.line = t->ph_buf;
    t->rd_rec.len = pl + bl - 1; /* without the body's newline */
    t->rd_rec.seq = t->rd_expect;
    t->rd_rec.placeholder = 1;
}

/* Finds the reader's segment again (acks may have trimmed it): its index,
 * or -1 when nothing is left to read. */
static long rd_segment(telemetry *t) {
    size_t i = 0;
    while (i < t->nsegs && t->segs[i].first < t->rd.first) i++;
    if (i == t->nsegs) return -1;
    if (t->segs[i].first != t->rd.first) { /* ours was trimmed: the next one from its start */
        telemetry_rd_close(&t->rd);
        t->rd.first = t->segs[i].first;
        t->rd.off = 0;
        t->rd_opened = 0;
        t->rd_have = 0;
    }
    return (long)i;
}

int telemetry_spool_peek(telemetry *t, telemetry_record *out) {
    while (!t->rd_ready) {
        long i = rd_segment(t);
        if (i < 0) return 0;
        segment *s = &t->segs[i];
        if (!t->rd_opened) {
            if (telemetry_rd_open(&t->rd, t, s->first, s->size, t->rd.off)) {
                /* a segment that cannot be opened: its seqs come out as missing */
                if ((size_t)i + 1 == t->nsegs) return 0;
                t->rd.first = t->segs[i + 1].first;
                t->rd.off = 0;
                continue;
            }
            t->rd_opened = 1;
        }
        t->rd.size = s->size; /* the newest one grows */
        if (!t->rd_have) {
            if (!telemetry_rd_line(&t->rd, &t->rd_line)) {
                if ((size_t)i + 1 == t->nsegs) return 0;
                telemetry_rd_close(&t->rd);
                t->rd_opened = 0;
                t->rd.first = t->segs[i + 1].first;
                t->rd.off = 0;
                continue;
            }
            t->rd_have = 1;
        }
        telemetry_line *l = &t->rd_line;
        if (l->kind == TM_MAGIC) {
            t->rd_have = 0;
            continue;
        }
        if (l->kind != TM_INTACT) {
            telemetry_spool_damage(t, t->rd.first, l->off, l->kind, l->why, 1);
            t->rd_have = 0;
            continue;
        }
        if (l->seq <= t->rd_maxseen) {
            char why[64];
            snprintf(why, sizeof why, "seq %llu again", (unsigned long long)l->seq);
            telemetry_spool_damage(t, t->rd.first, l->off, DMG_DUPLICATE, why, 1);
            t->rd_have = 0;
            continue;
        }
        if (l->seq < t->rd_expect) { /* before the resume point: sent already */
            t->rd_maxseen = l->seq;
            t->rd_have = 0;
            continue;
        }
        if (l->seq > t->rd_expect) {
            if (!t->rd_why[0]) {
                char why[96];
                snprintf(why, sizeof why, "no record of seqs %llu..%llu before this one",
                         (unsigned long long)t->rd_expect, (unsigned long long)l->seq - 1);
                telemetry_spool_damage(t, t->rd.first, l->off, DMG_MISSING, why, 1);
            }
            placeholder(t, t->rd_why);
        } else if (refused_seq(t, l->seq)) {
            char why[64];
            snprintf(why, sizeof why, "seq %llu", (unsigned long long)l->seq);
            telemetry_spool_damage(t, t->rd.first, l->off, DMG_REFUSED, why, 1);
            placeholder(t, t->rd_why);
        } else {
            t->rd_rec = (telemetry_record){l->payload, l->plen, l->seq, 0};
        }
        t->rd_ready = 1;
    }
    *out = t->rd_rec;
    return 1;
}

void telemetry_spool_take(telemetry *t) {
    if (!t->rd_ready) return;
    t->rd_ready = 0;
    if (!t->rd_rec.placeholder || t->rd_line.seq == t->rd_expect) {
        t->rd_maxseen = t->rd_line.seq;
        t->rd_have = 0;
    }
    t->rd_expect++;
    if (t->rd_have && t->rd_line.seq == t->rd_expect) t->rd_why[0] = 0;
    if (!t->rd_have) t->rd_why[0] = 0;
}
