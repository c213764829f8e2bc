/* spool.c -- the on-disk write-ahead log of one run: writing it, framed.
 *
 * Spool layout: SPOOL_DIR/RUN/seg-<first seq, 20 digits>.log, each holding
 * the line TM_SPOOL_MAGIC and then complete records ("#LEN CRC PAYLOAD\n",
 * spool_read.c reads them back) with consecutive seqs starting at the
 * number in its name; the newest segment is the one being appended to. An empty newest segment
 * records the next seq when everything else was acknowledged and trimmed.
 * SPOOL_DIR/RUN/lock is flock()ed by the owning process.
 * SPOOL_DIR/RUN/hello.json is the run's hello without its token: what a
 * later client (telemetry_upload_all, the background uploader) needs to
 * upload a run it knows nothing else about. A run that ends with everything
 * acknowledged leaves only an empty newest segment, so "a segment with
 * bytes" means "unacknowledged messages, or a client that died".
 */
#include "telemetry_int.h"

#include <dirent.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c.h"

char *telemetry_seg_path(const telemetry *t, uint64_t first) {
    size_t n = strlen(t->dir) + 40;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/seg-%020llu.log", t->dir, (unsigned long long)first);
    return p;
}

static int seg_push(telemetry *t, uint64_t first, uint64_t size) {
    if (t->nsegs == t->segcap) {
        size_t nc = t->segcap ? t->segcap * 2 : 16;
        segment *ns = realloc(t->segs, nc * sizeof *ns);
        if (!ns) return -1;
        t->segs = ns;
        t->segcap = nc;
    }
    t->segs[t->nsegs++] = (segment){first, size};
    return 0;
}

/* Opens a new, empty newest segment named after next_seq. */
int telemetry_spool_rotate(telemetry *t) {
    if (t->wfd >= 0) close(t->wfd);
    t->wfd = -1;
    char *p = telemetry_seg_path(t, t->next_seq);
    if (!p) return -1;
    t->wfd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    free(p);
    if (t->wfd < 0) return -1;
    if (t->nsegs && t->segs[t->nsegs - 1].first == t->next_seq) return 0; /* reopened */
    return seg_push(t, t->next_seq, 0);
}

void telemetry_spool_unlink(telemetry *t, uint64_t first) {
    char *p = telemetry_seg_path(t, first);
    if (p) unlink(p);
    free(p);
}

/* Deletes the segments whose every line is acknowledged (never the newest). */
void telemetry_spool_trim(telemetry *t) {
    size_t k = 0;
    while (k + 1 < t->nsegs && t->segs[k + 1].first - 1 <= t->acked) {
        telemetry_spool_unlink(t, t->segs[k].first);
        t->spool_total -= t->segs[k].size;
        k++;
    }
    if (k) {
        memmove(t->segs, t->segs + k, (t->nsegs - k) * sizeof *t->segs);
        t->nsegs -= k;
    }
    ST_SET(t, st_spool_bytes, t->spool_total);
}

static int cmp_seg(const void *a, const void *b) {
    const segment *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

static int mkdir_p(const char *path) {
    char *p = strdup(path);
    if (!p) return -1;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0700) && errno != EEXIST) {
            free(p);
            return -1;
        }
        *s = '/';
    }
    int rc = mkdir(p, 0700) && errno != EEXIST ? -1 : 0;
    free(p);
    return rc;
}

/* Opens the run's spool directory, locks it, and recovers the segments and
 * next_seq: the newest segment is read record by record (spool_read.c);
 * a torn tail (a crash mid-write: never sent, because the sender only
 * streams records it wrote completely) is named and cut, and next_seq
 * follows its last intact record. A newest segment of the older,
 * unframed format is not appended to: framed records go to a new one. */
