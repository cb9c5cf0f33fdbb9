// Command failure is the QStash failure-callback Lambda: a Function URL (BUFFERED) in
// front of deadletter.CallbackHandler, which records each finally failed delivery as a
// dead letter. With LISTEN_ADDR set it serves the same handler over net/http instead.
//
// Environment: DATABASE_URL, QSTASH_CURRENT_SIGNING_KEY, QSTASH_NEXT_SIGNING_KEY (required);
// FAILURE_CALLBACK_URL (the exact failure-callback URL the relay publishes; default: the
// Function URL's own origin plus the request path), MAX_BODY_BYTES (default 4 MiB),
// LOG_LEVEL (debug|info|warn|error, default info), METRICS_NAMESPACE (default OutboxRelay),
// LISTEN_ADDR (optional).
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/pkg/awsenv"
	"github.com/outbox-relay/outbox-relay/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/pkg/funcurl"
	"github.com/outbox-relay/outbox-relay/pkg/metrics"
)

// maxConns: one Lambda environment serves one invoke at a time.
const maxConns = 2

type config struct {
	envconfig.ReceiverConfig
	// creds re-reads the database secret when the server refuses the password (a rotation);
	// nil with a plain DATABASE_URL.
	creds *awsenv.Credentials
}

// loadConfig reads the environment through getenv and reports every missing or invalid
// variable at once.
func loadConfig(getenv func(string) string) (config, error) {
	rc, err := envconfig.ReadFailure(getenv, deadletter.DefaultCallbackMaxBodyBytes)
	return config{ReceiverConfig: rc}, err
}

func main() {
	// Secrets named by DB_SECRET_ARN and *_PARAM are fetched once per cold start.
	getenv, err := awsenv.Resolve(context.Background(), os.Getenv)
	if err != nil {
		slog.New(slog.NewJSONHandler(os.Stdout, nil)).Error("resolve secrets", slog.Any("error", err))
		os.Exit(1)
	}
	cfg, err := loadConfig(getenv)
	if read := (awsenv.Resolver{}).DatabaseURLReader(os.Getenv); read != nil {
		cfg.creds = awsenv.NewCredentials(read)
	}
	logger := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: cfg.LogLevel}))
	if err != nil {
		logger.Error("load failure-callback config", slog.Any("error", err))
		os.Exit(1)
	}
	h, pool, err := build(context.Background(), cfg, logger)
	if err != nil {
		logger.Error("start failure-callback recorder", slog.Any("error", err))
		os.Exit(1)
	}
	defer pool.Close()
	// Every request first makes sure the pool can connect, re-reading a rotated secret.
	if err := funcurl.Serve(cfg.creds.Handler(pool, h), cfg.ListenAddr, funcurl.Config{MaxBodyBytes: cfg.MaxBodyBytes, Logger: logger}); err != nil {
		logger.Error("serve failure callbacks", slog.Any("error", err))
		os.Exit(1)
	}
}

// build creates the pool (once per cold start) and the handler.
func build(ctx context.Context, cfg config, logger *slog.Logger) (*deadletter.CallbackHandler, *pgxpool.Pool, error) {
	pool, err := newPool(ctx, cfg.DatabaseURL, cfg.creds, logger)
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
		Observe:      observer(metrics.NewEMF(os.Stdout, metrics.EMFConfig{Namespace: cfg.MetricsNamespace}), logger),
	})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return h, pool, nil
}

func newPool(ctx context.Context, dsn string, creds *awsenv.Credentials, logger *slog.Logger) (*pgxpool.Pool, error) {
	return awsenv.NewPool(ctx, dsn, awsenv.PoolConfig{MaxConns: maxConns, Logger: logger, Credentials: creds})
}

// outcomeMetric maps callback outcomes to metrics (Function=failure). A newly recorded dead
// letter counts as DeliveryDeadLetters (the "any delivery dead letter" alarm); a refused
// callback as RejectedCallbacks (its failure is only in QStash's DLQ). Duplicated callbacks
// and transient failures (QStash retries them) are not counted.
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
