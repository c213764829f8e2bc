"""How far lossless coding could take a real sigmatrain stream (the
2.5 bytes/value target), metric by metric, against what the blocks cost today.

    python3 bench/storage_floor.py DB [LONG_DB]

DB is an entropyd database (its longest run is read); LONG_DB, optional, the
same stream replayed to a long run (bench_history_seed --replay DB), whose
pages give the all-in overhead per value (a short recording's fixed pages
would weigh too much).

For every metric with at least 100 frames it prints the bytes per value its
sealed chunks take in DB (per value they hold: the open block's raw frames
are left out) (format 3, daemon/fblock.c: the delta from the same
cell's previous step, 32 bit planes, zstd) and the cost an ideal adaptive
coder would reach on the residuals of four predictors, each on the float32
bits as integers (for positive floats a difference of bits is a difference of
log2 scaled by 2^23, so a common multiplicative change cancels):

  time        the same cell at the previous step (what format 3 codes);
  linear      two steps back extrapolated (2 x[t-1] - x[t-2]);
  neighbour   the previous step plus the change of the cell before it in
              the same layer (the Lorenzo predictor: catches a change all
              heads of a layer share, such as logit_scale's input norm);
  metric      the previous step plus the change of a related metric at the
              same cell (entropy_norm from entropy, entropy_bound and
              max_logit from logit_scale), where there is one.

The ideal coder: a residual r is coded as its size class k (the bit length
of zigzag(r)) with an adaptive model fitted to the whole metric, i.e. the
class entropy, plus its k - 1 low bits raw. This is what zstd on bit planes
approximates (the stored column tracks it within a few percent); it is an
estimate for a coder that knows each metric's class distribution in advance,
so it errs low. A line then gives what a real size-class coder, per block
and chunk as format 3, takes on the same sealed blocks (class_coder_bytes).
The last lines add the other parts of LONG_DB (dbstat:
the block pages' free space and row headers, rollups, raw frames of the open
blocks, indexes) per value to the best predictor per metric: the all-in
figure a codec built on these predictors could reach.
"""
import ctypes
import os
import sqlite3
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from daemon_harness import shadow_frames  # noqa: E402

_zstd = None
RELATED = {"entropy_norm": "entropy", "entropy_bound": "logit_scale", "max_logit": "logit_scale"}


def size_classes(r):
    """The size class of each residual in r (int64, any shape): the bit
    length of its zigzag code (0 for 0); the k - 1 bits below the leading
    one are what a size-class coder stores raw."""
    z = np.where(r >= 0, 2 * r, -2 * r - 1).astype(np.uint64)
    k = np.zeros(z.shape, dtype=np.int64)
    nz = z > 0
    k[nz] = np.floor(np.log2(z[nz].astype(np.float64))).astype(np.int64) + 1
    return k


def ideal_bytes(r):
    """Bytes per residual of the size-class + raw-bits coder described above."""
    r = np.asarray(r, dtype=np.int64).ravel()
    if not r.size:
        return float("nan")
    k = size_classes(r)
    _, cnt = np.unique(k, return_counts=True)
    p = cnt / cnt.sum()
    return (-(p * np.log2(p)).sum() * k.size + np.maximum(k - 1, 0).sum()) / 8 / k.size


def load(con):
    """The heads per layer of the longest run, and {metric name: (metric id,
    kind, steps, values as int64 bits [steps, cells])} of its metrics with at
    least 100 frames."""
    run = con.execute("SELECT s.run_id, r.heads FROM steps s JOIN runs r ON r.id = s.run_id GROUP BY s.run_id "
                      "ORDER BY count(*) DESC LIMIT 1").fetchone()
    if not run:
        raise SystemExit("storage_floor: the database has no steps")
    shadow_frames(con)
    out = {}
    for mid, name, kind in con.execute("SELECT id, name, kind FROM metrics WHERE run_id = ?", (run[0],)):
        rows = con.execute("SELECT step, data FROM temp.frames WHERE metric_id = ? ORDER BY step", (mid,)).fetchall()
        if len(rows) >= 100:
            bits = np.stack([np.frombuffer(d, dtype="<u4") for _, d in rows]).astype(np.int64)
            out[name] = (mid, kind, np.array([s for s, _ in rows]), bits)
    return run[1], out


