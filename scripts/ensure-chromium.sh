#!/usr/bin/env bash
# The dashboard's tests drive Debian's Chromium (no browser download: see
# ../shared/browser-testing.md). Install it when it is missing and we may (root);
# otherwise say how, and the browser tests skip themselves with the same message.
set -u
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian's chromium for the dashboard tests (once per machine)..."
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
    || echo "could not install chromium; the browser tests will be skipped"
else
  echo "no /usr/bin/chromium: the browser tests will be skipped (as root: apt-get install chromium)"
fi
exit 0