int telemetry_spool_open(telemetry *t, char *err, size_t errlen) {
    if (mkdir_p(t->dir)) {
        telemetry_set_err(err, errlen, "spool: mkdir %s: %s", t->dir, strerror(errno));
        return -1;
    }
    size_t n = strlen(t->dir) + 8;
    char *lp = malloc(n);
    if (!lp) return -1;
    snprintf(lp, n, "%s/lock", t->dir);
    t->lock_fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    free(lp);
    if (t->lock_fd < 0) {
        telemetry_set_err(err, errlen, "spool: open lock in %s: %s", t->dir, strerror(errno));
        return -1;
    }
    if (flock(t->lock_fd, LOCK_EX | LOCK_NB)) {
        telemetry_set_err(err, errlen, "spool: %s is in use by another client: %s", t->dir, strerror(errno));
        return -1;
    }
    DIR *d = opendir(t->dir);
    if (!d) {
        telemetry_set_err(err, errlen, "spool: opendir %s: %s", t->dir, strerror(errno));
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned long long first;
        char tail[8];
        if (strlen(e->d_name) != 28 || sscanf(e->d_name, "seg-%20llu.%3s", &first, tail) != 2 || strcmp(tail, "log") ||
            first == 0)
            continue;
        struct stat st;
        char *p = telemetry_seg_path(t, first);
        int ok = p && stat(p, &st) == 0;
        free(p);
        if (!ok || seg_push(t, first, (uint64_t)st.st_size)) {
            closedir(d);
            goto fail;
        }
    }
    closedir(d);
    if (t->nsegs == 0) {
        t->next_seq = 1;
        if (telemetry_spool_rotate(t)) goto fail;
        return 0;
    }
    qsort(t->segs, t->nsegs, sizeof *t->segs, cmp_seg);
    segment *last = &t->segs[t->nsegs - 1];
    telemetry_rd r = {.fd = -1};
    telemetry_line l;
    uint64_t good = 0, maxseq = 0;
    int ver = 0, torn = 0;
    if (telemetry_rd_open(&r, t, last->first, last->size, 0)) goto fail;
    while (telemetry_rd_line(&r, &l)) {
        if (l.kind == TM_INTACT && l.seq > maxseq) maxseq = l.seq;
        if (l.off + l.n < r.size || l.raw[l.n - 1] == '\n') good = l.off + l.n;
        else torn = 1;
    }
    ver = r.ver;
    telemetry_rd_free(&r);
    if (torn) {
        char why[96];
        snprintf(why, sizeof why, "%llu bytes without a newline, cut", (unsigned long long)(last->size - good));
        telemetry_spool_damage(t, last->first, good, DMG_TORN, why, 0);
        char *p = telemetry_seg_path(t, last->first);
        int fd = p ? open(p, O_RDWR | O_CLOEXEC) : -1;
        free(p);
        if (fd < 0 || ftruncate(fd, (off_t)good)) {
            if (fd >= 0) close(fd);
            goto fail;
        }
        close(fd);
        last->size = good;
    }
    t->next_seq = maxseq >= last->first ? maxseq + 1 : last->first;
    for (size_t i = 0; i < t->nsegs; i++) t->spool_total += t->segs[i].size;
    if (ver == 1 && last->size > 0) {
        /* framed records go to a segment of their own; when nothing in the
         * old one was intact, its first seq goes out as a placeholder */
        if (t->next_seq == last->first) t->next_seq++;
        if (telemetry_spool_rotate(t)) goto fail;
        return 0;
    }
    /* Append to the newest segment again (next_seq names a new one only
     * when rotating). */
    uint64_t keep = t->next_seq;
    t->next_seq = last->first;
    int rc = telemetry_spool_rotate(t);
    t->next_seq = keep;
    if (rc) goto fail;
    return 0;
fail:
    telemetry_set_err(err, errlen, "spool: recovering %s: %s", t->dir, strerror(errno));
    return -1;
}

/* Writes all of buf to fd: 0, or -1 with the bytes written in *done. */
static int write_all(int fd, const char *buf, size_t len, size_t *done) {
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, buf + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            *done = off;
            return -1;
        }
        off += (size_t)w;
    }
    *done = off;
    return 0;
}

/* Writes len bytes holding n records (the last n seqs assigned) to the
 * newest segment, after the version line when it is empty. On failure the
 * segment is cut back and the seqs are taken back, so numbering stays
 * gapless; the records count as dropped. */
static int spool_write(telemetry *t, const char *buf, size_t len, unsigned n) {
    segment *s = &t->segs[t->nsegs - 1];
    static const char magic[] = TM_SPOOL_MAGIC;
    size_t m = s->size == 0 ? sizeof magic - 1 : 0, done = 0;
    if ((m && write_all(t->wfd, magic, m, &done)) || (done = m, write_all(t->wfd, buf, len, &done))) {
        int torn = (m || done > 0) && ftruncate(t->wfd, (off_t)s->size) != 0;
        t->next_seq -= n;
        ST_SET(t, st_next_seq, t->next_seq);
        ST_ADD(t, st_dropped_spool, n);
        /* A torn tail that cannot be cut must not be followed by more
         * appends: continue in a new segment. */
        if (torn) telemetry_spool_rotate(t);
        return -1;
    }
    s->size += m + len;
    t->spool_total += m + len;
    ST_ADD(t, st_spooled, n);
    ST_SET(t, st_spool_bytes, t->spool_total);
    return 0;
}

