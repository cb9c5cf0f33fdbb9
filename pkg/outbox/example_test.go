package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// Enqueue the event in the same transaction as the business change: both commit, or
// neither does. The relay publishes it after the commit.
func ExampleEnqueue() {
	ctx := context.Background()
	// A migrated schema of its own on DATABASE_URL's server; in an application this is
	// the pool it already has, migrated with postgres.Migrate.
	db := pgtest.MustOpen(ctx, `CREATE TABLE orders (id text PRIMARY KEY, amount_cents bigint)`)
	defer db.Close()
	pool := db.Pool

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The business change ...
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, amount_cents) VALUES ($1, $2)`, "o-42", 1299); err != nil {
			return err
		}
		// ... and its event, in the same transaction.
		payload, _ := json.Marshal(map[string]any{"order_id": "o-42", "amount_cents": 1299, "currency": "EUR"})
		id, err := outbox.Enqueue(ctx, tx, outbox.Event{
			Topic:        "order.created",
			PartitionKey: "order:o-42", // events of one order are delivered in order
			Payload:      payload,
			Headers:      map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		})
		if err != nil {
			return err // *outbox.ValidationError for bad input; nothing was written
		}
		fmt.Println("enqueued:", id > 0)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	var pending int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE dispatched_at IS NULL`).Scan(&pending); err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending events:", pending)
	// Output:
	// enqueued: true
	// pending events: 1
}

// An invalid event is refused before anything is written, with a *ValidationError that
// names the field; the caller's transaction is untouched and may still commit.
func ExampleEnqueue_validation() {
	ctx := context.Background()
	db := pgtest.MustOpen(ctx)
	defer db.Close()

	_, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: "order created", Payload: []byte(`{}`)})
	var verr *outbox.ValidationError
	if errors.As(err, &verr) {
		fmt.Println("field:", verr.Field)
		fmt.Println("invalid topic:", errors.Is(err, outbox.ErrInvalidTopic))
	}
	// Output:
	// field: Topic
	// invalid topic: true
}
