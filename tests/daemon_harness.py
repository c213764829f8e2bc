"""Shared helpers for end-to-end tests: start the real entropyd on a temp
directory, talk protocol v1 to it over its real socket, read its real
SQLite file, receive its HTTP notifications. Standard library only.

Not a test itself (the runner picks up tests/e2e_*.py only)."""
import collections
import http.server
import json
import math
import os
import signal
import socket
import sqlite3
import struct
import subprocess
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTROPYD = os.environ.get("ENTROPYD") or os.path.join(ROOT, "build", "entropyd")
# the build folder (make test's BUILD, e.g. build/san under the sanitizers), absolute
BUILD = os.environ.get("BUILD", "build")
BUILD = BUILD if os.path.isabs(BUILD) else os.path.join(ROOT, BUILD)


def use_python_client():
    """Makes `import entropyd` load this checkout's python/entropyd and the
    client library of BUILD (unless ENTROPYD_TELEMETRY_LIB names another)."""
    import sys
    os.environ.setdefault("ENTROPYD_TELEMETRY_LIB", os.path.join(BUILD, "libentropyd_telemetry.so"))
    sys.path.insert(0, os.path.join(ROOT, "python"))

# The demo's unstable config (docs/demo.md: post-LN, Adam lr 0.1, no warmup or clip,
# no σReparam): its first-layer heads collapse within ~30 steps. For tests of
# the trainer's answer to alerts (e2e_rollback, e2e_mpi).
UNSTABLE_ARGS = ["--layers", "2", "--heads", "4", "--dim", "64", "--seq-len", "64", "--batch", "8",
                 "--norm", "post", "--optimizer", "adam", "--lr", "0.1", "--warmup", "0", "--clip", "0",
                 "--schedule", "constant", "--seed", "1", "--threads", "1", "--reparam", "none",
                 "--print-every", "50", "--eval-every", "0", "--eval-batches", "2"]
# A rules file with entropy_collapse alone, as in the built-in set (below 0.01 for 20 steps).
COLLAPSE_ONLY_RULES = {"rules": [
    {"name": "entropy_collapse", "metric": "entropy_norm", "scope": "head",
     "condition": {"op": "below", "value": 0.01}, "for": 20, "severity": "critical"},
]}


_zstd = None


def _words_of_planes(raw, fmt, m):
    """The m coded words of a chunk from its planes (schema/storage.md,
    "Blocks"): format 1 four byte planes, format 2 32 bit planes of m // 8
    bytes then the last m % 8 words as they are."""
    if fmt == 1:
        return [raw[i] | raw[m + i] << 8 | raw[2 * m + i] << 16 | raw[3 * m + i] << 24 for i in range(m)]
    pb = m // 8
    words = [0] * m
    for b in range(32):
        bit = 1 << b
        for i, ch in enumerate(reversed(bin(int.from_bytes(raw[b * pb:(b + 1) * pb], "little"))[2:])):
            if ch == "1":
                words[i] |= bit
    tail = raw[32 * pb:]
    for j in range(m - 8 * pb):
        words[8 * pb + j] = struct.unpack_from("<I", tail, 4 * j)[0]
    return words


def _zstd_decompress(src, size):
    """zstd's decompression of src into exactly size bytes (libzstd through ctypes)."""
    global _zstd
    import ctypes
    if _zstd is None:
        _zstd = ctypes.CDLL("libzstd.so.1")
        _zstd.ZSTD_decompress.restype = ctypes.c_size_t
        _zstd.ZSTD_decompress.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    dst = ctypes.create_string_buffer(size)
    got = _zstd.ZSTD_decompress(dst, size, bytes(src), len(src))
    assert got == size, "block chunk does not decode"
    return dst.raw


def _decode_chunk(raw, fmt, words, k0, cells, nframes):
    """Cells [k0, k0 + cells) of every frame, from one chunk's zstd frame
    `raw`, into words (nframes lists of u32): the per-cell differences from
    the previous step undone."""
    m = cells * nframes
    z = _words_of_planes(_zstd_decompress(raw, 4 * m), fmt, m)
    for c in range(cells):
        prev = 0
        for f in range(nframes):
            d = z[c * nframes + f]
            prev = (prev + ((d >> 1) ^ (-(d & 1) & 0xFFFFFFFF))) & 0xFFFFFFFF
            words[f][k0 + c] = prev


def decode_block(blob, nframes, n):
    """The nframes frames of n float32 values of a sealed block (daemon/fblock.h),
    each as the little-endian bytes a raw frame row holds. blob is a row of
    `blocks` (formats 1 and 2: every chunk in one blob), or the list of a
    block's rows of `block_chunks` (format 3: one chunk a row), chunk 0 first."""
    words = [[0] * n for _ in range(nframes)]
    if isinstance(blob, list):
        for k, row in enumerate(blob):
            assert row[0] == 3, "unknown chunk format %d" % row[0]
            chunk = row[1]
            _decode_chunk(row[2:], 2, words, chunk * k, min(chunk, n - chunk * k), nframes)
        assert len(blob) == (n + blob[0][1] - 1) // blob[0][1], "a block without all its chunks"
        return [struct.pack("<%dI" % n, *w) for w in words]
    fmt = blob[0]
    assert fmt in (1, 2), "unknown block format %d" % fmt
    chunk = blob[1]
    nchunks = (n + chunk - 1) // chunk
    sizes = struct.unpack("<%dI" % nchunks, blob[2:2 + 4 * nchunks])
    at = 2 + 4 * nchunks
    for k in range(nchunks):
        _decode_chunk(blob[at:at + sizes[k]], fmt, words, chunk * k, min(chunk, n - chunk * k), nframes)
        at += sizes[k]
    return [struct.pack("<%dI" % n, *w) for w in words]


