package awsenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/rds/auth"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool defaults.
const (
	// DefaultMaxConns: an execution environment runs one invocation at a time, so the
	// database's connection budget is spent by concurrency, not by pool size.
	DefaultMaxConns int32 = 2
	// DefaultPingTimeout bounds the ping pgxpool sends on acquiring a connection idle for
	// over a second: a socket that died while the environment was frozen must fail fast,
	// not eat the invocation's deadline.
	DefaultPingTimeout = 2 * time.Second
	// DefaultInitPingTimeout bounds the ping at start.
	DefaultInitPingTimeout = 3 * time.Second
)

// dsnKeyIAMAuth is the one connection-string key NewPool understands beyond pgx's own (like
// pgxpool's pool_* keys, it is removed before connecting): rds_iam_auth=true.
const dsnKeyIAMAuth = "rds_iam_auth"

// PoolConfig tunes NewPool. Zero fields take the defaults; pool_max_conns and
// pool_ping_timeout in the connection string win over MaxConns and PingTimeout.
type PoolConfig struct {
	// MaxConns caps the pool. Default DefaultMaxConns.
	MaxConns int32
	// PingTimeout bounds the liveness ping of an idle connection on acquire. Default
	// DefaultPingTimeout.
	PingTimeout time.Duration
	// InitPingTimeout bounds the ping at start. Default DefaultInitPingTimeout.
	InitPingTimeout time.Duration
	// MustConnect makes the ping at start a condition: its failure closes the pool and is
	// NewPool's error. For a command that has nothing to do without the database (outboxctl),
	// not for a Lambda's init phase. The ping is then bounded by ctx (and the connection
	// string's connect_timeout), InitPingTimeout only when set, and tried once more after a
	// refused password, which Credentials has re-read by then.
	MustConnect bool
	// Pooler: the endpoint is RDS Proxy or PgBouncer. Queries use unnamed statements
	// (QueryExecModeExec): named prepared statements pin an RDS Proxy session and break on
	// a transaction-mode PgBouncer. Also set by default_query_exec_mode=exec in the
	// connection string.
	Pooler bool
	// IAMAuth authenticates every new connection with a fresh RDS IAM token (valid 15
	// minutes, used only at connect) instead of a password. Also set by rds_iam_auth=true
	// in the connection string. Needs TLS (sslmode=require or stricter) and
	// rds-db:connect on the database user.
	IAMAuth bool
	// AWSConfig gives the region and credentials for IAM tokens. Default
	// config.LoadDefaultConfig, loaded only with IAMAuth.
	AWSConfig *aws.Config
	// Logger receives the start-up ping warning and one line per re-read of Credentials.
	// Default: discard.
	Logger *slog.Logger
	// Credentials, when set, supplies the user and password of new connections after a
	// rotation: a connection refused with SQLSTATE 28P01 makes the next attempt re-read the
	// secret (see Credentials). Ignored with IAMAuth, whose tokens are fresh per
	// connection.
	Credentials *Credentials
}

