#!/bin/sh
# The TypeScript SDK check (tests/test_mcp_node.py) needs tests/node's npm packages;
# it is skipped where Node is not installed.
set -e
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || exit 0
cd "$(dirname "$0")/../../tests/node"
if [ -f package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error
else
    npm install --no-audit --no-fund --loglevel=error
fi
