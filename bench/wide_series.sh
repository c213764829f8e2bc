#!/usr/bin/env bash
# Whole-run series of a wide model (issue "Long runs", 32 x 32 heads): a run
# of STEPS steps, LAYERS x HEADS heads, HEAD_METRICS head metrics (synthetic
# values), seeded by bench_history_seed and served by the real entropyd;
# REQUESTS requests of 1000 points each on one keep-alive connection, of one
# head (layer 7 head 5), of a layer and of the whole metric, p50 and p99.
# BASE=DIR (the build directory of another checkout, say the previous
# release's) seeds and serves the same run with that build too, and prints
# both side by side: the figures of one machine at one time.
#   STEPS=100000 LAYERS=32 HEADS=32 BASE=../old/build bench/wide_series.sh
set -euo pipefail
BUILD=${BUILD:-build}
STEPS=${STEPS:-100000}
LAYERS=${LAYERS:-32}
HEADS=${HEADS:-32}
HM=${HEAD_METRICS:-1}
REQUESTS=${REQUESTS:-200}
dir=$(mktemp -d /tmp/entropyd-wide.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
. scripts/start-entropyd.sh
builds=("$BUILD")
[ -n "${BASE:-}" ] && builds+=("$BASE")
ports=()
for i in "${!builds[@]}"; do
  b=${builds[$i]}
  mkdir -p "$dir/$i"
  t0=$(date +%s)
  "$b/bench/bench_history_seed" --db "$dir/$i/entropyd.db" --run wide --steps "$STEPS" --layers "$LAYERS" \
    --heads "$HEADS" --head-metrics "$HM" >/dev/null
  sync "$dir/$i/entropyd.db"
  cat "$dir/$i/entropyd.db" >/dev/null
  echo "wide: $b seeded $STEPS steps of $LAYERS x $HEADS in $(( $(date +%s) - t0 )) s ($(( $(stat -c %s "$dir/$i/entropyd.db") / 1048576 )) MiB)"
  start_entropyd "$b/entropyd" "$dir/$i"
  pids+=("$entropyd_pid")
  ports+=("$entropyd_port")
done
echo "wide: load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
/usr/bin/python3 - "$REQUESTS" "${ports[@]}" <<'PY'
import http.client, json, sys, time
reqs = int(sys.argv[1]); ports = sys.argv[2:]
conns = [http.client.HTTPConnection("127.0.0.1", int(p)) for p in ports]
def get(c, path):
    c.request("GET", path)
    r = c.getresponse(); body = r.read()
    if r.status != 200: raise SystemExit("wide: %s: HTTP %d %s" % (path, r.status, body[:200]))
    return body
run = json.loads(get(conns[0], "/api/runs"))
rid = [r for r in run["runs"]][0]["id"] if isinstance(run, dict) else run[0]["id"]
queries = [("one head (layer 7, head 5)", "&layer=7&head=5"), ("one layer (layer 7)", "&layer=7"), ("whole metric", "")]
print("wide: series of 1000 points over the whole run, %d requests each, ms" % reqs)
print("wide: %-28s %s" % ("", "   ".join("%-17s" % ("p50 / p99 " + ("new" if i == 0 else "base")) for i in range(len(conns)))))
for name, q in queries:
    path = "/api/runs/%d/series?metric=entropy_norm&points=1000%s" % (rid, q)
    t = [[] for _ in conns]
    for k in range(reqs):
        for i, c in enumerate(conns):  # interleaved: both see the same moments of the machine
            t0 = time.perf_counter(); get(c, path); t[i].append((time.perf_counter() - t0) * 1000)
    cells = []
    for x in t:
        x.sort(); cells.append("%6.2f / %6.2f   " % (x[len(x) // 2], x[min(len(x) - 1, int(len(x) * 0.99))]))
    print("wide: %-28s %s" % (name, "".join(cells)))
PY
