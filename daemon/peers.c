/* peers.c: open connections per peer key. See peers.h. A chained hash of
 * fixed size: the number of distinct peers is at most the number of open
 * connections (bounded by --max-conns), and lookups happen on accept only. */
#include "peers.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PEERS_BUCKETS 1024

struct peer {
    char key[PEERS_KEY_MAX];
    int count;
    struct peer *next;
};

struct peers {
    int limit;
    struct peer *bucket[PEERS_BUCKETS];
};

static size_t bucket_of(const char *key) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *s = (const unsigned char *)key; *s; s++) h = (h ^ *s) * 16777619u;
    return h % PEERS_BUCKETS;
}

struct peers *peers_create(int limit) {
    struct peers *p = calloc(1, sizeof *p);
    if (p) p->limit = limit > 0 ? limit : 1;
    return p;
}

void peers_destroy(struct peers *p) {
    if (!p) return;
    for (size_t i = 0; i < PEERS_BUCKETS; i++)
        while (p->bucket[i]) {
            struct peer *n = p->bucket[i]->next;
            free(p->bucket[i]);
            p->bucket[i] = n;
        }
    free(p);
}

struct peer *peers_acquire(struct peers *p, const char *key) {
    char k[PEERS_KEY_MAX];
    strncpy(k, key, sizeof k - 1);
    k[sizeof k - 1] = 0;
    size_t b = bucket_of(k);
    struct peer *e = p->bucket[b];
    while (e && strcmp(e->key, k) != 0) e = e->next;
    if (!e) {
        if (!(e = calloc(1, sizeof *e))) return NULL;
        memcpy(e->key, k, sizeof k);
        e->next = p->bucket[b];
        p->bucket[b] = e;
    }
    if (e->count >= p->limit) return NULL;
    e->count++;
    return e;
}

void peers_release(struct peers *p, struct peer *e) {
    if (!e || --e->count > 0) return;
    for (struct peer **pp = &p->bucket[bucket_of(e->key)]; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            free(e);
            return;
        }
}

const char *peers_key(const struct peer *e) { return e->key; }

int peers_count(const struct peer *e) { return e->count; }
