/* peers.h: connection counts per peer, for per-peer limits.
 *
 * A peer is named by a short key the caller makes (ingest: "uid:1000" for
 * a Unix-socket client, its SO_PEERCRED uid; "ip:127.0.0.1" for a TCP
 * client). The table counts open connections per key and refuses one more
 * over the limit, so one user or one address cannot take every slot.
 *
 * Not thread-safe: one thread (ingest's loop) owns a table. */
#ifndef PEERS_H
#define PEERS_H

#include <stddef.h>

#define PEERS_KEY_MAX 64 /* key bytes, terminator included; longer keys are cut */

struct peers;
struct peer; /* one key's entry; valid while its count is > 0 */

/* A table whose keys may each hold at most limit connections (limit >= 1).
 * Returns NULL when out of memory. */
struct peers *peers_create(int limit);

/* Frees the table and every entry. Accepts NULL. */
void peers_destroy(struct peers *p);

/* Counts one more connection for key. Returns its entry, or NULL when the
 * key already holds limit connections (or out of memory): refuse it then.
 * The key is copied. */
struct peer *peers_acquire(struct peers *p, const char *key);

/* Counts one connection less; the entry is freed when its count reaches 0.
 * Accepts NULL. */
void peers_release(struct peers *p, struct peer *e);

/* The key an entry counts (owned by the table). */
const char *peers_key(const struct peer *e);

/* Connections counted for the entry. */
int peers_count(const struct peer *e);

#endif
