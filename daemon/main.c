/* main.c: entropyd — flags, signals and wiring. The modules do the work:
 * store (SQLite), writer (the thread that writes), ingest (trainer sockets),
 * query (read-only connections), stream (SSE ring), http (libmicrohttpd).
 * Nothing below main() exits the process. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <stdatomic.h>

#include "http.h"
#include "ingest.h"
#include "alerter.h"
#include "metrics.h"
#include "fblock.h"
#include "flags.h"
#include "integrity.h"
#include "query.h"
#include "remote_write.h"
#include "store.h"
#include "stream.h"
#include "writer.h"
#include "net.h"
#include "now.h"


static struct ingest *g_ingest;

/* Takes the database's lock file (DB.lock, holding the owner's pid) for the
 * life of the process, before anything reads or changes the database: a
 * second entropyd on the same data must not mark the first one's live runs
 * stale or write beside it.  Returns the lock's descriptor (kept open; the
 * kernel releases the lock when the process ends, however it ends), or -1
 * with a message in err. */
static int lock_database(const char *db, char *err, size_t errlen) {
    char path[4200];
    snprintf(path, sizeof path, "%s.lock", db);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open lock file %.800s: %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        char owner[32] = "";
        ssize_t n = pread(fd, owner, sizeof owner - 1, 0);
        owner[n > 0 ? n : 0] = 0;
        owner[strcspn(owner, "\n")] = 0;
        char who[64] = "";
        if (*owner) snprintf(who, sizeof who, " (pid %s)", owner);
        snprintf(err, errlen, "%.800s is in use by another entropyd%s: stop it first, or give this one its own --data",
                 db, who);
        close(fd);
        return -1;
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)len, 0) != len) { /* the pid is a courtesy */
    }
    return fd;
}

/* The database and its -wal and -shm files hold everything the trainers
 * sent: readable by their owner only, whatever the umask was when an
 * earlier version (or sqlite3 by hand) created them. */
static void make_database_private(const char *db) {
    static const char *const suffix[] = {"", "-wal", "-shm", ".lock"};
    char path[4200];
    for (size_t i = 0; i < sizeof suffix / sizeof *suffix; i++) {
        snprintf(path, sizeof path, "%s%s", db, suffix[i]);
        if (chmod(path, 0600) < 0 && errno != ENOENT)
            fprintf(stderr, "entropyd: warning: cannot make %s private: %s\n", path, strerror(errno));
    }
}

/* 1 when "HOST:PORT" names a loopback address (127.0.0.0/8, ::1,
 * localhost): nobody else on the network can reach it. */
static int loopback_address(const char *spec) {
    char host[256];
    int port;
    return net_split_hostport(spec, host, sizeof host, &port) == 0 && net_host_is_loopback(host);
}

static void on_signal(int sig) {
    (void)sig;
    if (g_ingest) ingest_stop(g_ingest);
}

/* The writer's commit hook: the live stream, then the HTTP side (commit
 * latency, DELETE completion). http is set once HTTP is up. */
struct hooks {
    struct stream *stream;
    struct alerter *alerter;
    struct remote_write *remote_write;
    _Atomic(struct http *) http;
};

static void on_commit(void *ctx, const struct writer_item *items, double commit_ms) {
    struct hooks *hk = ctx;
    if (hk->stream) stream_on_commit(hk->stream, items);
    if (hk->alerter) alerter_on_commit(hk->alerter, items);
    remote_write_on_commit(hk->remote_write, items);
    struct http *h = atomic_load(&hk->http);
    if (h) http_on_commit(h, items, commit_ms);
}

static void on_tick(void *ctx, double now) {
    struct hooks *hk = ctx;
    if (hk->stream) stream_on_tick(hk->stream, now);
    if (hk->alerter) alerter_on_tick(hk->alerter, now);
    struct http *h = atomic_load(&hk->http);
    if (h) http_tick(h);
}

/* Trainers x connections can exceed the default 1024 descriptors. */
static void raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* Every flag's value (FLAGS says what each does). */
struct options {
    const char *data, *db, *sock, *tcp, *token;
    long max_conns, queue_mb, drain_ms, per_peer, hello_s, idle_s, input_mb, http_per_ip, max_cells;
    flag_list allow_hosts;
    const char *http_listen, *web_root;
    long http_conns, stream_events, keepalive_ms, http_timeout_s, am_resend_s;
    int http_explicit, metrics_heads, quiet_alerts, lossy_bf16;
    long lossy_bits; /* --lossy-bits, or 7 for --lossy-bf16; 0: exact */
    double metrics_keep_s;
    const char *retain_raw; /* --retain-raw, parsed into retain_steps or retain_s */
    long retain_steps;
    double retain_s;
    const char *rules, *webhook, *on_alert, *alertmanager, *remote_write;
    const char *check; /* --check: verify this data directory (or database file) and exit */
    char dbpath[4096], sockpath[4096];
};

