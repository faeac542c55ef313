# meshagent — build, run and test every module of the workspace.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
SERVICES := signer rotator operator sds-edge xds-relay launcher node-agent
# Every module of the workspace, as import-path patterns (go test ./... fails at a
# go.work root with no root module).
PKGS = $(shell $(GO) list -m -f '{{.Path}}/...')
TEST_TIMEOUT ?= 30m
# -race needs cgo and a C compiler; without one, test without it and say so.
RACE ?= $(shell command -v $$($(GO) env CC) >/dev/null 2>&1 && echo -race)
# grpcnotrace: grpc-go otherwise links x/net/trace and html/template, whose reflection
# makes the linker keep every exported method of every Envoy proto type (binaries
# 28 -> 22 MB, sds-edge file-backed RSS 16.6 -> 13.5 MB). Nothing enables gRPC tracing.
# What every binary says it is (-version, /healthz's X-Meshagent-Version, meshctl status).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
BUILD_FLAGS := -trimpath -tags grpcnotrace -ldflags "-X github.com/meshagent/meshagent/pkg/buildinfo.Version=$(VERSION)"
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# Native Go fuzz targets, as <package>:<FuzzName> (docs/fuzzing.md). Go fuzzes one
# target per invocation; a failing input is written to the package's testdata/fuzz/.
FUZZ_TARGETS := \
	github.com/meshagent/meshagent/services/signer/internal/issuer:FuzzIssue \
	github.com/meshagent/meshagent/pkg/authn:FuzzJWTVerify \
	github.com/meshagent/meshagent/pkg/events:FuzzDecode \
	github.com/meshagent/meshagent/pkg/events:FuzzDecodeCompact \
	github.com/meshagent/meshagent/services/sds-edge/internal/sds:FuzzSDSRequest \
	github.com/meshagent/meshagent/services/xds-relay/internal/relay:FuzzParseFrame \
	github.com/meshagent/meshagent/services/xds-relay/internal/wasm:FuzzWasmRewrite \
	github.com/meshagent/meshagent/pkg/xdswire:FuzzWireDecode \
	github.com/meshagent/meshagent/services/launcher/internal/bootstrap:FuzzTemplateAsTextTemplate \
	github.com/meshagent/meshagent/services/signer/internal/ca:FuzzLoadDir
FUZZTIME ?= 30s

IMAGES := signer rotator operator sds-edge xds-relay launcher node-agent meshctl nats-server
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
COMPOSE_FILE := deploy/compose/compose.yaml

.PHONY: build run test tidy-check test-short test-compose test-kube test-istio bench lint vet tidy clean images compose-up compose-down fuzz fuzz-smoke

# Says what it builds: the first build on a fresh machine downloads modules and
# compiles for minutes, and silence then looks like a hang.
build:
	@mkdir -p $(BIN)
	@echo "building meshagent $(VERSION) into $(BIN)/ (the first build downloads modules and takes minutes)"
	@for s in $(SERVICES); do echo "  $$s"; CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN)/$$s ./services/$$s || exit 1; done
	@echo "  envoy-standin"; CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN)/envoy-standin ./services/launcher/cmd/envoy-standin
	@echo "  meshctl"; CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN)/meshctl ./cmd/meshctl
	@# The pod's three roles from one executable: meshagent sds-edge|xds-relay|launcher|pod.
	@echo "  meshagent"; CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN)/meshagent ./cmd/meshagent
	@echo "built: $$(ls $(BIN) | tr '\n' ' ')"

# The embedded default: NATS, a signer, a rotator and a demo pod, until Ctrl-C.
run: build
	$(BIN)/meshctl up

# One vet of every package, the kube- and istio-tagged tests included (the tags only
# add test files to a few packages): make test-kube and make test-istio then have
# nothing left to vet (VETTED=1, as .ci/run says). Each vet compiles the test dependencies, the
# Kubernetes API types among them; twice cost CI minutes on a loaded machine.
VET_TAGS ?= kube,istio
vet:
	$(GO) vet -tags $(VET_TAGS) $(PKGS)

test: lint tidy-check
	@[ -n "$(RACE)" ] || echo "note: no C compiler ($$($(GO) env CC)) found, so tests run without -race; install gcc for the race detector"
	$(GO) test $(RACE) -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)
	$(MAKE) --no-print-directory fuzz-smoke

test-short:
	$(GO) test -short -count=1 $(PKGS)

# Each fuzz target for FUZZTIME (make fuzz FUZZTIME=10m), one after the other.
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$name ($$pkg) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg || \
		{ echo "fuzz $$name: once more (a found crasher is now in testdata/fuzz and fails again; Go's fuzzer can also report 'context deadline exceeded' when FUZZTIME ends mid-minimization)"; \
		  $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg; } || exit 1; \
	done

# Each fuzz target briefly: part of make test.
fuzz-smoke:
	@$(MAKE) --no-print-directory fuzz FUZZTIME=4s