// NewPool opens the pool an execution environment keeps for its lifetime. It pings the
// database once, within InitPingTimeout: a failure is logged, not returned (unless
// MustConnect), because every invocation then fails on its own and the next one retries,
// whereas a failed init phase would only add a cold start to each attempt. A connection
// string or configuration that cannot work is an error.
func NewPool(ctx context.Context, dsn string, cfg PoolConfig) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors may quote the string, password included.
		return nil, errors.New("parse DATABASE_URL: not a valid Postgres connection string")
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if v, ok := pc.ConnConfig.RuntimeParams[dsnKeyIAMAuth]; ok {
		delete(pc.ConnConfig.RuntimeParams, dsnKeyIAMAuth)
		on, err := parseBool(dsnKeyIAMAuth, v)
		if err != nil {
			return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
		}
		cfg.IAMAuth = cfg.IAMAuth || on
	}
	if !dsnHas(dsn, "pool_max_conns") {
		pc.MaxConns = orDefault(cfg.MaxConns, DefaultMaxConns)
	}
	if !dsnHas(dsn, "pool_ping_timeout") {
		pc.PingTimeout = orDefault(cfg.PingTimeout, DefaultPingTimeout)
	}
	if cfg.Pooler {
		pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	if cfg.IAMAuth {
		if err := requireTLS(pc.ConnConfig); err != nil {
			return nil, err
		}
		awsCfg := cfg.AWSConfig
		if awsCfg == nil {
			c, err := config.LoadDefaultConfig(ctx)
			if err != nil {
				return nil, fmt.Errorf("load AWS config for RDS IAM auth: %w", err)
			}
			awsCfg = &c
		}
		if awsCfg.Region == "" || awsCfg.Credentials == nil {
			return nil, errors.New("RDS IAM auth needs an AWS region (AWS_REGION) and credentials")
		}
		pc.BeforeConnect = iamAuth(awsCfg.Region, awsCfg.Credentials)
	} else if cfg.Credentials != nil {
		creds := cfg.Credentials
		pc.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error { return creds.beforeConnect(ctx, cc, logger) }
		// Built from a connection string, the config has no tracer of its own to keep.
		pc.ConnConfig.Tracer = connectTracer{cfg.Credentials}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", err)
	}
	if cfg.MustConnect {
		if err := mustPing(ctx, pool, cfg); err != nil {
			pool.Close()
			return nil, fmt.Errorf("connect to database: %w", err)
		}
		return pool, nil
	}
	pingCtx, cancel := context.WithTimeout(ctx, orDefault(cfg.InitPingTimeout, DefaultInitPingTimeout))
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		logger.WarnContext(ctx, "database not reachable at start; invocations fail until it is", slog.Any("error", err))
	}
	return pool, nil
}

// mustPing is MustConnect's ping: bounded by ctx unless InitPingTimeout is set, and tried
// again once after a refused password, which Credentials re-read on meeting it.
func mustPing(ctx context.Context, pool *pgxpool.Pool, cfg PoolConfig) error {
	if cfg.InitPingTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.InitPingTimeout)
		defer cancel()
	}
	err := pool.Ping(ctx)
	if IsAuthFailure(err) && cfg.Credentials != nil && !cfg.IAMAuth {
		err = pool.Ping(ctx)
	}
	return err
}

// iamAuth returns a BeforeConnect hook that puts a fresh token in each new connection's
// config (pgxpool passes a copy per connection).
func iamAuth(region string, creds aws.CredentialsProvider) func(context.Context, *pgx.ConnConfig) error {
	return func(ctx context.Context, cc *pgx.ConnConfig) error {
		endpoint := net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))
		tok, err := auth.BuildAuthToken(ctx, endpoint, region, cc.User, creds)
		if err != nil {
			return fmt.Errorf("build RDS IAM auth token for %s@%s: %w", cc.User, endpoint, err)
		}
		cc.Password = tok
		return nil
	}
}

// requireTLS refuses configurations that could send a token in clear text: sslmode=prefer
// or allow adds a plaintext fallback.
func requireTLS(cc *pgx.ConnConfig) error {
	ok := cc.TLSConfig != nil
	for _, fb := range cc.Fallbacks {
		ok = ok && fb.TLSConfig != nil
	}
	if !ok {
		return errors.New("RDS IAM auth needs TLS: use sslmode=require, verify-ca or verify-full")
	}
	return nil
}

// dsnHas reports whether the connection string sets key, in URL or keyword/value form.
func dsnHas(dsn, key string) bool {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		return err == nil && u.Query().Has(key)
	}
	for _, f := range strings.Fields(dsn) {
		if strings.HasPrefix(f, key+"=") {
			return true
		}
	}
	return false
}

// orDefault returns v, or def when v is zero.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
