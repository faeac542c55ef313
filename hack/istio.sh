#!/usr/bin/env bash
# Build Istio's istiod (pilot-discovery) and pilot-agent from the Go module proxy into a
# cache outside the repository, once per version: a warm run finds the stamp and returns at
# once. Istio's CRDs are copied from the same module, so the control plane, the agent and the
# CRDs all come from one Istio commit.
#
#   hack/istio.sh          # prints the cache directory on its last line:
#                          #   pilot-discovery, pilot-agent, crd-all.gen.yaml
#
# The version is the pseudo-version the module proxy serves for istio/istio master of
# 2026-08-27 (eed52ebb66ad): docs/benchmarks.md's first pilot-agent (86c9f01fd73) is not
# served by the proxy. istio.io/istio's go.mod has no replace directives, so `go install
# pkg@version` builds it as published. The tags and ldflags are the ones Istio's release
# build uses (Makefile.core.mk: STANDARD_TAGS for istiod, AGENT_TAGS for the agent,
# RELEASE_LDFLAGS; pkg/version as common/scripts/report_build_info.sh sets it).
set -euo pipefail

ISTIO_VERSION="${ISTIO_VERSION:-v0.0.0-20260827124520-eed52ebb66ad}"
ISTIO_TAG="${ISTIO_TAG:-1.31-dev}"     # VERSION file of that commit (1.31) + Makefile's -dev
GO="${GO:-go}"
CACHE="${MESHAGENT_ISTIO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshagent/istio-$ISTIO_VERSION}"
STAMP="$CACHE/stamp"
WANT_STAMP="istio $ISTIO_VERSION $ISTIO_TAG $($GO env GOVERSION) $($GO env GOOS)/$($GO env GOARCH)"

log() { echo "istio.sh: $*" >&2; }

if [ -x "$CACHE/pilot-discovery" ] && [ -x "$CACHE/pilot-agent" ] && [ -f "$CACHE/crd-all.gen.yaml" ] &&
	[ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT_STAMP" ]; then
	echo "$CACHE"
	exit 0
fi

log "building istiod and pilot-agent $ISTIO_VERSION into $CACHE (31 minutes cold on two shared cores, 2026-12-07)"
start=$(date +%s)
mkdir -p "$CACHE"
work="$(mktemp -d "$CACHE/build.XXXXXX")"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

src="$(GOWORK=off GOFLAGS=-mod=mod $GO mod download -json "istio.io/istio@$ISTIO_VERSION" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -n "$src" ] && [ -d "$src" ] || { log "module download of istio.io/istio@$ISTIO_VERSION gave no directory"; exit 1; }
crds="$src/manifests/charts/base/files/crd-all.gen.yaml"
[ -f "$crds" ] || { log "$crds is missing"; exit 1; }

rev="${ISTIO_VERSION##*-}"
v="istio.io/istio/pkg/version"
ldflags="-extldflags -static -s -w -X $v.buildVersion=$ISTIO_TAG -X $v.buildGitRevision=$rev"
ldflags+=" -X $v.buildStatus=Clean -X $v.buildTag=$ISTIO_TAG -X $v.buildOS=$($GO env GOOS) -X $v.buildArch=$($GO env GOARCH)"

build() { # build TAGS PACKAGE
	GOWORK=off GOFLAGS= CGO_ENABLED=0 GOBIN="$work" $GO install -trimpath -tags "$1" -ldflags "$ldflags" "istio.io/istio/$2@$ISTIO_VERSION"
}
build vtprotobuf,disable_pgv pilot/cmd/pilot-discovery
build agent,disable_pgv,grpcnotrace,retrynotrace pilot/cmd/pilot-agent

cp "$crds" "$work/crd-all.gen.yaml"
mv -f "$work/pilot-discovery" "$CACHE/pilot-discovery"
mv -f "$work/pilot-agent" "$CACHE/pilot-agent"
mv -f "$work/crd-all.gen.yaml" "$CACHE/crd-all.gen.yaml"
echo "$WANT_STAMP" >"$STAMP"
log "built in $(( $(date +%s) - start )) s"
echo "$CACHE"
