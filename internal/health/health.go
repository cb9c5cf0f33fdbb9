// Package health answers "is the outbox healthy?" from the database alone: backlog and the
// age of its oldest row, flapping rows, stuck leases, throughput over the last hour,
// unresolved dead letters, table sizes and dead tuples, and what holds back VACUUM's xmin
// horizon (the classic way a Postgres queue dies: a forgotten open transaction keeps every
// dead row alive, and the queue's index scans slow to a crawl).
//
// Check turns a Report into healthy, degraded or unhealthy. Only the age of the oldest
// pending event makes it unhealthy: depth alone says nothing (a burst of 100,000 events
// drained in a minute is fine), while age is what users feel.
package health

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// FlappingAttempts: a pending row with more attempts than this is flapping (it keeps
// failing and being retried).
const FlappingAttempts = 3

// DB is what a report reads through: *pgxpool.Pool, *pgx.Conn or pgx.Tx.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// BacklogGauge is the relay's per-invocation view of the backlog.
type BacklogGauge struct {
	// Pending counts rows neither dispatched nor dead-lettered.
	Pending int64
	// Lateness is how long the longest-waiting due event has been ready and unpublished
	// (0 when none is): the figure to alarm on. An event enqueued with a future AvailableAt
	// is not late until then, nor are its key's later events it holds back (qBacklog says
	// how it is measured).
	Lateness time.Duration
	// OldestCreatedAge is the age of the oldest pending row from its created_at, delays
	// included.
	OldestCreatedAge time.Duration
	// OpenCircuits counts the open consumer circuits (0 before migration 0018).
	OpenCircuits int64
}

// Backlog returns the backlog gauge in one statement (see qBacklog).
func Backlog(ctx context.Context, db DB) (BacklogGauge, error) {
	var g BacklogGauge
	var created, late float64
	if err := db.QueryRow(ctx, qBacklog).Scan(&g.Pending, &created, &late); err != nil {
		return BacklogGauge{}, fmt.Errorf("query outbox backlog: %w", err)
	}
	g.OldestCreatedAge, g.Lateness = seconds(created), seconds(late)
	var pgErr *pgconn.PgError
	if err := db.QueryRow(ctx, qOpenCircuits).Scan(&g.OpenCircuits); err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P01") {
		return BacklogGauge{}, fmt.Errorf("query open circuits: %w", err)
	}
	return g, nil
}

// Report is a snapshot of the outbox's health. Durations are in seconds (float) so the JSON
// is readable by tools in any language.
type Report struct {
	CheckedAt time.Time `json:"checked_at"`
	Queue     Queue     `json:"queue"`
	// DispatchedPerMinute has 60 entries, oldest first; the last is the current minute.
	DispatchedPerMinute []int64 `json:"dispatched_per_minute"`
	DispatchedLastHour  int64   `json:"dispatched_last_hour"`
	// DeadLetters are the unresolved dead letters by source and topic.
	DeadLetters           []DeadLetterGroup `json:"dead_letters_unresolved"`
	DeadLettersUnresolved int64             `json:"dead_letters_unresolved_total"`
	Outbox                Table             `json:"outbox_table"`
	// ProcessedMessages: RowsEstimate is the statistics collector's live-tuple estimate
	// (not an exact count, which would scan the table).
	ProcessedMessages Table   `json:"processed_messages_table"`
	Horizon           Horizon `json:"xmin_horizon"`
	// Circuits are the open consumer circuits (a consumer down), oldest first; HeldEvents
	// the pending events the relay holds behind them.
	Circuits   []Circuit `json:"open_circuits"`
	HeldEvents int64     `json:"held_events"`
}

// Queue describes the pending rows.
type Queue struct {
	Pending int64 `json:"pending"`
	// Ready are pending rows that may be claimed now.
	Ready int64 `json:"ready"`
	// Leased are held by a live lease (a relay is publishing them).
	Leased int64 `json:"leased"`
	// StuckLeases expired without being marked: the relay died mid-batch. They become
	// claimable again at once, so they should not persist.
	StuckLeases int64 `json:"stuck_leases"`
	// Flapping have more than FlappingAttempts attempts.
	Flapping    int64 `json:"flapping"`
	MaxAttempts int64 `json:"max_attempts"`
	// OldestPendingAgeSeconds counts from created_at (an event enqueued with a delay
	// ages from its creation too). 0 when nothing is pending.
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	OldestPendingID         int64   `json:"oldest_pending_id,omitempty"`
}

// DeadLetterGroup counts unresolved dead letters of one source (relay|delivery) and topic.
type DeadLetterGroup struct {
	Source   string    `json:"source"`
	Topic    string    `json:"topic"`
	Count    int64     `json:"count"`
	OldestAt time.Time `json:"oldest_at"`
}