/* The frame header of a payload ("#LEN CRC "), into hdr (FRAME_HDR_MAX
 * bytes, not terminated). Returns its length. */
static size_t frame_header(char *hdr, const char *payload, size_t plen) {
    char tmp[FRAME_HDR_MAX + 1];
    int n = snprintf(tmp, sizeof tmp, "#%zu %08x ", plen, proto_crc32c(0, payload, plen));
    memcpy(hdr, tmp, (size_t)n);
    return (size_t)n;
}

void telemetry_spool_flush(telemetry *t) {
    if (t->wlen) spool_write(t, t->wbuf, t->wlen, t->wbuf_n);
    t->wlen = 0;
    t->wbuf_n = 0;
}

/* Gives the body (text after the seq, from "\"type\"" to the newline, placed
 * at body with BODY_AT free bytes before it) the next seq and its frame and
 * appends it, or drops it when the spool bound would be exceeded. Returns 0 when
 * spooled (or buffered for writing), -1 when dropped. */
int telemetry_spool_add(telemetry *t, char *body, size_t blen) {
    for (;;) {
        char pre[SEQ_PREFIX_MAX];
        size_t plen = proto_write_seq_prefix(pre, t->next_seq);
        size_t len = FRAME_HDR_MAX + plen + blen; /* at most: the frame is written below */
        if (t->spool_total + t->wlen + len > t->spool_max || t->nsegs == 0) {
            ST_ADD(t, st_dropped_spool, 1);
            return -1;
        }
        segment *s = &t->segs[t->nsegs - 1];
        if (s->size + t->wlen + len > t->seg_bytes && s->size + t->wlen > 0) {
            /* A failed flush takes its seqs back, hence the loop: the line
             * is numbered only once everything before it is telemetry_settled. */
            telemetry_spool_flush(t);
            if (t->segs[t->nsegs - 1].size > 0 && telemetry_spool_rotate(t)) {
                ST_ADD(t, st_dropped_spool, 1);
                return -1;
            }
            continue;
        }
        if (t->wlen && t->wlen + len > WBUF_CAP) {
            telemetry_spool_flush(t);
            continue;
        }
        memcpy(body - plen, pre, plen);
        char hdr[FRAME_HDR_MAX];
        size_t hlen = frame_header(hdr, body - plen, plen + blen - 1);
        char *line = body - plen - hlen;
        memcpy(line, hdr, hlen);
        len = hlen + plen + blen;
        t->next_seq++;
        ST_SET(t, st_next_seq, t->next_seq);
        if (len > WBUF_CAP) return spool_write(t, line, len, 1);
        memcpy(t->wbuf + t->wlen, line, len);
        t->wlen += len;
        t->wbuf_n++;
        return 0;
    }
}

/* Rewrites every unacknowledged intact spool record with consecutive seqs
 * from `from` into one new segment (damaged records, already named by the
 * reader or named now, are left out). Used when the daemon already holds
 * more of the run than the spool knows (the spool was lost, or the run
 * name reused): records we numbered at or below its last_seq were never
 * stored (the daemon took them for duplicates), so they get new numbers
 * instead of being lost. Returns the number of records renumbered, -1 on
 * I/O failure. */
