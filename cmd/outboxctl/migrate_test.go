package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// TestMigrateExample: a fresh schema gets the outbox's tables and, only with --example,
// the example consumer's billing_charges; a second run changes nothing; bad arguments exit
// 2 naming the usage.
func TestMigrateExample(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{NoMigrate: true})
	exists := func(table string) bool {
		var ok bool
		if err := db.Pool.QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if code, out, stderr := runCLI(t, db.URL, "migrate", "up"); code != 0 || !strings.Contains(out, "applied 0001") {
		t.Fatalf("migrate up: %d %s %s", code, out, stderr)
	}
	if !exists("outbox") || exists("billing_charges") {
		t.Fatal("migrate up must create the outbox and not the example's table")
	}
	if code, out, stderr := runCLI(t, db.URL, "migrate", "up", "--example"); code != 0 || !strings.Contains(out, "schema is up to date") || !strings.Contains(out, "billing_charges") {
		t.Fatalf("migrate up --example: %d %s %s", code, out, stderr)
	}
	if !exists("billing_charges") {
		t.Fatal("--example did not create billing_charges")
	}
	if code, _, stderr := runCLI(t, db.URL, "migrate", "up", "--example"); code != 0 {
		t.Fatalf("second run: %d %s", code, stderr)
	}
	for _, args := range [][]string{{"migrate", "status", "--example"}, {"migrate", "down"}, {"migrate", "up", "extra"}} {
		if code, _, stderr := runCLI(t, db.URL, args...); code != 2 || !strings.Contains(stderr, "usage: outboxctl migrate") {
			t.Errorf("%v: code %d stderr %q", args, code, stderr)
		}
	}
}

