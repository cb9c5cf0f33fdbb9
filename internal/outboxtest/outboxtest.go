// Package outboxtest holds what the tests of several packages do on a pgtest schema:
// enqueue a load of events, run a statement, read one column, end a session. Each helper fails the test on an error, so a
// test states what it sets up or checks, not how to handle a driver error. Tests only.
package outboxtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// DB runs the helpers' statements: a pool (pgtest.DB.Pool), a connection or a transaction.
type DB = outbox.Querier

// Orders returns events first..first+n-1 as the example producer writes them: topic
// order.created, event i keyed key(i), its payload an order examples/orders accepts.
func Orders(first, n int, key func(i int) string) []outbox.Event {
	evs := make([]outbox.Event, n)
	for j := range evs {
		i := first + j
		evs[j] = outbox.Event{Topic: "order.created", PartitionKey: key(i),
			Payload: fmt.Appendf(nil, `{"order_id":"o-%d","amount_cents":100,"currency":"EUR"}`, i)}
	}
	return evs
}

// Mod is the key function of a load spread over keys partition keys: "k<i mod keys>".
func Mod(keys int) func(i int) string {
	return func(i int) string { return fmt.Sprintf("k%d", i%keys) }
}

// maxBatch bounds one Enqueue statement: the producer API takes any number of events, and
// a test's load of 100k goes in statements of this size.
const maxBatch = 1000

// Enqueue writes evs with the producer API (outbox.EnqueueBatch), in one statement up to
// 1000 events, and returns their ids in order.
func Enqueue(tb testing.TB, db DB, evs []outbox.Event) []outbox.ID {
	tb.Helper()
	ids := make([]outbox.ID, 0, len(evs))
	for start := 0; start < len(evs); start += maxBatch {
		got, err := outbox.EnqueueBatch(tb.Context(), db, evs[start:min(len(evs), start+maxBatch)])
		if err != nil {
			tb.Fatalf("outboxtest: enqueue: %v", err)
		}
		ids = append(ids, got...)
	}
	return ids
}

// Exec runs sql on db and returns how many rows it changed.
func Exec(tb testing.TB, db DB, sql string, args ...any) int64 {
	tb.Helper()
	tag, err := db.Exec(tb.Context(), sql, args...)
	if err != nil {
		tb.Fatalf("outboxtest: %s: %v", sql, err)
	}
	return tag.RowsAffected()
}

// Column runs query, which returns one column, on db and returns its values in order.
func Column[T any](tb testing.TB, db DB, query string, args ...any) []T {
	tb.Helper()
	rows, err := db.Query(tb.Context(), query, args...)
	if err != nil {
		tb.Fatalf("outboxtest: %s: %v", query, err)
	}
	vals, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		tb.Fatalf("outboxtest: %s: %v", query, err)
	}
	return vals
}

// Beginner starts transactions: a pool (pgtest.DB.Pool) or a connection.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Begin starts a transaction on db that the end of the test rolls back, unless the test
// committed or rolled it back first.
func Begin(tb testing.TB, db Beginner) pgx.Tx {
	tb.Helper()
	tx, err := db.Begin(tb.Context())
	if err != nil {
		tb.Fatalf("outboxtest: begin: %v", err)
	}
	// Not tb.Context(): it is cancelled before cleanups run.
	tb.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// Terminate ends the server sessions pids with pg_terminate_backend, run on db, and waits
// until they are gone: the next statement of a pool that held one finds it dead, as after
// a failover or an idle timeout.
func Terminate(tb testing.TB, db DB, pids ...int32) {
	tb.Helper()
	Exec(tb, db, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid`, pids)
	testwait.Eventually(tb, 10*time.Second, func() bool {
		return len(Column[int32](tb, db, `SELECT pid FROM pg_stat_activity WHERE pid = ANY($1)`, pids)) == 0
	}, "sessions %v to end after pg_terminate_backend", pids)
}
