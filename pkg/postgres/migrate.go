package postgres

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
	"github.com/outbox-relay/outbox-relay/v3/migrations"
)

// MigrationStatus is one migration file and whether it has been applied.
type MigrationStatus struct {
	Version int64
	Name    string
	Applied bool
}

// Defaults of MigrateOptions.
const (
	// DefaultLockTimeout bounds every lock wait of a migration statement. A statement queued
	// for a table lock makes every later writer of that table queue behind it (Postgres
	// grants locks in order), so this is also the longest a producer's INSERT or a relay's
	// claim waits because of a migration. One second is a choice, not a measurement: short
	// next to the producers' own timeouts (the 3 s lock_timeout of issue 27's producer),
	// long next to the short transactions of producers and relays that the lock must wait
	// out when nothing long-running holds the table.
	DefaultLockTimeout = time.Second
	// DefaultLockAttempts bounds the tries of one migration that keeps timing out on a lock:
	// with DefaultLockBackoff doubling up to DefaultMaxLockBackoff, 20 attempts wait about
	// 7.5 minutes in all before Migrate gives up (nothing is left half-applied: see Migrate).
	DefaultLockAttempts = 20
	// DefaultLockBackoff is the wait before the second attempt; each later wait doubles.
	DefaultLockBackoff = time.Second
	// DefaultMaxLockBackoff caps the wait between attempts.
	DefaultMaxLockBackoff = 30 * time.Second
)

// MigrateOptions tunes how Migrate behaves beside a running deployment.
type MigrateOptions struct {
	// Logger receives the lock waits and the out-of-order repairs (and goose's own lines);
	// nil discards them.
	Logger *slog.Logger
	// LockTimeout is the migration session's lock_timeout (default DefaultLockTimeout).
	LockTimeout time.Duration
	// LockAttempts is how often one migration is tried before Migrate gives up on a lock
	// (default DefaultLockAttempts).
	LockAttempts int
	// LockBackoff is the first wait between attempts, doubling up to MaxLockBackoff
	// (defaults DefaultLockBackoff, DefaultMaxLockBackoff).
	LockBackoff, MaxLockBackoff time.Duration
}

func (o MigrateOptions) withDefaults() MigrateOptions {
	o.Logger = cmp.Or(o.Logger, slog.New(slog.DiscardHandler))
	o.LockTimeout = configcheck.Positive(o.LockTimeout, DefaultLockTimeout)
	o.LockAttempts = configcheck.Positive(o.LockAttempts, DefaultLockAttempts)
	o.LockBackoff = configcheck.Positive(o.LockBackoff, DefaultLockBackoff)
	o.MaxLockBackoff = configcheck.Positive(o.MaxLockBackoff, DefaultMaxLockBackoff)
	return o
}

// knownOutOfOrder are the versions a deployed database may lack below its highest applied
// version, and which are safe to apply late. Main shipped 0010, 0011 and a first 0012
// (dead_letters.generation) at 07:39 UTC on 2026-12-03 (6d217bb); at 08:18 (7f58c87) the
// merge of 0005-0007 replaced that 0012 (0005 adds the same column, IF NOT EXISTS). A
// database migrated in between holds 1-4, 10, 11, 12 and misses 5, 6, 7:
//   - 0005 finds the column there, sets the open letters' generation and builds the index
//     as on any database;
//   - 0006 is written to run again (IF NOT EXISTS, a repair that finds nothing the second
//     time, VALIDATE);
//   - 0007 creates legacy_identity, which no migration of that window created, and opens
//     the legacy window because the window's relay published without the identity in the
//     URL.
//
// Any other gap is refused: applying an unknown migration out of order is a decision for
// a person, not for a deploy job.
var knownOutOfOrder = []int64{5, 6, 7}