// TestMigrateLockWait: with 0013-0017 pending beside an open producer transaction, 0013
// (the outbox's fillfactor: its lock lets writers go on) applies and 0014 (the outbox
// trigger, which must wait for the producer) gives up after --lock-attempts with the lock
// timeout instead of queueing producers behind it; a transaction holding the lock VACUUM or
// ANALYZE takes makes migrate up log each wait on stderr and fail the same way; once both
// transactions end, the rest applies. 0017 alone waits the same way; 0018 (a new table)
// does not wait.
func TestMigrateLockWait(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	pending := func(from int) {
		if _, err := db.Pool.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id >= $1`, from); err != nil {
			t.Fatal(err)
		}
		// 0015 and 0016 create functions, triggers and a sequence: gone again so that they
		// can run again.
		if _, err := db.Pool.Exec(ctx, `DROP TRIGGER IF EXISTS dead_letters_skip_second_open ON dead_letters;
			DROP FUNCTION IF EXISTS dead_letters_skip_second_open();
			DROP TRIGGER IF EXISTS outbox_reopened ON outbox;
			DROP FUNCTION IF EXISTS outbox_count_reopened();
			DROP SEQUENCE IF EXISTS outbox_reopened_seq`); err != nil {
			t.Fatal(err)
		}
	}
	hold := func(sql string) pgx.Tx {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Ended before the schema is dropped, even when the test fails half way (the drop
		// would wait for it for ever).
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
		return tx
	}

	pending(13)
	producer := hold(`INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', 'k', '{}')`)
	code, out, stderr := runCLI(t, db.URL, "migrate", "up", "--lock-timeout", "100ms", "--lock-attempts", "1")
	if code != 3 || !strings.Contains(out, "applied 0013") || strings.Contains(out, "applied 0014") || !strings.Contains(stderr, "SQLSTATE 55P03") {
		t.Fatalf("migrate up beside an open producer transaction: %d %q %q, want 0013 applied and 0014 given up on the lock timeout", code, out, stderr)
	}
	_ = producer.Rollback(ctx)

	pending(13)
	vacuum := hold(`LOCK TABLE outbox IN SHARE UPDATE EXCLUSIVE MODE`)
	code, out, stderr = runCLI(t, db.URL, "migrate", "up", "--lock-timeout", "100ms", "--lock-attempts", "2")
	if code != 3 || strings.Contains(out, "applied") || strings.Count(stderr, "migration waits for a lock") != 1 ||
		!strings.Contains(stderr, "version=13") || !strings.Contains(stderr, "SQLSTATE 55P03") {
		t.Fatalf("migrate up behind a held lock: %d %q %q, want one logged wait, then the lock timeout", code, out, stderr)
	}
	_ = vacuum.Rollback(ctx)
	if code, out, stderr := runCLI(t, db.URL, "migrate", "up"); code != 0 || !strings.Contains(out, "applied 0013") || !strings.Contains(out, "applied 0017") {
		t.Fatalf("migrate up after the lock was released: %d %s %s", code, out, stderr)
	}

	// 0017 (available_at's default) and 0020 (a nullable column), each ACCESS EXCLUSIVE for
	// an instant, give up on the lock timeout beside an open producer transaction too, and
	// apply once it has ended. Each is made pending with every later version (0018 creates
	// its table IF NOT EXISTS: applied again, it changes nothing).
	for _, m := range []struct {
		version int
		undo    string
	}{
		{17, `ALTER TABLE outbox ALTER COLUMN available_at SET DEFAULT now()`},
		{20, `ALTER TABLE outbox DROP COLUMN relay_deaths`},
		{21, `DROP INDEX outbox_dispatched_key_idx`},
	} {
		name := fmt.Sprintf("%04d", m.version)
		if _, err := db.Pool.Exec(ctx, m.undo); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id >= $1`, m.version); err != nil {
			t.Fatal(err)
		}
		producer = hold(`INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', 'k', '{}')`)
		if code, out, stderr := runCLI(t, db.URL, "migrate", "up", "--lock-timeout", "100ms", "--lock-attempts", "1"); code != 3 || strings.Contains(out, "applied "+name) || !strings.Contains(stderr, "SQLSTATE 55P03") {
			t.Fatalf("%s beside an open producer transaction: %d %q %q, want it given up on the lock timeout", name, code, out, stderr)
		}
		_ = producer.Rollback(ctx)
		if code, out, stderr := runCLI(t, db.URL, "migrate", "up"); code != 0 || !strings.Contains(out, "applied "+name) {
			t.Fatalf("%s after the producer ended: %d %s %s", name, code, out, stderr)
		}
	}

	// 0018 (a new table, the consumer circuits) takes no lock on the outbox: it applies
	// beside an open producer transaction, and 0020 after it (pending again with it: the
	// runner refuses gaps) gives up on the lock timeout there, as above.
	if _, err := db.Pool.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id >= 18; DROP TABLE outbox_circuits;
		ALTER TABLE outbox DROP COLUMN relay_deaths`); err != nil {
		t.Fatal(err)
	}
	producer = hold(`INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', 'k', '{}')`)
	if code, out, stderr := runCLI(t, db.URL, "migrate", "up", "--lock-timeout", "100ms", "--lock-attempts", "1"); code != 3 || !strings.Contains(out, "applied 0018") || strings.Contains(out, "applied 0020") {
		t.Fatalf("0018 beside an open producer transaction: %d %q %q, want it applied and 0020 given up on the lock timeout", code, out, stderr)
	}
	_ = producer.Rollback(ctx)
	if code, out, stderr := runCLI(t, db.URL, "migrate", "up"); code != 0 || !strings.Contains(out, "applied 0020") {
		t.Fatalf("0020 after the producer ended: %d %s %s", code, out, stderr)
	}
	for _, args := range [][]string{{"migrate", "up", "--lock-timeout", "0s"}, {"migrate", "up", "--lock-attempts", "0"}} {
		if code, _, stderr := runCLI(t, db.URL, args...); code != 2 || !strings.Contains(stderr, "usage: outboxctl migrate") {
			t.Errorf("%v: code %d stderr %q", args, code, stderr)
		}
	}
}
