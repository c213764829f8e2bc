/* spool.c -- the on-disk write-ahead log of one run.
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

char *tm_seg_path(const telemetry *t, uint64_t first)
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
int tm_spool_rotate(telemetry *t)
{
    if (t->wfd >= 0) close(t->wfd);
    t->wfd = -1;
    char *p = tm_seg_path(t, t->next_seq);
    if (!p) return -1;
    t->wfd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    free(p);
    if (t->wfd < 0) return -1;
    if (t->nsegs && t->segs[t->nsegs - 1].first == t->next_seq) return 0; /* reopened */
    return seg_push(t, t->next_seq, 0);
}

void tm_spool_unlink(telemetry *t, uint64_t first)
{
    char *p = tm_seg_path(t, first);
    if (p) unlink(p);
    free(p);
}

/* Deletes the segments whose every line is acknowledged (never the newest). */
void tm_spool_trim(telemetry *t)
{
    size_t k = 0;
    while (k + 1 < t->nsegs && t->segs[k + 1].first - 1 <= t->acked) {
        tm_spool_unlink(t, t->segs[k].first);
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
int tm_spool_open(telemetry *t, char *err, size_t errlen)
{
    if (mkdir_p(t->dir)) {
        tm_set_err(err, errlen, "spool: mkdir %s: %s", t->dir, strerror(errno));
        return -1;
    }
    size_t n = strlen(t->dir) + 8;
    char *lp = malloc(n);
    if (!lp) return -1;
    snprintf(lp, n, "%s/lock", t->dir);
    t->lock_fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    free(lp);
    if (t->lock_fd < 0) {
        tm_set_err(err, errlen, "spool: open lock in %s: %s", t->dir, strerror(errno));
        return -1;
    }
    if (flock(t->lock_fd, LOCK_EX | LOCK_NB)) {
        tm_set_err(err, errlen, "spool: %s is in use by another client: %s", t->dir, strerror(errno));
        return -1;
    }
    DIR *d = opendir(t->dir);
    if (!d) {
        tm_set_err(err, errlen, "spool: opendir %s: %s", t->dir, strerror(errno));
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
        char *p = tm_seg_path(t, first);
        int ok = p && stat(p, &st) == 0;
        free(p);
        if (!ok || seg_push(t, first, (uint64_t)st.st_size)) { closedir(d); goto fail; }
    }
    closedir(d);
    if (t->nsegs == 0) {
        t->next_seq = 1;
        if (tm_spool_rotate(t)) goto fail;
        return 0;
    }
    qsort(t->segs, t->nsegs, sizeof *t->segs, cmp_seg);
    segment *last = &t->segs[t->nsegs - 1];
    char *p = tm_seg_path(t, last->first);
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
    int rc = tm_spool_rotate(t);
    t->next_seq = keep;
    if (rc) goto fail;
    return 0;
fail:
    tm_set_err(err, errlen, "spool: recovering %s: %s", t->dir, strerror(errno));
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
            if (torn) tm_spool_rotate(t);
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

void tm_spool_flush(telemetry *t)
{
    if (t->wlen) spool_write(t, t->wbuf, t->wlen, t->wbuf_n);
    t->wlen = 0;
    t->wbuf_n = 0;
}

/* Gives the body (text after the seq, from "\"type\"" to the newline, placed
 * at body with SEQ_PREFIX_MAX free bytes before it) the next seq and appends
 * it, or drops it when the spool bound would be exceeded. Returns 0 when
 * spooled (or buffered for writing), -1 when dropped. */
int tm_spool_add(telemetry *t, char *body, size_t blen)
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
             * is numbered only once everything before it is tm_settled. */
            tm_spool_flush(t);
            if (t->segs[t->nsegs - 1].size > 0 && tm_spool_rotate(t)) {
                ST_ADD(t, st_dropped_spool, 1);
                return -1;
            }
            continue;
        }
        if (t->wlen && t->wlen + len > WBUF_CAP) {
            tm_spool_flush(t);
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

/* Positions the spool reader on the line with seq `seq`. */
void tm_spool_seek(telemetry *t, uint64_t seq)
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
    char *p = tm_seg_path(t, t->rd_first);
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
long tm_spool_renumber(telemetry *t, uint64_t from)
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
        char *p = tm_seg_path(t, sg->first);
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
    char *dst = tm_seg_path(t, from);
    if (!dst || rename(tmp, dst)) { free(dst); goto fail; }
    free(dst);
    free(tmp);
    for (size_t i = 0; i < t->nsegs; i++)
        if (t->segs[i].first != from) tm_spool_unlink(t, t->segs[i].first);
    t->nsegs = 0;
    seg_push(t, from, size); /* capacity exists: nsegs was >= 1 */
    t->spool_total = size;
    t->next_seq = seq;
    ST_SET(t, st_next_seq, t->next_seq);
    ST_SET(t, st_spool_bytes, t->spool_total);
    if (t->wfd >= 0) close(t->wfd);
    t->next_seq = from;
    tm_spool_rotate(t); /* reopens seg-FROM for appending */
    t->next_seq = seq;
    return n;
fail:
    if (out >= 0) close(out);
    unlink(tmp);
    free(tmp);
    free(buf);
    return -1;
}

/* SPOOL_DIR/RUN/hello.json: the hello without token, replaced atomically. */
int tm_spool_write_hello(telemetry *t)
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
void tm_spool_compact(telemetry *t)
{
    if (!t->has_address || t->acked + 1 < t->next_seq || !t->nsegs) return;
    if (t->nsegs == 1 && t->segs[0].first == t->next_seq && t->segs[0].size == 0) return;
    size_t n = t->nsegs;
    segment *old = malloc(n * sizeof *old);
    if (!old) return;
    memcpy(old, t->segs, n * sizeof *old);
    t->nsegs = 0;
    t->spool_total = 0;
    if (tm_spool_rotate(t) == 0)
        for (size_t i = 0; i < n; i++)
            if (old[i].first != t->next_seq) tm_spool_unlink(t, old[i].first);
    free(old);
}

void tm_spool_remove(telemetry *t)
{
    for (size_t i = 0; i < t->nsegs; i++) tm_spool_unlink(t, t->segs[i].first);
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
