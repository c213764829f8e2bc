#!/usr/bin/env bash
# scripts/check-format.sh [--fix]: every tracked C file (.c and .h) against
# .clang-format.  Without --fix it changes nothing and fails naming the files
# that differ (clang-format --dry-run -Werror prints where); with --fix
# (`make format`) it rewrites them.  The list comes from git so vendored
# node_modules and build output are never touched.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check-format: clang-format not found (make deps installs it)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.c' '*.h' 2>/dev/null || find daemon trainer telemetry proto cli tests bench examples scripts -name '*.[ch]')
[ ${#files[@]} -gt 0 ] || { echo "check-format: no C files found" >&2; exit 1; }
if [ "${1:-}" = --fix ]; then
  clang-format -i "${files[@]}"
  echo "check-format: formatted ${#files[@]} files"
else
  clang-format --dry-run -Werror "${files[@]}"
  echo "check-format: ${#files[@]} files as .clang-format says ($(clang-format --version | head -1))"
fi
