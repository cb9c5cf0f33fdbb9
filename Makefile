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

dev-deployed: ## make dev with the relay as deployed: built, under aws-lambda-rie behind a local Lambda service, kicked after each commit, ticked every minute
	$(GO) run ./cmd/outboxctl dev --deployed $(ARGS)

.DEFAULT_GOAL := help
.PHONY: help dev dev-deployed test build lint fmt vet

help: ## list targets
	@grep -hE '^[a-zA-Z_%-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-22s %s\n",$$1,$$2}'

build-RelayFunction: ## sam build target: relay Lambda
	$(LAMBDA_BUILD) -o "$(ARTIFACTS_DIR)/bootstrap" ./functions/relay
build-WebhookFunction: ## sam build target: webhook Lambda
	$(LAMBDA_BUILD) -o "$(ARTIFACTS_DIR)/bootstrap" ./functions/webhook
build-FailureFunction: ## sam build target: failure-callback Lambda
	$(LAMBDA_BUILD) -o "$(ARTIFACTS_DIR)/bootstrap" ./functions/failure

LAMBDA_FUNCTIONS := RelayFunction WebhookFunction FailureFunction
build: ## the three Lambda bootstraps as sam build makes them, in bin/lambda/<LogicalId>/bootstrap
	@for f in $(LAMBDA_FUNCTIONS); do $(MAKE) --no-print-directory build-$$f ARTIFACTS_DIR=$(CURDIR)/bin/lambda/$$f || exit 1; done

# ---- Local invokes: sam local (Docker) or aws-lambda-rie (no Docker) -------------------
# Both read the function variables from ENV_JSON (sam's --env-vars format: "Parameters"
# for every function, then one object per LogicalId). Receiver events are re-signed first
# (outboxctl sign-event): a QStash signature expires after five minutes.
SAM ?= sam
ENV_JSON ?= env.example.json
RIE ?= $(shell command -v aws-lambda-rie 2>/dev/null || echo "$$($(GO) env GOPATH)/bin/aws-lambda-rie")
RIE_PORT ?= 9000
RIE_API_PORT ?= 9001
RIE_TIMEOUT ?= 30
.PHONY: sam-build invoke-relay invoke-retention invoke-webhook invoke-failure rie-install rie-relay rie-retention rie-webhook rie-failure rie-chain FORCE

sam-build: ## sam build (runs the build-<LogicalId> targets into .aws-sam/build)
	$(SAM) build

bin/events/%.json: events/%.json FORCE
	@mkdir -p bin/events
	$(GO) run ./cmd/outboxctl sign-event -in $< > $@

invoke-relay: sam-build ## sam local invoke RelayFunction -e events/schedule.json (drain)
	$(SAM) local invoke RelayFunction -e events/schedule.json --env-vars $(ENV_JSON)
invoke-retention: sam-build ## sam local invoke RelayFunction -e events/retention.json
	$(SAM) local invoke RelayFunction -e events/retention.json --env-vars $(ENV_JSON)
invoke-webhook: sam-build bin/events/webhook.json ## sam local invoke WebhookFunction with the re-signed events/webhook.json
	$(SAM) local invoke WebhookFunction -e bin/events/webhook.json --env-vars $(ENV_JSON)
invoke-failure: sam-build bin/events/failure.json ## sam local invoke FailureFunction with the re-signed events/failure.json
	$(SAM) local invoke FailureFunction -e bin/events/failure.json --env-vars $(ENV_JSON)

rie-install: ## install aws-lambda-rie (the emulator sam local runs in its container) into $(go env GOPATH)/bin
	$(GO) install github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@latest