#define O(f) offsetof(struct options, f)
#define LONG FLAG_LONG_ROW
#define STR FLAG_STR_ROW
#define BOOL FLAG_BOOL_ROW

static const flag FLAGS[] = {
    FLAG_SECTION_ROW("storage and trainers:"),
    STR("--data", O(data), "DIR", "data directory (default ./entropyd-data); created if missing"),
    STR("--db", O(db), "PATH", "database file (default DIR/entropyd.db)"),
    STR("--check", O(check), "DIR",
        "verify the database of data directory DIR (or the database file DIR), read-only,\n"
        "list each damaged row (run, metric, steps) and exit: 0 clean, 1 damage found,\n"
        "2 cannot open it (docs/reliability.md); safe while a daemon runs on it"),
    STR("--socket", O(sock), "PATH",
        "Unix socket for trainers (default DIR/entropyd.sock, mode 0600);\n'off' for none"),
    STR("--listen-tcp", O(tcp), "HOST:PORT",
        "also accept trainers over TCP (use loopback unless the\n"
        "network is trusted, and set --token); port 0 picks a free one"),
    STR("--token", O(token), "TOKEN", "require this token in every hello (or $ENTROPYD_TOKEN)"),
    LONG("--max-conns", O(max_conns), 1, 1000000, "N",
         "trainer connections at most (default 10000); when all are\n"
         "taken, one that has not said hello yet makes room"),
    LONG("--max-conns-per-peer", O(per_peer), 1, 1000000, "N",
         "connections per user (Unix socket) or per address (TCP)\n"
         "at most (default half of --max-conns, or all while it is under 2048)"),
    LONG("--hello-timeout-s", O(hello_s), 1, 3600, "N", "close a connection not welcomed within N s (default 10)"),
    LONG("--idle-timeout-s", O(idle_s), 0, 2000000, "N",
         "close a welcomed connection silent for N s (default 0: never)"),
    LONG("--max-cells-per-run", O(max_cells), 1, PROTO_MAX_CELLS, "N",
         "layers x heads of a run at most (default 65536); a hello\n"
         "over it is refused (bad_field), so one trainer cannot\n"
         "exhaust the daemon's memory"),
    LONG("--input-mb", O(input_mb), 1, 65536, "N",
         "memory for unfinished input lines of all connections\n"
         "(default 64); a line before the welcome is at most 64 KiB"),
    STR("--retain-raw", O(retain_raw), "KEEP",
        "keep a run's raw frames for its last KEEP steps (>= 64), or\n"
        "those of the last KEEP of time (N[s|m|h|d]); older ones are deleted,\n"
        "their exact rollups kept forever (default: keep all; docs/long-runs.md)"),
    LONG("--queue-mb", O(queue_mb), 1, 65536, "N",
         "memory for accepted, uncommitted messages (default 64);\n"
         "when spent, trainers wait (their clients spool)"),
    LONG("--drain-ms", O(drain_ms), 0, 600000, "N", "at shutdown, wait this long to commit and ack (default 5000)"),
    LONG("--lossy-bits", O(lossy_bits), 1, 22, "N",
         "store each complete block of 64 steps rounded to N of float32's\n"
         "23 mantissa bits (relative error <= 2^-(N+1); e.g. 16: ~2.4 bytes\n"
         "per value all-in instead of ~3.5; the last steps, the latest values\n"
         "and the rollups stay exact; default: exact): see docs/storage.md"),
    BOOL("--lossy-bf16", O(lossy_bf16), "--lossy-bits 7 (bfloat16: ~1.2 bytes per value)"),
    FLAG_SECTION_ROW("HTTP API and dashboard:"),
    STR("--http", O(http_listen), "HOST:PORT",
        "serve the HTTP API and dashboard (default 127.0.0.1:8080);\n"
        "port 0 picks a free one (printed as \"http port N\"); 'off' for none.\n"
        "With --token, /api and /metrics need Authorization: Bearer TOKEN"),
    LONG("--http-max-conns", O(http_conns), 1, 100000, "N",
         "HTTP connections at most, stream clients included (default 512)"),
    LONG("--http-max-conns-per-ip", O(http_per_ip), 1, 100000, "N",
         "HTTP connections per client address (default a quarter\nof --http-max-conns)"),
    FLAG_LIST_ROW("--allow-host", O(allow_hosts), "NAME",
                  "also accept requests whose Host is NAME (repeatable); by default\n"
                  "only IP addresses and localhost (against DNS rebinding)"),
    STR("--web-root", O(web_root), "DIR", "serve the dashboard from DIR instead of the embedded copy"),
    BOOL("--metrics-heads", O(metrics_heads),
         "/metrics also exports the latest value of every head\n"
         "(layers x heads series per metric and run: mind the cardinality)"),
    FLAG_DURATION_ROW("--metrics-keep-finished", O(metrics_keep_s), "DURATION",
                      "/metrics exports a run that ended (finished,\n"
                      "failed, aborted or stale) for this long after its end, then\n"
                      "drops its series (default 1h; 0: at once). DURATION: N[s|m|h|d]"),
    LONG("--http-timeout-s", O(http_timeout_s), 1, 86400, "N",
         "close an HTTP connection that makes no progress for N s,\n"
         "a client that stopped reading included (default 60)"),
    LONG("--stream-events", O(stream_events), 1, 10000000, "N",
         "live events kept for Last-Event-ID resume (default 16384)"),
    LONG("--keepalive-ms", O(keepalive_ms), 10, 3600000, "N", "SSE keep-alive comment interval (default 15000)"),
    FLAG_SECTION_ROW("alerts and export:"),
    STR("--rules", O(rules), "FILE", "alert rules (JSON; default: the built-in set, see docs/alerts.md)"),
    STR("--webhook", O(webhook), "URL", "POST Alertmanager-style webhook JSON on firing and resolved"),
    STR("--on-alert", O(on_alert), "CMD", "run /bin/sh -c CMD with the alert JSON on stdin"),
    STR("--alertmanager", O(alertmanager), "URL",
        "also send alerts to Alertmanager's API (URL/api/v2/alerts),\n"
        "firing ones re-sent every --alertmanager-resend-s"),
    LONG("--alertmanager-resend-s", O(am_resend_s), 1, 86400, "N", "(default 60)"),
    BOOL("--quiet-alerts", O(quiet_alerts), "do not log alerts on stderr"),
    STR("--remote-write", O(remote_write), "URL",
        "also push every committed step to a Prometheus remote-write\n"
        "receiver (docs/remote-write.md)"),
    FLAG_VERSION_ROW("print the version and exit"),
    FLAG_HELP_ROW("this text (also -h)"),
};
static const flag_table TABLE = {"entropyd", FLAGS, FLAG_COUNT(FLAGS)};