// openProvider opens goose over db. Two migrators of one schema at once (a deploy job and a
// developer) take turns on an advisory lock instead of racing to create the same tables.
// The lock id is derived from the schema, so migrations of different schemas (parallel
// tests) do not wait on each other.
func openProvider(ctx context.Context, pool *pgxpool.Pool, db *sql.DB, logger *slog.Logger, outOfOrder bool) (*goose.Provider, error) {
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return nil, fmt.Errorf("open migrations: read current schema: %w", err)
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte("outbox-relay migrations " + schema))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(int64(h.Sum64()>>1)), lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("open migrations: %w", err)
	}
	opts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true), goose.WithSessionLocker(locker),
		goose.WithAllowOutofOrder(outOfOrder)}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrationsFS(), opts...)
	if err != nil {
		return nil, fmt.Errorf("open migrations: %w", err)
	}
	return p, nil
}

func migrationsFS() fs.FS { return migrations.FS }

// migrationPool is a pool of its own for the migrations, on the caller's connection settings
// (search_path, auth hooks), whose sessions carry lock_timeout: the setting must not leak
// into the caller's pool.
func migrationPool(ctx context.Context, pool *pgxpool.Pool, lockTimeout time.Duration) (*pgxpool.Pool, error) {
	cfg := pool.Config()
	cfg.MinConns, cfg.MaxConns = 0, 2 // goose's session, and the lock-wait report
	after := cfg.AfterConnect
	// SET rather than a startup parameter: poolers and proxies pass statements through but
	// may refuse startup parameters they do not know.
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if after != nil {
			if err := after(ctx, c); err != nil {
				return err
			}
		}
		_, err := c.Exec(ctx, fmt.Sprintf("SET lock_timeout = %d", lockTimeout.Milliseconds()))
		return err
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open migration pool: %w", err)
	}
	return p, nil
}

// Migrate applies every pending migration and returns the versions it applied. It is
// MigrateWithOptions with the defaults and logger.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) ([]int64, error) {
	return MigrateWithOptions(ctx, pool, MigrateOptions{Logger: logger})
}

// MigrateWithOptions applies every pending migration and returns the versions it applied.
//
// It runs beside a live deployment. Every statement waits at most opts.LockTimeout for a
// lock, so a migration queued behind a long transaction holds producers and relays up for
// that long at most; it then fails with lock_not_available, is logged ("migration waits for
// a lock", with the oldest open transaction) and is tried again after a backoff, up to
// opts.LockAttempts times. A retried migration starts from nothing: a transactional one was
// rolled back, and the one migration that runs outside a transaction (0006) consists of
// steps that are each safe to run again. The versions missing below the database's highest
// one in knownOutOfOrder are applied late; any other gap is an error naming them.
func MigrateWithOptions(ctx context.Context, pool *pgxpool.Pool, opts MigrateOptions) ([]int64, error) {
	opts = opts.withDefaults()
	mpool, err := migrationPool(ctx, pool, opts.LockTimeout)
	if err != nil {
		return nil, err
	}
	defer mpool.Close()
	db := stdlib.OpenDBFromPool(mpool)
	defer db.Close()

	p, err := openProvider(ctx, mpool, db, opts.Logger, false)
	if err != nil {
		return nil, err
	}
	missing, err := missingVersions(ctx, p)
	if err != nil {
		return nil, err
	}
	if len(missing) > 0 {
		for _, v := range missing {
			if !slices.Contains(knownOutOfOrder, v) {
				return nil, fmt.Errorf("apply migrations: versions %v are missing below the database's highest version and only %v are known to be safe to apply late; apply them by hand or restore the schema they belong to", missing, knownOutOfOrder)
			}
		}
		opts.Logger.WarnContext(ctx, "applying migrations missing below the database's highest version (a database migrated between 07:39 and 08:18 UTC on 2026-12-03)",
			"versions", missing)
		if p, err = openProvider(ctx, mpool, db, opts.Logger, true); err != nil {
			return nil, err
		}
	}

	var applied []int64
	backoff := opts.LockBackoff
	for attempt := 1; ; attempt++ {
		res, err := p.Up(ctx)
		var partial *goose.PartialError
		if errors.As(err, &partial) {
			res = partial.Applied
		}
		for _, r := range res {
			applied = append(applied, r.Source.Version)
		}
		if err == nil {
			return applied, nil
		}
		if partial == nil || !retryable(partial.Failed.Source.Version, err) || attempt >= opts.LockAttempts {
			return applied, fmt.Errorf("apply migrations: %w", err)
		}
		reportWait(ctx, mpool, opts, partial.Failed.Source.Version, attempt, backoff, err)
		select {
		case <-ctx.Done():
			return applied, fmt.Errorf("apply migrations: %w (while waiting to retry: %w)", err, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, opts.MaxLockBackoff)
	}
}

// missingVersions returns the pending versions below the highest applied one.
func missingVersions(ctx context.Context, p *goose.Provider) ([]int64, error) {
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("read migration status: %w", err)
	}
	var top int64
	for _, s := range st {
		if s.State == goose.StateApplied {
			top = max(top, s.Source.Version)
		}
	}
	var missing []int64
	for _, s := range st {
		if s.State != goose.StateApplied && s.Source.Version < top {
			missing = append(missing, s.Source.Version)
		}
	}
	return missing, nil
}

