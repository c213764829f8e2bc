/* ingest_lines.c: what the lines a trainer sends do: each complete line
 * of a connection's input is parsed (proto_parse), a hello taken (the
 * token, the size, the run taken over from an older connection), any
 * other line checked against its run (hello first, not ended, the next
 * seq, the run's shapes) and queued for the writer; what fails is
 * answered with an error line. The wire format is schema/protocol.md; the
 * calls are in ingest_int.h. Not here: reading the socket and the
 * writer's replies (ingest_loop.c), the run table (ingest.c), what a
 * connection may cost (ingest_guard.c). */
#include "ingest.h"
#include "ingest_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "derive.h"
#include "net.h"
#include "now.h"

static int check_shapes(const struct proto_msg *m, const struct run *run, char *err, size_t errlen) {
    for (uint32_t i = 0; i < m->nmetrics; i++) {
        const struct proto_metric *pm = &m->metrics[i];
        if (pm->kind == PROTO_LAYER && pm->rows != run->layers) {
            snprintf(err, errlen, "layer metric %s has %u values, the run has %lld layers", pm->name, pm->rows,
                     (long long)run->layers);
            return -1;
        }
        if (pm->kind == PROTO_HEAD && (pm->rows != run->layers || pm->cols != run->heads)) {
            snprintf(err, errlen, "head metric %s is %u x %u, the run is %lld layers x %lld heads", pm->name, pm->rows,
                     pm->cols, (long long)run->layers, (long long)run->heads);
            return -1;
        }
    }
    return 0;
}

enum { LINE_DONE, LINE_BLOCKED };

/* Takes a hello for c: checks its token and size, takes the run over from
 * a connection that had it, and queues the hello for the writer (the
 * welcome comes back in handle_replies). Returns PROTO_OK, the hello then
 * moved into the writer's item (*msg zeroed), or an error code with err
 * filled (msg untouched). */
static int hello_take(struct ingest *ing, struct conn *c, struct proto_msg *msg, char *err, size_t errlen) {
    if (ing->cfg.token && (!msg->token || !net_equal_ct(msg->token, ing->cfg.token))) {
        snprintf(err, errlen, "%s", msg->token ? "wrong token" : "this daemon requires a token in hello");
        return PROTO_E_UNAUTHORIZED;
    }
    if (msg->layers * msg->heads > ing->cfg.max_cells_per_run) {
        snprintf(err, errlen, "layers x heads = %lld cells, over this daemon's --max-cells-per-run %lld",
                 (long long)(msg->layers * msg->heads), (long long)ing->cfg.max_cells_per_run);
        return PROTO_E_BAD_FIELD;
    }
    c->ack_delay_ms = msg->ack_delay_ms;
    struct writer_item *it = calloc(1, sizeof *it);
    struct run *r = ingest_run_by_name(ing, msg->run);
    if (!it || (!r && !(r = calloc(1, sizeof *r)))) {
        free(it);
        snprintf(err, errlen, "out of memory");
        return PROTO_E_INTERNAL;
    }
    if (!r->name[0]) { /* new: not in the table yet */
        snprintf(r->name, sizeof r->name, "%s", msg->run);
        if (ingest_run_add(ing, r)) {
            free(r);
            free(it);
            snprintf(err, errlen, "out of memory");
            return PROTO_E_INTERNAL;
        }
    }
    if (r->id && (r->layers != msg->layers || r->heads != msg->heads)) {
        /* refused before it takes the run over: a name reused with another
         * shape must not supersede (and so stop) the run's live trainer;
         * the writer would refuse it too, but only after that */
        free(it);
        snprintf(err, errlen, "run %s has %lld layers x %lld heads, not %lld x %lld", r->name, (long long)r->layers,
                 (long long)r->heads, (long long)msg->layers, (long long)msg->heads);
        return PROTO_E_SHAPE_MISMATCH;
    }
    if (r->owner && r->owner != c) {
        struct conn *old = r->owner;
        ingest_send_error(ing, old, PROTO_E_SUPERSEDED, "another connection said hello for this run", 0);
        old->run = NULL; /* the run stays live: the new connection has it */
        r->owner = NULL;
        ingest_conn_flush(ing, old);
    }
    if (c->run && c->run != r) ingest_conn_detach(ing, c);
    r->owner = c;
    r->seq_len = msg->seq_len; /* the store takes the hello's too (a resume updates it) */
    r->noncausal = msg->noncausal;
    c->run = r;
    c->waiting = 1;
    it->kind = WRITER_HELLO;
    it->conn = c->id;
    it->msg = *msg;
    *msg = (struct proto_msg){0};
    it->time = now_wall();
    writer_submit(ing->writer, it); /* hellos are always taken */
    return PROTO_OK;
}

/* Whether a step, event or end may go on for c's run: it said hello, the
 * run has not ended, the seq is the next one, the shapes are the run's.
 * Returns PROTO_OK or an error code with err filled. */
