/* fixture_telemetry.h: a real entropyd in a new temporary directory and a
 * telemetry client streaming one run to it over its Unix socket, spooling
 * under the same directory: the setup the frozen-daemon test and benchmark
 * share. Header-only, like fixture.h. */
#ifndef FIXTURE_TELEMETRY_H
#define FIXTURE_TELEMETRY_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "fixture.h"
#include "telemetry.h"

struct daemon_client {
    char dir[64], sock[128], spool[128], db[128], log[128], addr[160];
    pid_t pid;    /* the daemon: the caller stops and reaps it */
    telemetry *t; /* the caller destroys it */
};

/* Makes the directory from tmpl (mkdtemp's XXXXXX form), starts the daemon
 * there and creates the client of run (layers x heads, seq_len 128). 0, or
 * -1 with the reason in err; on failure nothing is left running (the
 * directory stays, for its log). */
static inline int daemon_client_start(struct daemon_client *dc, const char *tmpl, const char *run, int layers,
                                      int heads, char *err, size_t errcap) {
    snprintf(dc->dir, sizeof dc->dir, "%s", tmpl);
    if (!mkdtemp(dc->dir)) {
        snprintf(err, errcap, "mkdtemp %s: %s", tmpl, strerror(errno));
        return -1;
    }
    snprintf(dc->sock, sizeof dc->sock, "%s/entropyd.sock", dc->dir);
    snprintf(dc->spool, sizeof dc->spool, "%s/spool", dc->dir);
    snprintf(dc->db, sizeof dc->db, "%s/entropyd.db", dc->dir);
    snprintf(dc->log, sizeof dc->log, "%s/daemon.log", dc->dir);
    snprintf(dc->addr, sizeof dc->addr, "unix:%s", dc->sock);
    if ((dc->pid = entropyd_start(dc->dir, dc->sock, dc->log, err, errcap)) < 0) return -1;
    telemetry_config cfg;
    telemetry_config_init(&cfg);
    cfg.address = dc->addr;
    cfg.run = run;
    cfg.layers = layers;
    cfg.heads = heads;
    cfg.seq_len = 128;
    cfg.spool_dir = dc->spool;
    char why[512];
    if (!(dc->t = telemetry_create(&cfg, why, sizeof why))) {
        snprintf(err, errcap, "telemetry_create: %s", why);
        kill(dc->pid, SIGKILL);
        waitpid(dc->pid, NULL, 0);
        return -1;
    }
    return 0;
}

#endif
