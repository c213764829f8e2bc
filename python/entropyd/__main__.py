"""python3 -m entropyd upload SPOOL_DIR [--run NAME] [--daemon ADDR] [--token T] [--timeout S]:
uploads every run in SPOOL_DIR left unacknowledged (or run NAME alone).
Exit status, as `sigmatrain --upload-spool`'s (docs/client.md#damage): 0
everything delivered, 6 every intact record delivered but some spool
records were damaged (each named on stderr, skipped), 1 something is still
unacknowledged (no daemon, a refused run, the timeout)."""
import argparse
import sys

import entropyd

EXIT_LEFT = 1
EXIT_DAMAGED = 6


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m entropyd")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("upload", help="upload every unacknowledged run of a spool directory")
    up.add_argument("spool_dir")
    up.add_argument("--run", default=None, help="only this run of the spool directory")
    up.add_argument("--daemon", default=None, help="unix:PATH or tcp:HOST:PORT")
    up.add_argument("--token", default=None)
    up.add_argument("--timeout", type=float, default=60.0, help="seconds per run")
    a = ap.parse_args(argv)
    r = entropyd.upload_spool_report(a.spool_dir, daemon=a.daemon, token=a.token, timeout=a.timeout, run=a.run)
    left, damaged = r["runs_left"], r["damaged"]
    line = "every run acknowledged" if left == 0 else "%d run(s) still spooled" % left
    if damaged:
        line += "; %d damaged spool record(s) skipped, named above" % damaged
    print("entropyd upload: %s" % line, flush=True)
    return EXIT_LEFT if left else EXIT_DAMAGED if damaged else 0


if __name__ == "__main__":
    sys.exit(main())