def sealed_blocks(con):
    """Every sealed block of the database on con, of both layouts
    (schema/storage.md, "Blocks"): (metric_id, block, mask, blob, n) with blob
    as decode_block takes it. block_chunks' rowid is (base + chunk) << 26 | block,
    where base is the metric's in block_series."""
    n_of = ("CASE m.kind WHEN 0 THEN 1 WHEN 1 THEN r.layers ELSE r.layers * r.heads END")
    out = []
    if con.execute("SELECT 1 FROM main.sqlite_master WHERE name = 'blocks'").fetchall():
        out += con.execute("SELECT b.metric_id, b.block, b.mask, b.data, " + n_of + " FROM main.blocks b "
                           "JOIN main.metrics m ON m.id = b.metric_id JOIN main.runs r ON r.id = m.run_id").fetchall()
    if con.execute("SELECT 1 FROM main.sqlite_master WHERE name = 'block_chunks'").fetchall():
        byblock = {}
        for mid, base, chunks, n in con.execute("SELECT s.metric_id, s.base, s.chunks, " + n_of + " FROM main.block_series s "
                                                "JOIN main.metrics m ON m.id = s.metric_id "
                                                "JOIN main.runs r ON r.id = m.run_id").fetchall():
            for rid, mask, data in con.execute("SELECT id, mask, data FROM main.block_chunks WHERE id >= ? AND id < ? "
                                               "ORDER BY id", (base << 26, (base + chunks) << 26)):
                key = (mid, rid & ((1 << 26) - 1))
                byblock.setdefault(key, [mask, n, []])[2].append(data)
        out += [(mid, block, mask, rows, n) for (mid, block), (mask, n, rows) in sorted(byblock.items())]
    return out


def shadow_frames(con, with_data=True):
    """Shadows the database's `frames` on connection con with a TEMP table of the
    same name holding every frame, raw or sealed (`blocks`, `block_chunks`:
    schema/storage.md, "Blocks"), so that a test reads frames as rows wherever
    the daemon keeps them. Without with_data the sealed frames' data is NULL
    (counting steps needs no decoding)."""
    con.execute("CREATE TEMP TABLE frames(id INTEGER PRIMARY KEY, metric_id INTEGER, step INTEGER, data BLOB)")
    con.execute("INSERT INTO temp.frames SELECT id, metric_id, step, data FROM main.frames")
    for mid, block, mask, data, n in sealed_blocks(con):
        mask &= (1 << 64) - 1
        steps = [block * 64 + i for i in range(64) if mask >> i & 1]
        frames = decode_block(data, len(steps), n) if with_data else [None] * len(steps)
        for step, frame in zip(steps, frames):
            con.execute("INSERT INTO temp.frames(metric_id, step, data) VALUES (?, ?, ?)", (mid, step, frame))


def wait_for(pred, timeout=20, what="condition"):
    """Polls pred() every 50 ms until it returns something true, and returns
    that; AssertionError naming `what` after timeout seconds."""
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Daemon:
    """One entropyd process on its own data directory."""

    def __init__(self, data=None, args=(), env=None, http=False):
        self.tmp = None
        if data is None:
            self.tmp = tempfile.TemporaryDirectory(prefix="entropyd-e2e-")
            data = self.tmp.name
        self.data = data
        self.args = list(args)
        self.env = env
        self.proc = None
        self.sock = os.path.join(data, "entropyd.sock")
        self.db = os.path.join(data, "entropyd.db")
        self.log_path = os.path.join(data, "daemon.log")
        self.stdout_lines = []
        self.http = http
        self.http_port = None

    def start(self, wait=True):
        log = open(self.log_path, "ab")
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        http = ["--http", "127.0.0.1:0" if self.http else "off"] if self._has_http_flag() else []
        self.proc = subprocess.Popen([ENTROPYD, "--data", self.data] + http + self.args,
                                     stdout=subprocess.PIPE, stderr=log, env=env)
        if wait:
            line = self.proc.stdout.readline().decode()
            self.stdout_lines.append(line)
            if not line:
                raise RuntimeError("entropyd did not start: " + self.log())
            if self.http:
                line = self.proc.stdout.readline().decode()
                self.stdout_lines.append(line)
                if not line.startswith("http port "):
                    raise RuntimeError("entropyd printed no http port: %r %s" % (line, self.log()))
                self.http_port = int(line.split()[2])
        return self

    def get(self, path, headers=None):
        """GET path on the daemon's HTTP API; returns (status, parsed JSON or text)."""
        import urllib.request
        import urllib.error
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.http_port, path), headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                body, status, ctype = r.read(), r.status, r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            body, status, ctype = e.read(), e.code, e.headers.get("Content-Type", "")
        if "json" in ctype:
            return status, json.loads(body)
        return status, body.decode()

    _http_flag = None

    @classmethod
    def _has_http_flag(cls):
        if cls._http_flag is None:
            out = subprocess.run([ENTROPYD, "--help"], capture_output=True).stdout.decode()
            cls._http_flag = "--http" in out
        return cls._http_flag

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if not self.proc:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc.stdout.close()
        self.proc = None
        return rc

    def kill9(self):
        return self.stop(signal.SIGKILL)

    def rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def query(self, sql, args=()):
        con = sqlite3.connect(self.db, timeout=10)
        try:
            if "frames" in sql:
                shadow_frames(con, with_data="data" in sql)
            return con.execute(sql, args).fetchall()
        finally:
            con.close()

    def cleanup(self):
        if self.proc:
            self.stop(signal.SIGKILL)
        if self.tmp:
            self.tmp.cleanup()


