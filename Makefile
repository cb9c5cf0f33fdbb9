# outbox-relay. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
# Tests use DATABASE_URL, else the dev machines' local server. `make dev` does not default
# it: without DATABASE_URL the local stack starts its own throwaway cluster.
TEST_DATABASE_URL := $(or $(DATABASE_URL),postgres://postgres@127.0.0.1:5432/test?sslmode=disable)

# What `sam build` runs (BuildMethod: makefile): one target per function, leaving
# $(ARTIFACTS_DIR)/bootstrap, a static linux/arm64 binary for provided.al2023.
LAMBDA_GOOS ?= linux
LAMBDA_GOARCH ?= arm64
LAMBDA_BUILD = GOOS=$(LAMBDA_GOOS) GOARCH=$(LAMBDA_GOARCH) CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags='-s -w'

dev: ## the main job: local stack + demo (1,000 events) end to end; ARGS="--events 5000 --forever" to change it
	$(GO) run ./cmd/outboxctl dev $(ARGS)

.DEFAULT_GOAL := help
.PHONY: help dev test build lint fmt vet

help: ## list targets
	@grep -hE '^[a-zA-Z_%-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-22s %s\n",$$1,$$2}'

build-RelayFunction: ## sam build target: relay Lambda
	$(LAMBDA_BUILD) -o "$(ARTIFACTS_DIR)/bootstrap" ./functions/relay
build-WebhookFunction: ## sam build target: webhook Lambda
	$(LAMBDA_BUILD) -o "$(ARTIFACTS_DIR)/bootstrap" ./functions/webhook
build-FailureFunction: ## sam build target: failure-callback Lambda
	$(LAMBDA_BUILD) -o "$(ARTIFACTS_DIR)/bootstrap" ./functions/failure

test: ## run every test against real Postgres (DATABASE_URL), with the race detector
	DATABASE_URL='$(TEST_DATABASE_URL)' $(GO) test -race -count=1 -timeout 20m ./...

vet: ## go vet
	$(GO) vet ./...

fmt: ## gofmt -l (fails if anything is unformatted)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "$$out"; exit 1; fi

lint: fmt vet ## gofmt + go vet

.PHONY: bench bench-short
bench: ## full benchmark on DATABASE_URL (~15 min): docs/bench-results.{json,md} and docs/bench-drain.svg
	$(GO) build -o bin/outboxctl ./cmd/outboxctl
	DATABASE_URL='$(TEST_DATABASE_URL)' ./bin/outboxctl bench --out docs/bench-results.json --chart docs/bench-drain.svg > docs/bench-results.md

bench-short: ## every benchmark scenario at its short size (under two minutes), results in tmp/
	$(GO) build -o bin/outboxctl ./cmd/outboxctl
	DATABASE_URL='$(TEST_DATABASE_URL)' ./bin/outboxctl bench --short --out tmp/bench-short.json --chart tmp/bench-short.svg
