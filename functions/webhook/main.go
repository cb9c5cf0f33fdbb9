// Command webhook is the QStash delivery Lambda: a Function URL (BUFFERED) in front of
// webhook.Handler. With LISTEN_ADDR set it serves the same handler over net/http instead
// (local stack, tests).
//
// Environment: DATABASE_URL, QSTASH_CURRENT_SIGNING_KEY, QSTASH_NEXT_SIGNING_KEY (required);
// PUBLIC_BASE_URL (the base URL the relay publishes to; default: the Function URL's own
// origin), MAX_BODY_BYTES (default 1 MiB), LOG_LEVEL (debug|info|warn|error, default info), METRICS_NAMESPACE (default OutboxRelay),
// LISTEN_ADDR (optional); tracing: the standard OTEL_* variables (package telemetry;
// off unless an OTLP exporter is configured).
package main

import (
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/examples/orders"
	"github.com/outbox-relay/outbox-relay/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/pkg/webhook"
)

// readConfig reads the environment through getenv and reports every missing or invalid
// variable at once.
func readConfig(getenv func(string) string) (envconfig.ReceiverConfig, error) {
	return envconfig.ReadWebhook(getenv, webhook.DefaultMaxBodyBytes)
}

func main() { receiverfunc.Main("outbox-webhook", readConfig, build) }

// build makes the webhook handler on the pool and verifier of the cold start. This is
// where your own topic handlers are registered.
func build(cfg receiverfunc.Config, pool *pgxpool.Pool, v *qstash.Verifier, logger *slog.Logger) (http.Handler, error) {
	// Register your topics here; order.created is the example (examples/orders; its table
	// comes from `outboxctl migrate up --example`).
	handlers := orders.Handlers()
	em := metrics.NewEMF(os.Stdout, metrics.EMFConfig{Namespace: cfg.MetricsNamespace, Topics: slices.Collect(maps.Keys(handlers))})
	return webhook.New(webhook.Config{
		Pool:          pool,
		Verifier:      v,
		Handlers:      handlers,
		MaxBodyBytes:  cfg.MaxBodyBytes,
		PublicBaseURL: cfg.PublicURL,
		Logger:        logger,
		Tracer:        cfg.Tracer,
		// The outbox shares this database: deliveries published before the message id
		// moved into the signed URL are checked against it (README, Message identity).
		Legacy:  webhook.LegacyOutbox(pool),
		Observe: receiverfunc.Observer(em, logger, metrics.FunctionWebhook, outcomeMetric),
	})
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