// retryable reports whether a migration that failed with err may simply be run again.
func retryable(version int64, err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "55P03", "40P01": // lock_not_available (lock_timeout), deadlock_detected
		return true
	case "23505":
		// 0005 resolves duplicate open letters, then builds the index that forbids them; a
		// writer still running the previous release can add a duplicate in between. The
		// migration rolled back, and the next attempt resolves that one too.
		return version == 5 && pgErr.ConstraintName == "dead_letters_one_open_idx"
	}
	return false
}

// reportWait logs one failed attempt with the oldest open transaction of the database,
// which is usually what the migration waited for.
func reportWait(ctx context.Context, pool *pgxpool.Pool, opts MigrateOptions, version int64, attempt int, backoff time.Duration, err error) {
	attrs := []any{
		slog.Int64("version", version), slog.Int("attempt", attempt), slog.Int("attempts", opts.LockAttempts),
		slog.Duration("lock_timeout", opts.LockTimeout), slog.Duration("retry_in", backoff), slog.String("error", err.Error()),
	}
	var (
		pid          int32
		ageSeconds   float64
		state, query string
	)
	qerr := pool.QueryRow(ctx, `
SELECT pid, extract(epoch FROM now() - xact_start)::float8, coalesce(state, ''), left(coalesce(query, ''), 200)
FROM pg_stat_activity
WHERE datname = current_database() AND xact_start IS NOT NULL AND pid <> pg_backend_pid()
ORDER BY xact_start
LIMIT 1`).Scan(&pid, &ageSeconds, &state, &query)
	if qerr == nil {
		attrs = append(attrs, slog.Int("oldest_xact_pid", int(pid)), slog.Duration("oldest_xact_age", time.Duration(ageSeconds*float64(time.Second)).Round(time.Millisecond)),
			slog.String("oldest_xact_state", state), slog.String("oldest_xact_query", query))
	}
	opts.Logger.WarnContext(ctx, "migration waits for a lock", attrs...)
}

// Status reports every embedded migration and whether the database has it.
func Status(ctx context.Context, pool *pgxpool.Pool) ([]MigrationStatus, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := openProvider(ctx, pool, db, nil, false)
	if err != nil {
		return nil, err
	}
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("read migration status: %w", err)
	}
	out := make([]MigrationStatus, 0, len(st))
	for _, s := range st {
		out = append(out, MigrationStatus{
			Version: s.Source.Version,
			Name:    s.Source.Path,
			Applied: s.State == goose.StateApplied,
		})
	}
	return out, nil
}
