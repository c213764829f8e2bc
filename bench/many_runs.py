"""Many-runs benchmark, run by bench/many_runs.sh.

Two daemons side by side: one with 10 runs stored, one with 10,000 (seeded
over the protocol: hello, one step, end). Every figure alternates between
them, so that other load on the machine weighs on both alike:
  - hello latency: hello -> welcome of 400 new runs each, median and p90,
    and the daemon's CPU time per hello (+ its end), which other load on
    the machine does not inflate as it does a latency;
  - ingest rate: a run streaming 1,000 steps of 12 x 12 heads (3 head
    metrics + loss), head-values committed and acked per second, best of 3;
  - /api/runs first page (limit=100, the runs page's request), median of 100;
  - the runs page's first render in chromium (bench/many_runs.mjs), median of LOADS;
  - daemon RSS per idle stored run: RSS growth while seeding 9,990 runs.
Then a 1024 x 1024-head run (3 steps of entropy_norm; BIG_STEPS=N for
more: its alert windows fill up to 50 steps) is sent, ended and deleted: RSS before, at its peak and after, and the same for a second one.
Prints the two cases side by side with their ratio (the targets:
<= 1.5 for hello latency, first page and first render; first render
<= 1 s with 10,000 runs; RSS back within 10% after the big run).
Standard library only (plus node + chromium for the render)."""
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from daemon_harness import Client, Daemon, wait_for  # noqa: E402

MANY = int(os.environ.get("MANY_RUNS", "10000"))
FEW = 10


def pct(xs, p):
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


def seed(d, names, conns=8):
    """hello, one step, end for each name, over `conns` connections in parallel."""
    chunks = [names[i::conns] for i in range(conns)]

    def work(chunk):
        c = Client(d.sock, timeout=60)
        for i, name in enumerate(chunk):
            w = c.hello(name, layers=2, heads=4, meta={"reparam": "sigma" if i % 2 else "none", "sweep": name[:6]})
            seq = w["last_seq"]
            ent = [[0.5 + 0.01 * ((i + h) % 7) for h in range(4)] for _ in range(2)]
            c.send({"type": "step", "seq": seq + 1, "step": 0, "scalars": {"loss": 3.0},
                    "heads": {"entropy_norm": ent}})
            c.send({"type": "end", "seq": seq + 2, "status": "finished"})
            c.wait_ack(seq + 2, timeout=60)
        c.close()

    ts = [threading.Thread(target=work, args=(ch,)) for ch in chunks if ch]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def hello_once(c, name):
    t0 = time.perf_counter()
    w = c.hello(name, layers=2, heads=4)
    dt = (time.perf_counter() - t0) * 1e3
    c.send({"type": "end", "seq": w["last_seq"] + 1, "status": "finished"})
    c.wait_ack(w["last_seq"] + 1)
    return dt


def ingest_rate(d, tag, steps=1000, L=12, H=12):
    c = Client(d.sock, timeout=60)
    w = c.hello("ingest-%s" % tag, layers=L, heads=H)
    grid = json.dumps([[0.5 + 0.001 * ((l * H + h) % 97) for h in range(H)] for l in range(L)])
    lines = []
    for s in range(steps):
        lines.append('{"type":"step","seq":%d,"step":%d,"scalars":{"loss":%g},"heads":{"entropy_norm":%s,'
                     '"entropy":%s,"max_logit":%s}}\n' % (w["last_seq"] + 1 + s, s, 3.0 - s * 1e-4, grid, grid, grid))
    data = "".join(lines).encode()
    t0 = time.perf_counter()
    c.send_raw(data)
    c.wait_ack(w["last_seq"] + steps, timeout=300)
    dt = time.perf_counter() - t0
    c.send({"type": "end", "seq": w["last_seq"] + steps + 1, "status": "finished"})
    c.wait_ack(w["last_seq"] + steps + 1)
    c.close()
    return steps * 3 * L * H / dt


def page_once(d):
    url = "http://127.0.0.1:%d/api/runs?limit=100&sort=id&order=desc" % d.http_port
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as r:
        size = len(r.read())
    return (time.perf_counter() - t0) * 1e3, size


