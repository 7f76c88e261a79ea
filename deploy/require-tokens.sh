#!/bin/sh
# Runs its arguments (`runbus serve auth`, `runbus serve gateway`) only when the bus has tokens
# of its own: without RUNBUS_TOKENS_FILE those services accept the packaged dev tokens
# (dev-alice, dev-bob, dev-carol), which are public, so anyone who can reach the bus or the
# ingress could act as those users. RUNBUS_ALLOW_DEV_TOKENS=1 accepts them anyway (a local
# trial on loopback ports); it is read here only, and unset before runbus starts, which
# refuses any RUNBUS_* variable it does not know.
set -eu
if [ -z "${RUNBUS_TOKENS_FILE:-}" ] && [ "${RUNBUS_ALLOW_DEV_TOKENS:-0}" != "1" ]; then
  echo "runbus: refusing to start without RUNBUS_TOKENS_FILE: the packaged dev tokens are" \
    "public. Point RUNBUS_TOKENS_FILE at your token file (docs/operations.md, 'Tokens'), or" \
    "set RUNBUS_ALLOW_DEV_TOKENS=1 to accept the dev tokens for a local trial." >&2
  exit 78
fi
unset RUNBUS_ALLOW_DEV_TOKENS
exec "$@"
