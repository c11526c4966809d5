# infergate — build, test, demo, benchmarks. Every target works on a fresh
# machine with Go installed; nothing is downloaded outside the Go module proxy.

GO       ?= go
# The image's binary; beside it the conformance suite and the Envoy
# stand-in, which link test frameworks and harness code the image must not.
BIN      := bin/infergate
CONFORMANCE_BIN := bin/infergate-conformance
ENVOYSIM := bin/envoysim
WASM     := build/infergate-payload.wasm
# The release version: the image tag and the charts' appVersion (a test
# holds them equal). The commit is in `infergate version` as well.
VERSION  ?= $(shell cat VERSION)
COMMIT   ?= $(shell git describe --always --dirty --abbrev=12 2>/dev/null)
LDFLAGS  := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

.PHONY: all build image wasm test test-unit conformance-reports controlplane lint vet fmt staticcheck demo bench bench-scheduling bench-epp bench-payload bench-envoysim bench-egext bench-routing bench-stalled bench-reference bench-h2attack clean

all: build

## build: the three commands into bin/: infergate (the image's: epp, payload, egext, envoy-bootstrap, sim), infergate-conformance (the suite) and envoysim (the Envoy stand-in, for the demo and tests).
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/infergate ./cmd/infergate-conformance ./cmd/envoysim

## image: the infergate container image (static, non-root), built without a container engine: an OCI layout at bin/image/oci and a tarball for docker/podman load at bin/infergate-image.tar; prints the digest.
image:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o bin/image/infergate ./cmd/infergate
	$(GO) run ./hack/image --binary bin/image/infergate --version $(VERSION) --layout bin/image/oci --tarball bin/infergate-image.tar

## wasm: the payload processor as a proxy-wasm plugin (upstream Go, GOOS=wasip1), at $(WASM).
wasm:
	GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 $(GO) build -buildmode=c-shared -trimpath -ldflags='-s -w' -o $(WASM) ./wasm/payload

## test: lint, the test control plane (kube-apiserver, etcd, Envoy Gateway's controller, Istio's pilot-discovery and CRDs), h2spec and @grpc/grpc-js, then every test (unit, integration over real gRPC and HTTP on loopback, h2spec and a grpc-js client against both ext_proc transports, Kubernetes mode against a real kube-apiserver, Envoy Gateway with the extension) with the race detector, and beside them the gateway conformance runs without it (CONFORMANCE_RUNS).
# The gateway conformance runs' package goes without the race detector:
# upstream's tests it calls (gateway-api-inference-extension conformance
# v1.6.0: GatewayFollowingEPPRouting, its data-parallel variant and
# GatewayWeightedAcrossTwoInferencePools) fill in one ExpectedResponse from
# ten goroutines at once, a race in code not ours that fails a run now and
# then. What of infergate runs in that package (the extension, the stand-in,
# the picker) is race-tested in its own packages. kgateway's run
# (TestKgateway, about 17 minutes, most of them spent waiting out tests
# kgateway fails) goes in a process of its own, in its own network
# namespace, beside the other runs rather than after them.
CONFORMANCE_RUNS := ./test/gatewayconformance
test: lint
	assets="$$(hack/controlplane.sh)" && eg="$$(hack/envoygateway.sh)" && istio="$$(hack/istio.sh)" && kgw="$$(hack/kgateway.sh)" && h2spec="$$(hack/h2spec.sh)" && grpcjs="$$(hack/grpcjs.sh)" && iptables="$$(hack/iptables.sh)" && \
	export KUBEBUILDER_ASSETS="$$assets" INFERGATE_ENVOY_GATEWAY="$$eg/envoy-gateway" INFERGATE_ISTIO="$$istio" INFERGATE_KGATEWAY="$$kgw" INFERGATE_H2SPEC="$$h2spec" INFERGATE_GRPCJS="$$grpcjs" INFERGATE_IPTABLES="$$iptables" && \
	pkgs="$$($(GO) list ./... | grep -vxF "$$($(GO) list $(CONFORMANCE_RUNS))")" && \
	{ $(GO) test -count=1 -timeout 30m -skip '^TestKgateway$$' $(CONFORMANCE_RUNS) & runs=$$!; \
	  $(GO) test -count=1 -timeout 30m -run '^TestKgateway$$' $(CONFORMANCE_RUNS) & kgw=$$!; \
	  $(GO) test -race -count=1 -timeout 30m $$pkgs; rest=$$?; \
	  wait $$runs; runs=$$?; wait $$kgw; kgw=$$?; test $$rest -eq 0 && test $$runs -eq 0 && test $$kgw -eq 0; }

