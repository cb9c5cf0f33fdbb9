package postgres_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// Migrate applies the embedded migrations that the database lacks and returns their
// versions; running it again applies nothing, so every cold start or deploy job may run
// it. Here the database is a fresh schema of DATABASE_URL's server.
func ExampleMigrate() {
	ctx := context.Background()
	schema, err := postgres.CreateSchema(ctx, pgtest.URL(), "example", false, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer schema.Drop(ctx)
	pool, err := pgxpool.New(ctx, schema.URL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	applied, err := postgres.Migrate(ctx, pool, nil) // nil: no log lines
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first run applied migrations:", len(applied) > 0)

	again, err := postgres.Migrate(ctx, pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("second run applied:", len(again))

	status, err := postgres.Status(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	pending := 0
	for _, m := range status {
		if !m.Applied {
			pending++
		}
	}
	fmt.Println("pending:", pending)
	// Output:
	// first run applied migrations: true
	// second run applied: 0
	// pending: 0
}
