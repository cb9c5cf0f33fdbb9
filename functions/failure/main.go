// Command failure is the QStash failure-callback Lambda: a Function URL (BUFFERED) in
// front of deadletter.CallbackHandler, which records each finally failed delivery as a
// dead letter. With LISTEN_ADDR set it serves the same handler over net/http instead.
//
// Environment: DATABASE_URL, QSTASH_CURRENT_SIGNING_KEY, QSTASH_NEXT_SIGNING_KEY (required);
// FAILURE_CALLBACK_URL (the exact failure-callback URL the relay publishes; default: the
// Function URL's own origin plus the request path), MAX_BODY_BYTES (default 4 MiB),
// LOG_LEVEL (debug|info|warn|error, default info), METRICS_NAMESPACE (default OutboxRelay),
// LISTEN_ADDR (optional); tracing: the standard OTEL_* variables (package telemetry;
// off unless an OTLP exporter is configured).
package main

import (
	"net/http"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
)

func main() { receiver.Main() }

// receiver is this function: its variables, its metrics and its handler.
var receiver = receiverfunc.Receiver{
	Function: metrics.FunctionFailure,
	Read:     envconfig.ReadFailure(deadletter.DefaultCallbackMaxBodyBytes),
	Outcomes: outcomeMetric,
	// Handler makes the callback handler on the pool and verifier of the cold start.
	Handler: func(p receiverfunc.Parts) (http.Handler, error) {
		if !p.FunctionURL && p.PublicURL == "" {
			// Over net/http no Function URL event names the origin QStash signed: fail
			// here rather than answer every callback 500.
			bad := configcheck.For("failure callback")
			bad.Bad("FailureURL", "is empty; with LISTEN_ADDR set FAILURE_CALLBACK_URL to the failure-callback URL the relay publishes (e.g. http://127.0.0.1:8082/failure)")
			return nil, bad.Err()
		}
		return deadletter.NewCallbackHandler(deadletter.CallbackConfig{
			Pool:         p.Pool,
			Verifier:     p.Verifier,
			FailureURL:   p.PublicURL,
			MaxBodyBytes: p.MaxBodyBytes,
			Logger:       p.Logger,
			Tracer:       p.Tracer,
			Observe:      func(outcome string) { p.Observe("", outcome) },
		})
	},
}

// outcomeMetric maps callback outcomes to metrics (Function=failure). A newly recorded dead
// letter counts as DeliveryDeadLetters (the "any delivery dead letter" alarm); a transient
// failure put back in the outbox as DeliveriesRescheduled (the consumer-outage alarm); a refused
// callback as RejectedCallbacks (its failure is only in QStash's DLQ). Duplicated callbacks,
// transient failures (QStash retries them) and superseded ones (a late callback about a
// generation its event has left behind: recorded resolved, nothing to do) are not counted.
var outcomeMetric = map[string][]string{
	deadletter.OutcomeRecorded:     {metrics.DeliveryDeadLetters},
	deadletter.OutcomeRescheduled:  {metrics.DeliveriesRescheduled},
	deadletter.OutcomeUnauthorized: {metrics.RejectedCallbacks},
	deadletter.OutcomeMalformed:    {metrics.RejectedCallbacks},
	deadletter.OutcomeTooLarge:     {metrics.RejectedCallbacks},
}
