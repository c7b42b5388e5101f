# Stratum Join. `make demo` runs the whole flow on loopback; `make test` runs
# every test (as root: network namespaces, systemd-analyze).
GO       ?= go
BIN      := bin
DESTDIR  ?=
PREFIX   ?= /usr/local
PKGS     := ./...
STATICCHECK_VERSION := v0.8.2
NFPM_VERSION := v2.45.2
# --version and `version --json` name these (internal/cli); a build with
# -buildvcs=false or from a tarball has no VCS stamp of its own
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
COMMIT   ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
DATE     ?= $(shell git log -1 --format=%cI 2>/dev/null || echo unknown)
CLIPKG   := github.com/stratumjoin/stratum/internal/cli
LDFLAGS  := -X $(CLIPKG).version=$(VERSION) -X $(CLIPKG).commit=$(COMMIT) -X $(CLIPKG).date=$(DATE)
# package version: the last tag, or 0.0.0 plus the commit
PKG_VERSION ?= $(shell v=$$(git describe --tags --abbrev=0 2>/dev/null); echo $${v:-0.0.0}+git$$(git rev-parse --short HEAD 2>/dev/null || echo unknown) | sed 's/^v//')
# go-nvml's header marks many calls deprecated; gcc would print each one
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

# demo-ha needs an etcd server: built from the etcd Go module this module requires.
.PHONY: all build test test-short demo demo-ha bench herd fuzz lint install docs package clean

all: build

# The listener needs no C: static (CGO_ENABLED=0), it runs on any Linux.
# The agent links NVML's loader through cgo (glibc 2.34 or later).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/stratum-listener
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/stratum-agent

# The whole suite under the race detector. Fuzz targets run their seed
# corpus here; `make fuzz` runs them for real.
test:
	$(GO) test -race -timeout 30m -count=1 $(PKGS)

test-short:
	$(GO) test -short -count=1 $(PKGS)

demo: build
	./scripts/demo.sh

# Three etcd members, three listeners: joins through each, a rotation, a kill.
demo-ha: build
	$(GO) build -o $(BIN)/etcd ./internal/store/etcdtest/etcdmain
	./scripts/demo-ha.sh

# Figures for the issue notes: join latency, one-shot `stratum-agent join`
# processes against their floor, listener CPU per join against the floor,
# RSS after 1,000 joins, KE2 timing of live/inactive/unknown. -v because
# testing keeps only ten lines of a benchmark's log without it.
bench:
	$(GO) test -v -run '^$$' -bench . -benchtime 1x -timeout 30m ./bench/
	$(GO) test -run '^$$' -bench . -benchmem ./internal/pake/ ./pki/... ./internal/store/...

# 10,000 machines joining at once through one listener, three runs: with
# tokens (up to 1,000 real agent processes, the rest in-process), with batch
# codes approved by a script, and one code's own rate; then three herds of
# tokens with the floor also measured while they run (BenchmarkHerd).
herd:
	STRATUM_HERD=10000 $(GO) test -v -run '^$$' -bench Herd -benchtime 1x -timeout 60m ./bench/

FUZZTIME ?= 30s
# every fuzz target in the module, each for FUZZTIME
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for fn in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "fuzz $$pkg $$fn"; $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $(PKGS)

# The units name the binaries under PREFIX (ExecStart=).
install: build
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BIN)/stratum-agent $(BIN)/stratum-listener $(DESTDIR)$(PREFIX)/bin/
	install -d $(DESTDIR)/lib/systemd/system
	for u in systemd/*.service systemd/*.socket; do \
	  sed 's#/usr/local/bin/#$(PREFIX)/bin/#g' $$u > $(DESTDIR)/lib/systemd/system/$$(basename $$u); \
	  chmod 0644 $(DESTDIR)/lib/systemd/system/$$(basename $$u); \
	done

# man pages and shell completions, generated from the commands (cobra)
docs: build
	rm -rf $(BIN)/docs
	$(BIN)/stratum-listener gen-docs $(BIN)/docs
	$(BIN)/stratum-agent gen-docs $(BIN)/docs

# dist/*.deb and dist/*.rpm (never committed) with nfpm, run as a Go tool
package: docs
	rm -rf $(BIN)/pkgroot dist
	$(MAKE) install DESTDIR=$(CURDIR)/$(BIN)/pkgroot PREFIX=/usr
	mkdir -p dist
	for p in deb rpm; do \
	  PKG_VERSION=$(PKG_VERSION) $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VERSION) \
	    package --config packaging/nfpm.yaml --packager $$p --target dist/ || exit 1; \
	done

clean:
	rm -rf $(BIN) .demo dist
