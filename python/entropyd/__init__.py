"""entropyd: watch any training run's attention metrics with entropyd.

    import entropyd
    run = entropyd.init("my-run", layers=12, heads=12, seq_len=1024,
                        config={"lr": 3e-4}, daemon="unix:entropyd-data/entropyd.sock")
    for step in range(steps):
        ...
        run.log(step, scalars={"loss": loss}, heads={"entropy": ent})  # (L, H) array or tensor
    run.finish("finished")

A thin ctypes binding over libentropyd_telemetry (telemetry/telemetry.h): the C
library's sender thread formats, spools (a write-ahead log on disk), sends,
reconnects and resumes exactly once, without the GIL; `log` only copies
floats into a preallocated queue slot.  Non-finite values (NaN, +-Inf) are
sent as JSON null, as schema/protocol.md says (stored as NaN), never as a
`NaN` literal.  Values are numbers, lists, numpy arrays or torch tensors (any
device; moved to the host here: use entropyd.torch to make that one copy per
step).  Alert lines the daemon sends back are in `run.alerts()` and go to the
`on_alert` callback, both on the training thread, from inside `log`.

Not here: computing metrics (entropyd.torch does that for PyTorch models).
"""
import atexit
import ctypes
import json
import math
import os
import re
import sys
import time as _time
import weakref

from . import _lib

try:
    import numpy as _np
except ImportError:  # lists and numbers still work
    _np = None

__all__ = ["init", "Run", "upload_spool", "upload_spool_report", "EntropydError", "RunRefused"]

_C, _LIBPATH = _lib.load()
_LIBC, _STDERR = _lib.declare(_C)
_log = _C.telemetry_step_log
_poll = _C.telemetry_poll
_NAME_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}\Z")

DEFAULT_DAEMON = "unix:entropyd-data/entropyd.sock"  # entropyd's default --data DIR, run from the same place
NAME_MAX = 64


class EntropydError(RuntimeError):
    pass


class RunRefused(EntropydError):
    """The daemon refused the run's hello at init: the name belongs to a run
    of another shape (shape_mismatch), a wrong token (unauthorized), a bad
    field.  The message is the daemon's; nothing was sent, and the existing
    run is untouched."""