# $(call rie_invoke,<functions/ dir>,<LogicalId>,<event file>): host-arch bootstrap under
# aws-lambda-rie with ENV_JSON's variables only, one invoke, response on stdout; fails if
# the emulator's 200 carries a function error or a timeout.
define rie_invoke
	@command -v jq >/dev/null || { echo "rie targets read $(ENV_JSON) with jq: install jq" >&2; exit 1; }
	@test -x "$(RIE)" || { echo "aws-lambda-rie not found at $(RIE): make rie-install" >&2; exit 1; }
	@CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -o bin/rie/$(1)/bootstrap ./functions/$(1)
	@set -euo pipefail; \
	mapfile -t vars < <(jq -r --arg f $(2) '((.Parameters // {}) + (.[$$f] // {})) | to_entries[] | "\(.key)=\(.value)"' $(ENV_JSON)); \
	env -i PATH="$$PATH" HOME="$$HOME" AWS_REGION="$${AWS_REGION:-eu-west-1}" "$${vars[@]}" \
	  AWS_LAMBDA_FUNCTION_NAME=$(2) AWS_LAMBDA_FUNCTION_TIMEOUT=$(RIE_TIMEOUT) \
	  "$(RIE)" --runtime-interface-emulator-address 127.0.0.1:$(RIE_PORT) \
	  --runtime-api-address 127.0.0.1:$(RIE_API_PORT) --log-level error bin/rie/$(1)/bootstrap >&2 & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null || true' EXIT; \
	for _ in $$(seq 100); do curl -so /dev/null http://127.0.0.1:$(RIE_PORT)/ && break; sleep 0.1; done; \
	out=$$(curl -sS -XPOST http://127.0.0.1:$(RIE_PORT)/2015-03-31/functions/function/invocations --data-binary @$(3)); \
	echo "$$out"; ! grep -qE '"errorType"|^Task timed out' <<<"$$out"
endef

rie-relay: ## the relay under aws-lambda-rie with events/schedule.json (no Docker)
	$(call rie_invoke,relay,RelayFunction,events/schedule.json)
rie-retention: ## the relay under aws-lambda-rie with events/retention.json
	$(call rie_invoke,relay,RelayFunction,events/retention.json)
rie-webhook: bin/events/webhook.json ## the webhook under aws-lambda-rie with the re-signed events/webhook.json
	$(call rie_invoke,webhook,WebhookFunction,bin/events/webhook.json)
rie-failure: bin/events/failure.json ## the failure callback under aws-lambda-rie with the re-signed events/failure.json
	$(call rie_invoke,failure,FailureFunction,bin/events/failure.json)
# The targets above each run one function alone; this one connects them: the built relay,
# webhook and failure functions under aws-lambda-rie, the local QStash delivering to the
# receivers behind emulated Function URLs, on a schema of TEST_DATABASE_URL's server.
rie-chain: ## relay -> local QStash -> webhook and failure callback, all under aws-lambda-rie (a Go test)
	DATABASE_URL='$(TEST_DATABASE_URL)' $(GO) test -count=1 -v -run 'TestRIEScheduledDrainEndToEnd' ./internal/samtemplate

test: ## run every test against real Postgres (DATABASE_URL), with the race detector
	DATABASE_URL='$(TEST_DATABASE_URL)' $(GO) test -race -count=1 -timeout 20m ./...

# The claim's differential test (internal/outboxstore): its short run is part of make
# test; this runs fresh seeds for DIFFERENTIAL_FOR (30m) on a throwaway cluster with
# PostgreSQL's defaults (run as root, it uses the postgres user) and prints the summary that
# docs/reliability.md quotes. DIFFERENTIAL_SEED=<n> replays one seed.
DIFFERENTIAL_FOR ?= 30m
.PHONY: differential
differential: ## the claim's bounds against the plain statement on random interleavings for DIFFERENTIAL_FOR (30m)
	DATABASE_URL='$(TEST_DATABASE_URL)' DIFFERENTIAL_FOR=$(DIFFERENTIAL_FOR) $(GO) test -count=1 -timeout 0 -v -run '^TestDifferentialClaim$$' ./internal/outboxstore

vet: ## go vet
	$(GO) vet ./...

fmt: ## gofmt -l (fails if anything is unformatted)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "$$out"; exit 1; fi

# staticcheck is pinned (2026.2.2 supports Go 1.26); lint installs it when the one on
# GOPATH/bin is missing or another version, so a fresh clone (CI) needs nothing first.
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK ?= $(shell $(GO) env GOPATH)/bin/staticcheck
.PHONY: lint-install staticcheck cfn-lint