class Client:
    """A protocol v1 connection. recv() returns parsed daemon lines."""

    def __init__(self, path=None, tcp=None, timeout=10):
        if tcp:
            self.s = socket.create_connection(tcp, timeout=timeout)
        else:
            self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.s.connect(path)  # blocking: waits for room in the backlog
            self.s.settimeout(timeout)
        self.buf = b""

    def send_raw(self, data):
        self.s.sendall(data)

    def send(self, obj):
        self.s.sendall(json.dumps(obj, allow_nan=False).encode() + b"\n")

    def recv(self, timeout=10):
        self.s.settimeout(timeout)
        while b"\n" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                raise EOFError("connection closed; buffered %r" % self.buf[:200])
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def recv_until(self, pred, timeout=10):
        deadline = time.time() + timeout
        seen = []
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError("no matching line; saw %r" % seen[-5:])
            m = self.recv(left)
            seen.append(m)
            if pred(m):
                return m, seen

    def hello(self, run, layers=2, heads=3, seq_len=16, meta=None, token=None):
        msg = {"type": "hello", "protocol": 1, "run": run, "layers": layers, "heads": heads, "seq_len": seq_len}
        if meta is not None:
            msg["meta"] = meta
        if token is not None:
            msg["token"] = token
        self.send(msg)
        return self.recv_until(lambda m: m["type"] in ("welcome", "error"))[0]

    def wait_ack(self, seq, timeout=10):
        return self.recv_until(lambda m: m["type"] == "ack" and m["seq"] >= seq, timeout)

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


def step_msg(seq, step, layers=2, heads=3, base=0.0, extra=None):
    """A step whose values are a deterministic function of (step, l, h)."""
    heads_m = {"entropy": [[head_value(step, l, h, base) for h in range(heads)] for l in range(layers)]}
    msg = {"type": "step", "seq": seq, "step": step, "time": 1764500000 + step,
           "scalars": {"loss": 3.0 - step * 0.001},
           "layers": {"rank_ratio": [0.5 + l * 0.01 for l in range(layers)]},
           "heads": heads_m}
    if extra:
        msg.update(extra)
    return msg


def head_value(step, l, h, base=0.0):
    return base + ((step * 7 + l * 3 + h) % 101) / 10.0


def floats(blob):
    return list(struct.unpack("<%df" % (len(blob) // 4), blob))


def isnan(x):
    return isinstance(x, float) and math.isnan(x)


class Post(collections.namedtuple("Post", "time path body content_type status")):
    """One POST a Receiver got: arrival time (time.time()), path, the raw
    body (bytes), its Content-Type, and the status it was answered with."""

    def json(self):
        return json.loads(self.body)


class Receiver:
    """A fake HTTP endpoint for the daemon's notifications (--webhook,
    --alertmanager): a server on 127.0.0.1 and a free port, in a thread of
    its own, that keeps every POST in .posts (a list of Post, in arrival
    order). The first `refuse` POSTs whose body satisfies refuse_if (default:
    any body) are answered refuse_status, for the daemon to retry; every
    other POST gets 200. The caller owns the receiver and calls close();
    .posts stays readable after that."""

    def __init__(self, refuse=0, refuse_status=500, refuse_if=None):
        self.posts = []
        self.refuse_left = refuse
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status = receiver._answer(body)
                receiver.posts.append(Post(time.time(), self.path, body, self.headers.get("Content-Type"), status))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *a):
                pass

        self._refuse_status = refuse_status
        self._refuse_if = refuse_if or (lambda body: True)
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def _answer(self, body):
        with self._lock:
            if self.refuse_left > 0 and self._refuse_if(body):
                self.refuse_left -= 1
                return self._refuse_status
            return 200

    def url(self, path="/"):
        return "http://127.0.0.1:%d%s" % (self.srv.server_port, path)

    def delivered(self):
        """The POSTs answered 200, in arrival order (a new list)."""
        return [p for p in self.posts if p.status == 200]

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()
