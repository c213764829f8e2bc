#!/usr/bin/env bash
# make deps: installs the Debian packages the project needs when run as root,
# otherwise prints the apt-get line; then installs the browser-test npm packages.
set -euo pipefail
pkgs=(build-essential pkg-config clang libclang-rt-14-dev
      libmicrohttpd-dev libsqlite3-dev sqlite3 libopenblas-dev liblapacke-dev
      libcjson-dev libcmocka-dev libcurl4-openssl-dev
      python3 chromium gnuplot-nox
      libopenmpi-dev openmpi-bin)
# Node.js may come from elsewhere with npm inside it: ask for the commands.
command -v node >/dev/null || pkgs+=(nodejs)
command -v npm >/dev/null || pkgs+=(npm)
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
    echo "deps: missing Debian packages; run as root:"
    echo "  apt-get install -y ${missing[*]}"
    exit 1
  fi
fi
# Browser tests: playwright-core from npm drives Debian's /usr/bin/chromium.
if [ -f tests/browser/package.json ] && [ ! -d tests/browser/node_modules/playwright-core ]; then
  echo "deps: npm install in tests/browser"
  (cd tests/browser && npm install --no-audit --no-fund --silent)
fi
exit 0
