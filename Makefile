# urnbd — see README.md. Every target installs what it needs (tools/deps.sh).
SHELL := /bin/bash
GO = $(shell bash tools/deps.sh | sed -n 's/^GO=//p')

.PHONY: all build deb install test host-test lab-test demo bench fuzz lint generate clean

all: build

build:
	$(GO) build -o bin/urnbd ./cmd/urnbd

# The Debian package (.cache/deb/urnbd_VERSION_ARCH.deb): binary, man
# pages, completions, systemd units, defaults that export nothing.
deb:
	GO=$(GO) tools/deb/build.sh

# Without a package: PREFIX (/usr/local) inside DESTDIR, units in
# /etc/systemd/system.
install:
	GO=$(GO) PREFIX=$(or $(PREFIX),/usr/local) DESTDIR=$(DESTDIR) tools/install.sh

# The whole suite, as CI runs it: lint, host tests, short fuzzing, then one
# lab boot for the tests that need real ublk and RDMA.
test:
	tools/test.sh all

host-test:
	tools/test.sh host

lab-test:
	tools/test.sh lab

# The lab demo (README's first command).
demo:
	tools/demo.sh

# Benchmarks: Go benchmarks with -benchmem on the host, fio in the lab.
bench:
	tools/bench/run.sh

# Longer fuzzing than CI's: URNBD_FUZZTIME per target (default 60s).
fuzz:
	tools/test.sh fuzz

lint:
	tools/test.sh lint

generate:
	$(GO) generate ./...

clean:
	rm -rf bin .cache/lab/out
