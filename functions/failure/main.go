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
	"context"
	"log/slog"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/pkg/metrics"
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
	return envconfig.ReadFailure(getenv, deadletter.DefaultCallbackMaxBodyBytes)
}

func main() {
	receiverfunc.Main("outbox-failure", readConfig, func(ctx context.Context, cfg config, logger *slog.Logger) (http.Handler, *pgxpool.Pool, error) {
		return build(ctx, cfg, logger)
	})
}

// build creates the pool (once per cold start) and the handler.
func build(ctx context.Context, cfg config, logger *slog.Logger) (*deadletter.CallbackHandler, *pgxpool.Pool, error) {
	pool, err := receiverfunc.NewPool(ctx, cfg, logger)
	if err != nil {
		return nil, nil, err
	}
	v, err := cfg.Verifier()
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	h, err := deadletter.NewCallbackHandler(deadletter.CallbackConfig{
		Pool:         pool,
		Verifier:     v,
		FailureURL:   cfg.PublicURL,
		MaxBodyBytes: cfg.MaxBodyBytes,
		Logger:       logger,
		Tracer:       cfg.Tracer,
		Observe:      observer(metrics.NewEMF(os.Stdout, metrics.EMFConfig{Namespace: cfg.MetricsNamespace}), logger),
	})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return h, pool, nil
}

// outcomeMetric maps callback outcomes to metrics (Function=failure). A newly recorded dead
// letter counts as DeliveryDeadLetters (the "any delivery dead letter" alarm); a refused
// callback as RejectedCallbacks (its failure is only in QStash's DLQ). Duplicated callbacks,
// transient failures (QStash retries them) and superseded ones (a late callback about a
// generation its event has left behind: recorded resolved, nothing to do) are not counted.
var outcomeMetric = map[string]string{
	deadletter.OutcomeRecorded:     metrics.DeliveryDeadLetters,
	deadletter.OutcomeUnauthorized: metrics.RejectedCallbacks,
	deadletter.OutcomeMalformed:    metrics.RejectedCallbacks,
	deadletter.OutcomeTooLarge:     metrics.RejectedCallbacks,
}

// observer writes one EMF line per counted callback outcome.
func observer(em *metrics.EMF, logger *slog.Logger) func(outcome string) {
	return func(outcome string) {
		name, ok := outcomeMetric[outcome]
		if !ok {
			return
		}
		ev := metrics.Event{Function: metrics.FunctionFailure, Values: []metrics.Value{metrics.Count(name, 1)}}
		if err := em.Record(ev); err != nil {
			logger.Warn("record failure metric", slog.Any("error", err))
		}
	}
}
