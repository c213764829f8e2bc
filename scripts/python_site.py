#!/usr/bin/env python3
"""Where `make install PREFIX=P` puts the Python package, for the python3
that runs this script (the Makefile runs it with Debian's /usr/bin/python3,
the interpreter python3-torch and python3-numpy are installed for).

    python_site.py PREFIX          prints the directory
    python_site.py --say DIR       prints, for make install's last line,
                                   whether this interpreter finds DIR

The directory: the first entry of this interpreter's sys.path (or of the
site directories it would add once they exist) under
PREFIX/lib that is a site or dist-packages directory (PREFIX=/usr/local:
/usr/local/lib/python3.11/dist-packages on Debian; /usr:
/usr/lib/python3/dist-packages), else the purelib of the posix_prefix
scheme under PREFIX (PREFIX/lib/python3.X/site-packages, what
`pip install --prefix` uses), which needs PYTHONPATH.  Not a packaging
tool: it only names a directory."""
import os
import site
import sys
import sysconfig


def site_for(prefix):
    prefix = os.path.abspath(prefix).rstrip("/") or "/"
    # getsitepackages: the directories site.py adds when they exist (a fresh
    # machine may not have /usr/local/lib/python3.11/dist-packages yet)
    for p in sys.path + site.getsitepackages():
        if p.startswith(prefix + "/lib/") and os.path.basename(p) in ("site-packages", "dist-packages"):
            return p
    return sysconfig.get_path("purelib", "posix_prefix", vars={"base": prefix, "platbase": prefix})


def main(argv):
    if len(argv) == 3 and argv[1] == "--say":
        d = os.path.abspath(argv[2])
        if d in [os.path.abspath(p) for p in sys.path if p]:
            print("entropyd: Python package installed in %s, on %s's sys.path: `%s -c 'import entropyd'` works as is"
                  % (d, sys.executable, sys.executable))
        else:
            print("entropyd: Python package installed in %s, which %s does not search: "
                  "export PYTHONPATH=%s (docs/client.md, \"Which python3\")" % (d, sys.executable, d))
        return 0
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    print(site_for(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
