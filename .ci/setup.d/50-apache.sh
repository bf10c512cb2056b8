#!/bin/sh
# tests/test_githosts.py serves a hub with Apache running git http-backend (mod_cgi,
# Basic auth from an htpasswd file). The tests start Apache with their own config
# on a loopback port; no system Apache is left running on port 80.
set -e
if [ -x /usr/sbin/apache2 ] && command -v htpasswd >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# policy-rc.d keeps the package from starting Apache on port 80
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get install -y -qq --no-install-recommends apache2 apache2-utils >/dev/null
