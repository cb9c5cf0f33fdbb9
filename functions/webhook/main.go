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
	"context"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/examples/orders"
	"github.com/outbox-relay/outbox-relay/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/pkg/metrics"
	"github.com/outbox-relay/outbox-relay/pkg/webhook"
)

// config is the receiver's environment (receiverfunc.Config).
type config = receiverfunc.Config

// loadConfig reads the environment through getenv and reports every missing or invalid
// variable at once.
func loadConfig(getenv func(string) string) (config, error) {
	rc, err := readConfig(getenv)
	return config{ReceiverConfig: rc}, err
}

func readConfig(getenv func(string) string) (envconfig.ReceiverConfig, error) {
	return envconfig.ReadWebhook(getenv, webhook.DefaultMaxBodyBytes)
}

func main() {
	receiverfunc.Main("outbox-webhook", readConfig, func(ctx context.Context, cfg config, logger *slog.Logger) (http.Handler, *pgxpool.Pool, error) {
		return build(ctx, cfg, logger)
	})
}

// build creates the pool (once per cold start) and the handler. This is where your own
// topic handlers are registered.
func build(ctx context.Context, cfg config, logger *slog.Logger) (*webhook.Handler, *pgxpool.Pool, error) {
	pool, err := receiverfunc.NewPool(ctx, cfg, logger)
	if err != nil {
		return nil, nil, err
	}
	v, err := cfg.Verifier()
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	// Register your topics here; order.created is the example (examples/orders; its table
	// comes from `outboxctl migrate up --example`).
	handlers := orders.Handlers()
	h, err := webhook.New(webhook.Config{
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
		Observe: observer(metrics.NewEMF(os.Stdout, metrics.EMFConfig{Namespace: cfg.MetricsNamespace, Topics: slices.Collect(maps.Keys(handlers))}), logger),
	})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return h, pool, nil
}

// outcomeMetric maps webhook outcomes to the consumer metrics the alarms and dashboard use.
// A refused request also counts as RejectedDeliveries, the metric the rejection alarm watches.
var outcomeMetric = map[string][]string{
	webhook.OutcomeProcessed:    {metrics.Processed},
	webhook.OutcomeDuplicate:    {metrics.Duplicate},
	webhook.OutcomePermanent:    {metrics.PermanentFailure},
	webhook.OutcomeTransient:    {metrics.TransientFailure},
	webhook.OutcomeUnauthorized: {metrics.Unauthorized, metrics.RejectedDeliveries},
	webhook.OutcomeTooLarge:     {metrics.PermanentFailure, metrics.RejectedDeliveries},
}

// observer writes one EMF line per delivery (Function=webhook, plus Topic for registered
// topics).
func observer(em *metrics.EMF, logger *slog.Logger) func(topic, outcome string) {
	return func(topic, outcome string) {
		names, ok := outcomeMetric[outcome]
		if !ok {
			return
		}
		values := make([]metrics.Value, len(names))
		for i, n := range names {
			values[i] = metrics.Count(n, 1)
		}
		ev := metrics.Event{Function: metrics.FunctionWebhook, Topic: topic, Values: values}
		if err := em.Record(ev); err != nil {
			logger.Warn("record webhook metric", slog.Any("error", err))
		}
	}
}
