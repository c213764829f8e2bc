"""python3 -m entropyd upload SPOOL_DIR [--daemon ADDR] [--token T] [--timeout S]:
uploads every run in SPOOL_DIR left unacknowledged; exit 0 when all were."""
import argparse
import sys

import entropyd


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m entropyd")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("upload", help="upload every unacknowledged run of a spool directory")
    up.add_argument("spool_dir")
    up.add_argument("--daemon", default=None, help="unix:PATH or tcp:HOST:PORT")
    up.add_argument("--token", default=None)
    up.add_argument("--timeout", type=float, default=60.0, help="seconds per run")
    a = ap.parse_args(argv)
    left = entropyd.upload_spool(a.spool_dir, daemon=a.daemon, token=a.token, timeout=a.timeout)
    print("entropyd upload: %s" % ("every run acknowledged" if left == 0 else "%d run(s) still spooled" % left))
    return 0 if left == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
