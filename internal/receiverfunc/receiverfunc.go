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

	"github.com/outbox-relay/outbox-relay/v3/internal/awsenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/internal/telemetry"
	"github.com/outbox-relay/outbox-relay/v3/pkg/funcurl"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
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
	// RereadKeys reads both signing keys again from their SSM parameters when a
	// signature matches neither (keys rolled with no cold start since); nil when the keys
	// are fixed values.
	RereadKeys func(ctx context.Context) (current, next string, err error)
}

// Read reads a receiver's variables through getenv, reporting every missing or invalid
// one at once.
type Read func(getenv func(string) string) (envconfig.ReceiverConfig, error)

// Build makes a receiver's handler on the pool and signature verifier its cold start
// opened: the one part that differs between the receivers.
type Build func(cfg Config, pool *pgxpool.Pool, v *qstash.Verifier, logger *slog.Logger) (http.Handler, error)

// Main runs a receiver function named service (the traces' service name): read reads its
// variables, build makes its handler. It logs and exits 1 when any step fails.
func Main(service string, read Read, build Build) {
	if err := run(context.Background(), service, read, build); err != nil {
		os.Exit(1)
	}
}

// LoadConfig is the configuration Main starts from, without the secrets and tracing that
// need AWS: what a function's tests check.
func LoadConfig(read Read, getenv func(string) string) (Config, error) {
	rc, err := read(getenv)
	return Config{ReceiverConfig: rc}, err
}

// Start opens the pool (refreshing rotated credentials) and the verifier of cfg's signing
// keys, and builds the handler on them. A field the verifier or the handler refuses is
// reported under the variable that set it. On error nothing stays open.
func Start(ctx context.Context, cfg Config, logger *slog.Logger, build Build) (http.Handler, *pgxpool.Pool, error) {
	pool, err := NewPool(ctx, cfg, logger)
	if err != nil {
		return nil, nil, err
	}
	vc := cfg.VerifierConfig()
	vc.Reread, vc.Logger = cfg.RereadKeys, logger
	v, err := qstash.NewVerifier(vc)
	if err == nil {
		var h http.Handler
		if h, err = build(cfg, pool, v, logger); err == nil {
			return h, pool, nil
		}
	}
	pool.Close()
	return nil, nil, cfg.ByVariable(err)
}

// Observer returns an Observe func that writes one EMF line per counted outcome:
// names[outcome] are the metrics it adds 1 to, with Function=function and the topic when
// the EMF's Topics has it. An outcome not in names is not counted.
func Observer(em *metrics.EMF, logger *slog.Logger, function string, names map[string][]string) func(topic, outcome string) {
	return func(topic, outcome string) {
		ns, ok := names[outcome]
		if !ok {
			return
		}
		values := make([]metrics.Value, len(ns))
		for i, n := range ns {
			values[i] = metrics.Count(n, 1)
		}
		ev := metrics.Event{Function: function, Topic: topic, Values: values}
		if err := em.Record(ev); err != nil {
			logger.Warn("record "+function+" metric", slog.Any("error", err))
		}
	}
}

func run(ctx context.Context, service string, read Read, build Build) error {
	// Secrets named by DB_SECRET_ARN and *_PARAM are fetched once per cold start.
	getenv, err := awsenv.Resolve(ctx, os.Getenv)
	if err != nil {
		slog.New(slog.NewJSONHandler(os.Stdout, nil)).ErrorContext(ctx, "resolve secrets", slog.Any("error", err))
		return err
	}
	rc, err := read(getenv)
	cfg := Config{ReceiverConfig: rc}
	if read := (awsenv.Resolver{}).DatabaseURLReader(os.Getenv); read != nil {
		cfg.Creds = awsenv.NewCredentials(read)
	}
	cfg.RereadKeys = rereadSigningKeys(awsenv.Resolver{}, os.Getenv)
	logger := slog.New(telemetry.LogHandler(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: cfg.LogLevel})))
	if err != nil {
		logger.ErrorContext(ctx, "load "+service+" config", slog.Any("error", err))
		return err
	}
	// Tracing is on when the OTEL_* variables name an exporter (the ADOT layer's collector).
	tel, err := telemetry.Setup(ctx, getenv, service)
	if err != nil {
		logger.ErrorContext(ctx, "set up tracing", slog.Any("error", err))
		return err
	}
	defer tel.Shutdown(context.Background())
	cfg.Tracer = tel.Tracer()
	h, pool, err := Start(ctx, cfg, logger, build)
	if err != nil {
		logger.ErrorContext(ctx, "start "+service, slog.Any("error", err))
		return err
	}
	defer pool.Close()
	// Every request first makes sure the pool can connect, re-reading a rotated secret.
	// The adapter keeps Lambda's own body limit: a body over MAX_BODY_BYTES reaches the
	// handler, which refuses it as the adapter would and also counts it (RejectedDeliveries,
	// RejectedCallbacks), so the alarm on oversized events fires.
	if err := funcurl.Serve(telemetry.FlushHandler(tel, logger, cfg.Creds.Handler(pool, h)), cfg.ListenAddr,
		funcurl.Config{Logger: logger}); err != nil {
		logger.ErrorContext(ctx, "serve "+service, slog.Any("error", err))
		return err
	}
	return nil
}

// NewPool opens a receiver's pool on cfg's database, refreshing rotated credentials.
func NewPool(ctx context.Context, cfg Config, logger *slog.Logger) (*pgxpool.Pool, error) {
	return awsenv.NewPool(ctx, cfg.DatabaseURL, awsenv.PoolConfig{MaxConns: MaxConns, Logger: logger, Credentials: cfg.Creds})
}

// rereadSigningKeys reads QSTASH_CURRENT_SIGNING_KEY and QSTASH_NEXT_SIGNING_KEY again from
// their _PARAM parameters, in one request; nil unless both come from one (a fixed key cannot
// change).
func rereadSigningKeys(r awsenv.Resolver, getenv func(string) string) func(context.Context) (string, string, error) {
	read := r.ParametersReader(getenv, "QSTASH_CURRENT_SIGNING_KEY", "QSTASH_NEXT_SIGNING_KEY")
	if read == nil {
		return nil
	}
	return func(ctx context.Context) (string, string, error) {
		get, err := read(ctx)
		if err != nil {
			return "", "", err
		}
		return get("QSTASH_CURRENT_SIGNING_KEY"), get("QSTASH_NEXT_SIGNING_KEY"), nil
	}
}
