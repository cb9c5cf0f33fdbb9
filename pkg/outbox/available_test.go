package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
)

// An event becomes ready at the time it was written, not at the start of the producer's
// transaction: the relay's claim walks the ready index from a second before the present
// (internal/outboxstore, walk.go), so an event stamped with the start of a transaction
// that worked for longer than that before writing it would wait for the relay's probe.
// Enqueue, EnqueueBatch and a plain INSERT (migration 0017's default) alike.
func TestAvailableAtIsTheWriteNotTheTransactionStart(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	const work = 300 * time.Millisecond
	var ids []outbox.ID
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_sleep($1)", work.Seconds()); err != nil {
			return err
		}
		id, err := outbox.Enqueue(ctx, tx, validEvent())
		if err != nil {
			return err
		}
		batch, err := outbox.EnqueueBatch(ctx, tx, []outbox.Event{validEvent()})
		if err != nil {
			return err
		}
		var plain outbox.ID
		if err := tx.QueryRow(ctx, `INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', 'k', '{}') RETURNING id`).Scan(&plain); err != nil {
			return err
		}
		ids = append([]outbox.ID{id, plain}, batch...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT id, extract(epoch FROM available_at - created_at) FROM outbox WHERE id = ANY($1) ORDER BY id`, ids)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var id outbox.ID
		var lag float64
		if err := rows.Scan(&id, &lag); err != nil {
			t.Fatal(err)
		}
		// created_at is the transaction's start (now()); available_at comes after the work.
		if lag < work.Seconds() {
			t.Errorf("event %d: available_at %.3f s after the transaction's start, want at least %v", id, lag, work)
		}
		n++
	}
	if err := rows.Err(); err != nil || n != len(ids) {
		t.Fatalf("read %d of %d events: %v", n, len(ids), err)
	}
}
