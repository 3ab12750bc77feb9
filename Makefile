GO ?= go
BIN := bin/tidyconnect
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X github.com/tidyconnect/tidyconnect/runtime/version.Version=$(VERSION) -X github.com/tidyconnect/tidyconnect/runtime/version.Commit=$(COMMIT)

.PHONY: build test fmt-check vet unit bench capture-cost run up demo clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/tidyconnect

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# All tests, with the race detector. Integration tests need PostgreSQL and
# RabbitMQ: see README "Running the tests".
# -race needs cgo, which Go turns off without a C compiler: then the tests
# run without it, with a warning.
RACE ?= $(if $(filter 1,$(shell $(GO) env CGO_ENABLED 2>/dev/null)),-race,)

test: fmt-check vet
	@[ -n "$(RACE)" ] || echo "warning: cgo is off (no C compiler?): running the tests WITHOUT the race detector; install gcc to get it"
	$(GO) test $(RACE) -count=1 -timeout 30m ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m ./...

# pgaudit's capture cost in instructions (callgrind; needs valgrind and
# PostgreSQL's server binaries): the same figures on every run, to 0.02%.
capture-cost:
	scripts/capture-cost.sh

run: build
	$(BIN) standalone --data-dir ./data

up:
	docker compose up

# The walkthrough (docs/walkthrough.md) against the running stack: `make up`
# in another terminal first, or set DEMO_* (see scripts/demo.sh).
demo:
	./scripts/demo.sh

clean:
	rm -rf bin data
