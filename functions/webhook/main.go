// Command webhook is the QStash delivery Lambda: a Function URL (BUFFERED) in front of
// webhook.Handler. With LISTEN_ADDR set it serves the same handler over net/http instead
// (local stack, tests).
//
// Environment: DATABASE_URL, QSTASH_CURRENT_SIGNING_KEY, QSTASH_NEXT_SIGNING_KEY (required);
// PUBLIC_BASE_URL (the base URL the relay publishes to; default: the Function URL's own
// origin), MAX_BODY_BYTES (default 1 MiB), LOG_LEVEL (debug|info|warn|error, default info), METRICS_NAMESPACE (default OutboxRelay),
// LISTEN_ADDR (optional).
package main

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/examples/orders"
	"github.com/outbox-relay/outbox-relay/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/pkg/awsenv"
	"github.com/outbox-relay/outbox-relay/pkg/funcurl"
	"github.com/outbox-relay/outbox-relay/pkg/metrics"
	"github.com/outbox-relay/outbox-relay/pkg/webhook"
)

// maxConns: one Lambda environment serves one invoke at a time; the database's connection
// budget is spent by concurrency, not by pool size.
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
	rc, err := envconfig.ReadWebhook(getenv, webhook.DefaultMaxBodyBytes)
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
		logger.Error("load webhook config", slog.Any("error", err))
		os.Exit(1)
	}
	h, pool, err := build(context.Background(), cfg, logger)
	if err != nil {
		logger.Error("start webhook", slog.Any("error", err))
		os.Exit(1)
	}
	defer pool.Close()
	// Every request first makes sure the pool can connect, re-reading a rotated secret.
	if err := funcurl.Serve(cfg.creds.Handler(pool, h), cfg.ListenAddr, funcurl.Config{MaxBodyBytes: cfg.MaxBodyBytes, Logger: logger}); err != nil {
		logger.Error("serve webhook", slog.Any("error", err))
		os.Exit(1)
	}
}

// build creates the pool (once per cold start) and the handler. This is where your own
// topic handlers are registered.
func build(ctx context.Context, cfg config, logger *slog.Logger) (*webhook.Handler, *pgxpool.Pool, error) {
	pool, err := newPool(ctx, cfg.DatabaseURL, cfg.creds, logger)
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

func newPool(ctx context.Context, dsn string, creds *awsenv.Credentials, logger *slog.Logger) (*pgxpool.Pool, error) {
	return awsenv.NewPool(ctx, dsn, awsenv.PoolConfig{MaxConns: maxConns, Logger: logger, Credentials: creds})
}
