#!/usr/bin/env bash
# Build a pinned kube-apiserver and kube-controller-manager from the Go module proxy
# into a cache outside the repository, once per version: a warm run finds the stamp
# and returns at once. Both come from one `go build -o dir/`, so the packages they
# share (most of client-go, apiserver and the API types) compile once. The
# controller manager's csrsigning controller is the external signer the signer's
# registration-authority tests use (docs/kubernetes.md).
# Also makes sure etcd is installed (Debian's etcd-server), as .ci/run does for chromium.
#
#   hack/kube-apiserver.sh          # prints kube-apiserver's path on its last line;
#                                   # kube-controller-manager is beside it
#
# Kubernetes is released as a Go module whose go.mod replaces every k8s.io/* staging
# module with ./staging/src/...; those directories are not in the module zip, so the
# replaces are rewritten to the published k8s.io/* modules of the same release.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.34.2}"
STAGING_VERSION="v0${KUBE_VERSION#v1}"   # v1.34.2 -> v0.34.2
GO="${GO:-go}"
CACHE="${MESHAGENT_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshagent/kube-apiserver-$KUBE_VERSION}"
BIN="$CACHE/kube-apiserver"
KCM="$CACHE/kube-controller-manager"
STAMP="$CACHE/stamp"
WANT_STAMP="kubernetes $KUBE_VERSION staging $STAGING_VERSION kube-apiserver kube-controller-manager $($GO env GOVERSION) $($GO env GOOS)/$($GO env GOARCH)"

log() { echo "kube-apiserver.sh: $*" >&2; }

if ! command -v etcd >/dev/null 2>&1; then
	log "installing Debian's etcd-server (etcd is missing)"
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO="sudo"
	$SUDO apt-get update -qq && $SUDO apt-get install -y -qq etcd-server >/dev/null
fi

if [ -x "$BIN" ] && [ -x "$KCM" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT_STAMP" ]; then
	echo "$BIN"
	exit 0
fi

log "building kube-apiserver and kube-controller-manager $KUBE_VERSION into $CACHE (about 15 minutes on two cores, much longer on a busy machine)"
start=$(date +%s)
mkdir -p "$CACHE"
work="$(mktemp -d "$CACHE/build.XXXXXX")"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

src="$(GOWORK=off GOFLAGS=-mod=mod $GO mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -n "$src" ] && [ -d "$src" ] || { log "module download of k8s.io/kubernetes@$KUBE_VERSION gave no directory"; exit 1; }
cp -r "$src/." "$work/"
chmod -R u+w "$work"

# k8s.io/api => ./staging/src/k8s.io/api   becomes   k8s.io/api => k8s.io/api v0.34.2
sed -i -E "s#^([[:space:]]*)(k8s\.io/[A-Za-z0-9._-]+) => \./staging/src/k8s\.io/[A-Za-z0-9._-]+\$#\1\2 => \2 $STAGING_VERSION#" "$work/go.mod"
if grep -q '=> ./staging' "$work/go.mod"; then
	log "go.mod still replaces with ./staging after the rewrite:"; grep '=> ./staging' "$work/go.mod" >&2; exit 1
fi

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
ldflags+=" -X k8s.io/component-base/version.gitMajor=$(echo "$KUBE_VERSION" | cut -d. -f1 | tr -d v)"
ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
mkdir -p "$work/out"
(cd "$work" && GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 $GO build -trimpath -ldflags "$ldflags" -o "$work/out/" ./cmd/kube-apiserver ./cmd/kube-controller-manager)
mv -f "$work/out/kube-apiserver" "$BIN"
mv -f "$work/out/kube-controller-manager" "$KCM"
echo "$WANT_STAMP" >"$STAMP"
log "built in $(( $(date +%s) - start )) s"
echo "$BIN"