# BenchmarkStorm (cmd/meshctl) storms a fresh `meshctl up -pods 0` with `meshctl bench
# storm` at STORM_PODS (default 1000,5000,10000) pods of STORM_CONNS (default 1) connections,
# then a root rotation of them (STORM_ROTATE: new-key, same-key or none).
# BenchmarkOperatorFleet (cmd/meshctl) seeds OPERATOR_CERTS (default 1000,100000)
# certificates through the real signer into a fresh `meshctl up` and times the operator's
# pages, memory and restart and the readers (status, check, describe pod, certs).
bench: build
	set -o pipefail; MESHAGENT_BIN=$(BIN) $(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 60m $(PKGS) | tee bench.out

lint: vet
	$(GO) run $(STATICCHECK) $(PKGS)

tidy:
	@for d in $$($(GO) list -m -f '{{.Dir}}'); do (cd $$d && GOWORK=off $(GO) mod tidy) || exit 1; done

# Every module tidy on its own (GOWORK=off): a module that misses a replace for a
# workspace module it reaches builds in the workspace but not alone. Part of make test.
tidy-check:
	@for d in $$($(GO) list -m -f '{{.Dir}}'); do (cd $$d && GOWORK=off $(GO) mod tidy -diff >/dev/null) || \
		{ echo "tidy-check: $$d is not tidy on its own (GOWORK=off go mod tidy -diff; make tidy mends it)"; exit 1; }; done

# Images FROM scratch around the static binaries (no registry needed). Each image
# carries the sha256 of its binary as a label and is rebuilt only when that changed.
images: build
	@CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/nats-server github.com/nats-io/nats-server/v2
	@for i in $(IMAGES); do \
		sum=$$(sha256sum $(BIN)/$$i | cut -d' ' -f1); \
		have=$$(docker image inspect -f '{{index .Config.Labels "io.meshagent.bin.sha256"}}' meshagent/$$i:dev 2>/dev/null); \
		[ "$$sum" = "$$have" ] && continue; \
		echo "image meshagent/$$i:dev: $(BIN)/$$i changed, rebuilding"; \
		docker build -q -t meshagent/$$i:dev --label io.meshagent.bin.sha256=$$sum --build-arg BIN=$$i -f deploy/compose/Dockerfile $(BIN) >/dev/null || exit 1; \
	done
	@echo "images: $(addprefix meshagent/,$(addsuffix :dev,$(IMAGES)))"

# The init container writes the operator's credentials (admin.nk, audit.nk, ca.pem) to
# deploy/compose/.secrets; made here first so that they belong to you, not to root.
compose-up: images
	@mkdir -p deploy/compose/.secrets
	$(COMPOSE) -f $(COMPOSE_FILE) up

compose-down:
	$(COMPOSE) -f $(COMPOSE_FILE) down -v

# The compose fault suite (docs/reliability.md): the stack as containers under its own
# project name and free host ports (it runs beside compose-up), each fault of issue 10
# checked at the pod's SDS socket, the secured bus's refusals, and issue 10's guarantees
# (no expired certificate served while a signer is reachable, readiness within a second,
# no event dropped); MESHAGENT_FAULTS_STRICT=0 only measures those. The rotation step
# handshakes every chain in OpenSSL and BoringSSL too: hack/tls-tools.sh installs them
# when missing, and the step fails rather than skip without them.
test-compose: images
	@hack/tls-tools.sh
	MESHAGENT_REQUIRE_BSSL=1 COMPOSE="$(COMPOSE)" $(GO) test -tags compose -count=1 -timeout 35m -v ./deploy/compose/...

# Tests against a real Kubernetes API server (build tag kube; docs/kubernetes.md):
# hack/kube-apiserver.sh builds a pinned kube-apiserver and kube-controller-manager (the
# registration-authority tests' external signer) once into ~/.cache (docs/kubernetes.md
# states the cold time) and installs Debian's etcd-server when missing; the tests then
# fail instead of skipping if any is missing.
KUBE_TEST_DIRS = $(sort $(dir $(shell grep -rl --include='*_test.go' '^//go:build kube' cmd deploy pkg services tests)))
test-kube:
	@hack/kube-apiserver.sh >/dev/null
	@[ "$(VETTED)" = 1 ] || $(GO) vet -tags kube $(addprefix ./,$(KUBE_TEST_DIRS))
	MESHAGENT_REQUIRE_KUBE=1 $(GO) test $(RACE) -tags kube -count=1 -timeout $(TEST_TIMEOUT) -run '^TestKube' $(addprefix ./,$(KUBE_TEST_DIRS))

# Tests against Istio's own istiod (build tag istio; docs/istio.md, "Against Istio's
# own istiod"): istiod runs against the test-kube API server with Istio's CRDs.
# hack/istio.sh builds istiod and pilot-agent from the Go module proxy once into
# ~/.cache (docs/istio.md states the cold time); the tests fail instead of skipping
# if it, the API server or the TLS tools are missing.
ISTIO_TEST_DIRS = $(sort $(dir $(shell grep -rl --include='*_test.go' '^//go:build istio' cmd deploy pkg services tests)))
test-istio:
	@hack/kube-apiserver.sh >/dev/null
	@hack/istio.sh >/dev/null
	@hack/tls-tools.sh
	@[ "$(VETTED)" = 1 ] || $(GO) vet -tags istio $(addprefix ./,$(ISTIO_TEST_DIRS))
	MESHAGENT_REQUIRE_KUBE=1 MESHAGENT_REQUIRE_ISTIO=1 MESHAGENT_REQUIRE_BSSL=1 $(GO) test $(RACE) -tags istio -count=1 -timeout $(TEST_TIMEOUT) -run '^TestIstiod' $(addprefix ./,$(ISTIO_TEST_DIRS))

clean:
	rm -rf $(BIN) .meshagent bench.out
