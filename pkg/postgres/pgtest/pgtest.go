// Package pgtest gives each test its own migrated Postgres schema, so tests that share one
// server run in parallel without seeing each other's rows.
//
// The server comes from DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test). When it cannot be reached the test
// fails under CI (CI set) and is skipped, with the reason, otherwise.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
)

// defaultURL is the database used when DATABASE_URL is unset: the dev machines' local server.
const defaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL returns DATABASE_URL or defaultURL.
func URL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return defaultURL
}

// DB is one test's schema on the shared server.
type DB struct {
	// Pool is connected with search_path set to Schema.
	Pool *pgxpool.Pool
	// Schema is the test's own schema name.
	Schema string
	// URL connects to the schema (search_path in the connection string), for subprocesses.
	URL string

	close func() error // set by MustOpen
}

// Close closes the pool and drops the schema of a DB from MustOpen, panicking if the drop
// fails. A DB from New is closed when its test ends; Close does nothing for it.
func (db *DB) Close() {
	if db.close == nil {
		return
	}
	if err := db.close(); err != nil {
		panic("pgtest: " + err.Error())
	}
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
	db, closeDB, err := open(ctx, opts)
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		unreachable(tb, err)
		return nil
	}
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := closeDB(); err != nil {
			tb.Logf("pgtest: %v", err)
		}
	})
	return db
}

// MustOpen is New for code without a testing.TB, such as an Example function: a fresh
// migrated schema on the server of URL, which Close drops, with the setup statements
// (an example's own tables and rows) run in it. Unlike New it neither skips nor fails a
// test: it panics when the server cannot be reached or migrated or a setup statement
// fails, so an example without a database fails with the reason.
func MustOpen(ctx context.Context, setup ...string) *DB {
	db, closeDB, err := open(ctx, Options{})
	if err != nil {
		panic(fmt.Sprintf("pgtest: DATABASE_URL=%q: %v", URL(), err))
	}
	db.close = closeDB
	for _, q := range setup {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			_ = closeDB()
			panic(fmt.Sprintf("pgtest: setup %q: %v", q, err))
		}
	}
	return db
}

func open(ctx context.Context, opts Options) (*DB, func() error, error) {
	sc, err := postgres.CreateSchema(ctx, URL(), "t", false, nil)
	if err != nil {
		return nil, nil, err
	}
	db := &DB{Schema: sc.Name, URL: sc.URL}
	closeDB := func() error {
		if db.Pool != nil {
			db.Pool.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return sc.Drop(ctx)
	}
	fail := func(format string, err error) (*DB, func() error, error) {
		return nil, nil, errors.Join(fmt.Errorf(format, err), closeDB())
	}
	cfg, err := pgxpool.ParseConfig(sc.URL)
	if err != nil {
		return fail("parse DATABASE_URL: %w", err)
	}
	cfg.MaxConns = 8
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	if db.Pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return fail("open pool: %w", err)
	}
	if !opts.NoMigrate {
		if _, err := postgres.Migrate(ctx, db.Pool, nil); err != nil {
			return fail("migrate: %w", err)
		}
	}
	return db, closeDB, nil
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

// OpenPool opens a pool of its own on url (a DB's URL, or another database's), tuned by
// tune when it is not nil, and closes it when the test ends: for a test that needs a pool
// other than DB.Pool (one connection, no ping, session settings).
func OpenPool(tb testing.TB, url string, tune func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatalf("pgtest: parse pool url: %v", err)
	}
	if tune != nil {
		tune(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: open pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// LockTable begins a transaction that takes table's ACCESS EXCLUSIVE lock, so every other
// statement on the table waits: for tests of what a blocked statement does. The test may
// roll the transaction back itself; a cleanup does otherwise, before the schema is dropped.
func (db *DB) LockTable(tb testing.TB, table string) pgx.Tx {
	tb.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		tb.Fatalf("pgtest: begin: %v", err)
	}
	tb.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		tb.Fatalf("pgtest: lock %s: %v", table, err)
	}
	return tx
}

// Count runs query, which selects one integer (a count(*)), on the schema and returns it,
// failing the test on an error.
func (db *DB) Count(tb testing.TB, query string, args ...any) int {
	tb.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		tb.Fatalf("pgtest: %s: %v", query, err)
	}
	return n
}
