/* http_slots.c: the HTTP server's connection slots, pushed out idle-longest
 * first when a newcomer finds them all taken. See http_slots.h. */
#include "http_slots.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "now.h"

/* One open connection. */
struct slot {
    MHD_socket fd;
    int busy;                 /* a request is being handled */
    int evicted;              /* shut down (to make room, or timed out); gone at its closed notification */
    int reserved;             /* admitted into a reserved slot: /healthz and /metrics only, one request */
    double since;             /* monotonic ms: accepted, or its last request ended */
    struct slot *prev, *next; /* in s's list: idle longest first (busy ones where they were) */
};

struct http_slots {
    pthread_mutex_t mu; /* guards everything below */
    unsigned max;
    double idle_ms;
    unsigned open;     /* slots in the list */
    unsigned evicting; /* of them, ordinary ones shut down and not closed yet */
    unsigned reserved; /* of them, reserved ones (HTTP_SLOTS_RESERVED at most) */
    uint64_t evicted, timed_out, reserved_total;
    struct slot *head, *tail;
};

struct http_slots *http_slots_create(unsigned max, double idle_ms) {
    struct http_slots *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    s->max = max;
    s->idle_ms = idle_ms;
    return s;
}

void http_slots_destroy(struct http_slots *s) {
    if (!s) return;
    while (s->head) {
        struct slot *n = s->head->next;
        free(s->head);
        s->head = n;
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Shuts x down: its thread sees the end of its input and closes it; the
 * socket stays open till then (see http_slots.h, Threads). s->mu held. */
static void shut(struct http_slots *s, struct slot *x) {
    shutdown(x->fd, SHUT_RDWR);
    x->evicted = 1;
    if (!x->reserved) s->evicting++;
}

static void unlink_slot(struct http_slots *s, struct slot *x) {
    if (x->prev) x->prev->next = x->next;
    else s->head = x->next;
    if (x->next) x->next->prev = x->prev;
    else s->tail = x->prev;
    x->prev = x->next = NULL;
}

static void append(struct http_slots *s, struct slot *x) {
    x->prev = s->tail;
    x->next = NULL;
    if (s->tail) s->tail->next = x;
    else s->head = x;
    s->tail = x;
}

void http_slots_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                       enum MHD_ConnectionNotificationCode code) {
    struct http_slots *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct slot *x = ci ? calloc(1, sizeof *x) : NULL;
        *socket_context = x;
        if (!x) return; /* not tracked: it is never pushed out */
        x->fd = ci->connect_fd;
        x->since = now_mono_ms();
        pthread_mutex_lock(&s->mu);
        /* admitted with every ordinary slot serving a request (admit runs
         * just before, on this same thread): a reserved one */
        if (s->open - s->evicting - s->reserved >= s->max) {
            x->reserved = 1;
            s->reserved++;
            s->reserved_total++;
        }
        append(s, x);
        s->open++;
        pthread_mutex_unlock(&s->mu);
        return;
    }
    struct slot *x = *socket_context;
    if (code != MHD_CONNECTION_NOTIFY_CLOSED || !x) return;
    pthread_mutex_lock(&s->mu);
    unlink_slot(s, x);
    s->open--;
    if (x->reserved) s->reserved--;
    else if (x->evicted) s->evicting--;
    pthread_mutex_unlock(&s->mu);
    free(x);
    *socket_context = NULL;
}

enum MHD_Result http_slots_admit(void *cls, const struct sockaddr *addr, socklen_t addrlen) {
    (void)addr;
    (void)addrlen;
    struct http_slots *s = cls;
    enum MHD_Result ok = MHD_YES;
    pthread_mutex_lock(&s->mu);
    if (s->open - s->evicting - s->reserved >= s->max) {
        struct slot *v = s->head;
        while (v && (v->busy || v->evicted || v->reserved)) v = v->next;
        /* libmicrohttpd holds max + HTTP_SLOTS_SPARE (+ the reserved
         * ones): beyond, it would refuse the newcomer after its victim
         * was shut down */
        if (!v || s->open - s->reserved >= s->max + HTTP_SLOTS_SPARE) {
            /* every slot serves a request: a reserved one, for a health
             * check (notify marks it) */
            ok = !v && s->reserved < HTTP_SLOTS_RESERVED ? MHD_YES : MHD_NO;
        } else {
            shut(s, v);
            s->evicted++;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

static struct slot *slot_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void http_slots_busy(struct http_slots *s, struct MHD_Connection *c) {
    struct slot *x = slot_of(c);
    if (!x) return;
    pthread_mutex_lock(&s->mu);
    x->busy = 1;
    pthread_mutex_unlock(&s->mu);
}

void http_slots_idle(struct http_slots *s, struct MHD_Connection *c) {
    struct slot *x = slot_of(c);
    if (!x) return;
    pthread_mutex_lock(&s->mu);
    x->busy = 0;
    x->since = now_mono_ms();
    unlink_slot(s, x); /* idle from now: the last to be pushed out */
    append(s, x);
    /* its one request is answered (the response is sent when this is
     * called): the reserved slot is given back */
    if (x->reserved && !x->evicted) shut(s, x);
    pthread_mutex_unlock(&s->mu);
}

int http_slots_reserved(struct MHD_Connection *c) {
    struct slot *x = slot_of(c);
    return x && x->reserved; /* set once, before any request of c */
}

unsigned http_slots_sweep(struct http_slots *s, double now_ms) {
    unsigned n = 0;
    pthread_mutex_lock(&s->mu);
    /* not in order of since: a busy slot stays where it was */
    for (struct slot *x = s->head; x; x = x->next)
        if (!x->busy && !x->evicted &&
            now_ms - x->since >
                (x->reserved && HTTP_SLOTS_RESERVED_IDLE_MS < s->idle_ms ? HTTP_SLOTS_RESERVED_IDLE_MS : s->idle_ms)) {
            shut(s, x);
            n++;
        }
    s->timed_out += n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

uint64_t http_slots_timed_out(struct http_slots *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->timed_out;
    pthread_mutex_unlock(&s->mu);
    return n;
}

uint64_t http_slots_reserved_total(struct http_slots *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->reserved_total;
    pthread_mutex_unlock(&s->mu);
    return n;
}

uint64_t http_slots_evicted(struct http_slots *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->evicted;
    pthread_mutex_unlock(&s->mu);
    return n;
}
