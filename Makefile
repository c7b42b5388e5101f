# Stratum Join. `make demo` runs the whole flow on loopback; `make test` runs
# every test (as root: network namespaces, systemd-analyze).
GO       ?= go
BIN      := bin
DESTDIR  ?=
PREFIX   ?= /usr/local
PKGS     := ./...
STATICCHECK_VERSION := v0.8.2
# go-nvml's header marks many calls deprecated; gcc would print each one
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

# demo-ha needs an etcd server: built from the etcd Go module this module requires.
.PHONY: all build test test-short demo demo-ha bench herd fuzz lint install clean

all: build

build:
	$(GO) build -trimpath -o $(BIN)/ ./cmd/...

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

# Figures for the issue notes: join latency, listener CPU per join against
# the floor, RSS after 1,000 joins, KE2 timing of live/inactive/unknown.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./bench/
	$(GO) test -run '^$$' -bench . -benchmem ./internal/pake/ ./pki/ ./internal/store/...

# 10,000 agents joining at once through one listener.
herd:
	STRATUM_HERD=10000 $(GO) test -run '^$$' -bench Herd -benchtime 1x -timeout 60m ./bench/

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

install: build
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BIN)/stratum-agent $(BIN)/stratum-listener $(DESTDIR)$(PREFIX)/bin/
	install -d $(DESTDIR)/lib/systemd/system
	install -m 0644 systemd/*.service systemd/*.socket $(DESTDIR)/lib/systemd/system/

clean:
	rm -rf $(BIN) .demo