def render(d, loads):
    out = subprocess.run(["node", os.path.join(ROOT, "bench", "many_runs.mjs"), "http://127.0.0.1:%d/" % d.http_port,
                          str(loads)], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        print("many_runs: render failed: %s" % out.stderr[-2000:])
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def nruns(d):
    return len(json.loads(urllib.request.urlopen("http://127.0.0.1:%d/api/runs" % d.http_port).read()))


def cpu_s(d):
    """The daemon's user + system CPU time so far (seconds)."""
    f = open("/proc/%d/stat" % d.proc.pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def measure_both(few_d, many_d):
    """Every figure alternates between the two daemons, so that whatever
    else loads the machine weighs on both alike."""
    ds = {"few": few_d, "many": many_d}
    m = {k: {"runs": nruns(d), "hello": [], "page": [], "ingest": [], "render": []} for k, d in ds.items()}
    conns = {k: Client(d.sock, timeout=60) for k, d in ds.items()}
    cpu0 = {k: cpu_s(d) for k, d in ds.items()}
    hellos = 400
    for i in range(hellos):
        for k in ("few", "many") if i % 2 else ("many", "few"):
            m[k]["hello"].append(hello_once(conns[k], "hello-%04d" % i))
    for k, d in ds.items():
        m[k]["hello_cpu_ms"] = (cpu_s(d) - cpu0[k]) * 1e3 / hellos
    for c in conns.values():
        c.close()
    for i in range(100):
        for k in ("few", "many") if i % 2 else ("many", "few"):
            t, size = page_once(ds[k])
            m[k]["page"].append(t)
            m[k]["bytes"] = size
    for i in range(3):
        for k in ("few", "many") if i % 2 else ("many", "few"):
            m[k]["ingest"].append(ingest_rate(ds[k], "%s-%d" % (k, i)))
    loads = int(os.environ.get("LOADS", "5"))
    for i in range(loads):
        for k in ("few", "many") if i % 2 else ("many", "few"):
            r = render(ds[k], 1)
            if r:
                m[k]["render"].append(r["median"])
                m[k]["requests"] = r["requests"]
    time.sleep(0.5)
    for k, d in ds.items():
        m[k]["rss_kb"] = d.rss_kb()
    return m["few"], m["many"]


def rss_anon_kb(d):
    """The daemon's anonymous resident memory (its heap, caches and maps;
    VmRSS adds file pages of the database mapped by readers)."""
    with open("/proc/%d/status" % d.proc.pid) as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def alert_state_bytes(d):
    """entropyd_alert_state_bytes from /metrics: the engine's per-cell state."""
    body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % d.http_port, timeout=30).read().decode()
    for line in body.splitlines():
        if line.startswith("entropyd_alert_state_bytes "):
            return float(line.split()[1])
    return float("nan")


def big_run(d, name, L=1024, H=1024, steps=int(os.environ.get("BIG_STEPS", "3"))):
    c = Client(d.sock, timeout=120)
    w = c.hello(name, layers=L, heads=H)
    row = "[" + ",".join("1" if h % 3 else "0" for h in range(H)) + "]"
    vals = "[" + ",".join([row] * L) + "]"
    for s in range(steps):
        c.send_raw(('{"type":"step","seq":%d,"step":%d,"heads":{"entropy_norm":%s}}\n'
                    % (w["last_seq"] + 1 + s, s, vals)).encode())
        if s % 3 == 2 or s == steps - 1:  # a few 2 MB lines in flight at most, as a trainer's would be
            c.wait_ack(w["last_seq"] + 1 + s, timeout=300)
    peak = d.rss_kb()
    state = alert_state_bytes(d)
    c.send({"type": "end", "seq": w["last_seq"] + steps + 1, "status": "finished"})
    c.wait_ack(w["last_seq"] + steps + 1, timeout=60)
    c.close()
    req = urllib.request.Request("http://127.0.0.1:%d/api/runs/%d" % (d.http_port, w["run_id"]), method="DELETE")
    urllib.request.urlopen(req, timeout=120).read()
    # the DELETE removes the run at once and purges its rows in chunks
    # afterwards (writer.h), reading them back into the writer's cache,
    # which it releases when the purge is done: measure after that
    wait_for(lambda: d.query("SELECT count(*) FROM purge")[0][0] == 0, timeout=300, what="the purge")
    time.sleep(0.5)
    return peak, state, d.rss_kb(), rss_anon_kb(d)


def main():
    print("many_runs: load average before: %s on %d cores" % (" ".join(open("/proc/loadavg").read().split()[:3]),
                                                              os.cpu_count()))
    # the 1024 x 1024-head run is over the default --max-cells-per-run
    big = ["--max-cells-per-run", "1048576"]
    few_d = Daemon(http=True, args=big).start()
    many_d = Daemon(http=True, args=big).start()
    try:
        seed(few_d, ["few-%02d" % i for i in range(FEW)])
        seed(many_d, ["few-%02d" % i for i in range(FEW)])
        rss_few_seeded = many_d.rss_kb()
        t0 = time.time()
        seed(many_d, ["many-%05d" % i for i in range(MANY - FEW)])
        print("many_runs: seeded %d runs in %.1f s" % (MANY - FEW, time.time() - t0))
        time.sleep(0.5)
        rss_many_seeded = many_d.rss_kb()
        few, many = measure_both(few_d, many_d)
        print("many_runs: %-36s %14s %14s %8s" % ("", "%d runs" % few["runs"], "%d runs" % many["runs"], "ratio"))

        def row(label, a, b, fmt="%.2f", target=""):
            r = b / a if a else float("nan")
            print("many_runs: %-36s %14s %14s %8.2f %s" % (label, fmt % a, fmt % b, r, target))
        med = statistics.median
        row("hello latency median (ms)", med(few["hello"]), med(many["hello"]), target="(target <= 1.5)")
        row("hello latency p90 (ms)", pct(few["hello"], 0.9), pct(many["hello"], 0.9))
        row("daemon CPU per hello + end (ms)", few["hello_cpu_ms"], many["hello_cpu_ms"])
        row("ingest, best of 3 (head-values/s)", max(few["ingest"]), max(many["ingest"]), fmt="%.3g")
        row("/api/runs first page median (ms)", med(few["page"]), med(many["page"]), target="(target <= 1.5)")
        row("/api/runs first page p90 (ms)", pct(few["page"], 0.9), pct(many["page"], 0.9))
        row("/api/runs first page (bytes)", few["bytes"], many["bytes"], fmt="%d")
        if few["render"] and many["render"]:
            row("runs page first render median (ms)", med(few["render"]), med(many["render"]),
                fmt="%.0f", target="(target <= 1.5; <= 1000 ms at 10k)")
            row("runs page API requests", few["requests"], many["requests"], fmt="%d")
        row("daemon RSS after the figures (KiB)", few["rss_kb"], many["rss_kb"], fmt="%d")
        per = (rss_many_seeded - rss_few_seeded) * 1024.0 / (MANY - FEW)
        print("many_runs: daemon RSS per idle stored run: %.0f bytes (%d -> %d KiB over %d runs seeded)"
              % (per, rss_few_seeded, rss_many_seeded, MANY - FEW))
        d = few_d
        before, anon_before = d.rss_kb(), rss_anon_kb(d)
        for i in range(2):
            peak, state, after, anon = big_run(d, "big-%d" % i)
            print("many_runs: 1024x1024-head run %d (%s steps of entropy_norm): RSS before %d KiB, peak %d KiB "
                  "(alert state %.0f MiB), after end + delete %d KiB (%+.1f%% of before; target at most +10%%); "
                  "anonymous %d -> %d KiB (%+.1f%%)"
                  % (i, os.environ.get("BIG_STEPS", "3"), before, peak, state / 2**20, after,
                     100.0 * (after - before) / before, anon_before, anon, 100.0 * (anon - anon_before) / anon_before))
        print("many_runs: load average after: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
    finally:
        for d in (few_d, many_d):
            d.stop()
            d.cleanup()


if __name__ == "__main__":
    main()
