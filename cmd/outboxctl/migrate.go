package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/internal/awsenv"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
)

func databaseURL(e env) (string, error) {
	if u := e.getenv("DATABASE_URL"); u != "" {
		return u, nil
	}
	return "", usageErr(errors.New("DATABASE_URL is not set; export it, e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
}

// openPool opens DATABASE_URL, or the database its AWS references name (DB_SECRET_ARN,
// DB_HOST, DB_IAM_AUTH: internal/awsenv, as the Lambdas read them), and checks it answers.
func openPool(ctx context.Context, e env) (*pgxpool.Pool, error) {
	getenv, err := awsenv.Resolve(ctx, e.getenv)
	if err != nil {
		return nil, err
	}
	return resolvedPool(ctx, getenv)
}

// resolvedPool opens and checks a pool on DATABASE_URL of getenv, an environment whose AWS
// references are resolved already.
func resolvedPool(ctx context.Context, getenv func(string) string) (*pgxpool.Pool, error) {
	url, err := databaseURL(env{getenv: getenv})
	if err != nil {
		return nil, err
	}
	return poolFor(ctx, url)
}

// poolFor opens and checks a pool on url, a DATABASE_URL already resolved (awsenv).
func poolFor(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return checkedPool(ctx, url, awsenv.PoolConfig{MaxConns: int32(max(4, runtime.NumCPU()))})
}

// checkedPool opens a pool on url with cfg and checks that the database answers. A url that
// does not parse is the invocation's fault (exit 2, as the help says of an invalid
// environment), unlike a server that does not answer (3).
func checkedPool(ctx context.Context, url string, cfg awsenv.PoolConfig) (*pgxpool.Pool, error) {
	if _, err := pgxpool.ParseConfig(url); err != nil {
		// Not pgx's message: it may quote the string, password included.
		return nil, usageErr(errors.New("DATABASE_URL is not a valid Postgres connection string; " +
			"e.g. postgres://user:password@host:5432/db?sslmode=require"))
	}
	cfg.MustConnect = true
	return awsenv.NewPool(ctx, url, cfg)
}

const migrateUsage = `usage: outboxctl migrate up [--example] [--lock-timeout D] [--lock-attempts N]
       outboxctl migrate status

up applies the pending schema migrations to DATABASE_URL; status lists them, applied or pending.`

func runMigrate(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "migrate").withUsage(migrateUsage)
	example := fs.Bool("example", false, "also create the example consumer's table (examples/orders: billing_charges), for a deployment that runs the example handler")
	lockTimeout := fs.Duration("lock-timeout", postgres.DefaultLockTimeout,
		"longest a migration statement waits for a lock, and so the longest it holds up producers and relays queued behind it; then it is retried")
	lockAttempts := fs.Int("lock-attempts", postgres.DefaultLockAttempts,
		"tries of a migration that keeps timing out on a lock (waits between them double from 1s to 30s) before migrate up fails")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (pos[0] != "up" && pos[0] != "status") || (*example && pos[0] != "up") || *lockTimeout <= 0 || *lockAttempts <= 0 {
		return fs.fail(errors.New("expected up [--example] [--lock-timeout D] [--lock-attempts N] (both positive) or status"))
	}
	cmd := pos[0]
	pool, err := openPool(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	if cmd == "up" {
		// Lock waits and late migrations are logged to stderr, so a deploy job's log shows
		// what a slow migrate up waited for.
		logger := slog.New(slog.NewTextHandler(e.stderr, nil))
		applied, err := postgres.MigrateWithOptions(ctx, pool, postgres.MigrateOptions{
			Logger: logger, LockTimeout: *lockTimeout, LockAttempts: *lockAttempts})
		for _, v := range applied {
			fmt.Fprintf(e.stdout, "applied %04d\n", v)
		}
		if err != nil {
			return err
		}
		if *example {
			if err := orders.Migrate(ctx, pool); err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, "example tables ready (billing_charges)")
		}
		if len(applied) == 0 {
			fmt.Fprintln(e.stdout, "schema is up to date")
		}
		return nil
	}
	st, err := postgres.Status(ctx, pool)
	if err != nil {
		return err
	}
	for _, s := range st {
		state := "pending"
		if s.Applied {
			state = "applied"
		}
		fmt.Fprintf(e.stdout, "%04d  %-8s %s\n", s.Version, state, s.Name)
	}
	return nil
}