def _finite_or_none(o):
    """meta must be JSON that the daemon's parser accepts: no NaN literals."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): _finite_or_none(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite_or_none(v) for v in o]
    if isinstance(o, (str, int, bool)) or o is None:
        return o
    if hasattr(o, "item") and getattr(o, "ndim", 1) == 0:  # numpy / torch scalars
        return _finite_or_none(o.item())
    return str(o)


def _as_float32(v, n, what):
    """A C-contiguous float32 array of n values (numpy), kept alive by the caller."""
    if hasattr(v, "detach"):  # a torch tensor, without importing torch
        v = v.detach()
        if v.device.type != "cpu":
            v = v.cpu()
        v = v.float().numpy()
    if _np is not None:
        a = _np.ascontiguousarray(v, dtype=_np.float32)
        if a.size != n:
            raise ValueError("entropyd: %s has %d values, expected %d" % (what, a.size, n))
        return a, a.__array_interface__["data"][0]
    flat = []
    for row in v:
        if isinstance(row, (list, tuple)):
            flat.extend(row)
        else:
            flat.append(row)
    if len(flat) != n:
        raise ValueError("entropyd: %s has %d values, expected %d" % (what, len(flat), n))
    a = (ctypes.c_float * n)(*[float(x) for x in flat])
    return a, ctypes.addressof(a)


def _rows(n, shape):
    """A staging block of n rows of the given shape (float32), and its address."""
    width = 1
    for d in shape:
        width *= d
    if _np is not None:
        a = _np.zeros((n,) + shape, dtype=_np.float32)
        return a, a.ctypes.data
    a = (ctypes.c_float * (n * width))()
    return a, ctypes.addressof(a)


def _put(dst, v, n, what):
    """Copies v (n numbers: numpy array, torch tensor, list, nested list)
    into the staging row dst, converting to float32."""
    if _np is not None:
        if type(v) is not _np.ndarray:
            if hasattr(v, "detach"):  # a torch tensor, without importing torch
                try:
                    v = v.numpy()  # CPU, no grad: a view, no copy
                except (RuntimeError, TypeError):
                    v = v.detach().cpu().float().numpy()
            else:
                v = _np.asarray(v, dtype=_np.float32)
        if v.size != n:
            raise ValueError("entropyd: %s has %d values, expected %d" % (what, v.size, n))
        dst[:] = v.reshape(n)
        return
    a, _ = _as_float32(v, n, what)
    ctypes.memmove(dst, a, 4 * n)


def _put_rows(stage, row_addr, d, width, shape, what):
    """Copies the values of dict d (each width numbers) into consecutive rows
    of stage; returns how many.  numpy arrays of the right shape take the
    fast path (one assignment each); anything else goes through _put."""
    np_ = _np
    i = 0
    for k, v in d.items():
        if np_ is not None and type(v) is np_.ndarray and v.shape == shape:
            stage[i] = v
        elif np_ is not None:
            _put(stage[i].reshape(width), v, width, "%s %r" % (what, k))
        else:
            a, _ = _as_float32(v, width, "%s %r" % (what, k))
            ctypes.memmove(row_addr + 4 * width * i, a, 4 * width)
        i += 1
    return i


class Run:
    """One run streamed to entropyd.  Create it with entropyd.init.  log,
    event, alerts and finish are meant for one thread (the training loop)."""

    def __init__(self, name, layers, heads, seq_len, config=None, daemon=None, spool_dir=None,
                 token=None, on_alert=None, grace=30.0, queue_slots=0, max_scalars=0,
                 max_layer_metrics=0, max_head_metrics=0, upload_spool=True, send_interval_ms=0,
                 causal=True, welcome_timeout=5.0):
        self.layers, self.heads = int(layers), int(heads)
        self._LH = self.layers * self.heads
        self.on_alert = on_alert
        self.grace = grace
        self._alerts = []
        self._messages = []
        self._names = {}
        self._t = None
        cfg = _lib.Config()
        _C.telemetry_config_init(ctypes.byref(cfg))
        addr = daemon if daemon is not None else os.environ.get("ENTROPYD_DAEMON", DEFAULT_DAEMON)
        self._keep = []  # the bytes the config points to, until create copied them
        def b(s):
            if s is None:
                return None
            s = s.encode() if isinstance(s, str) else s
            self._keep.append(s)
            return s
        cfg.address = b(addr) if addr else None
        cfg.run = b(name)
        cfg.layers, cfg.heads, cfg.seq_len = self.layers, self.heads, int(seq_len)
        if config is not None:
            cfg.meta_json = b(json.dumps(_finite_or_none(dict(config)), allow_nan=False))
        cfg.token = b(token if token is not None else os.environ.get("ENTROPYD_TOKEN"))
        cfg.spool_dir = b(spool_dir if spool_dir is not None else os.environ.get("ENTROPYD_SPOOL"))
        cfg.queue_slots = queue_slots
        cfg.max_scalars, cfg.max_layer_metrics, cfg.max_head_metrics = max_scalars, max_layer_metrics, max_head_metrics
        cfg.no_spool_upload = 0 if upload_spool else 1
        cfg.send_interval_ms = int(send_interval_ms)
        cfg.noncausal = 0 if causal else 1
        err = ctypes.create_string_buffer(512)
        t = _C.telemetry_create(ctypes.byref(cfg), err, len(err))
        self._keep = None
        if not t:
            raise EntropydError("entropyd.init: " + err.value.decode(errors="replace"))
        self.name = _C.telemetry_run_name(t).decode()
        if addr and welcome_timeout:
            # The daemon's answer to the hello, so that a refused run (a
            # name reused with another shape) raises here, before any step
            # is logged, instead of spooling steps nobody will take.  No
            # daemon listening: returns at once and the run goes on in the
            # background as before.
            rc = _C.telemetry_wait_welcome(t, int(welcome_timeout * 1000), err, len(err))
            if rc == _lib.EREFUSED:
                _C.telemetry_destroy(t, None, 0)
                raise RunRefused("entropyd.init: " + err.value.decode(errors="replace"))
        self._t = t
        self._msg = _lib.Msg()
        # Staging: a step's values are copied into these blocks, then one
        # call (telemetry_step_log) copies them into the ring slot.
        self._max = (max_scalars or 64, max_layer_metrics or 32, max_head_metrics or 16)
        self._sval = (ctypes.c_double * self._max[0])()
        self._sptr = ctypes.addressof(self._sval)
        self._lshape, self._hshape = (self.layers,), (self.layers, self.heads)
        self._lstage, self._lptr = _rows(self._max[1], self._lshape)
        self._hstage, self._hptr = _rows(self._max[2], self._hshape)
        self._namesets = {}
        _live.add(self)

    # ------------------------------------------------------------ hot path

    def _name(self, name):
        b = self._names.get(name)
        if b is None:
            b = name.encode()
            if not 1 <= len(b) <= NAME_MAX:
                raise ValueError("entropyd: metric name %r: 1..64 bytes of [A-Za-z0-9._:-]" % name)
            self._names[name] = b
        return b

    def _names_of(self, keys):
        """The C array of the names in keys (a tuple), kept per key set:
        a training loop logs the same names every step."""
        e = self._namesets.get(keys)
        if e is None:
            arr = (ctypes.c_char_p * len(keys))(*[self._name(k) for k in keys])
            e = (arr, ctypes.addressof(arr))
            if len(self._namesets) < 256:
                self._namesets[keys] = e
        return e

    def _start(self, time, scalars):
        """What log and log_stacked begin with: the run is open, the step's
        time, the scalars staged.  Returns (time, n_scalars, names)."""
        if self._t is None:
            raise EntropydError("entropyd: log after finish")
        time = _time.time() if time is None else float(time)
        if not scalars:
            return time, 0, None
        keys = tuple(scalars)
        if len(keys) > self._max[0]:
            self._too_many("scalar", keys, self._max[0])
        sv = self._sval
        i = 0
        for v in scalars.values():
            sv[i] = float(v)
            i += 1
        return time, i, self._names_of(keys)

    def _too_many(self, kind, keys, n):
        raise ValueError("entropyd: %d %ss (%s), at most %d (max_* at init)" % (len(keys), kind, ", ".join(keys), n))

    def _send(self, step, time, ns, sn, nl, ln, lp, nh, hn, hp):
        """What log and log_stacked end with: one call enqueues the step;
        the daemon's lines are taken.  True when queued, False when the
        queue was full (dropped and counted); ValueError when refused."""
        step = int(step)
        rc = _log(self._t, step, time, ns, sn[1] if ns else None, self._sptr, nl, ln[1] if nl else None, lp,
                  nh, hn[1] if nh else None, hp)
        self._drain()
        if rc == -2:
            bad = [k for e in (sn, ln, hn) if e for k in e[0] if not _NAME_RE.match(k.decode())]
            raise ValueError("entropyd: step %d refused: %s" % (
                step, "bad metric name %r (1..64 of [A-Za-z0-9._:-])" % bad[0].decode() if bad
                else "negative step" if step < 0 else "bad arguments"))
        return rc == 0

    def log(self, step, scalars=None, layers=None, heads=None, time=None):
        """Queues one step: scalars {name: number}, layers {name: L values},
        heads {name: (L, H) values, row-major [layer][head]}.  Numbers,
        lists, numpy arrays, torch tensors.  Returns True when queued, False
        when the queue was full (the step is dropped and counted; the
        training loop never waits).  ValueError for a wrong number of
        values, a bad name, too many metrics of a kind or a negative step
        (nothing is queued).  Also takes the daemon's alert lines."""
        time, ns, sn = self._start(time, scalars)
        nl = nh = 0
        ln = hn = None
        if layers:
            keys = tuple(layers)
            if len(keys) > self._max[1]:
                self._too_many("layer metric", keys, self._max[1])
            nl = _put_rows(self._lstage, self._lptr, layers, self.layers, self._lshape, "layer metric")
            ln = self._names_of(keys)
        if heads:
            keys = tuple(heads)
            if len(keys) > self._max[2]:
                self._too_many("head metric", keys, self._max[2])
            nh = _put_rows(self._hstage, self._hptr, heads, self._LH, self._hshape, "head metric")
            hn = self._names_of(keys)
        return self._send(step, time, ns, sn, nl, ln, self._lptr, nh, hn, self._hptr)

    def log_stacked(self, step, scalars=None, layer_names=(), layer_values=None, head_names=(),
                    head_values=None, time=None):
        """log for metrics already stacked on the host: layer_values a float32
        C-contiguous numpy array (len(layer_names), L), head_values
        (len(head_names), L, H).  What entropyd.torch uses: one device->host
        copy per step, no staging copy here."""
        time, ns, sn = self._start(time, scalars)
        nl = nh = 0
        ln = hn = la = ha = None
        lp = hp = None
        if layer_names:
            keys = tuple(layer_names)
            if len(keys) > self._max[1]:
                self._too_many("layer metric", keys, self._max[1])
            la, lp = _as_float32(layer_values, len(keys) * self.layers, "layer_values")
            nl, ln = len(keys), self._names_of(keys)
        if head_names:
            keys = tuple(head_names)
            if len(keys) > self._max[2]:
                self._too_many("head metric", keys, self._max[2])
            ha, hp = _as_float32(head_values, len(keys) * self._LH, "head_values")
            nh, hn = len(keys), self._names_of(keys)
        return self._send(step, time, ns, sn, nl, ln, lp, nh, hn, hp)

    def _drain(self):
        m = self._msg
        while _poll(self._t, ctypes.byref(m)):
            line = ctypes.string_at(m.line).decode(errors="replace")
            _C.telemetry_msg_free(ctypes.byref(m))
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("type") == "alert":
                self._alerts.append(obj)
                if self.on_alert is not None:
                    self.on_alert(obj)
            else:
                self._messages.append(obj)
                del self._messages[:-256]

    # ------------------------------------------------------------ the rest

    def event(self, text, level="info"):
        """An event line (level info|warn|error, text up to 64 KiB)."""
        if self._t is None:
            raise EntropydError("entropyd: event after finish")
        rc = _C.telemetry_event(self._t, level.encode(), str(text).encode())
        if rc == -2:
            raise ValueError("entropyd: event level %r: info, warn or error" % level)
        return rc == 0

    def alerts(self):
        """The alert lines (dicts, schema/protocol.md) received since the last
        call, oldest first."""
        if self._t is not None:
            self._drain()
        out, self._alerts = self._alerts, []
        return out

    def messages(self):
        """Other lines from the daemon and the client (welcome, error,
        client notes such as "uploaded"), since the last call."""
        if self._t is not None:
            self._drain()
        out, self._messages = self._messages, []
        return out

    def stats(self):
        """The client's counters (enqueued, acked, dropped_queue, ...); after
        finish, the final ones (as they were once the sender stopped)."""
        if self._t is None:
            return dict(self._final_stats)
        st = _lib.Stats()
        _C.telemetry_get_stats(self._t, ctypes.byref(st))
        return self._stats_dict(st)

    @staticmethod
    def _stats_dict(st):
        return {n: getattr(st, n) for n in _lib.STATS_FIELDS + ["connected"]}

    def flush(self, timeout=10.0):
        """Waits until the daemon acknowledged everything; True if it did."""
        ok = _C.telemetry_flush(self._t, int(timeout * 1000)) == 0
        self._drain()
        return ok

    def finish(self, status="finished", grace=None, quiet=False):
        """Ends the run (status finished|failed|aborted; None leaves it
        resumable) and waits up to grace seconds (default: init's, 30) for the
        daemon's acks, reconnecting; a progress line a second on stderr while
        it waits.  Returns True when everything was acknowledged; the rest
        stays in the spool for the next client on the same spool_dir."""
        if self._t is None:
            return True
        if status is not None and status not in ("finished", "failed", "aborted"):
            raise ValueError("entropyd: status %r: finished, failed or aborted" % status)
        self._drain()
        g = self.grace if grace is None else grace
        sys.stderr.flush()
        t, self._t = self._t, None
        st = _lib.Stats()
        rc = _C.telemetry_finish_stats(t, status.encode() if status else None, int(g * 1000),
                                       None if quiet else _STDERR, ctypes.byref(st))
        self._final_stats = self._stats_dict(st)
        _live.discard(self)
        return rc == 0

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.finish("failed" if exc_type else "finished")
        return False


