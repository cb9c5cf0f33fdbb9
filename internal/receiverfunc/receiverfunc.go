// Package receiverfunc is the cold start the two QStash receiver functions share
// (functions/webhook and functions/failure): resolve the secrets, read and check the
// environment, set up logging and tracing, open the pool, and serve the handler as a
// Function URL (or over net/http with LISTEN_ADDR). Each function keeps only what differs:
// its variables, its handler and its metrics.
package receiverfunc

import (
	"context"
	"log/slog"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/pkg/awsenv"
	"github.com/outbox-relay/outbox-relay/pkg/funcurl"
	"github.com/outbox-relay/outbox-relay/pkg/telemetry"
)

// MaxConns: one Lambda environment serves one invoke at a time; the database's connection
// budget is spent by concurrency, not by pool size.
const MaxConns = 2

// Config is a receiver's environment and what its cold start derived from it.
type Config struct {
	envconfig.ReceiverConfig
	// Creds re-reads the database secret when the server refuses the password (a
	// rotation); nil with a plain DATABASE_URL.
	Creds *awsenv.Credentials
	// Tracer is telemetry.Setup's (OTEL_* variables); nil when tracing is off.
	Tracer trace.Tracer
}

// Build makes a receiver's handler over a pool it opened with NewPool.
type Build func(ctx context.Context, cfg Config, logger *slog.Logger) (http.Handler, *pgxpool.Pool, error)

// Main runs a receiver function named service (the traces' service name): read reads its
// variables (reporting every missing or invalid one at once), build makes its handler.
// It logs and exits 1 when any step fails.
func Main(service string, read func(getenv func(string) string) (envconfig.ReceiverConfig, error), build Build) {
	if err := run(context.Background(), service, read, build); err != nil {
		os.Exit(1)
	}
}

func run(ctx context.Context, service string, read func(func(string) string) (envconfig.ReceiverConfig, error), build Build) error {
	// Secrets named by DB_SECRET_ARN and *_PARAM are fetched once per cold start.
	getenv, err := awsenv.Resolve(ctx, os.Getenv)
	if err != nil {
		slog.New(slog.NewJSONHandler(os.Stdout, nil)).Error("resolve secrets", slog.Any("error", err))
		return err
	}
	rc, err := read(getenv)
	cfg := Config{ReceiverConfig: rc}
	if read := (awsenv.Resolver{}).DatabaseURLReader(os.Getenv); read != nil {
		cfg.Creds = awsenv.NewCredentials(read)
	}
	logger := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: cfg.LogLevel}))
	if err != nil {
		logger.Error("load "+service+" config", slog.Any("error", err))
		return err
	}
	// Tracing is on when the OTEL_* variables name an exporter (the ADOT layer's collector).
	tel, err := telemetry.Setup(ctx, getenv, service)
	if err != nil {
		logger.Error("set up tracing", slog.Any("error", err))
		return err
	}
	defer tel.Shutdown(context.Background())
	cfg.Tracer = tel.Tracer()
	h, pool, err := build(ctx, cfg, logger)
	if err != nil {
		logger.Error("start "+service, slog.Any("error", err))
		return err
	}
	defer pool.Close()
	// Every request first makes sure the pool can connect, re-reading a rotated secret.
	if err := funcurl.Serve(telemetry.FlushHandler(tel, logger, cfg.Creds.Handler(pool, h)), cfg.ListenAddr,
		funcurl.Config{MaxBodyBytes: cfg.MaxBodyBytes, Logger: logger}); err != nil {
		logger.Error("serve "+service, slog.Any("error", err))
		return err
	}
	return nil
}

// NewPool opens a receiver's pool on cfg's database, refreshing rotated credentials.
func NewPool(ctx context.Context, cfg Config, logger *slog.Logger) (*pgxpool.Pool, error) {
	return awsenv.NewPool(ctx, cfg.DatabaseURL, awsenv.PoolConfig{MaxConns: MaxConns, Logger: logger, Credentials: cfg.Creds})
}
