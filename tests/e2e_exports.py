#!/usr/bin/env python3
"""The shared client library exports its public API and nothing else.

`nm -D --defined-only BUILD/libentropyd_telemetry.so` must list exactly the
functions telemetry/telemetry.h declares: a proto_* or net_* symbol, or one
of the library's internal telemetry_* functions (telemetry_int.h, which
share the public prefix), exported would bind to (or be overridden by) a
program's own function of that name. The Python binding (python/entropyd/_lib.py) looks its functions
up by name: each must be among them."""
import ctypes
import os
import re
import shutil
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD", "build")
BUILD = BUILD if os.path.isabs(BUILD) else os.path.join(ROOT, BUILD)
LIB = os.path.join(BUILD, "libentropyd_telemetry.so")


def strip_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


def declared():
    """The function names telemetry/telemetry.h declares (a name followed by
    its parameter list, outside comments)."""
    with open(os.path.join(ROOT, "telemetry", "telemetry.h")) as f:
        code = strip_comments(f.read())
    return set(re.findall(r"\b(telemetry_\w+)\s*\(", code)) - set(re.findall(r"\(\s*\*\s*(telemetry_\w+)\s*\)", code))


def exported():
    """The defined dynamic symbols of the library (its version nodes aside)."""
    out = subprocess.run(["nm", "-D", "--defined-only", LIB], check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] == "A":  # an absolute symbol names a version node, not code
            continue
        names.add(parts[2].split("@")[0])
    return names


@unittest.skipUnless(shutil.which("nm"), "nm (binutils) is not installed")
class ExportsTest(unittest.TestCase):
    def test_only_the_public_api(self):
        api, syms = declared(), exported()
        self.assertGreater(len(api), 10, "telemetry.h's declarations were not found: %s" % sorted(api))
        self.assertEqual(sorted(syms - api), [], "exported but not declared in telemetry/telemetry.h")
        self.assertEqual(sorted(api - syms), [], "declared in telemetry/telemetry.h but not exported")

    def test_python_binding_finds_its_functions(self):
        with open(os.path.join(ROOT, "python", "entropyd", "_lib.py")) as f:
            used = set(re.findall(r"[\"'](telemetry_\w+)[\"']\s*:", f.read()))  # declare()'s table of signatures
        self.assertGreater(len(used), 10, "declare()'s table was not found in _lib.py: %s" % sorted(used))
        self.assertEqual(sorted(used - exported()), [], "_lib.py uses functions the library does not export")

    @unittest.skipIf(os.environ.get("SANITIZE"), "ctypes cannot load the instrumented library")
    def test_python_binding_declares_against_the_library(self):
        """The binding's own declare() on the real library: a function it
        wants and the library hides raises AttributeError."""
        sys.path.insert(0, os.path.join(ROOT, "python"))
        from entropyd import _lib
        _lib.declare(ctypes.CDLL(LIB))

if __name__ == "__main__":
    unittest.main(verbosity=2)