_live = weakref.WeakSet()


@atexit.register
def _at_exit():
    # A run never finished: what is queued goes to the spool, the run stays
    # resumable (no end), nobody waits long.
    for r in list(_live):
        r.finish(None, grace=1.0, quiet=True)


def init(name=None, layers=None, heads=None, seq_len=None, config=None, daemon=None, **kw):
    """Opens a run and starts streaming in the background (waits only for
    the daemon's answer to the hello, see welcome_timeout).  name: the run name (None: generated); layers, heads,
    seq_len: the model's shape; config: a dict stored as the run's meta;
    daemon: "unix:PATH" or "tcp:HOST:PORT" (default $ENTROPYD_DAEMON, else
    unix:entropyd-data/entropyd.sock); also spool_dir (default $ENTROPYD_SPOOL,
    else a private temporary one), token, on_alert (callable(dict)), grace
    (seconds finish waits, default 30), queue_slots, max_scalars,
    max_layer_metrics, max_head_metrics, upload_spool (default True: upload
    the other unacknowledged runs found in spool_dir, in the background),
    send_interval_ms (0: the library's default, 100 ms: the sender wakes and
    sends once per interval; negative: every step at once), causal (default
    True: row i attends positions 0..i; False: every row attends all
    seq_len, used by the daemon to derive entropy_norm from entropy),
    welcome_timeout (seconds init waits for the daemon's answer to the
    hello, default 5; returns at once when no daemon listens; 0: no wait).
    Raises RunRefused with the daemon's message when the daemon refuses the
    run (its name taken by a run of another shape)."""
    if layers is None or heads is None or seq_len is None:
        raise TypeError("entropyd.init needs layers, heads and seq_len")
    return Run(name, layers, heads, seq_len, config=config, daemon=daemon, **kw)


