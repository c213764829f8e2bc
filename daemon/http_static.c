/* http_static.c: the dashboard's files: the web/ directory embedded at
 * build time (gzip when the client takes it), or a directory on disk with
 * --web-root, with ETags for revalidation. Not the API (http_api.c). The
 * contract is in http_int.h. */
#include "http.h"
#include "http_int.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "embed.h"

static const char *content_type(const char *path) {
    static const struct {
        const char *ext, *type;
    } types[] = {{".html", "text/html; charset=utf-8"},
                 {".js", "text/javascript; charset=utf-8"},
                 {".mjs", "text/javascript; charset=utf-8"},
                 {".css", "text/css; charset=utf-8"},
                 {".json", "application/json"},
                 {".svg", "image/svg+xml"},
                 {".png", "image/png"},
                 {".ico", "image/x-icon"},
                 {".txt", "text/plain; charset=utf-8"},
                 {".map", "application/json"},
                 {".woff2", "font/woff2"},
                 {".wasm", "application/wasm"}};
    const char *dot = strrchr(path, '.');
    if (dot)
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
            if (strcmp(dot, types[i].ext) == 0) return types[i].type;
    return "application/octet-stream";
}

/* A request path as a file path under web/: "" and ".../" name index.html.
 * -1 when it tries to leave the directory or is too long. */
static int static_path(const char *url, char *out, size_t cap) {
    while (*url == '/') url++;
    for (const char *p = url; *p; p++)
        if (*p == '\\') return -1;
    /* no segment may be "..": the path must stay inside the root */
    for (const char *seg = url; seg && *seg;) {
        const char *end = strchr(seg, '/');
        size_t n = end ? (size_t)(end - seg) : strlen(seg);
        if (n == 2 && seg[0] == '.' && seg[1] == '.') return -1;
        seg = end ? end + 1 : NULL;
    }
    size_t len = strlen(url);
    int n = snprintf(out, cap, "%s%s", url, len == 0 || url[len - 1] == '/' ? "index.html" : "");
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* 1 when the request's If-None-Match names etag (or is "*"). */
static int etag_matches(struct MHD_Connection *c, const char *etag) {
    const char *inm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
    if (!inm) return 0;
    if (strcmp(inm, "*") == 0) return 1;
    size_t n = strlen(etag);
    /* a list of tags: etag must appear whole, between separators */
    for (const char *p = strstr(inm, etag); p; p = strstr(p + 1, etag)) {
        char after = p[n];
        if (after == 0 || after == ',' || after == ' ') return 1;
    }
    return 0;
}

/* 1 when Accept-Encoding takes gzip (and not with q=0). */
static int accepts_gzip(struct MHD_Connection *c) {
    const char *ae = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT_ENCODING);
    const char *g = ae ? strstr(ae, "gzip") : NULL;
    if (!g) return 0;
    const char *q = strstr(g, ";q=");
    const char *comma = strchr(g, ',');
    if (q && (!comma || q < comma)) return strtod(q + 3, NULL) > 0;
    return 1;
}

/* The headers every static answer carries: a file can change with the
 * daemon (an upgrade, --web-root), so caches keep it but revalidate each
 * use; the strong ETag makes that a 304 without a body. */
static void static_headers(struct MHD_Response *r, const char *rel, const char *etag, int gz, int varies) {
    MHD_add_response_header(r, "Content-Type", content_type(rel));
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "ETag", etag);
    if (gz) MHD_add_response_header(r, "Content-Encoding", "gzip");
    if (varies) MHD_add_response_header(r, "Vary", "Accept-Encoding");
}

/* An embedded file: its gzip bytes when the client takes gzip (their own
 * ETag, "...-gz": another representation), 304 when If-None-Match has the
 * tag. */
static enum MHD_Result send_embedded(struct http *h, struct MHD_Connection *c, const struct embed_file *f,
                                     const char *rel) {
    int gz = f->gz && accepts_gzip(c);
    char etag[64];
    size_t tl = strlen(f->etag);
    if (gz && tl >= 2 && tl < sizeof etag - 4) snprintf(etag, sizeof etag, "%.*s-gz\"", (int)(tl - 1), f->etag);
    else snprintf(etag, sizeof etag, "%s", f->etag);
    if (etag_matches(c, etag)) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "ETag", etag);
        if (f->gz) MHD_add_response_header(r, "Vary", "Accept-Encoding");
        return http_respond(h, c, MHD_HTTP_NOT_MODIFIED, r);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer((size_t)(gz ? f->gz_size : f->size),
                                                             (void *)(gz ? f->gz : f->data), MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    static_headers(r, rel, etag, gz, f->gz != NULL);
    return http_respond(h, c, 200, r);
}

enum MHD_Result http_static(struct http *h, struct MHD_Connection *c, const char *url) {
    char rel[1024];
    if (static_path(url, rel, sizeof rel)) return http_send_error(h, c, 400, "bad path");
    if (!h->web_root) {
        for (const struct embed_file *f = webassets; f->path; f++)
            if (strcmp(f->path, rel) == 0) return send_embedded(h, c, f, rel);
        return http_send_error(h, c, 404, "no such file: /%s", rel);
    }
    char full[PATH_MAX + 1100], real[PATH_MAX];
    snprintf(full, sizeof full, "%s/%s", h->web_root, rel);
    /* symlinks may not lead outside the root either */
    size_t rl = strlen(h->web_root);
    if (!realpath(full, real) || strncmp(real, h->web_root, rl) != 0 || real[rl] != '/')
        return http_send_error(h, c, 404, "no such file: /%s", rel);
    int fd = open(real, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        return http_send_error(h, c, 404, "no such file: /%s", rel);
    }
    /* from disk (--web-root, for working on the page): the tag from size
     * and modification time, sent as is */
    char etag[80];
    snprintf(etag, sizeof etag, "\"%llx-%llx-%lx\"", (unsigned long long)st.st_size,
             (unsigned long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
    if (etag_matches(c, etag)) {
        close(fd);
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "ETag", etag);
        return http_respond(h, c, MHD_HTTP_NOT_MODIFIED, r);
    }
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)st.st_size, fd); /* takes the fd */
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    static_headers(r, rel, etag, 0, 0);
    return http_respond(h, c, 200, r);
}
