package pgtest_test

import (
	"context"
	"fmt"
	"log"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// MustOpen gives an example (or any code without a testing.TB) a migrated schema of its
// own, with the example's tables and rows created by the setup statements; Close drops
// it. A test uses pgtest.New(t) instead, which closes it when the test ends and skips or
// fails, with the reason, when no server answers.
func ExampleMustOpen() {
	ctx := context.Background()
	db := pgtest.MustOpen(ctx,
		`CREATE TABLE orders (id text PRIMARY KEY, total_cents bigint NOT NULL)`,
		`INSERT INTO orders VALUES ('o-1', 4200)`,
	)
	defer db.Close()

	// The outbox is migrated: produce in the same transaction as the business write.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `UPDATE orders SET total_cents = 4500 WHERE id = 'o-1'`); err != nil {
		log.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: "order.updated", PartitionKey: "order:o-1", Payload: []byte(`{"total_cents":4500}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	var pending int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE dispatched_at IS NULL`).Scan(&pending); err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending events:", pending)
	// Output:
	// pending events: 1
}
