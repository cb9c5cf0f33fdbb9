// Package qstash connects the relay to Upstash QStash: a batching Publisher (relay.Publisher
// over /v2/batch) whose client also reads and deletes the dead-letter queue (Publisher.DLQ),
// a hardened signature Verifier for receiving functions, typed API errors with their
// classification, and the FailureCallback body decoder. Its sibling qstashtest is
// a QStash-compatible server for tests and the local stack.
//
// # Configuration
//
// The functions read these variables and pass them in PublisherConfig / VerifierConfig:
//
//	QSTASH_URL                  API base (default https://qstash.upstash.io)
//	QSTASH_TOKEN                API token (bearer)
//	QSTASH_CURRENT_SIGNING_KEY  verifier: current key
//	QSTASH_NEXT_SIGNING_KEY     verifier: next key (required; an empty key accepts forgeries)
//	PUBLIC_BASE_URL             webhook base; a topic T is delivered to <base>/events/T
//
// Retries (Upstash-Retries, default 3), the failure-callback URL, the ordering mode, flow
// control, the deployment name (OUTBOX_NAME), the plan (QSTASH_PLAN) and the size limits are
// PublisherConfig fields.
//
// # What QStash's answers mean
//
// docs/qstash-contract.md lists every rule of the service the relay relies on, its source,
// how qstashtest enforces it and how the publisher reacts. In short: a 429 defers the call
// until the reset (publish.DeferQuota); 401/403/404/405 and answers naming the deployment
// defer it for an operator (publish.DeferDeployment, the error names the variable); a
// 400/412/413/422 for several messages is bisected down to the message refused alone, the
// only one that fails permanently; unknown item errors are retried.
//
// # Ordering
//
// publish.OrderingPublish (default) publishes each message on its own with optional flow control
// keyed by partition key (parallelism, rate per period). Deliveries run in parallel and
// QStash does not keep per-key order: not with flow control, not across retries. Consumers
// must be order-tolerant. Throughput is highest.
//
// publish.OrderingFIFO enqueues into FIFOQueues queues, queue = fnv1a(partition key) mod N, which
// EnsureQueues creates with parallelism 1 and checks once per cold start. A queue
// delivers one message at a time, and the next waits until the current one is delivered or
// has exhausted its retries and its failure callback has run, so every key keeps strict
// order end to end at a total delivery parallelism of N. The relay's own head-of-line rule
// (never publish a key's later event before its earlier one is accepted) is what makes the
// queue order equal id order. Costs: a slow or failing message stalls every key sharing its
// queue for up to its whole retry schedule; changing N re-maps keys, so only change it
// while the queues are drained.
//
// # Pointing elsewhere
//
// The local server (outboxctl qstash-dev) prints the four QSTASH_* variables with the
// official dev server's credentials, so the same values work with `npx @upstash/qstash-cli
// dev` or the Docker image public.ecr.aws/upstash/qstash. For Upstash, set QSTASH_URL to
// https://qstash.upstash.io (or a regional URL), QSTASH_TOKEN and the signing keys from the
// console, and PUBLIC_BASE_URL to a publicly reachable webhook URL.
package qstash
