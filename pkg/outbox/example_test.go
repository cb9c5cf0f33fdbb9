package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/postgres"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
)

// Enqueue the event in the same transaction as the business change: both commit, or
// neither does. The relay publishes it after the commit.
func ExampleEnqueue() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.URL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := postgres.Migrate(ctx, pool, nil); err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The business change ...
		// _, err := tx.Exec(ctx, "INSERT INTO orders (id, amount_cents) VALUES ($1, $2)", "o-42", 1299)

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
	// Output: enqueued: true
}