// Table sizes one table.
type Table struct {
	TableBytes int64 `json:"table_bytes"`
	IndexBytes int64 `json:"index_bytes"`
	TotalBytes int64 `json:"total_bytes"`
	// RowsEstimate and DeadTuples come from the statistics collector: estimates.
	RowsEstimate   int64      `json:"rows_estimate"`
	DeadTuples     int64      `json:"dead_tuples"`
	LastVacuum     *time.Time `json:"last_vacuum,omitempty"`
	LastAutovacuum *time.Time `json:"last_autovacuum,omitempty"`
}

// Horizon describes what holds back VACUUM in this database.
type Horizon struct {
	OpenTransactions int64 `json:"open_transactions"`
	// OldestTransactionAgeSeconds is the age of the oldest open transaction of another
	// session in this database, with that session's pid, state and application name.
	OldestTransactionAgeSeconds float64 `json:"oldest_transaction_age_seconds"`
	OldestTransactionPID        int64   `json:"oldest_transaction_pid,omitempty"`
	OldestTransactionState      string  `json:"oldest_transaction_state,omitempty"`
	OldestTransactionApp        string  `json:"oldest_transaction_application,omitempty"`
	// BackendXminAge is the age, in transaction ids, of the oldest snapshot a session holds.
	BackendXminAge int64 `json:"backend_xmin_age_xids"`
	// SlotXminAge is the oldest replication slot's xmin (or catalog_xmin) age, in ids.
	SlotXminAge              int64   `json:"replication_slot_xmin_age_xids"`
	PreparedTransactions     int64   `json:"prepared_transactions"`
	OldestPreparedAgeSeconds float64 `json:"oldest_prepared_age_seconds"`
	PreparedXminAge          int64   `json:"prepared_xmin_age_xids"`
	XminHorizonAge           int64   `json:"xmin_horizon_age_xids"`
}

// Collect reads a Report in one round trip (one statement per question, sent as a batch).
func Collect(ctx context.Context, db DB) (Report, error) {
	r := Report{CheckedAt: time.Now().UTC()}
	b := &pgx.Batch{}
	b.Queue(qQueue, FlappingAttempts).QueryRow(func(row pgx.Row) error {
		var age float64
		q := &r.Queue
		if err := row.Scan(&q.Pending, &q.Ready, &q.Leased, &q.StuckLeases, &q.Flapping, &q.MaxAttempts, &age, &q.OldestPendingID); err != nil {
			return fmt.Errorf("query pending outbox rows: %w", err)
		}
		q.OldestPendingAgeSeconds = age
		return nil
	})
	b.Queue(qDispatchedPerMinute).QueryRow(func(row pgx.Row) error {
		if err := row.Scan(&r.DispatchedPerMinute); err != nil {
			return fmt.Errorf("query dispatches per minute: %w", err)
		}
		for _, n := range r.DispatchedPerMinute {
			r.DispatchedLastHour += n
		}
		return nil
	})
	b.Queue(qDeadLetters).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var g DeadLetterGroup
			if err := rows.Scan(&g.Source, &g.Topic, &g.Count, &g.OldestAt); err != nil {
				return fmt.Errorf("query unresolved dead letters: %w", err)
			}
			r.DeadLetters = append(r.DeadLetters, g)
			r.DeadLettersUnresolved += g.Count
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("query unresolved dead letters: %w", err)
		}
		return nil
	})
	b.Queue(qTables).Query(func(rows pgx.Rows) error {
		found := 0
		for rows.Next() {
			var name string
			var t Table
			if err := rows.Scan(&name, &t.TableBytes, &t.IndexBytes, &t.TotalBytes, &t.RowsEstimate, &t.DeadTuples, &t.LastVacuum, &t.LastAutovacuum); err != nil {
				return fmt.Errorf("query table sizes: %w", err)
			}
			switch name {
			case "outbox":
				r.Outbox = t
			case "processed_messages":
				r.ProcessedMessages = t
			}
			found++
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("query table sizes: %w", err)
		}
		if found < 2 {
			return fmt.Errorf("query table sizes: outbox or processed_messages missing from the current schema (run outboxctl migrate up)")
		}
		return nil
	})
	b.Queue(qHorizon).QueryRow(func(row pgx.Row) error {
		h := &r.Horizon
		if err := row.Scan(&h.OpenTransactions, &h.OldestTransactionAgeSeconds, &h.OldestTransactionPID, &h.OldestTransactionState,
			&h.OldestTransactionApp, &h.BackendXminAge, &h.SlotXminAge, &h.PreparedTransactions, &h.OldestPreparedAgeSeconds, &h.PreparedXminAge); err != nil {
			return fmt.Errorf("query xmin horizon: %w", err)
		}
		h.XminHorizonAge = max(h.BackendXminAge, h.SlotXminAge, h.PreparedXminAge)
		return nil
	})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return Report{}, fmt.Errorf("collect health report: %w", err)
	}
	if r.DeadLetters == nil {
		r.DeadLetters = []DeadLetterGroup{}
	}
	if err := collectCircuits(ctx, db, &r); err != nil {
		return Report{}, fmt.Errorf("collect health report: %w", err)
	}
	return r, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
