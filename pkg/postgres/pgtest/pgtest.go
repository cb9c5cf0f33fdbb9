// Package pgtest gives each test its own migrated Postgres schema, so tests that share one
// server run in parallel without seeing each other's rows.
//
// The server comes from DATABASE_URL (default DefaultURL). When it cannot be reached the test
// fails under CI=true and is skipped, with the reason, otherwise.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/pkg/postgres"
)

// DefaultURL is the database used when DATABASE_URL is unset: the dev machines' local server.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL returns DATABASE_URL or DefaultURL.
func URL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// DB is one test's schema on the shared server.
type DB struct {
	// Pool is connected with search_path set to Schema.
	Pool *pgxpool.Pool
	// Schema is the test's own schema name.
	Schema string
	// URL connects to the schema (search_path in the connection string), for subprocesses.
	URL string
}

// New creates a fresh schema, applies all migrations to it and drops it when the test ends.
func New(tb testing.TB) *DB {
	tb.Helper()
	return NewWithOptions(tb, Options{})
}

// Options tunes the pool of NewWithOptions.
type Options struct {
	// MaxConns caps the pool (default 8).
	MaxConns int32
	// NoMigrate leaves the schema empty.
	NoMigrate bool
}

// NewWithOptions is New with pool settings.
func NewWithOptions(tb testing.TB, opts Options) *DB {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	sc, err := postgres.CreateSchema(ctx, URL(), "t", false, nil)
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		unreachable(tb, err)
		return nil
	}
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	schema, url := sc.Name, sc.URL
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := sc.Drop(ctx); err != nil {
			tb.Logf("pgtest: %v", err)
		}
	})

	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatalf("pgtest: parse DATABASE_URL: %v", err)
	}
	cfg.MaxConns = 8
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("pgtest: open pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	if !opts.NoMigrate {
		if _, err := postgres.Migrate(ctx, pool, nil); err != nil {
			tb.Fatalf("pgtest: migrate: %v", err)
		}
	}
	return &DB{Pool: pool, Schema: schema, URL: url}
}

func unreachable(tb testing.TB, err error) {
	tb.Helper()
	msg := fmt.Sprintf("pgtest: cannot reach Postgres at DATABASE_URL=%q: %v "+
		"(start it with `pg_ctlcluster --skip-systemctl-redirect 15 main start` or set DATABASE_URL)", URL(), err)
	if os.Getenv("CI") != "" {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
}
