// Package qstash connects the relay to Upstash QStash: a batching Publisher (relay.Publisher
// over /v2/batch), a hardened signature Verifier for receiving functions, typed API errors
// with their classification, and the FailureCallback body decoder. Its sibling qstashtest is
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
// Retries (Upstash-Retries, default 3), the failure-callback URL, the ordering mode and flow
// control are PublisherConfig fields.
//
// # Ordering
//
// OrderingPublish (default) publishes each message on its own with optional flow control
// keyed by partition key (parallelism, rate per period). Deliveries run in parallel and
// QStash does not keep per-key order: not with flow control, not across retries. Consumers
// must be order-tolerant. Throughput is highest.
//
// OrderingFIFO enqueues into FIFOQueues queues, queue = fnv1a(partition key) mod N. A queue
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
