// Package retention keeps the outbox and processed_messages tables bounded: it deletes
// finished outbox rows older than the outbox retention and dedupe records older than the
// dedupe TTL, in small batches (one short statement each, oldest first through an index),
// so it never takes a long lock or scans a table. It never deletes a pending, leased or
// dead-lettered-and-unresolved row.
//
// Deletes are the simple answer up to a few million rows a day. Beyond that, time
// partitioning (drop or detach whole old partitions) costs nothing per row and leaves no
// dead tuples; see docs/operations.md, Retention.
package retention

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
)

// Defaults for Config.
const (
	// DefaultOutboxRetention keeps a week of dispatched events for audits and redrives.
	DefaultOutboxRetention = 7 * 24 * time.Hour
	// DefaultDedupeTTL is 14 days. The default retry horizon (defaultHorizon: the relay's
	// 12 attempts with 30s..1h backoff, plus QStash's 3 retries and their delivery
	// attempts) is under 8 hours, so 14 days leaves a wide margin, and it still passes
	// ValidateDedupeTTL with QStash retries raised up to 17 (each retry from the fifth on
	// waits a day). A redrive is a manual act and can come later than any TTL: a redriven
	// event that had in fact been processed is absorbed only while its record lives.
	DefaultDedupeTTL = 14 * 24 * time.Hour
	// DefaultBatchSize rows per delete statement: milliseconds of locks per batch.
	DefaultBatchSize = 1000
	// DefaultMaxBatches per table and run: a run deletes at most 1M rows per table, so
	// it fits a Lambda invocation; the next run continues.
	DefaultMaxBatches = 1000
	// MaxBatchSize bounds BatchSize.
	MaxBatchSize = 10000
)

// DB is what retention runs on: *pgxpool.Pool in practice. Each batch is its own
// autocommitted statement, so do not pass a transaction (it would hold every lock to the end).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config tunes a run. Zero fields take the defaults.
type Config struct {
	// OutboxRetention: finished outbox rows older than this are deleted. Default
	// DefaultOutboxRetention.
	OutboxRetention time.Duration
	// DedupeTTL: processed_messages rows older than this are deleted. It must exceed the
	// retry horizon (ValidateDedupeTTL). Default DefaultDedupeTTL.
	DedupeTTL time.Duration
	// BatchSize rows per statement. Default DefaultBatchSize, at most MaxBatchSize.
	BatchSize int
	// MaxBatches per table per run. Default DefaultMaxBatches.
	MaxBatches int
	// Now overrides the database clock (tests). Nil means now().
	Now func() time.Time
	// Logger receives one line per run. Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.OutboxRetention = cmp.Or(c.OutboxRetention, DefaultOutboxRetention)
	c.DedupeTTL = cmp.Or(c.DedupeTTL, DefaultDedupeTTL)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.MaxBatches = cmp.Or(c.MaxBatches, DefaultMaxBatches)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// Validate reports every invalid field (after WithDefaults).
func (c Config) Validate() error {
	bad := configcheck.For("retention")
	if c.OutboxRetention < time.Minute {
		bad.Bad("OutboxRetention", "%v is below one minute", c.OutboxRetention)
	}
	if c.DedupeTTL < time.Minute {
		bad.Bad("DedupeTTL", "%v is below one minute", c.DedupeTTL)
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		bad.Bad("BatchSize", "%d is outside 1..%d", c.BatchSize, MaxBatchSize)
	}
	if c.MaxBatches < 1 {
		bad.Bad("MaxBatches", "%d must be at least 1", c.MaxBatches)
	}
	return bad.Err()
}

// Result counts what a run deleted (or, from Plan, would delete).
type Result struct {
	OutboxDeleted    int64 `json:"outbox_deleted"`
	ProcessedDeleted int64 `json:"processed_deleted"`
	// Batches is the number of delete statements run.
	Batches int `json:"batches"`
	// Complete is false when the run stopped at MaxBatches or because ctx ended; the next
	// run continues where it stopped.
	Complete bool          `json:"complete"`
	Duration time.Duration `json:"-"`
}

// Run deletes, in batches: dispatched outbox rows older than OutboxRetention (kept while a
// dead letter of theirs is unresolved), relay-dead-lettered rows whose dead letters were
// all resolved before the cutoff, and processed_messages older than DedupeTTL. When ctx
// ends between or during batches, Run stops (the interrupted statement rolls back) and
// returns what was deleted with Complete false and a nil error: a partial run is normal
// under a deadline. A database error is returned with the counts so far.
func Run(ctx context.Context, db DB, cfg Config) (Result, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	start := time.Now()
	res := Result{Complete: true}
	now := nowArg(cfg.Now)
	steps := []struct {
		what      string
		query     string
		retention time.Duration
		counter   *int64
	}{
		{"dispatched outbox rows", qDeleteDispatched, cfg.OutboxRetention, &res.OutboxDeleted},
		{"dead-lettered outbox rows", qDeleteDeadLettered, cfg.OutboxRetention, &res.OutboxDeleted},
		{"processed messages", qDeleteProcessed, cfg.DedupeTTL, &res.ProcessedDeleted},
	}
	var err error
steps:
	for _, s := range steps {
		for b := 0; ; b++ {
			if b == cfg.MaxBatches {
				res.Complete = false
				break
			}
			if ctx.Err() != nil {
				res.Complete = false
				break steps
			}
			tag, e := db.Exec(ctx, s.query, now, s.retention, cfg.BatchSize)
			if e != nil {
				res.Complete = false
				if ctx.Err() == nil {
					err = fmt.Errorf("delete %s: %w", s.what, e)
				}
				break steps
			}
			res.Batches++
			*s.counter += tag.RowsAffected()
			if tag.RowsAffected() < int64(cfg.BatchSize) {
				break
			}
		}
	}
	res.Duration = time.Since(start)
	cfg.Logger.InfoContext(ctx, "retention run",
		slog.Int64("outbox_deleted", res.OutboxDeleted), slog.Int64("processed_deleted", res.ProcessedDeleted),
		slog.Int("batches", res.Batches), slog.Bool("complete", res.Complete),
		slog.Int64("duration_ms", res.Duration.Milliseconds()))
	return res, err
}

// Plan counts what Run would delete now, without deleting (a dry run). The counts are not
// capped by MaxBatches.
func Plan(ctx context.Context, db DB, cfg Config) (Result, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	start := time.Now()
	now := nowArg(cfg.Now)
	var dispatched, dead, processed int64
	if err := db.QueryRow(ctx, qCountDispatched, now, cfg.OutboxRetention).Scan(&dispatched); err != nil {
		return Result{}, fmt.Errorf("count dispatched outbox rows: %w", err)
	}
	if err := db.QueryRow(ctx, qCountDeadLettered, now, cfg.OutboxRetention).Scan(&dead); err != nil {
		return Result{}, fmt.Errorf("count dead-lettered outbox rows: %w", err)
	}
	if err := db.QueryRow(ctx, qCountProcessed, now, cfg.DedupeTTL).Scan(&processed); err != nil {
		return Result{}, fmt.Errorf("count processed messages: %w", err)
	}
	return Result{OutboxDeleted: dispatched + dead, ProcessedDeleted: processed, Complete: true, Duration: time.Since(start)}, nil
}

func nowArg(now func() time.Time) *time.Time {
	if now == nil {
		return nil
	}
	t := now()
	return &t
}
