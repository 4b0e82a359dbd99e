# Sluice. `make test` is what CI runs (.ci/run).
GO ?= go
PKGS := ./...

.PHONY: all run test services node vet bench bench-rls bench-cold fuzz build image check-units example-up example-down monitoring helm-test

all: vet test

## run: a limiter with an embedded NATS server and the in-memory origin
run:
	$(GO) run ./cmd/limiter

## build: static binaries bin/limiter and bin/bridge with VERSION stamped in
## (limiter --version; default: git describe, else "dev"). Scripts need a built
## binary: `go run` turns exit status 2 into 1.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
BIN ?= bin
build:
	mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w -X main.version=$(VERSION)' -o $(BIN)/ ./cmd/limiter ./cmd/bridge

## image: container images sluice-limiter and sluice-bridge (FROM scratch, user
## 65532) built with buildah, then smoke-checked by running each entrypoint
## chrooted into the image as that user (needs root; not part of `make test`)
IMAGE_TAG ?= $(VERSION)
image: build
	IMAGE_TAG=$(IMAGE_TAG) BIN=$(BIN) ./scripts/image.sh

## check-units: systemd-analyze verify and security of deploy/systemd (part of `make test`)
check-units:
	GO=$(GO) ./scripts/check-units.sh

## example-up / example-down: three regions on this machine (examples/three-regions;
## docs/operations.md, "Three regions on one machine")
example-up:
	./examples/three-regions/up
example-down:
	./examples/three-regions/down

## services: make sure Redis and MariaDB answer on loopback (start or install them)
services:
	./scripts/services.sh

## node: make sure Node.js and npm are installed (apt where missing) and the
## TypeScript example's pinned packages are (npm ci when its lock changed)
node:
	./scripts/node.sh

## vet: gofmt and go vet
vet:
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet $(PKGS)

## monitoring: promtool check rules and test rules on monitoring/alerts.yml
## (installs Debian's prometheus package for promtool where missing; starts no server)
monitoring:
	./scripts/promtool.sh

## test: services, node, vet, the systemd units' check, monitoring, then every test with the
## race detector (fuzz seed corpora included), then the allocation tests without it (its
## instrumentation allocates)
test: services node vet check-units monitoring
	$(GO) test -race -count=1 -timeout 15m $(PKGS)
	$(GO) test -count=1 -run Allocations $(PKGS)
	cd deploy/helm && $(GO) vet ./... && $(GO) test -count=1 ./...

## helm-test: the Helm chart (deploy/helm/sluice) rendered with Helm's engine and every
## manifest checked against Kubernetes' types and the commands' flags; no cluster
## (deploy/helm is a module of its own, so `go test ./...` above does not reach it)
helm-test:
	cd deploy/helm && $(GO) vet ./... && $(GO) test -count=1 ./...

## bench: micro-benchmarks, then the end-to-end figures with their ratios
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./window ./service ./bus/... ./httplimit ./natslimit
	$(GO) run ./test/bench

## bench-rls: Envoy's most common load (a limit per client address, 1 s windows, 20 ms
## deadlines) against a limiter process on a redis-server of its own, ROUNDS (default 3)
## runs a load, medians reported; UPSTREAM=path/to/envoyproxy-ratelimit runs upstream's
## server beside it, the two in turn on the same YAML and Redis
ROUNDS ?= 3
bench-rls:
	$(GO) run ./test/bench -rls-cold -d 10s -rounds $(ROUNDS)$(if $(UPSTREAM), -upstream-ratelimit $(UPSTREAM))

## bench-cold: cold checks over NATS (a fresh identifier each, far from its limit) against a
## limiter process on a redis-server of its own, next to a bare NATS echo on the same server,
## at 64 and 256 in flight: req/s, p50/p99, CPU a check, breaker openings, limiter / echo
bench-cold:
	$(GO) run ./test/bench -cold-nats -d 10s

