#!/usr/bin/env bash
# scripts/check-house.sh: the house's size rules on the production C code
# (daemon/ trainer/ telemetry/ proto/ cli/, and common/ once it exists), run by
# the suite as its `house` test. Fails, naming each offender, when
#   - a .c or .h file is over 1,000 lines (a file doing several jobs: split
#     it at its own seams),
#   - a function is over 120 lines (split it into named leaf functions),
#   - any file there (comments, strings, docs) cites "issue N" of a tracker outside the
#     repository (say the reason instead).
# A function is measured from its first line, at column 0, to the "}" at
# column 0 that closes it, both counted; its signature may span lines up to
# the one ending in ") {" (the layout .clang-format gives every C file).
# Tests, benchmarks and examples are not held to these rules.
set -uo pipefail
cd "$(dirname "$0")/.."
MAX_FILE=1000
MAX_FUNC=120
dirs=()
for d in daemon trainer telemetry proto cli common; do [ -d "$d" ] && dirs+=("$d"); done
mapfile -t files < <(find "${dirs[@]}" -name '*.[ch]' | sort)
[ ${#files[@]} -gt 0 ] || { echo "check-house: no C files found" >&2; exit 1; }
bad=0
for f in "${files[@]}"; do
  n=$(wc -l <"$f")
  if [ "$n" -gt "$MAX_FILE" ]; then
    echo "check-house: $f is $n lines (at most $MAX_FILE)"
    bad=1
  fi
done
long=$(awk -v max="$MAX_FUNC" '
  FNR == 1 { state = 0 }
  # a candidate: a column-0 line naming something with a parameter list
  state == 0 && /^[A-Za-z_][^;]*\(/ && !/^(typedef|struct [A-Za-z_0-9]+ \{|#)/ {
    start = FNR; head = $0; state = 1
  }
  state == 1 {
    if ($0 ~ /\) \{$/) { state = 2; next }
    if ($0 ~ /;/ || $0 ~ /^}/ || ($0 ~ /^[^ \t]/ && FNR != start)) state = 0
    next
  }
  state == 2 && /^}/ {
    len = FNR - start + 1
    if (len > max) {
      name = head; sub(/\(.*/, "", name); sub(/.*[ *]/, "", name)
      printf "check-house: %s:%d %s is %d lines (at most %d)\n", FILENAME, start, name, len, max
    }
    state = 0
  }
' "${files[@]}")
if [ -n "$long" ]; then
  echo "$long"
  bad=1
fi
cites=$(grep -rn "issue [0-9]" "${dirs[@]}")
if [ -n "$cites" ]; then
  echo "$cites" | sed 's/^/check-house: cites a tracker, say why instead: /'
  bad=1
fi
[ "$bad" = 0 ] && echo "check-house: ${#files[@]} files in ${dirs[*]}: none over $MAX_FILE lines, no function over $MAX_FUNC, no \"issue N\""
exit "$bad"
