// Package relayfunc is the relay Lambda (functions/relay): its cold start and the handler
// of its invocations. Load, the reading of the relay's environment, is also what
// `outboxctl relay` starts from, so the long-lived relay outlives the same rotations.
package relayfunc

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/awsenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig/relayenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/telemetry"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

const (
	// baseConns: one environment runs one invocation at a time. The drain claims on one
	// connection and marks each batch in flight (PUBLISH_CONCURRENCY) on its own; the
	// backlog gauge uses one more; waiting for events (IDLE_GAP) adds the LISTEN session.
	baseConns = 2
	// DeadlineReserve is kept back from the Lambda deadline: the runtime is killed at the
	// deadline itself, so the metrics line and the response must be out before it.
	DeadlineReserve = 2 * time.Second
	// gaugeTimeout bounds the backlog query run after the drain, inside the reserve.
	gaugeTimeout = 1500 * time.Millisecond
)

// Env is the relay's environment, read once per process with its AWS references
// (DB_SECRET_ARN, DB_HOST, *_PARAM) resolved, and what reads the rotating secrets again.
type Env struct {
	relayenv.Config
	// Getenv is the environment with the references resolved (telemetry reads it).
	Getenv func(string) string
	// Credentials re-read the database secret when the server refuses the password (a
	// rotation); nil with a plain DATABASE_URL.
	Credentials *awsenv.Credentials
	// Tracer is telemetry.Setup's, set by the caller once tracing is up; nil: off.
	Tracer trace.Tracer
}

// Load resolves getenv's AWS references and reads the relay's variables, reporting every
// missing or invalid one at once (each an *envconfig.VarError). Publisher.Tokens reads
// QSTASH_TOKEN again from QSTASH_TOKEN_PARAM the first time QStash refuses it: a process
// that never restarts (a warm Lambda, `outboxctl relay`) carries on after a token
// rotation. An error that is not a variable's is the secrets' (AWS unreachable, a
// parameter missing), and Env is then empty.
func Load(ctx context.Context, getenv func(string) string) (Env, error) {
	resolved, err := awsenv.Resolve(ctx, getenv)
	if err != nil {
		return Env{}, err // it says "resolve secrets: ..."
	}
	cfg, err := relayenv.Read(resolved)
	env := Env{Config: cfg, Getenv: resolved}
	var r awsenv.Resolver
	if read := r.DatabaseURLReader(getenv); read != nil {
		env.Credentials = awsenv.NewCredentials(read)
	}
	env.Publisher.Tokens = qstash.NewToken(cfg.Publisher.Token, r.ParameterReader(getenv, "QSTASH_TOKEN"))
	return env, err
}

// Main is the relay Lambda: it sets the memory limit, loads the environment, checks the
// function timeout, starts tracing and the pool, and serves invocations. It logs and
// exits 1 when any step fails.
func Main() {
	// The memory limit first, before anything is allocated: the Lambda kills a relay over
	// its memory size before it marks what it published.
	limit, err := memoryLimit(os.Getenv)
	if err != nil {
		slog.New(slog.NewJSONHandler(os.Stdout, nil)).Error("set memory limit", slog.Any("error", err))
		os.Exit(1)
	}
	if limit > 0 {
		debug.SetMemoryLimit(limit)
	}
	if err := run(context.Background()); err != nil {
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	// Secrets named by DB_SECRET_ARN and *_PARAM are fetched once per cold start.
	env, err := Load(ctx, os.Getenv)
	logger := slog.New(telemetry.LogHandler(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: env.LogLevel})))
	if err == nil {
		err = checkTimeout(env.Getenv, env.Relay.DeadlineMargin)
	}
	if err != nil {
		logger.ErrorContext(ctx, "load relay config", slog.Any("error", err))
		return err
	}
	// Tracing is on when the OTEL_* variables name an exporter (the ADOT layer's collector).
	tel, err := telemetry.Setup(ctx, env.Getenv, "outbox-relay")
	if err != nil {
		logger.ErrorContext(ctx, "set up tracing", slog.Any("error", err))
		return err
	}
	defer tel.Shutdown(context.Background())
	env.Tracer = tel.Tracer()
	pool, err := newPool(ctx, env, logger)
	if err != nil {
		logger.ErrorContext(ctx, "start relay", slog.Any("error", err))
		return err
	}
	defer pool.Close()
	h, err := newHandler(env, pool, nil, os.Stdout, logger)
	if err != nil {
		logger.ErrorContext(ctx, "start relay", slog.Any("error", err))
		return err
	}
	// The cold start's ping left a session open; Lambda may initialise an environment
	// long before its first invocation (proactive initialisation), and an idle
	// environment holds no session.
	h.closeSessions()
	// The batch spans leave before the invocation returns: the environment may be frozen
	// right after.
	lambda.Start(telemetry.FlushAfter(tel, logger, h.handle))
	return nil
}

// checkTimeout refuses, at cold start, a function timeout that leaves the drain no time:
// Drain claims no batch with less than margin (publish + mark timeout) left before the
// deadline, and the handler keeps DeadlineReserve of it back, so such a relay would claim
// nothing on every tick, silently. The timeout is FUNCTION_TIMEOUT (seconds; the template
// sets it from RelayTimeout), else AWS_LAMBDA_FUNCTION_TIMEOUT (set by the emulator and sam
// local); with neither it is unknown and not checked.
func checkTimeout(getenv func(string) string, margin time.Duration) error {
	name, v := "FUNCTION_TIMEOUT", getenv("FUNCTION_TIMEOUT")
	if v == "" {
		name, v = "AWS_LAMBDA_FUNCTION_TIMEOUT", getenv("AWS_LAMBDA_FUNCTION_TIMEOUT")
	}
	if v == "" {
		return nil
	}
	secs, err := strconv.Atoi(v)
	if err != nil || secs <= 0 {
		return fmt.Errorf("%s %q must be the function timeout in whole seconds", name, v)
	}
	timeout := time.Duration(secs) * time.Second
	if left := timeout - DeadlineReserve; left < margin {
		return fmt.Errorf("relay function timeout %v (%s) leaves %v after the %v reserve, less than the drain's deadline margin %v "+
			"(PUBLISH_TIMEOUT + mark timeout): no batch would ever be claimed; raise the timeout (RelayTimeout) to at least %v or lower PUBLISH_TIMEOUT",
			timeout, name, left, DeadlineReserve, margin, (margin + DeadlineReserve).Round(time.Second))
	}
	return nil
}

// newPool opens the pool once per cold start.
func newPool(ctx context.Context, env Env, logger *slog.Logger) (*pgxpool.Pool, error) {
	conns := int32(baseConns + env.Relay.PublishConcurrency)
	if env.IdleGap > 0 {
		conns++ // the LISTEN session while it waits for events
	}
	return awsenv.NewPool(ctx, env.DatabaseURL, awsenv.PoolConfig{MaxConns: conns, Logger: logger, Credentials: env.Credentials})
}