def sealed(con, mid, cells):
    """Metric mid's sealed blocks: the bytes of their chunks (data only) and
    the values they hold (the steps of chunk 0's masks, times cells)."""
    base = con.execute("SELECT base, chunks FROM block_series WHERE metric_id = ?", (mid,)).fetchone()
    if not base:
        return 0, 0
    b, c = base
    size = con.execute("SELECT sum(length(data)) FROM block_chunks WHERE id >= ? AND id < ?",
                       (b << 26, (b + c) << 26)).fetchone()[0] or 0
    steps = sum(bin(m & (1 << 64) - 1).count("1")
                for (m,) in con.execute("SELECT mask FROM block_chunks WHERE id >= ? AND id < ?", (b << 26, (b + 1) << 26)))
    return size, steps * cells


def count_values(con):
    """How many values con's database holds (every run), without decoding:
    per metric, its raw frames' and its sealed blocks'."""
    total = 0
    for mid, cells in con.execute("SELECT m.id, CASE m.kind WHEN 0 THEN 1 WHEN 1 THEN r.layers "
                                  "ELSE r.layers * r.heads END FROM metrics m JOIN runs r ON r.id = m.run_id").fetchall():
        raw = con.execute("SELECT count(*) FROM frames WHERE metric_id = ?", (mid,)).fetchone()[0]
        total += raw * cells + sealed(con, mid, cells)[1]
    return total


def zstd_size(data):
    """The size of zstd's fast mode (level -1, as daemon/fblock.c) on data (libzstd through ctypes)."""
    global _zstd
    if _zstd is None:
        _zstd = ctypes.CDLL("libzstd.so.1")
        _zstd.ZSTD_compressBound.restype = ctypes.c_size_t
        _zstd.ZSTD_compress.restype = ctypes.c_size_t
        _zstd.ZSTD_compress.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
    dst = ctypes.create_string_buffer(_zstd.ZSTD_compressBound(len(data)))
    return _zstd.ZSTD_compress(dst, len(dst), data, len(data), -1)


def class_coder_bytes(bits, steps):
    """What a size-class coder, a real one, takes for the sealed blocks of one
    metric: per block of 64 steps and chunk of 16 cells (as format 3), the
    residuals from the previous step of the block (the first from 0), each
    residual's size class as a byte, zstd's fast mode on those bytes, and the
    k - 1 bits below each residual's leading one packed raw, plus a 3-byte
    header. Returns (bytes, values)."""
    blocks = steps // 64
    size = values = 0
    for b in np.unique(blocks)[:-1]:  # the last block is the open one
        x = bits[blocks == b]
        for c0 in range(0, x.shape[1], 16):
            xc = x[:, c0:c0 + 16]
            r = np.diff(np.vstack([np.zeros((1, xc.shape[1]), np.int64), xc]), axis=0)
            k = size_classes((r + 2 ** 31) % 2 ** 32 - 2 ** 31)
            size += zstd_size(k.T.astype(np.uint8).tobytes()) + (int(np.maximum(k - 1, 0).sum()) + 7) // 8 + 3
            values += xc.size
    return size, values


def predictors(name, bits, cells, heads, metrics):
    """The residuals of each predictor for one metric (rows: steps 2.., all cells)."""
    d = np.diff(bits, axis=0)
    res = {"time": d[1:], "linear": d[1:] - d[:-1]}
    nb = d.copy()
    first = np.arange(cells) % heads == 0 if cells > heads else np.arange(cells) == 0
    idx = np.arange(cells)
    nb[:, ~first] = d[:, ~first] - d[:, idx[~first] - 1]
    res["neighbour"] = nb[1:]
    rel = RELATED.get(name)
    if rel in metrics and metrics[rel][3].shape == bits.shape:
        res["metric"] = (d - np.diff(metrics[rel][3], axis=0))[1:]
    return res