static void usage(FILE *f) {
    fprintf(f, "usage: entropyd [flags]\n"
               "Stores attention-collapse telemetry from trainers (protocol v1, schema/protocol.md)\n"
               "in SQLite.\n");
    flags_usage(&TABLE, f);
    fprintf(f, "\nSIGTERM or SIGINT: stop accepting, commit, send the last acks, exit 0.\n");
}

/* --retain-raw: a number of steps (at least a block of 64, so the newest
 * sealed block is never the one deleted), or a duration with its unit
 * (s, m, h, d). 0, or -1 with a message. */
static int parse_retain(const char *s, long *steps, double *seconds) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    static const char units[] = "smhd";
    static const double secs[] = {1, 60, 3600, 86400};
    const char *u = *end ? strchr(units, *end) : NULL;
    if (!errno && end != s && u && !end[1] && v > 0 && v * secs[u - units] <= 3.2e9) {
        *seconds = v * secs[u - units];
        return 0;
    }
    long n = strtol(s, &end, 10);
    if (!errno && end != s && !*end && n >= 64) {
        *steps = n;
        return 0;
    }
    fprintf(stderr,
            "entropyd: --retain-raw wants a number of steps (64 or more) or a duration like 12h or 7d, "
            "got \"%s\"\n",
            s);
    return -1;
}

/* Fills o from the command line. Returns -1 to go on, or the exit status
 * (0 after --help or --version, 2 for a bad flag). */
