package e2e_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/retention"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// documentedGrants returns the GRANT statements docs/deploy.md gives the functions' user,
// outbox_app, for role instead.
func documentedGrants(t *testing.T, role string) []string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	var grants []string
	for line := range strings.Lines(string(doc)) {
		if stmt, ok := strings.CutSuffix(strings.TrimSpace(line), " TO outbox_app;"); ok && strings.HasPrefix(stmt, "GRANT ") {
			grants = append(grants, stmt+" TO "+role)
		}
	}
	if len(grants) == 0 {
		t.Fatal("docs/deploy.md: no `GRANT ... TO outbox_app;` lines; where did the application user's grants go?")
	}
	return grants
}

// appPool connects to db's schema as a new login role that holds only the grants of
// docs/deploy.md (and USAGE on the test's schema, which public has by default).
func appPool(t *testing.T, db *pgtest.DB) *pgxpool.Pool {
	t.Helper()
	ctx := t.Context()
	role, password := "app_"+db.Schema, rand.Text()
	if _, err := db.Pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD '"+password+"'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// After the pool's cleanup (registered later, run first); the schema is dropped
		// after this, and the role, cluster-wide, must go by hand.
		if _, err := db.Pool.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE IF EXISTS "+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	stmts := append([]string{"GRANT USAGE ON SCHEMA " + db.Schema + " TO " + role}, documentedGrants(t, role)...)
	for _, stmt := range stmts {
		if _, err := db.Pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password, cfg.MaxConns = role, password, 12
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var super bool
	if err := pool.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil || super {
		t.Fatalf("the application role is a superuser (%v) or cannot log in: %v", super, err)
	}
	return pool
}

// TestDocumentedGrantsRunThePipeline: a role with only the grants docs/deploy.md lists
// produces in a transaction, claims, publishes and marks, receives (and checks a legacy
// delivery), records a dead letter from the failure callback, redrives it and runs retention. Migration 0016's sequence,
// which every claim reads, was once missing from that list.
func TestDocumentedGrantsRunThePipeline(t *testing.T) {
	t.Parallel()
	s := &stack{db: pgtest.New(t)}
	ctx := t.Context()
	if err := orders.Migrate(ctx, s.db.Pool); err != nil {
		t.Fatal(err)
	}
	app := appPool(t, s.db)
	var fixed atomic.Bool
	s.start(t, app, webhook.Handlers{"order.created": func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		if strings.Contains(string(d.Payload), "o-poison") && !fixed.Load() {
			return webhook.Permanent(errors.New("customer is blocked"))
		}
		return orders.OrderCreated(ctx, tx, d)
	}}, 3, nil)

	first := orderEvent("o-1", 100)
	var ids []outbox.ID
	if err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) (err error) {
		ids, err = outbox.EnqueueBatch(ctx, tx, []outbox.Event{first, orderEvent("o-poison", 200)})
		return err
	}); err != nil {
		t.Fatalf("enqueue as the application role: %v", err)
	}
	if st := s.deliver(t); st.Dispatched != 2 {
		t.Fatalf("drain as the application role: %+v", st)
	}
	// A delivery published before the identity moved into the URL (migration 0007) is
	// checked against legacy_identity.
	legacy := webhook.LegacyDelivery{Identity: qstash.Identity{OutboxID: ids[0]}, Topic: first.Topic, Payload: first.Payload}
	if _, err := webhook.LegacyOutbox(app)(ctx, legacy); err != nil {
		t.Fatalf("legacy identity check as the application role: %v", err)
	}
	letters, err := deadletter.List(ctx, app, deadletter.Filter{})
	if err != nil || len(letters) != 1 {
		t.Fatalf("letters %+v, %v; want the poison event's", letters, err)
	}
	fixed.Store(true)
	if res, err := deadletter.Redrive(ctx, app, deadletter.Filter{IDs: []int64{letters[0].ID}}, nil); err != nil || len(res.Redriven) != 1 {
		t.Fatalf("redrive as the application role: %+v, %v", res, err)
	}
	if st := s.deliver(t); st.Dispatched != 1 {
		t.Fatalf("drain after the redrive: %+v", st)
	}
	if n := s.count(t, `SELECT count(*) FROM billing_charges`); n != 2 {
		t.Fatalf("%d charges, want 2", n)
	}
	later := time.Now().Add(30 * 24 * time.Hour) // past both retention horizons
	res, err := retention.Run(ctx, app, retention.Config{Now: func() time.Time { return later }, Logger: quiet()})
	if err != nil || res.OutboxDeleted != 2 || res.ProcessedDeleted != 2 {
		t.Fatalf("retention as the application role: %+v, %v", res, err)
	}
}