long telemetry_spool_renumber(telemetry *t, uint64_t from) {
    size_t pn = strlen(t->dir) + 20;
    char *tmp = malloc(pn), *rec = malloc(FRAME_HDR_MAX + proto_line_max((int64_t)t->L * t->H) + 1);
    telemetry_rd r = {.fd = -1};
    telemetry_line l;
    uint64_t seq = from, size = 0, maxseen = 0;
    long n = 0;
    int out = -1;
    size_t done;
    if (!tmp || !rec) goto fail;
    snprintf(tmp, pn, "%s/renumber.tmp", t->dir);
    out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0) goto fail;
    for (size_t i = 0; i < t->nsegs; i++) {
        segment *sg = &t->segs[i];
        if (telemetry_rd_open(&r, t, sg->first, sg->size, 0)) goto fail;
        while (telemetry_rd_line(&r, &l)) {
            if (l.kind != TM_INTACT) {
                if (l.kind != TM_MAGIC) telemetry_spool_damage(t, sg->first, l.off, l.kind, l.why, 1);
                continue;
            }
            const char *body = memchr(l.payload, ',', l.plen);
            if (l.seq <= maxseen || l.seq <= t->acked || !body) continue;
            maxseen = l.seq;
            body++;
            size_t blen = l.plen - (size_t)(body - l.payload);
            char pre[SEQ_PREFIX_MAX];
            size_t plen = proto_write_seq_prefix(pre, seq++);
            memcpy(rec + FRAME_HDR_MAX, pre, plen);
            memcpy(rec + FRAME_HDR_MAX + plen, body, blen);
            rec[FRAME_HDR_MAX + plen + blen] = '\n';
            char hdr[FRAME_HDR_MAX];
            size_t hlen = frame_header(hdr, rec + FRAME_HDR_MAX, plen + blen);
            char *line = rec + FRAME_HDR_MAX - hlen;
            memcpy(line, hdr, hlen);
            size_t len = hlen + plen + blen + 1;
            if (size == 0) {
                if (write_all(out, TM_SPOOL_MAGIC, sizeof TM_SPOOL_MAGIC - 1, &done)) goto fail;
                size += sizeof TM_SPOOL_MAGIC - 1;
            }
            if (write_all(out, line, len, &done)) goto fail;
            size += len;
            n++;
        }
    }
    telemetry_rd_free(&r);
    free(rec);
    rec = NULL;
    if (close(out)) {
        out = -1;
        goto fail;
    }
    out = -1;
    char *dst = telemetry_seg_path(t, from);
    if (!dst || rename(tmp, dst)) {
        free(dst);
        goto fail;
    }
    free(dst);
    free(tmp);
    for (size_t i = 0; i < t->nsegs; i++)
        if (t->segs[i].first != from) telemetry_spool_unlink(t, t->segs[i].first);
    t->nsegs = 0;
    seg_push(t, from, size); /* capacity exists: nsegs was >= 1 */
    t->dmg_any = 0;          /* a new file: its places are new */
    t->spool_total = size;
    t->next_seq = seq;
    ST_SET(t, st_next_seq, t->next_seq);
    ST_SET(t, st_spool_bytes, t->spool_total);
    if (t->wfd >= 0) close(t->wfd);
    t->next_seq = from;
    telemetry_spool_rotate(t); /* reopens seg-FROM for appending */
    t->next_seq = seq;
    return n;
fail:
    telemetry_rd_free(&r);
    if (out >= 0) close(out);
    if (tmp) unlink(tmp);
    free(tmp);
    free(rec);
    return -1;
}

/* SPOOL_DIR/RUN/hello.json: the hello without token, replaced atomically. */
int telemetry_spool_write_hello(telemetry *t) {
    size_t n = strlen(t->dir) + 24;
    char *tmp = malloc(n), *fin = malloc(n);
    int rc = -1, fd = -1;
    if (!tmp || !fin) goto out;
    snprintf(tmp, n, "%s/hello.json.tmp", t->dir);
    snprintf(fin, n, "%s/hello.json", t->dir);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) goto out;
    const char tail[] = "}\n";
    if (write(fd, t->hello, t->hello_public_len) != (ssize_t)t->hello_public_len || write(fd, tail, 2) != 2) goto out;
    if (close(fd)) {
        fd = -1;
        goto out;
    }
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
void telemetry_spool_compact(telemetry *t) {
    if (!t->has_address || t->acked + 1 < t->next_seq || !t->nsegs) return;
    if (t->nsegs == 1 && t->segs[0].first == t->next_seq && t->segs[0].size == 0) return;
    size_t n = t->nsegs;
    segment *old = malloc(n * sizeof *old);
    if (!old) return;
    memcpy(old, t->segs, n * sizeof *old);
    t->nsegs = 0;
    t->spool_total = 0;
    if (telemetry_spool_rotate(t) == 0)
        for (size_t i = 0; i < n; i++)
            if (old[i].first != t->next_seq) telemetry_spool_unlink(t, old[i].first);
    free(old);
}

void telemetry_spool_remove(telemetry *t) {
    for (size_t i = 0; i < t->nsegs; i++) telemetry_spool_unlink(t, t->segs[i].first);
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
