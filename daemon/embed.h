/* embed.h: files compiled into the daemon at build time (scripts/embed.c).
 * `migrations` holds the schema .sql files sorted by name; `webassets` holds web/;
 * `default_rules` the built-in alert rules (schema/default_rules.json).
 * Each table ends with an entry whose path is NULL. Data is NUL-terminated
 * (not counted in size) so SQL can be passed to sqlite3_exec directly. */
#ifndef EMBED_H
#define EMBED_H
#include <stddef.h>

struct embed_file {
    const char *path;          /* relative to schema/ or web/ */
    const unsigned char *data; /* static, never freed */
    long size;
    const unsigned char *gz; /* webassets: the gzip of data when smaller, else NULL */
    long gz_size;
    const char *etag; /* a strong entity tag of data, quoted ("\"0123abcd...\"") */
};

extern const struct embed_file migrations[];
extern const struct embed_file webassets[];
extern const struct embed_file default_rules[];

#endif
