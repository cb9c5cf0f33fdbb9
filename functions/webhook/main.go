// Command webhook is the QStash delivery Lambda: a Function URL (BUFFERED) in front of
// webhook.Handler. With LISTEN_ADDR set it serves the same handler over net/http instead
// (local stack, tests).
//
// Environment: DATABASE_URL, QSTASH_CURRENT_SIGNING_KEY, QSTASH_NEXT_SIGNING_KEY (required);
// PUBLIC_BASE_URL (the base URL the relay publishes to; default: the Function URL's own
// origin; required with LISTEN_ADDR), MAX_BODY_BYTES (default 1 MiB), LOG_LEVEL (debug|info|warn|error, default info), METRICS_NAMESPACE (default OutboxRelay),
// LISTEN_ADDR (optional); tracing: the standard OTEL_* variables (package telemetry;
// off unless an OTLP exporter is configured).
package main

import (
	"maps"
	"net/http"
	"slices"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

func main() { receiver.Main() }

// handlers are the topics this webhook serves: the example's order.created (examples/orders;
// its table comes from `outboxctl migrate up --example`). Your own handlers run in a consumer
// of your own, with no edit here (examples/consumer, docs/consuming.md).
var handlers = orders.Handlers()

// receiver is this function: its variables, its metrics (with a Topic dimension for the
// registered topics) and its handler.
var receiver = receiverfunc.Receiver{
	Function: metrics.FunctionWebhook,
	Read:     envconfig.ReadWebhook(webhook.DefaultMaxBodyBytes),
	Outcomes: outcomeMetric,
	Topics:   slices.Collect(maps.Keys(handlers)),
	// Handler makes the webhook handler on the pool and verifier of the cold start.
	Handler: func(p receiverfunc.Parts) (http.Handler, error) {
		return webhook.New(webhook.Config{
			Pool:          p.Pool,
			Verifier:      p.Verifier,
			Handlers:      handlers,
			MaxBodyBytes:  p.MaxBodyBytes,
			PublicBaseURL: p.PublicURL,
			// Unset PUBLIC_BASE_URL: the Function URL's own origin, from the Lambda event.
			// Over net/http (LISTEN_ADDR) there is none: the cold start fails naming it.
			OriginFromFunctionURL: p.FunctionURL,
			Logger:                p.Logger,
			Tracer:                p.Tracer,
			// The outbox shares this database: deliveries published before the message id
			// moved into the signed URL are checked against it (docs/consuming.md, Message identity).
			Legacy: webhook.LegacyOutbox(p.Pool),
			// For the same reason, a delivery of a generation its outbox row has left (the
			// event is back in the outbox after a consumer outage) is acknowledged unapplied:
			// it comes again in its key's order (docs/reliability.md, Consumer outage).
			SharesOutbox: true,
			Observe:      p.Observe,
		})
	},
}

// outcomeMetric maps webhook outcomes to the consumer metrics the alarms and dashboard use
// (Function=webhook, plus Topic for registered topics). A refused request also counts as
// RejectedDeliveries, the metric the rejection alarm watches.
var outcomeMetric = map[string][]string{
	webhook.OutcomeProcessed:    {metrics.Processed},
	webhook.OutcomeDuplicate:    {metrics.Duplicate},
	webhook.OutcomePermanent:    {metrics.PermanentFailure},
	webhook.OutcomeTransient:    {metrics.TransientFailure},
	webhook.OutcomeUnauthorized: {metrics.Unauthorized, metrics.RejectedDeliveries},
	webhook.OutcomeTooLarge:     {metrics.PermanentFailure, metrics.RejectedDeliveries},
}