def main():
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    if len(sys.argv) not in (2, 3):
        raise SystemExit("usage: storage_floor.py DB [LONG_DB] (--help says more)")
    for path in sys.argv[1:]:
        if not os.path.exists(path):
            raise SystemExit("storage_floor: no such database: %s" % path)
    path = sys.argv[1]
    con = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
    heads, metrics = load(con)
    if not metrics:
        raise SystemExit("storage_floor: %s has no metric with 100 frames or more: record a longer run" % path)
    names = ["time", "linear", "neighbour", "metric"]
    print("storage_floor: %s, %d metrics, bytes per value" % (path, len(metrics)))
    print("storage_floor: %-15s %9s %7s" % ("metric", "values", "stored") + "".join("%10s" % n for n in names) + "      best")
    tot = {"values": 0, "stored": 0.0, "sealed": 0, "best": 0.0, "classes": 0, "class_values": 0,
           **{n: 0.0 for n in names}}
    for name, (mid, kind, steps, bits) in metrics.items():
        n = bits.size
        size, nsealed = sealed(con, mid, bits.shape[1])
        res = predictors(name, bits, bits.shape[1], heads, metrics)
        cost = {k: ideal_bytes(v) for k, v in res.items()}
        best = min(cost.values())
        cols = "".join("%10.2f" % cost[k] if k in cost else "%10s" % "-" for k in names)
        print("storage_floor: %-15s %9d %7.2f%s %9.2f" % (name, n, size / max(nsealed, 1), cols, best))
        tot["values"] += n
        tot["stored"] += size
        tot["sealed"] += nsealed
        tot["best"] += best * n
        cb, cv = class_coder_bytes(bits, steps)
        tot["classes"] += cb
        tot["class_values"] += cv
        for k in names:
            tot[k] += cost.get(k, cost["time"]) * n
    v = tot["values"]
    print("storage_floor: %-15s %9d %7.2f%s %9.2f" % ("all", v, tot["stored"] / max(tot["sealed"], 1),
                                                       "".join("%10.2f" % (tot[k] / v) for k in names), tot["best"] / v))
    print("storage_floor: (in the all row, a metric without a related one counts its previous-step cost "
          "in the metric column)")
    print("storage_floor: a real size-class coder (the previous step; per block and chunk of 16 cells, the classes "
          "zstd-coded, the low bits raw) on the same sealed blocks: %.2f bytes/value, against format 3's %.2f"
          % (tot["classes"] / max(tot["class_values"], 1), tot["stored"] / max(tot["sealed"], 1)))
    if len(sys.argv) < 3:
        return
    long = sqlite3.connect("file:%s?mode=ro" % sys.argv[2], uri=True)
    values = count_values(long)
    pages, payload = long.execute("SELECT sum(pgsize), sum(payload) FROM dbstat WHERE name = 'block_chunks'").fetchone()
    total = long.execute("SELECT sum(pgsize) FROM dbstat").fetchone()[0]
    free = (pages - payload) / values
    rest = (total - pages) / values
    print("storage_floor: %s per value: blocks %.2f, their pages' free space and row headers %.2f, "
          "everything else (rollups, open blocks' frames, indexes, small tables) %.2f: all-in %.2f"
          % (sys.argv[2], payload / values, free, rest, total / values))
    print("storage_floor: the best predictor per metric with the same overheads: %.2f + %.2f + %.2f = %.2f "
          "bytes/value all-in (bar: 2.5)" % (tot["best"] / v, free, rest, tot["best"] / v + free + rest))

if __name__ == "__main__":
    main()