## fuzz: run each fuzz target for FUZZTIME (default 30s)
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecide$$' -fuzztime $(FUZZTIME) ./window
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeCheckRequest$$' -fuzztime $(FUZZTIME) ./bus/wire
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeBatchRequest$$' -fuzztime $(FUZZTIME) ./bus/wire
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeCheckResponse$$' -fuzztime $(FUZZTIME) ./bus/wire
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeComponents$$' -fuzztime $(FUZZTIME) ./bus/event
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeDenials$$' -fuzztime $(FUZZTIME) ./bus/event
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeImports$$' -fuzztime $(FUZZTIME) ./bus/event
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./rls
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRequests$$' -fuzztime $(FUZZTIME) ./policy/adminwire
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeCursor$$' -fuzztime $(FUZZTIME) ./policy/adminwire
	$(GO) test -run '^$$' -fuzz '^FuzzCellNameIsInjective$$' -fuzztime $(FUZZTIME) ./rls
	$(GO) test -run '^$$' -fuzz '^FuzzShouldRateLimit$$' -fuzztime $(FUZZTIME) ./rls
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeSnapshotChunk$$' -fuzztime $(FUZZTIME) ./bus/event
	$(GO) test -run '^$$' -fuzz '^FuzzParseXDS$$' -fuzztime $(FUZZTIME) ./rls
	$(GO) test -run '^$$' -fuzz '^FuzzHTTPDoorRoute$$' -fuzztime $(FUZZTIME) ./bus/transport
	$(GO) test -run '^$$' -fuzz '^FuzzParseRequestInfo$$' -fuzztime $(FUZZTIME) ./natslimit

## soak: one limiter (Redis origin, bridge in process) under sustained load over
## SOAK_IDS identifiers for SOAK_DURATION: rate, errors, live heap per active cell
## and its slope (not part of `make test`)
## (SOAK_RATE: checks/s; 20000 stays below what the shared Redis on a 2-core
## machine answers while every check reads a cold identifier)
SOAK_DURATION ?= 3m
SOAK_IDS ?= 2000000
SOAK_RATE ?= 20000
.PHONY: soak
soak:
	$(GO) run ./test/soak -d $(SOAK_DURATION) -ids $(SOAK_IDS) -rate $(SOAK_RATE)

## scale: the global layer's scale scenario: three regions (a limiter and a
## bridge each, as processes), a private MariaDB with SCALE_CELLS live cells,
## SCALE_CHANGES cells changed a second for SCALE_DURATION; prints the
## measurements and PASS/FAIL per target (not part of `make test`, which runs
## TestScaleShort, a small version)
SCALE_CELLS ?= 1000000
SCALE_CHANGES ?= 2000
SCALE_DURATION ?= 60s
.PHONY: scale
scale: services
	$(GO) run ./test/scale -cells $(SCALE_CELLS) -changes $(SCALE_CHANGES) -d $(SCALE_DURATION)

## scale-policies: the scale scenario's policies mode: SCALE_WORKSPACES ×
## SCALE_OVERRIDES overrides (every tenth a tombstone) and SCALE_MARKS reset
## marks a workspace loaded into the private MariaDB, three regions started on
## them (400 a workspace: at 1,000 a bridge's first full read does not finish within
## its store timeout; see docs/architecture.md), SCALE_POLICY_CHANGES sets, deletes and resets a second through the
## admin API for SCALE_DURATION; prints rows read per bridge against rows
## changed, live heaps, whether every change reached every region, and
## PASS/FAIL per target (not part of `make test`, which runs
## TestScalePoliciesShort, a small version)
SCALE_WORKSPACES ?= 1000
SCALE_OVERRIDES ?= 400
SCALE_MARKS ?= 10
SCALE_POLICY_CHANGES ?= 100
.PHONY: scale-policies
scale-policies: services
	$(GO) run ./test/scale -policies -workspaces $(SCALE_WORKSPACES) -overrides $(SCALE_OVERRIDES) -marks $(SCALE_MARKS) -policy-changes $(SCALE_POLICY_CHANGES) -d $(SCALE_DURATION)