static int options_parse(struct options *o, int argc, char **argv) {
    *o = (struct options){.data = "entropyd-data",
                          .token = getenv("ENTROPYD_TOKEN"),
                          .max_conns = 10000,
                          .queue_mb = 64,
                          .drain_ms = 5000,
                          .hello_s = 10,
                          .input_mb = 64,
                          .max_cells = INGEST_MAX_CELLS,
                          .http_listen = "127.0.0.1:8080",
                          .http_conns = 512,
                          .stream_events = 16384,
                          .keepalive_ms = 15000,
                          .http_timeout_s = 60,
                          .am_resend_s = 60,
                          .metrics_keep_s = 3600};
    char given[FLAG_COUNT(FLAGS)];
    switch (flags_parse(&TABLE, argc, argv, o, given)) {
    case FLAGS_HELP: usage(stdout); return 0;
    case FLAGS_VERSION:
        printf("entropyd %s (protocol %d, schema %d)\n", PROJECT_VERSION, PROTO_VERSION, store_schema_version());
        return 0;
    case FLAGS_BAD: return 2;
    default: break;
    }
    o->http_explicit = given[flags_find(&TABLE, "--http") - FLAGS];
    if (strcmp(o->http_listen, "off") == 0) o->http_listen = NULL;
    if (o->token && !*o->token) o->token = NULL;
    if (o->retain_raw && parse_retain(o->retain_raw, &o->retain_steps, &o->retain_s)) return 2;
    if (o->lossy_bf16) {
        if (o->lossy_bits && o->lossy_bits != FBLOCK_BITS_BF16) {
            fprintf(stderr, "entropyd: --lossy-bf16 is --lossy-bits %d; --lossy-bits %ld says otherwise\n",
                    FBLOCK_BITS_BF16, o->lossy_bits);
            return 2;
        }
        o->lossy_bits = FBLOCK_BITS_BF16;
    }
    return -1;
}

/* Creates the data directory and fills in the default database and socket
 * paths. Returns -1 to go on, or the exit status. */
static int options_paths(struct options *o) {
    if (mkdir(o->data, 0700) < 0 && errno != EEXIST) {
        fprintf(stderr, "entropyd: cannot create data directory %s: %s\n", o->data, strerror(errno));
        return 1;
    }
    snprintf(o->dbpath, sizeof o->dbpath, "%s/entropyd.db", o->data);
    snprintf(o->sockpath, sizeof o->sockpath, "%s/entropyd.sock", o->data);
    if (!o->db) o->db = o->dbpath;
    if (!o->sock) o->sock = o->sockpath;
    if (strcmp(o->sock, "off") == 0) o->sock = NULL;
    if (!o->sock && !o->tcp) {
        fprintf(stderr, "entropyd: no listener: give --socket or --listen-tcp\n");
        return 2;
    }
    return -1;
}

/* The running daemon's parts, in the order they start; daemon_close stops
 * them in reverse and accepts a half-started daemon. */
struct daemon {
    int lock_fd, efd;
    struct store *st;
    struct query_pool *pool;
    struct stream *stream;
    struct alerter *alerter;
    struct writer *w;
    struct http *http;
    struct hooks hooks;
    struct metrics_sources metrics; /* what /metrics reads (http_config.metrics_ctx) */
    char external[300];
};

/* The database, before anything else touches it: its lock, then the store
 * (migrated), its files made private, the runs an earlier daemon left live
 * marked stale; the pool of read connections. 0, or -1 (logged). */
static int daemon_open_storage(struct daemon *d, const struct options *o) {
    char err[1024];
    if ((d->lock_fd = lock_database(o->db, err, sizeof err)) < 0) goto fail;
    if (!(d->st = store_open(o->db, err, sizeof err))) goto fail;
    store_set_lossy_bits(d->st, (int)o->lossy_bits);
    make_database_private(o->db);
    int stale = store_mark_live_stale(d->st, now_wall());
    if (stale > 0) fprintf(stderr, "entropyd: %d run(s) left live by an earlier daemon are now stale\n", stale);
    /* HTTP's readers, and the alerter's one look at the alerts an earlier
     * daemon left firing */
    if (!(d->pool = query_pool_open(o->db, o->http_listen ? 16 : 1, err, sizeof err))) goto fail;
    return 0;
fail:
    fprintf(stderr, "entropyd: %s\n", err);
    return -1;
}

/* The live stream (with HTTP), the alerter, the writer and the trainers'
 * listeners, wired through the writer's hooks. 0, or -1 (logged). */