## conformance-reports: run the gateway profile against Envoy Gateway v1.9.1 with infergate's extension, plain Envoy Gateway v1.9.1, Istio's pilot-discovery and kgateway v2.2.0 on the test control plane, and the epp and payload profiles against infergate's picker, payload processor and Wasm plugin (as make test does), keep their reports under conformance/reports/$(SUITE_VERSION)/<implementation>/ and write the table of results there (README.md).
SUITE_VERSION := v1.6.0
REPORTS       := conformance/reports/$(SUITE_VERSION)
conformance-reports:
	rm -rf $(REPORTS)
	INFERGATE_CONFORMANCE_REPORTS="$(CURDIR)/$(REPORTS)" $(GO) test -count=1 -run '^(TestConformance|TestConformanceWasmPlugin)$$' ./conformance/epp/ ./conformance/payload/
	assets="$$(hack/controlplane.sh)" && eg="$$(hack/envoygateway.sh)" && istio="$$(hack/istio.sh)" && kgw="$$(hack/kgateway.sh)" && \
	KUBEBUILDER_ASSETS="$$assets" INFERGATE_ENVOY_GATEWAY="$$eg/envoy-gateway" INFERGATE_ISTIO="$$istio" INFERGATE_KGATEWAY="$$kgw" \
	INFERGATE_CONFORMANCE_REPORTS="$(CURDIR)/$(REPORTS)" $(GO) test -count=1 -timeout 60m -v -run '^(TestEnvoyGatewayWithExtension|TestPlainEnvoyGateway|TestIstio|TestKgateway)$$' ./test/gatewayconformance/ | grep -E '^(=== RUN|--- |PASS|FAIL|ok)' ; \
	{ echo "# Conformance reports, suite $(SUITE_VERSION)"; echo; \
	  echo "Written by \`make conformance-reports\` (upstream's report format) from the runs \`make test\` makes: the gateway profile in test/gatewayconformance (where \`make test\` runs three of the tests against plain Envoy Gateway, this target all but the four that would wait 300 s each), the epp and payload profiles in conformance/epp and conformance/payload."; echo; \
	  $(GO) run ./conformance/internal/reporttable $(REPORTS); } > $(REPORTS)/README.md.partial && mv $(REPORTS)/README.md.partial $(REPORTS)/README.md
	@cat $(REPORTS)/README.md

## controlplane: build (once; about 20 minutes on 2 cores) or reuse kube-apiserver, Envoy Gateway, Istio's pilot-discovery and kgateway in $$HOME/.cache/infergate, install etcd-server.
controlplane:
	hack/controlplane.sh
	hack/envoygateway.sh
	hack/istio.sh
	hack/kgateway.sh

## test-unit: the inner loop (1m40s warm on 2 cores): the packages that need no control plane and no outside tool, but for the slowest end-to-end runs, with the race detector; no lint. make test runs them too.
# Left out: the packages that start control planes (test/charts renders
# against a kube-apiserver), h2spec and grpc-js, the GAIE reference build,
# and the slowest end-to-end runs: the HTTP/2 attack suite (about 95 s),
# the image build (about 50 s), test/e2e (about 35 s) and the fault
# suite (about 4 minutes, iptables in a namespace of its own).
NOT_UNIT := ./test/charts ./test/envoygateway ./test/gatewayconformance ./test/istio ./test/kgateway ./test/kubernetes ./test/livecluster ./test/h2spec ./test/grpcjs ./bench/reference ./bench/h2attack ./internal/ociimage ./test/e2e ./test/faults
test-unit:
	$(GO) test -race -count=1 -timeout 10m $$($(GO) list ./... | grep -vxF "$$($(GO) list $(NOT_UNIT))")

