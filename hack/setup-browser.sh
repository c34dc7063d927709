#!/usr/bin/env bash
# A real browser for the console's tests: Debian's chromium (the tests speak its DevTools
# protocol directly, so no driver has to match its version). Idempotent; quiet when present.
set -euo pipefail
for name in chromium chromium-browser google-chrome; do
  command -v "$name" >/dev/null 2>&1 && exit 0
done
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-browser: install Chromium (Debian: apt-get install chromium) for the console's tests" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "[setup-browser] installing chromium (Debian package)"
apt-get install -y -qq chromium >/dev/null 2>&1 || {
  apt-get update -qq >/dev/null
  apt-get install -y -qq chromium >/dev/null
}
