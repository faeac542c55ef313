#!/usr/bin/env bash
# Installs the TLS stacks the tests handshake certificate chains with besides Go's —
# OpenSSL and BoringSSL (Envoy's; Debian's android-boringssl gives bssl-tool) — when
# either is missing. Used by .ci/run and make test-compose, which then fail (not
# skip) without them (MESHAGENT_REQUIRE_BSSL).
set -euo pipefail
if command -v bssl-tool >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1; then
	exit 0
fi
echo "installing android-boringssl and openssl for the TLS stack tests" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq && $SUDO apt-get install -y -qq android-boringssl openssl >/dev/null
