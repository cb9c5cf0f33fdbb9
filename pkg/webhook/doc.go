// Package webhook is the consumer's HTTP edge: a plain http.Handler that receives QStash
// deliveries at POST /events/{topic}, verifies their signature on the raw bytes, routes the
// topic to a registered HandlerFunc and runs it exactly once in effect (inbox.HandleOnce),
// then maps the result to the status codes QStash acts on:
//
//	processed, duplicate                  200
//	permanent (malformed JSON, unknown    489 + Upstash-NonRetryable-Error: true
//	  topic, payload conflict, handler      (QStash stops retrying; the failure
//	  error marked with Permanent)          callback records a dead letter)
//
// A transient failure is never dead-lettered: when QStash's retries run out, the failure
// callback puts the event back in the outbox and the relay holds its topic until a probe
// is delivered (docs/reliability.md, "Consumer outage").
//
//	body over MaxBodyBytes                489 + Upstash-NonRetryable-Error: true,
//	                                        code body_too_large, nothing written
//	bad or missing signature, or          401, generic body, nothing written
//	  X-Outbox-Id / X-Outbox-Generation
//	  contradicting the signed URL
//	not now: database unreachable,        503 + Retry-After (QStash retries then, not
//	  handler over its budget               on its own backoff; nothing written)
//	  (HandlerTimeout), handler error
//	  marked with Later
//	fifo: the key's previous event       503 + Retry-After: 5, code key_order (with
//	  failed and is not back in the         SharesOutbox; nothing written)
//	  outbox yet
//	fifo: an earlier event of the key     200 superseded; the delivery's row is put back
//	  is pending again                      in the outbox behind it (with SharesOutbox)
//	transient (any other unmarked error)  500 (QStash retries)
//	other paths / methods                 404 / 405
//
// The message id is the outbox id in the signed URL's query (?outbox_id=<id>&generation=<n>,
// put there by the relay), never a header; deliveries published before that (no id in the
// URL) are accepted only through Config.Legacy. The receive step (verify, limits, status
// table) is internal/receive, shared with the failure callback.
//
// Response bodies carry a short error code, never internal error text; the reason is
// logged. The one exception is chosen by the handler: the text of an error it marks
// Permanent goes in the 489's body as "message" (see Permanent for the rule). The same Handler serves net/http locally and Lambda through pkg/funcurl.
package webhook