static int line_check(const struct run *run, const struct proto_msg *msg, char *err, size_t errlen) {
    if (!run) {
        snprintf(err, errlen, "send hello first");
        return PROTO_E_NO_HELLO;
    }
    if (run->ended) {
        snprintf(err, errlen, "the run has ended; send hello to reopen it");
        return PROTO_E_RUN_ENDED;
    }
    if (msg->seq <= run->last_seq) {
        snprintf(err, errlen, "seq %lld is already stored (last is %lld); ignored", (long long)msg->seq,
                 (long long)run->last_seq);
        return PROTO_E_DUPLICATE;
    }
    if (msg->seq > run->last_seq + 1) {
        snprintf(err, errlen, "expected seq %lld, got %lld: resend from %lld", (long long)run->last_seq + 1,
                 (long long)msg->seq, (long long)run->last_seq + 1);
        return PROTO_E_SEQ_GAP;
    }
    if (msg->type == PROTO_STEP && check_shapes(msg, run, err, errlen)) return PROTO_E_BAD_SHAPE;
    return PROTO_OK;
}

/* Handles one complete line: a hello is taken (hello_take), anything else
 * checked (line_check) and queued for the writer; what fails is answered
 * with an error line. Returns LINE_BLOCKED when the line could not be
 * queued (writer full): the caller keeps it and retries later. */
static int handle_line(struct ingest *ing, struct conn *c, const char *line, size_t len) {
    struct proto_msg msg = {0};
    struct writer_item *it = NULL;
    char err[512];
    int ret = LINE_DONE;
    int code = proto_parse_max(line, len, ing->line_max, &msg, err, sizeof err);
    int64_t seq = msg.has_seq ? msg.seq : 0;
    if (code != PROTO_OK) goto refuse;
    if (msg.type == PROTO_HELLO) {
        if ((code = hello_take(ing, c, &msg, err, sizeof err)) != PROTO_OK) goto refuse;
        STAT_ADD(ing, messages, 1);
        goto out;
    }
    struct run *run = c->run;
    if ((code = line_check(run, &msg, err, sizeof err)) != PROTO_OK) goto refuse;
    /* here, before the writer: the store, the alerter and the stream all
     * see the derived entropy_norm as if the trainer had sent it */
    if (derive_step(&msg, run->seq_len, run->noncausal) < 0 || !(it = calloc(1, sizeof *it))) {
        code = PROTO_E_INTERNAL;
        snprintf(err, sizeof err, "out of memory");
        goto refuse;
    }
    it->kind = msg.type == PROTO_STEP ? WRITER_STEP : msg.type == PROTO_EVENT ? WRITER_EVENT : WRITER_END;
    it->conn = c->id;
    it->run_id = run->id;
    it->seq = msg.seq;
    it->linger_ms = c->ack_delay_ms;
    it->msg = msg;
    /* from a successful submit on, the item (and the message) belongs to
     * the writer thread, which ingest_run wakes once per round of the loop
     * (one wake-up for the lines of every read of the round) */
    if (writer_submit_quiet(ing->writer, it)) {
        it->msg = (struct proto_msg){0};
        writer_item_free(it);
        ret = LINE_BLOCKED;
        goto out;
    }
    ing->wake_writer = 1;
    run->last_seq = msg.seq;
    if (msg.type == PROTO_END) run->ended = 1;
    msg = (struct proto_msg){0};
    STAT_ADD(ing, messages, 1);
    goto out;
refuse:
    ingest_send_error(ing, c, code, err, seq);
out:
    proto_msg_free(&msg);
    return ret;
}

/* Handles the complete lines in the input buffer, stopping at a hello (the
 * rest waits for the welcome) or when the writer is full. Returns 0, or -1
 * when c was refused (a stranger's overlong line: held, or closed). */
int ingest_process_input(struct ingest *ing, struct conn *c) {
    size_t off = 0;
    uint64_t lines = 0;
    while (!c->waiting && !c->closing && !ing->paused) {
        char *nl = memchr(c->in + off, '\n', c->in_len - off);
        if (!nl) break;
        size_t len = (size_t)(nl - (c->in + off));
        if (c->skipping) {
            c->skipping = 0;
        } else {
            if (handle_line(ing, c, c->in + off, len) == LINE_BLOCKED) {
                ing->paused = 1;
                break;
            }
            lines++;
        }
        off += len + 1;
    }
    if (off) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    /* a stranger's unfinished line may not grow past INGEST_HELLO_MAX */
    if (!c->welcomed && !c->waiting && !c->closing && c->in_len > INGEST_HELLO_MAX && !memchr(c->in, '\n', c->in_len)) {
        if (lines) STAT_ADD(ing, lines, lines);
        ingest_conn_hold(ing, c, PROTO_E_LINE_TOO_LONG, "a line before the welcome is longer than 64 KiB");
        return -1;
    }
    /* a partial line longer than the limit can never become valid */
    if (c->in_len > ing->line_max && !c->skipping) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "line longer than %zu bytes (this daemon's limit, for --max-cells-per-run %lld); "
                 "skipped to its newline",
                 ing->line_max, (long long)ing->cfg.max_cells_per_run);
        ingest_send_error(ing, c, PROTO_E_LINE_TOO_LONG, msg, 0);
        c->skipping = 1;
        c->in_len = 0;
    } else if (c->skipping && !memchr(c->in, '\n', c->in_len)) {
        c->in_len = 0;
    }
    if (lines) STAT_ADD(ing, lines, lines);
    return 0;
}