def upload_spool(spool_dir, daemon=None, token=None, timeout=60.0, verbose=True):
    """Uploads every run in spool_dir left unacknowledged.  Returns the number
    of runs still not fully acknowledged (0: all uploaded; damaged records
    skipped do not count: upload_spool_report says how many there were)."""
    return upload_spool_report(spool_dir, daemon=daemon, token=token, timeout=timeout, verbose=verbose)["runs_left"]


def upload_spool_report(spool_dir, daemon=None, token=None, timeout=60.0, verbose=True, run=None):
    """Uploads every run in spool_dir left unacknowledged (run: that one
    alone), each waiting at most `timeout` seconds for its acks.  A damaged
    spool record does not stop it: every intact record is delivered once,
    and each damaged one is skipped and named on stderr when verbose
    ("entropyd upload: damaged: run R: FILE byte N: WHAT", docs/client.md).
    Returns {"runs_uploaded", "runs_left", "damaged"}: runs whose every intact
    record is acknowledged, runs still holding unacknowledged records, and
    the damaged records skipped.  Raises EntropydError when spool_dir cannot
    be read."""
    addr = daemon if daemon is not None else os.environ.get("ENTROPYD_DAEMON", DEFAULT_DAEMON)
    err = ctypes.create_string_buffer(512)
    res = _lib.UploadResult()
    n = _C.telemetry_upload_spool(addr.encode(), spool_dir.encode(), run.encode() if run else None,
                                  token.encode() if token else None, int(timeout * 1000),
                                  _STDERR if verbose else None, ctypes.byref(res), err, len(err))
    if n < 0:
        raise EntropydError("entropyd.upload_spool: " + err.value.decode(errors="replace"))
    return {"runs_uploaded": res.runs_uploaded, "runs_left": res.runs_left, "damaged": res.damaged}
