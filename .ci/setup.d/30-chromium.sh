#!/bin/sh
# The web board's browser tests (tests/test_web_browser.py) drive a headless Chromium
# through chromedriver (WebDriver over HTTP); they are skipped where it is missing.
set -e
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
