#!/bin/sh
# tests/test_githosts.py hosts a hub on gitolite (over the sshd of 10-sshd.sh): it
# needs the gitolite3 package. The package's own system instance is left unset
# (no admin key); each test sets up its own gitolite in a temporary HOME.
set -e
if command -v gitolite >/dev/null 2>&1 || [ -x /usr/share/gitolite3/gitolite ]; then
    exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends gitolite3 >/dev/null
