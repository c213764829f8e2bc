#!/usr/bin/env bash
# scripts/deps.sh PROFILE: makes sure the Debian packages (and, for the
# browser tests, the npm packages) that PROFILE needs are there.  As root it
# installs what is missing; as anyone else it prints the apt-get line and
# fails.  A profile asks only for what its goal uses:
#   demo         build the two programs and run the demo
#   experiments  demo + gnuplot (the sweep's plot)
#   test         everything the suite uses: cmocka, clang (fuzzing), clang-format
#                (the style check), MPI,
#                the sqlite3 shell, curl and jq (tests/e2e_docs runs the docs' examples),
#                Alertmanager (tests/e2e_alertmanager: the shipped routing, a real receiver),
#                chromium + Node.js + playwright-core, numpy and PyTorch
#                (the Python client's tests, examples/pytorch_lm.py), prometheus
#                (tests/e2e_remote_write pushes to a real one)
#   bench        test's packages (benchmarks drive the same programs)
#   all          every package of every profile (`make deps`)
set -euo pipefail
profile=${1:-all}
build=(build-essential pkg-config python3
       libmicrohttpd-dev libsqlite3-dev libopenblas-dev liblapacke-dev
       libcjson-dev libcurl4-openssl-dev libzstd-dev libsnappy-dev zlib1g-dev)
browser=(chromium)
# Node.js may come from elsewhere with npm inside it: ask for the commands.
command -v node >/dev/null || browser+=(nodejs)
command -v npm >/dev/null || browser+=(npm)
suite=(libcmocka-dev clang clang-format libclang-rt-14-dev sqlite3 curl jq libopenmpi-dev openmpi-bin python3-numpy python3-torch
       prometheus prometheus-alertmanager "${browser[@]}")
case $profile in
  demo)        pkgs=("${build[@]}") ;;
  experiments) pkgs=("${build[@]}" gnuplot-nox) ;;
  test|bench)  pkgs=("${build[@]}" "${suite[@]}") ;;
  all)         pkgs=("${build[@]}" "${suite[@]}" gnuplot-nox) ;;
  *) echo "deps: unknown profile '$profile' (demo, experiments, test, bench, all)" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "deps: missing Debian packages for 'make $profile'; run as root:" >&2
    echo "  apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
# Browser tests: playwright-core from npm drives Debian's /usr/bin/chromium.
case $profile in test|bench|all)
  # The version is pinned (1.49: newer ones refuse Debian 12's Node.js 18);
  # an older checkout's node_modules with another version is replaced.
  want=$(sed -n 's/.*"playwright-core": *"\([^"]*\)".*/\1/p' tests/browser/package.json 2>/dev/null || true)
  have=$(sed -n '0,/"version"/s/^ *"version": *"\([^"]*\)".*/\1/p' \
           tests/browser/node_modules/playwright-core/package.json 2>/dev/null || true)
  if [ -f tests/browser/package.json ] && [ "$want" != "$have" ]; then
    echo "deps: npm ci in tests/browser (playwright-core $want)"
    (cd tests/browser && npm ci --no-audit --no-fund --silent)
  fi ;;
esac
exit 0
