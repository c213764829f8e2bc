"""make bench, healthz_slots: /healthz and /metrics answered through the
reserved HTTP slots (daemon/http_slots.h) while 512 /api/stream clients
hold every ordinary one, beside the same probes with no stream open (the
machine's own latency). A probe is a fresh connection from 127.0.0.1, as a
health checker makes; PROBES of each (default 400), 20 ms apart.
Prints p50/p99/max and the unanswered count; exits 1 when /healthz p99
exceeds 100 ms or a probe went unanswered."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from daemon_harness import Daemon, wait_for  # noqa: E402
from e2e_faults import STREAMS, open_streams  # noqa: E402
from e2e_http_guard import raw  # noqa: E402

PROBES = int(os.environ.get("PROBES", "400"))
BAR_MS = 100.0


def probe(port, path):
    lat, failed = [], 0
    for _ in range(PROBES):
        t0 = time.perf_counter()
        try:
            st, _ = raw(port, "GET", path, timeout=5)
        except OSError:
            st = None
        if st == 200:
            lat.append((time.perf_counter() - t0) * 1e3)
        else:
            failed += 1
        time.sleep(0.02)
    lat.sort()
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")  # noqa: E731
    return pct(0.5), pct(0.99), lat[-1] if lat else float("nan"), failed


def main():
    print("healthz_slots: load average before: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
    d = Daemon(http=True).start()
    socks = []
    ok = True
    try:
        port = d.http_port
        quiet = {p: probe(port, p) for p in ("/healthz", "/metrics")}
        socks = open_streams(port, STREAMS)
        wait_for(lambda: "\nentropyd_stream_clients %d\n" % STREAMS in raw(port, "GET", "/metrics")[1],
                 what="%d streams" % STREAMS)
        busy = {p: probe(port, p) for p in ("/healthz", "/metrics")}
        for p in ("/healthz", "/metrics"):
            q, b = quiet[p], busy[p]
            print("healthz_slots: %-8s %d probes: no stream p50 %.2f p99 %.2f max %.1f ms, %d unanswered | "
                  "%d streams p50 %.2f p99 %.2f max %.1f ms, %d unanswered"
                  % (p, PROBES, q[0], q[1], q[2], q[3], STREAMS, b[0], b[1], b[2], b[3]))
        h = busy["/healthz"]
        ok = h[1] <= BAR_MS and h[3] == 0
        print("healthz_slots: /healthz with %d streams: p99 %.2f ms (bar %.0f ms), %d unanswered: %s"
              % (STREAMS, h[1], BAR_MS, h[3], "pass" if ok else "FAIL"))
    finally:
        for s in socks:
            s.close()
        d.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
