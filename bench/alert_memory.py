"""Alert-state memory with live wide runs: the daemon with its default flags
(and the built-in rules), RUNS live runs of LAYERS x HEADS heads each
sending the five head metrics the built-in rules read for STEPS steps
(windows of 50 steps full at 50), then the daemon's RSS and
entropyd_alert_state_bytes from /metrics, and bytes a head.
docs/reliability.md's memory bound quotes this with the defaults:

    ENTROPYD=build/entropyd python3 bench/alert_memory.py

(RUNS=8 LAYERS=256 HEADS=256 STEPS=60: --max-cells-per-run's default).
tests/e2e_faults.py MemoryBoundTest checks the same on 4 smaller runs.
Standard library only."""
import os
import sys
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from daemon_harness import Client, Daemon  # noqa: E402

RUNS = int(os.environ.get("RUNS", "8"))
LAYERS = int(os.environ.get("LAYERS", "256"))
HEADS = int(os.environ.get("HEADS", "256"))
STEPS = int(os.environ.get("STEPS", "60"))
# the metrics the built-in rules read (tests/e2e_faults.py RULE_METRICS)
METRICS = {"entropy_norm": "0.8123457", "entropy": "3.1234567", "entropy_bound": "0.5123457",
           "sigma_qk": "1.2345678", "max_logit": "7.1234567"}


def main():
    d = Daemon(http=True).start()
    try:
        row = "[" + ",".join(["%s"] * HEADS) + "]"
        body = ",".join('"%s":[%s]' % (m, ",".join([row % ((v,) * HEADS)] * LAYERS)) for m, v in METRICS.items())
        cs = []
        for r in range(RUNS):
            c = Client(d.sock, timeout=600)
            c.hello("mem-%d" % r, layers=LAYERS, heads=HEADS)
            cs.append(c)
        for s in range(STEPS):
            for c in cs:
                c.send_raw(('{"type":"step","seq":%d,"step":%d,"scalars":{"loss":%g},"heads":{%s}}\n'
                            % (s + 1, s, 2.0 - s * 1e-3, body)).encode())
        for c in cs:
            c.wait_ack(STEPS, timeout=600)
        m = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % d.http_port, timeout=60).read().decode()
        alert = float(m.split("\nentropyd_alert_state_bytes ")[1].split()[0])
        rss = d.rss_kb() / 1024
        cells = RUNS * LAYERS * HEADS
        print("alert memory: %d live %dx%d runs, %d steps: RSS %.1f MiB, alert state %.1f MiB (%.1f bytes a head)"
              % (RUNS, LAYERS, HEADS, STEPS, rss, alert / 2**20, alert / cells))
        for c in cs:
            c.close()
    finally:
        d.cleanup()


if __name__ == "__main__":
    main()
