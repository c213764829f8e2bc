/* http_slots.c: the HTTP server's connection slots, pushed out idle-longest
 * first when a newcomer finds them all taken. See http_slots.h. */
#include "http_slots.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "now.h"

/* A client's address, as compared for the per-address limit: the family
 * and its IP (never the port). */
struct addr_key {
    int family; /* AF_INET, AF_INET6, or 0: unknown (never counted) */
    unsigned char ip[16];
};

/* One open connection. */
struct slot {
    MHD_socket fd;
    struct addr_key addr;
    int busy;                 /* a request is being handled */
    int evicted;              /* shut down (to make room, or timed out); gone at its closed notification */
    int reserved;             /* admitted into a reserved slot (enum http_slots_kind): /healthz and /metrics
                               * only, one request */
    double since;             /* monotonic ms: accepted, or its last request ended */
    struct slot *prev, *next; /* in s's list: idle longest first (busy ones where they were) */
};

struct http_slots {
    pthread_mutex_t mu; /* guards everything below */
    unsigned max;
    unsigned per_addr; /* ordinary slots one client address may hold; 0: no limit */
    double idle_ms;
    unsigned open;     /* slots in the list */
    unsigned evicting; /* of them, ordinary ones shut down and not closed yet */
    unsigned reserved; /* of them, reserved ones (HTTP_SLOTS_RESERVED at most) */
    uint64_t evicted, timed_out, reserved_total;
    struct slot *head, *tail;
};

struct http_slots *http_slots_create(unsigned max, unsigned per_addr, double idle_ms) {
    struct http_slots *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    s->max = max;
    s->per_addr = per_addr;
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

static struct addr_key addr_key_of(const struct sockaddr *sa) {
    struct addr_key k = {0};
    if (sa && sa->sa_family == AF_INET) {
        k.family = AF_INET;
        memcpy(k.ip, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa && sa->sa_family == AF_INET6) {
        k.family = AF_INET6;
        memcpy(k.ip, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    }
    return k;
}

/* 1 when the address already holds its per_addr ordinary slots (those shut
 * down and closing aside), so that a newcomer from it gets a reserved slot
 * or none. s->mu held. */
static int addr_full(const struct http_slots *s, const struct addr_key *k) {
    if (!s->per_addr || !k->family) return 0;
    unsigned n = 0;
    for (const struct slot *x = s->head; x; x = x->next)
        if (!x->reserved && !x->evicted && x->addr.family == k->family && !memcmp(x->addr.ip, k->ip, 16) &&
            ++n >= s->per_addr)
            return 1;
    return 0;
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
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        x->addr = addr_key_of(ai ? ai->client_addr : NULL);
        pthread_mutex_lock(&s->mu);
        /* admitted with every ordinary slot serving a request, or from an
         * address that holds its share (admit runs just before, on this
         * same thread, and decided the same): a reserved one */
        int addr_over = addr_full(s, &x->addr);
        if (addr_over || s->open - s->evicting - s->reserved >= s->max) {
            x->reserved = addr_over ? HTTP_SLOTS_FOR_ADDR : HTTP_SLOTS_FOR_ALL_BUSY;
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
    (void)addrlen;
    struct http_slots *s = cls;
    enum MHD_Result ok = MHD_YES;
    struct addr_key k = addr_key_of(addr);
    pthread_mutex_lock(&s->mu);
    if (addr_full(s, &k)) {
        /* its share taken: a health check from it still gets a reserved
         * slot (a monitoring probe beside a dashboard's streams) */
        ok = s->reserved < HTTP_SLOTS_RESERVED ? MHD_YES : MHD_NO;
    } else if (s->open - s->evicting - s->reserved >= s->max) {
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
    return x ? x->reserved : HTTP_SLOTS_ORDINARY; /* set once, before any request of c */
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
