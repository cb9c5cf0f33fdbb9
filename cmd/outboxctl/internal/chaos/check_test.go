package chaos_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/chaos"
	"github.com/outbox-relay/outbox-relay/v3/internal/localstack"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// TestCheckerCatchesViolations: the checker is only worth its zeros if it counts what it
// claims to. A database with one event of each broken kind yields exactly those counts.
func TestCheckerCatchesViolations(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	if err := localstack.CreateDemoTables(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	_, err := db.Pool.Exec(ctx, `
INSERT INTO demo_orders (id, customer, amount_cents, poison) VALUES
  ('ok', 'k1', 1, false), ('twice', 'k1', 1, false), ('lost', 'k2', 1, false),
  ('poison-dl', 'k2', 0, true), ('poison-applied', 'k3', 0, true), ('healthy-dl', 'k3', 1, false),
  ('late', 'k4', 1, false), ('early', 'k4', 1, false), ('no-event', 'k5', 1, false);
INSERT INTO outbox (id, topic, partition_key, payload, dispatched_at) OVERRIDING SYSTEM VALUE VALUES
  (1, 'order.created', 'k1', '{"order_id":"ok"}', now()),
  (2, 'order.created', 'k1', '{"order_id":"twice"}', now()),
  (3, 'order.created', 'k2', '{"order_id":"lost"}', NULL),
  (4, 'order.created', 'k2', '{"order_id":"poison-dl"}', now()),
  (5, 'order.created', 'k3', '{"order_id":"poison-applied"}', now()),
  (6, 'order.created', 'k3', '{"order_id":"healthy-dl"}', now()),
  (7, 'order.created', 'k4', '{"order_id":"early"}', now()),
  (8, 'order.created', 'k4', '{"order_id":"late"}', now()),
  (9, 'order.created', 'k9', '{"order_id":"orphan"}', now());
INSERT INTO demo_effects (outbox_id, partition_key) VALUES
  (1, 'k1'), (2, 'k1'), (2, 'k1'), (5, 'k3'), (8, 'k4'), (7, 'k4'), (9, 'k9'), (99, 'k9');
INSERT INTO dead_letters (source, outbox_id, topic, partition_key, payload, headers, error, attempts, generation) VALUES
  ('delivery', 4, 'order.created', 'k2', '{}', '{}', 'poison', 1, 0),
  ('delivery', 6, 'order.created', 'k3', '{}', '{}', 'x', 1, 0),
  ('relay', 6, 'order.created', 'k3', '{}', '{}', 'x', 1, 1);`) // two open letters of one generation are refused by the schema (dead_letters_one_open_idx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := chaos.Check(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	want := chaos.Counts{Events: 9, AppliedOnce: 5, AppliedMoreThanOnce: 1, Lost: 1, Poison: 2, PoisonDeadLettered: 1,
		NonPoisonDeadLettered: 1, PoisonApplied: 1, DuplicateDeadLetters: 1, PendingLeft: 1, EventsWithoutOrder: 1,
		OrdersWithoutEvent: 1, PhantomEffects: 1, OrderViolations: 1}
	if c != want {
		t.Fatalf("Check =\n%+v\nwant\n%+v", c, want)
	}
	v := strings.Join(c.Violations(9, 2, true), "\n")
	for _, s := range []string{"applied_more_than_once", "lost", "poison_dead_lettered", "non_poison_dead_lettered", "poison_applied",
		"duplicate_dead_letters", "pending_left", "events_without_order", "orders_without_event", "phantom_effects", "order_violations"} {
		if !strings.Contains(v, s+":") {
			t.Errorf("violations lack %s:\n%s", s, v)
		}
	}
	if strings.Contains(strings.Join(c.Violations(9, 2, false), "\n"), "order_violations") {
		t.Error("order is checked in publish ordering")
	}
}