lint-install: ## install the pinned staticcheck (STATICCHECK_VERSION) where STATICCHECK points, $(go env GOPATH)/bin by default
	GOBIN="$(abspath $(dir $(STATICCHECK)))" $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

staticcheck: ## staticcheck ./... (installs the pinned version when missing)
	@"$(STATICCHECK)" -version 2>/dev/null | grep -qF '($(STATICCHECK_VERSION:v%=%))' || $(MAKE) --no-print-directory lint-install
	"$(STATICCHECK)" ./...

cfn-lint: ## cfn-lint on template.yaml, informational rules included (.cfnlintrc)
	@command -v cfn-lint >/dev/null || { echo "cfn-lint not found: pip install 'cfn-lint==1.51.*' (brings aws-sam-translator)" >&2; exit 1; }
	cfn-lint

lint: fmt vet staticcheck cfn-lint ## gofmt, go vet, staticcheck, cfn-lint: fails on any finding

.PHONY: docs
docs: ## regenerate docs/configuration.md from the variables' table (outboxctl env); a test fails when it is stale
	$(GO) run ./cmd/outboxctl env > docs/configuration.md

.PHONY: bench bench-short
# bench runs on DATABASE_URL when given, else on a throwaway cluster with PostgreSQL's
# defaults (autovacuum on, unlike the CI machines' server); the report names which.
bench: rie-install ## full benchmark (~60 min) on DATABASE_URL, else a throwaway cluster with PostgreSQL's defaults: docs/bench-results.{json,md}, docs/bench-drain.svg and docs/bench-drain-rtt.svg (the deployed scenario runs the built relay under aws-lambda-rie)
	$(GO) build -o bin/outboxctl ./cmd/outboxctl
	DATABASE_URL='$(DATABASE_URL)' ./bin/outboxctl bench --out docs/bench-results.json --chart docs/bench-drain.svg > docs/bench-results.md

bench-short: rie-install ## every benchmark scenario at its short size (a few minutes; CI runs it), results in tmp/
	$(GO) build -o bin/outboxctl ./cmd/outboxctl
	DATABASE_URL='$(TEST_DATABASE_URL)' ./bin/outboxctl bench --short --out tmp/bench-short.json --chart tmp/bench-short.svg

.PHONY: bench-river
# Three pairs, taking turns, so the machine's drift reaches both alike.
bench-river: ## River v0.51.2 working 200k no-op jobs (its benchmark's fetch settings) and the relay draining 200k events at RTT 0, three pairs in turns, on DATABASE_URL (the stretch comparison in docs/performance.md)
	$(GO) build -o bin/outboxctl ./cmd/outboxctl
	cd cmd/outboxctl/internal/bench/riverpeer && $(GO) build -o $(CURDIR)/bin/riverpeer .
	for i in 1 2 3; do \
		DATABASE_URL='$(TEST_DATABASE_URL)' ./bin/riverpeer --jobs 200000 || exit 1; \
		DATABASE_URL='$(TEST_DATABASE_URL)' ./bin/outboxctl bench relay-drain --events 200000 || exit 1; \
	done

.PHONY: fuzz
FUZZTIME ?= 20s
# Every fuzz target, each for FUZZTIME (go test -fuzz takes one target in one package).
FUZZ_TARGETS := \
	./pkg/qstash:FuzzVerify \
	./pkg/outbox:FuzzLimitsValidate \
	./internal/envconfig/relayenv:FuzzRelayConfig \
	./pkg/qstash:FuzzDecodeFailureCallback \
	./pkg/deadletter:FuzzFailureCallback \
	./pkg/webhook:FuzzWebhookRequest

fuzz: ## run every fuzz target for FUZZTIME each (default 20s): verifier, failure callback, Enqueue validation, config, webhook
	@fail=""; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; echo "== $$name ($$pkg, $(FUZZTIME))"; \
		DATABASE_URL='$(TEST_DATABASE_URL)' $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg || fail="$$fail $$name"; \
	done; if [ -n "$$fail" ]; then echo "fuzz failures:$$fail (inputs in the packages' testdata/fuzz)"; exit 1; fi

