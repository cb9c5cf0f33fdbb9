package health

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
)

// Circuit is an open consumer circuit (migration 0018): a topic whose consumer is down.
// The failure callback opened it when QStash gave up on a delivery for a transient reason;
// the relay holds the topic's events in the outbox and probes (docs/reliability.md,
// "Consumer outage").
type Circuit struct {
	Topic          string    `json:"topic"`
	OpenedAt       time.Time `json:"opened_at"`
	OpenForSeconds float64   `json:"open_for_seconds"`
	// Failures counts the transient final failures reported while it was open; ProbeFailures
	// the failed probes among them.
	Failures      int64 `json:"failures"`
	ProbeFailures int64 `json:"probe_failures"`
	// ProbeID is the outbox row of the probe in flight (0: none); NextProbeInSeconds how
	// long until the next probe may go (0: due).
	ProbeID            int64   `json:"probe_id,omitempty"`
	NextProbeInSeconds float64 `json:"next_probe_in_seconds"`
	LastError          string  `json:"last_error,omitempty"`
}

// qCircuits lists the open circuits, oldest first; qHeld counts the events the relay holds
// behind them ($1: outboxstore.HeldError), over the pending rows only (outbox_pending_age_idx).
const (
	qCircuits = `
SELECT topic, opened_at, extract(epoch FROM now() - opened_at)::float8, failures, probe_failures,
       coalesce(probe_id, 0), extract(epoch FROM greatest(probe_at - now(), interval '0'))::float8, coalesce(last_error, '')
FROM outbox_circuits
ORDER BY opened_at, topic`
	qCircuitsExist = `SELECT to_regclass('outbox_circuits') IS NOT NULL`
	// qOpenCircuits counts them for the backlog gauge (undefined_table before 0018).
	qOpenCircuits = `SELECT count(*) FROM outbox_circuits`
	qHeld         = `
SELECT count(*) FROM outbox
WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL AND last_error = $1`
)

// collectCircuits reads the open circuits into r, and how many events are held behind
// them. A schema without the circuit table (before migration 0018) has none: looked up by
// name first, so a missing table never fails the statement, which would abort the
// caller's transaction (the console reads the report and its chart in one).
func collectCircuits(ctx context.Context, db DB, r *Report) error {
	r.Circuits = []Circuit{}
	var exists bool
	if err := db.QueryRow(ctx, qCircuitsExist).Scan(&exists); err != nil {
		return fmt.Errorf("query open circuits: %w", err)
	}
	if !exists {
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(qCircuits).Query(func(rows pgx.Rows) error {
		var err error
		r.Circuits, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Circuit, error) {
			var c Circuit
			err := row.Scan(&c.Topic, &c.OpenedAt, &c.OpenForSeconds, &c.Failures, &c.ProbeFailures, &c.ProbeID, &c.NextProbeInSeconds, &c.LastError)
			return c, err
		})
		return err
	})
	b.Queue(qHeld, outboxstore.HeldError).QueryRow(func(row pgx.Row) error { return row.Scan(&r.HeldEvents) })
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("query open circuits: %w", err)
	}
	if r.Circuits == nil {
		r.Circuits = []Circuit{}
	}
	return nil
}