static int daemon_start_ingest(struct daemon *d, const struct options *o) {
    char err[1024];
    if ((d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        snprintf(err, sizeof err, "eventfd: %s", strerror(errno));
        goto fail;
    }
    if (o->http_listen) {
        struct stream_config scfg = {.max_events = (size_t)o->stream_events, .keepalive_ms = (int)o->keepalive_ms};
        if (!(d->stream = stream_create(&scfg, err, sizeof err))) goto fail;
        d->hooks.stream = d->stream;
        snprintf(d->external, sizeof d->external, "http://%s", o->http_listen); /* the port bound comes later */
    }
    struct alerter_config mcfg = {.rules_path = o->rules,
                                  .store = d->st,
                                  .stream = d->stream,
                                  .pool = d->pool,
                                  .notify = {.webhook_url = o->webhook,
                                             .exec_cmd = o->on_alert,
                                             .log = !o->quiet_alerts,
                                             .external_url = d->external,
                                             .alertmanager_url = o->alertmanager,
                                             .am_resend_s = (int)o->am_resend_s}};
    if (!(d->alerter = alerter_create(&mcfg, err, sizeof err))) goto fail;
    d->hooks.alerter = d->alerter;
    if (o->remote_write) {
        struct remote_write_config rcfg = {.url = o->remote_write, .db_path = o->db};
        if (!(d->hooks.remote_write = remote_write_create(&rcfg, err, sizeof err))) goto fail;
    }
    struct writer_config wcfg = {.max_bytes = (size_t)o->queue_mb << 20,
                                 .on_commit = on_commit,
                                 .on_tick = on_tick,
                                 .retain_steps = o->retain_steps,
                                 .retain_s = o->retain_s,
                                 .ctx = &d->hooks};
    if (!(d->w = writer_create(d->st, d->efd, &wcfg, err, sizeof err))) goto fail;
    alerter_set_writer(d->alerter, d->w);
    struct ingest_config icfg = {.socket_path = o->sock,
                                 .tcp = o->tcp,
                                 .token = o->token,
                                 .max_conns = (int)o->max_conns,
                                 .max_conns_per_peer = (int)o->per_peer,
                                 .hello_ms = (int)o->hello_s * 1000,
                                 .idle_ms = (int)o->idle_s * 1000,
                                 .max_input = (size_t)o->input_mb << 20,
                                 .max_cells_per_run = o->max_cells};
    if (!(g_ingest = ingest_create(&icfg, d->w, d->efd, err, sizeof err))) goto fail;
    return 0;
fail:
    fprintf(stderr, "entropyd: %s\n", err);
    return -1;
}

/* The HTTP API and dashboard, when asked for. A taken address is an
 * error, the default one too: running on without HTTP would leave the
 * user's browser (and its token) talking to whatever holds the port; port
 * 0 asks for any free port. 0, or -1 (logged). */
static int daemon_start_http(struct daemon *d, const struct options *o) {
    if (!o->http_listen) return 0;
    char err[1024];
    struct http_config hcfg = {.listen = o->http_listen,
                               .token = o->token,
                               .web_root = o->web_root,
                               .max_conns = (int)o->http_conns,
                               .timeout_s = (int)o->http_timeout_s,
                               .pool = d->pool,
                               .stream = d->stream,
                               .writer = d->w,
                               .rules_path = o->rules,
                               .allow_hosts = o->allow_hosts.v,
                               .n_allow_hosts = o->allow_hosts.n,
                               .max_conns_per_ip = (int)o->http_per_ip,
                               .metrics = metrics_write,
                               .metrics_ctx = &d->metrics};
    d->metrics = (struct metrics_sources){.alerter = d->alerter,
                                          .ingest = g_ingest,
                                          .writer = d->w,
                                          .stream = d->stream,
                                          .remote_write = d->hooks.remote_write,
                                          .pool = d->pool,
                                          .heads = o->metrics_heads,
                                          .keep_s = o->metrics_keep_s > 0 ? o->metrics_keep_s : -1};
    if (!(d->http = http_create(&hcfg, err, sizeof err))) {
        fprintf(stderr, "entropyd: %s%s\n", err,
                o->http_explicit ? ""
                                 : " (the default --http 127.0.0.1:8080: choose another with --http HOST:PORT, "
                                   "any free port with --http 127.0.0.1:0, or none with --http off)");
        return -1;
    }
    atomic_store(&d->hooks.http, d->http);
    /* alerts link to the port bound, not the one asked for (0 picks any) */
    char host[256];
    int port;
    if (net_split_hostport(o->http_listen, host, sizeof host, &port) == 0) {
        snprintf(d->external, sizeof d->external, strchr(host, ':') ? "http://[%s]:%d" : "http://%s:%d", host,
                 http_port(d->http));
        alerter_set_external_url(d->alerter, d->external);
    }
    return 0;
}

/* Stops what daemon_* started, in reverse; accepts a half-started daemon. */
static void daemon_close(struct daemon *d) {
    /* HTTP first: open streams end, no request reaches a closing writer */
    if (d->stream) stream_shutdown(d->stream);
    atomic_store(&d->hooks.http, NULL);
    http_destroy(d->http);
    ingest_destroy(g_ingest); /* marks still-connected runs stale through the writer */
    g_ingest = NULL;
    writer_destroy(d->w);                        /* commits everything queued */
    remote_write_destroy(d->hooks.remote_write); /* after the writer: its commit hook wakes it */
    alerter_destroy(d->alerter, 3000);           /* gives pending webhooks a moment */
    stream_destroy(d->stream);
    query_pool_close(d->pool);
    store_close(d->st);
    if (d->efd >= 0) close(d->efd);
    if (d->lock_fd >= 0) close(d->lock_fd);
}

/* Listening where anyone on the network can reach it, with no token. */
static void warn_if_open(const struct options *o) {
    if (o->token) return;
    if (o->tcp && !loopback_address(o->tcp))
        fprintf(stderr,
                "entropyd: warning: trainers are accepted on %s, not a loopback address, and no --token "
                "is set: anyone who can reach it can write runs\n",
                o->tcp);
    if (o->http_listen && !loopback_address(o->http_listen))
        fprintf(stderr,
                "entropyd: warning: HTTP is served on %s, not a loopback address, and no --token is "
                "set: anyone who can reach it can read and delete runs\n",
                o->http_listen);
}

/* The first lines on stdout, which scripts and tests read for the ports. */
static void print_listening(const struct daemon *d, const struct options *o) {
    printf("entropyd %s: db %s", PROJECT_VERSION, o->db);
    if (o->sock) printf(", socket %s", o->sock);
    if (o->tcp) printf(", tcp port %d", ingest_tcp_port(g_ingest));
    if (d->http) printf(", http %s", o->http_listen);
    printf("\n");
    if (d->http) printf("http port %d\n", http_port(d->http));
    fflush(stdout);
}

/* entropyd --check DIR: the database DIR/entropyd.db, or DIR itself when
 * it is a file; integrity_check's exit status (0 clean, 1 damage found, 2
 * cannot open). Never creates anything: a missing path is status 2. */
static int check_database(const char *dir) {
    struct stat sb;
    char path[4096];
    if (stat(dir, &sb) < 0) {
        fprintf(stderr, "entropyd --check: %s: %s\n", dir, strerror(errno));
        return 2;
    }
    snprintf(path, sizeof path, S_ISDIR(sb.st_mode) ? "%s/entropyd.db" : "%s", dir);
    if (stat(path, &sb) < 0) {
        fprintf(stderr, "entropyd --check: %s: %s\n", path, strerror(errno));
        return 2;
    }
    return integrity_check(path, stdout, stderr);
}

int main(int argc, char **argv) {
    /* Buffers over 256 KiB (a wide run's parsed values, its alert state)
     * are mapped and unmapped on their own: by default glibc raises this
     * threshold to the largest block freed, after which such buffers come
     * from the heap and stay there once freed (measured: +11 MB of RSS
     * kept after a 1024 x 1024-head run was deleted; bench/many_runs.sh). */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    static struct options o; /* large (paths): not on the stack */
    int rc = options_parse(&o, argc, argv);
    if (rc >= 0) return rc;
    if (o.check) return check_database(o.check);
    if ((rc = options_paths(&o)) >= 0) return rc;

    raise_fd_limit();
    signal(SIGPIPE, SIG_IGN);
    umask(077); /* every file the daemon creates (database, WAL, socket) is its owner's alone */

    struct daemon d = {.lock_fd = -1, .efd = -1};
    rc = 1;
    if (daemon_open_storage(&d, &o) == 0 && daemon_start_ingest(&d, &o) == 0 && daemon_start_http(&d, &o) == 0) {
        warn_if_open(&o);
        struct sigaction sa = {.sa_handler = on_signal};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        print_listening(&d, &o);
        rc = ingest_run(g_ingest, (int)o.drain_ms) == 0 ? 0 : 1;
        fprintf(stderr, "entropyd: stopping\n");
    }
    daemon_close(&d);
    return rc;
}