## lint: gofmt, go vet, and hack/lint.sh: staticcheck and two dead-code checks, with the deliberate exceptions (each with its reason) in hack/lint-exceptions.txt.
lint: fmt vet staticcheck

staticcheck:
	hack/lint.sh

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

## demo: three simulators, the endpoint picker, the payload processor and the Envoy stand-in on loopback; a few hundred requests; a table of where they went and why.
demo: build
	$(GO) run ./test/demo --binary $(BIN) --envoysim $(ENVOYSIM)

## bench: scheduling micro-benchmarks, the ext_proc load driver, the stand-in's two modes and the routing benchmark.
bench: bench-scheduling bench-epp bench-payload bench-envoysim bench-egext bench-stalled bench-routing

bench-scheduling:
	$(GO) test -run '^$$' -bench . -benchmem ./extproc/epp/scheduling/ ./extproc/epp/config/ ./extproc/epp/prefix/ ./inference/ ./inference/pii/ ./inference/policy/

## bench-payload: the payload processor's ext_proc round trip (p50/p99) and the Wasm plugin in the wazero host.
bench-payload:
	$(GO) test -run '^$$' -bench . -benchtime 3s ./extproc/payload/ ./wasm/payload/

## bench-envoysim: requests per second through the Envoy stand-in configured by flags and over xDS (same picker and simulators).
bench-envoysim:
	$(GO) test -run '^$$' -bench StandIn -benchtime 1x -v ./test/e2e/

## bench-egext: the Envoy Gateway extension's translation hook (100 routes, 20 pools) in-process and over gRPC; memory of 1,000 pools.
bench-egext:
	$(GO) test -run '^$$' -bench . -benchtime 2s ./gateways/envoygateway/

## bench-stalled: the payload processor under the shapes of pressure a client can make (stalled uploads, bodies of empty strings, 10,000 held streams, messages announced and not sent, trickled uploads, answers never read, prompts dense in zero-width characters and combining marks, a million e-mail addresses or 700,000 cards to mask), on grpc-go and h2, with the charts' 512 MiB memory limit: peak RSS, the share of well-behaved requests forwarded and how the costly requests were answered; exits 1 if a run peaks over 80% or forwards under 99% (about 4 minutes).
bench-stalled: build
	$(GO) run ./bench/stalled --binary $(BIN)

bench-epp: build
	$(GO) run ./bench/eppload --binary $(BIN)

## bench-h2attack: HTTP/2 attacks (rapid reset, CONTINUATION and SETTINGS/PING floods, HPACK bomb, held and violated windows, false message lengths) against the payload processor on grpc-go and on h2, a fresh process each: survival, RSS, CPU, a victim's answers meanwhile (about 4 minutes; make test runs a tenth of it, in bench/h2attack's TestAttacks).
bench-h2attack: build
	$(GO) run ./bench/h2attack --binary $(BIN) $(ARGS)

## bench-reference: infergate's picker and payload processor beside GAIE v1.5.0's epp and bbr (built by hack/reference.sh), same driver, rounds interleaved (needs root: a network namespace of its own). ARGS=--pin pins the processors to one core and the driver to the other.
bench-reference: build
	assets="$$(hack/controlplane.sh)" && ref="$$(hack/reference.sh)" && \
	KUBEBUILDER_ASSETS="$$assets" $(GO) run ./bench/reference --binary $(BIN) --reference "$$ref" $(ARGS)

## bench-routing: five workloads (the fifth, t, is (a) over four sim tokenizers) through the Envoy stand-in, the picker and simulators under five routing configs (about 14 minutes on 2 cores).
bench-routing: build
	$(GO) run ./bench/routing --binary $(BIN) --envoysim $(ENVOYSIM)

clean:
	rm -rf bin build
