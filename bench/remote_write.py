"""Remote-write benchmark, run by bench/remote_write.sh.

One daemon holds a backlog (RW_STEPS steps, default 2,000, of a 12 x 12 run:
3 head metrics, 1 layer metric, loss: 446 series, 892,000 samples) committed
while its receiver is down. Then the receiver comes up and the time until
the daemon's cursor reaches the last step is the push time. Two receivers,
alternated (2 rounds each, best kept):
  - null: a Python HTTP server that reads each request and answers 204
    without decoding it (what the pusher itself costs: reading SQLite,
    encoding, snappy, HTTP);
  - prometheus: Debian's prometheus 2.42 with --web.enable-remote-write-receiver
    on fresh temp storage (decoding and appending to its TSDB, on the same cores).
Each round gives the daemon a new URL, so its cursor starts over and pushes
the whole backlog again. Prints samples/s and the daemon's CPU seconds per
million samples for both, and the machine's load. Standard library only."""
import http.server
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from daemon_harness import Client, Daemon, free_port  # noqa: E402

STEPS = int(os.environ.get("RW_STEPS", "2000"))
L, H = 12, 12
SERIES = 3 * L * H + L + 1 + 1  # + entropyd_run_last_step
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def seed(d):
    c = Client(d.sock)
    assert c.hello("bench-rw", layers=L, heads=H)["type"] == "welcome"
    t0 = time.time() - 1800
    for s in range(1, STEPS + 1):
        v = [[((s * 131 + l * 17 + h * 7) % 9973) / 997.0 for h in range(H)] for l in range(L)]
        c.send({"type": "step", "seq": s, "step": s, "time": t0 + s * 0.1, "scalars": {"loss": 3.0 - s * 1e-4},
                "layers": {"rank_ratio": [0.5] * L},
                "heads": {"entropy_norm": v, "attn_max": v, "kl_uniform": v}})
    c.wait_ack(STEPS, timeout=120)
    c.close()


def cursor_step(d):
    try:
        with open(d.db + ".remote-write") as f:
            lines = f.read().splitlines()[2:]
        return max((int(x.split()[1]) for x in lines), default=-1)
    except (OSError, ValueError):
        return -1


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


class Null:
    def __init__(self, port):
        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


class Prom:
    def __init__(self, port, tmp):
        self.dir = tempfile.mkdtemp(dir=tmp)
        cfg = os.path.join(self.dir, "p.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
        self.p = subprocess.Popen([PROMETHEUS, "--config.file=" + cfg, "--storage.tsdb.path=" + self.dir + "/db",
                                   "--web.listen-address=127.0.0.1:%d" % port, "--web.enable-remote-write-receiver"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/-/ready" % port, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("prometheus not ready")
            time.sleep(0.05)

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)


def round_(d, kind, tmp):
    """Restarts d pointed at a new receiver URL (down), brings the receiver
    up, and times the push of the whole backlog."""
    port = free_port()
    d.stop()
    d.args = ["--remote-write", "http://127.0.0.1:%d/api/v1/write" % port]
    d.start()
    time.sleep(0.3)  # let its first pass meet the closed port (backoff starts at 100 ms)
    rx = Null(port) if kind == "null" else Prom(port, tmp)
    c0, t0 = cpu_s(d.proc.pid), time.time()
    while cursor_step(d) != STEPS:
        if time.time() - t0 > 600:
            raise RuntimeError("push did not finish")
        time.sleep(0.01)
    dt, cpu = time.time() - t0, cpu_s(d.proc.pid) - c0
    rx.stop()
    return STEPS * SERIES / dt, cpu / (STEPS * SERIES / 1e6)


def main():
    tmp = tempfile.mkdtemp(prefix="bench-rw-")
    d = Daemon(data=os.path.join(tmp, "data"), args=["--remote-write", "http://127.0.0.1:%d/w" % free_port()])
    os.makedirs(d.data)
    try:
        d.start()
        seed(d)
        res = {"null": [], "prometheus": []}
        for _ in range(2):
            for kind in ("null", "prometheus"):
                res[kind].append(round_(d, kind, tmp))
        n, p = max(res["null"]), max(res["prometheus"])
        print("remote write: %d steps x %d series = %d samples, load %.1f" % (STEPS, SERIES, STEPS * SERIES,
                                                                          os.getloadavg()[0]))
        print("  %-28s %14s %14s" % ("", "null receiver", "prometheus"))
        print("  %-28s %14.0f %14.0f" % ("samples/s (best of 2)", n[0], p[0]))
        print("  %-28s %14.2f %14.2f" % ("daemon CPU s / 1M samples", n[1], p[1]))
        print("  prometheus / null push rate: %.2f" % (p[0] / n[0]))
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
