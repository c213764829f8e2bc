"""ctypes declarations of libentropyd_telemetry (telemetry/telemetry.h), and where
the library is found.  Nothing here runs on a training step.

Why ctypes over the C library (and not a Python sender): the library's
sender thread (formatting, spool, socket, reconnects, exactly-once resume)
is a C thread that never touches the interpreter, so it never waits for the
GIL and the training loop never waits for it; each ctypes call releases the
GIL for its duration.  The training thread pays only for copying floats into
a preallocated ring slot (no syscall, no lock, no allocation).
"""
import ctypes
import ctypes.util
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    # ENTROPYD_CLIENT_LIB: the older name of the variable, still honoured
    env = os.environ.get("ENTROPYD_TELEMETRY_LIB") or os.environ.get("ENTROPYD_CLIENT_LIB")
    if env:
        yield env
    try:  # written by `make install`
        from . import _installed
        yield _installed.LIBRARY
    except ImportError:
        pass
    repo = os.path.dirname(os.path.dirname(_HERE))  # python/entropyd -> repo
    yield os.path.join(repo, "build", "libentropyd_telemetry.so")
    found = ctypes.util.find_library("entropyd_telemetry")
    if found:
        yield found


def load():
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError("entropyd: libentropyd_telemetry.so not found; run `make` in the repository or "
                      "`make install`, or set ENTROPYD_TELEMETRY_LIB. Tried: " + "; ".join(tried))


# telemetry.h's return codes
OK, EFULL, EINVAL, ETIMEDOUT, EREFUSED = 0, -1, -2, -3, -4


class Config(ctypes.Structure):
    _fields_ = [("address", ctypes.c_char_p), ("run", ctypes.c_char_p),
                ("layers", ctypes.c_int), ("heads", ctypes.c_int), ("seq_len", ctypes.c_int),
                ("meta_json", ctypes.c_char_p), ("token", ctypes.c_char_p),
                ("spool_dir", ctypes.c_char_p),
                ("queue_slots", ctypes.c_size_t), ("spool_max_bytes", ctypes.c_size_t),
                ("max_scalars", ctypes.c_int), ("max_layer_metrics", ctypes.c_int),
                ("max_head_metrics", ctypes.c_int),
                ("backoff_min_ms", ctypes.c_int), ("backoff_max_ms", ctypes.c_int),
                ("no_spool_upload", ctypes.c_int), ("send_interval_ms", ctypes.c_int),
                ("noncausal", ctypes.c_int)]


_U64 = ctypes.c_uint64
STATS_FIELDS = ["enqueued", "dropped_queue", "dropped_spool", "dropped_oversize", "spooled", "sent",
                "acked", "next_seq", "spool_bytes", "connects", "reconnects", "connect_failures",
                "errors", "inbox_dropped"]


class Stats(ctypes.Structure):
    _fields_ = [(n, _U64) for n in STATS_FIELDS] + [("connected", ctypes.c_int)]


class UploadResult(ctypes.Structure):
    """telemetry_upload_result (telemetry/telemetry.h)."""
    _fields_ = [("runs_uploaded", ctypes.c_int), ("runs_left", ctypes.c_int), ("damaged", _U64)]


class Msg(ctypes.Structure):
    _fields_ = [("type", ctypes.c_char * 32), ("line", ctypes.c_void_p)]


def declare(lib):
    P, I, D, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_double, ctypes.c_char_p
    sig = {
        "telemetry_config_init": (None, [ctypes.POINTER(Config)]),
        "telemetry_create": (P, [ctypes.POINTER(Config), ctypes.c_char_p, ctypes.c_size_t]),
        "telemetry_destroy": (I, [P, S, I]),
        "telemetry_finish": (I, [P, S, I, P]),
        "telemetry_finish_stats": (I, [P, S, I, P, ctypes.POINTER(Stats)]),
        "telemetry_wait_welcome": (I, [P, I, ctypes.c_char_p, ctypes.c_size_t]),
        "telemetry_run_name": (S, [P]),
        "telemetry_step_begin": (P, [P, ctypes.c_int64, D]),
        "telemetry_step_scalar": (I, [P, S, D]),
        "telemetry_step_layer": (I, [P, S, P]),
        "telemetry_step_heads": (I, [P, S, P]),
        "telemetry_step_commit": (I, [P, P]),
        "telemetry_step_log": (I, [P, ctypes.c_int64, D, I, P, P, I, P, P, I, P, P]),
        "telemetry_event": (I, [P, S, S]),
        "telemetry_poll": (I, [P, ctypes.POINTER(Msg)]),
        "telemetry_msg_free": (None, [ctypes.POINTER(Msg)]),
        "telemetry_get_stats": (None, [P, ctypes.POINTER(Stats)]),
        "telemetry_flush": (I, [P, I]),
        "telemetry_upload_all": (I, [S, S, S, I, P, ctypes.c_char_p, ctypes.c_size_t]),
        "telemetry_upload_spool": (I, [S, S, S, S, I, P, ctypes.POINTER(UploadResult), ctypes.c_char_p,
                                       ctypes.c_size_t]),
        "telemetry_now": (D, []),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [P]
    libc.free.restype = None
    stderr = ctypes.c_void_p.in_dll(libc, "stderr")
    return libc, stderr
