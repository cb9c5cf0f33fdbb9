package migrations_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// insertNotifies inserts one event on a connection of its own, then sends a marker NOTIFY
// from the same connection, and reports whether the insert's NOTIFY came first. Both are
// read on a listener filtered by the producer's pid: the channel is the database's, shared
// with every other test's schema, and notifications of one session arrive in commit order.
func insertNotifies(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	listen, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = listen.Hijack().Close(context.Background()) }()
	if _, err := listen.Exec(ctx, `LISTEN outbox`); err != nil {
		t.Fatal(err)
	}
	producer, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Release()
	pid := producer.Conn().PgConn().PID()
	if _, err := producer.Exec(ctx, `INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', 'k', '{}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := producer.Exec(ctx, `NOTIFY outbox, 'marker'`); err != nil {
		t.Fatal(err)
	}
	for {
		n, err := listen.Conn().WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("wait for the producer's notifications: %v", err)
		}
		if n.PID == pid {
			return n.Payload != "marker"
		}
	}
}

// sleep holds the sleeper lock, as a sleeping relay does (pkg/relay/linger.go), until the
// test ends.
func sleep(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	c, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Hijack().Close(context.Background()) })
	if _, err := c.Exec(context.Background(), `SELECT pg_advisory_lock(1868724343, 'outbox'::regclass::oid::int)`); err != nil {
		t.Fatal(err)
	}
}

// TestWakeUpUpgrade: before 0014 every insert NOTIFYs; after it an insert NOTIFYs only while
// a relay sleeps, and the documented way back to the old trigger restores the NOTIFY on
// every insert. Rows written before the upgrade stay.
func TestWakeUpUpgrade(t *testing.T) {
	t.Parallel()
	db := deployed(t, 12)
	if !insertNotifies(t, db.Pool) {
		t.Fatal("before 0014 an insert sent no NOTIFY")
	}
	if _, err := postgres.Migrate(t.Context(), db.Pool, nil); err != nil {
		t.Fatalf("upgrade to 0014: %v", err)
	}
	if insertNotifies(t, db.Pool) {
		t.Fatal("after 0014 an insert sent a NOTIFY although no relay sleeps")
	}
	if n := db.Count(t, `SELECT count(*) FROM outbox`); n != 2 {
		t.Fatalf("%d rows after the upgrade, want 2", n)
	}
	// The escape hatch in 0014's comment.
	exec(t, db.Pool, `DROP TRIGGER outbox_notify_insert ON outbox`)
	exec(t, db.Pool, `CREATE TRIGGER outbox_notify_insert AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()`)
	if !insertNotifies(t, db.Pool) {
		t.Fatal("the restored trigger sent no NOTIFY")
	}
}

// TestNotifyOnlyWhileARelaySleeps: the trigger sends a NOTIFY while a session holds the
// sleeper lock of this schema's outbox, and none once it lets go or when the lock held is
// another schema's.
func TestNotifyOnlyWhileARelaySleeps(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	other := pgtest.New(t)
	sleep(t, other.Pool)
	if insertNotifies(t, db.Pool) {
		t.Fatal("an insert sent a NOTIFY while only another schema's relay sleeps")
	}
	sleep(t, db.Pool)
	if !insertNotifies(t, db.Pool) {
		t.Fatal("an insert sent no NOTIFY while a relay sleeps")
	}
}

// TestWakeUpMigrationYieldsToProducers: 0014 replaces the trigger, which needs a lock that
// waits for open producer transactions. Behind one it gives up after its lock_timeout
// instead of queueing every later producer behind it, changes nothing, and succeeds once
// the producer has committed.
func TestWakeUpMigrationYieldsToProducers(t *testing.T) {
	t.Parallel()
	db := deployed(t, 12)
	ctx := t.Context()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', 'k', '{}')`); err != nil {
		t.Fatal(err)
	}
	// Two short tries: the runner retries a lock timeout (20 times by default, minutes).
	_, err = postgres.MigrateWithOptions(ctx, db.Pool, postgres.MigrateOptions{LockAttempts: 2, LockBackoff: 50 * time.Millisecond})
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("migrate behind an open producer: %v, want a lock timeout (55P03)", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !insertNotifies(t, db.Pool) {
		t.Fatal("the failed migration changed the trigger")
	}
	if _, err := postgres.Migrate(ctx, db.Pool, nil); err != nil {
		t.Fatalf("migrate once the producer committed: %v", err)
	}
	if insertNotifies(t, db.Pool) {
		t.Fatal("after 0014 an insert sent a NOTIFY although no relay sleeps")
	}
}
