// Package healthtest holds what the tests of the health report need beyond a migrated
// schema: a transaction that pins the xmin horizon, as a forgotten one does in production.
package healthtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// Snapshot is a REPEATABLE READ transaction that has taken its snapshot and stays open:
// it pins the server's xmin horizon, as a forgotten transaction does in production.
type Snapshot struct {
	// Tx is the open transaction.
	Tx pgx.Tx
	// PID is its backend's process id.
	PID int64
	// Began was read before BEGIN: the server dates the transaction from BEGIN, so its
	// age is at most time.Since(Began), where a clock read after BEGIN could lag it.
	Began time.Time
}

// HoldSnapshot opens a connection of its own on db's schema, named application
// (application_name, which health reports show), and holds a Snapshot on it until the
// test ends; the transaction is rolled back before the schema is dropped.
func HoldSnapshot(tb testing.TB, db *pgtest.DB, application string) Snapshot {
	tb.Helper()
	ctx := context.Background()
	cfg := db.Pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = application
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("healthtest: connect %s: %v", application, err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	s := Snapshot{Began: time.Now()}
	if s.Tx, err = conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}); err != nil {
		tb.Fatalf("healthtest: begin %s: %v", application, err)
	}
	tb.Cleanup(func() { _ = s.Tx.Rollback(context.Background()) })
	if err := s.Tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&s.PID); err != nil { // takes the snapshot
		tb.Fatalf("healthtest: snapshot %s: %v", application, err)
	}
	return s
}
