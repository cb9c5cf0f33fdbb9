package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// MigrationStatus is one migration file and whether it has been applied.
type MigrationStatus struct {
	Version int64
	Name    string
	Applied bool
}

// provider opens goose over the pool's connection settings. goose needs database/sql, so the
// pool's config (including search_path and auth hooks) is reused through pgx's stdlib bridge.
func provider(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (*goose.Provider, *sql.DB, error) {
	db := stdlib.OpenDBFromPool(pool)
	// Two migrators of one schema at once (a deploy job and a developer) take turns on an
	// advisory lock instead of racing to create the same tables. The lock id is derived from
	// the schema, so migrations of different schemas (parallel tests) do not wait on each other.
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("open migrations: read current schema: %w", err)
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte("outbox-relay migrations " + schema))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(int64(h.Sum64()>>1)), lock.WithLockTimeout(1, 300))
	if err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("open migrations: %w", err)
	}
	opts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true), goose.WithSessionLocker(locker)}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrationsFS(), opts...)
	if err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("open migrations: %w", err)
	}
	return p, db, nil
}

func migrationsFS() fs.FS { return migrations.FS }

// Migrate applies every pending migration and returns the versions it applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) ([]int64, error) {
	p, db, err := provider(ctx, pool, logger)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	res, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("apply migrations: %w", err)
	}
	applied := make([]int64, 0, len(res))
	for _, r := range res {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}

// Status reports every embedded migration and whether the database has it.
func Status(ctx context.Context, pool *pgxpool.Pool) ([]MigrationStatus, error) {
	p, db, err := provider(ctx, pool, nil)
	if err != nil {
		return nil, err
	}
	defer db.Close()
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
