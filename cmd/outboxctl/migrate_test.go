package main

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
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
