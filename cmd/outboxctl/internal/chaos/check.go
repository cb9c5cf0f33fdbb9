package chaos

import (
	"context"
	"fmt"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// Counts is what the checker reads from the database after a run.
type Counts struct {
	// Events are the committed outbox rows.
	Events int64 `json:"events"`
	// AppliedOnce and AppliedMoreThanOnce count events by their demo_effects rows.
	AppliedOnce         int64 `json:"applied_once"`
	AppliedMoreThanOnce int64 `json:"applied_more_than_once"`
	// Lost events were neither applied nor dead-lettered.
	Lost                  int64 `json:"lost"`
	Poison                int64 `json:"poison"`
	PoisonDeadLettered    int64 `json:"poison_dead_lettered"`
	NonPoisonDeadLettered int64 `json:"non_poison_dead_lettered"`
	// PoisonApplied: a poison event's side effect committed (its handler failed, so the
	// transaction must have rolled back).
	PoisonApplied int64 `json:"poison_applied"`
	// DuplicateDeadLetters: events with more than one dead letter.
	DuplicateDeadLetters int64 `json:"duplicate_dead_letters"`
	// PendingLeft are outbox rows not finished at the end; LeasesLeft dispatched rows that
	// still carry a lease (a mark that did not clear it).
	PendingLeft int64 `json:"pending_left"`
	LeasesLeft  int64 `json:"leases_left"`
	// StaleLeasesOnDeadLetters are rows QStash's failure callback dead-lettered while a
	// relay that published them and then died still held their lease. The token is inert
	// (the row is finished, and a redrive clears it); reported, not a violation.
	StaleLeasesOnDeadLetters int64 `json:"stale_leases_on_dead_letters"`
	// EventsWithoutOrder and OrdersWithoutEvent break the outbox's atomicity with the
	// business write; PhantomEffects are applications of events that never committed
	// (the producers' rolled-back transactions).
	EventsWithoutOrder int64 `json:"events_without_order"`
	OrdersWithoutEvent int64 `json:"orders_without_event"`
	PhantomEffects     int64 `json:"phantom_effects"`
	// OrderViolations: an application of a key's event after a later event of that key.
	// Checked in fifo ordering only (publish ordering promises no order).
	OrderViolations int64 `json:"order_violations"`
}

// Check reads the invariants' counts from the database db points at.
func Check(ctx context.Context, db outbox.Querier) (Counts, error) {
	var c Counts
	err := db.QueryRow(ctx, qCheck).Scan(&c.Events, &c.AppliedOnce, &c.AppliedMoreThanOnce, &c.Lost,
		&c.Poison, &c.PoisonDeadLettered, &c.NonPoisonDeadLettered, &c.PoisonApplied, &c.DuplicateDeadLetters,
		&c.PendingLeft, &c.LeasesLeft, &c.StaleLeasesOnDeadLetters, &c.EventsWithoutOrder, &c.PhantomEffects, &c.OrdersWithoutEvent, &c.OrderViolations)
	if err != nil {
		return c, fmt.Errorf("check chaos invariants: %w", err)
	}
	return c, nil
}

// Violations lists every broken invariant. wantEvents and wantPoison are what the
// producers committed (negative: unknown, not checked); checkOrder is false in publish
// ordering.
func (c Counts) Violations(wantEvents, wantPoison int64, checkOrder bool) []string {
	var v []string
	must := func(ok bool, format string, args ...any) {
		if !ok {
			v = append(v, fmt.Sprintf(format, args...))
		}
	}
	if wantEvents >= 0 {
		must(c.Events == wantEvents, "events: %d committed outbox rows, the producers committed %d", c.Events, wantEvents)
	}
	if wantPoison >= 0 {
		must(c.Poison == wantPoison, "poison: %d poison events in the database, the producers committed %d", c.Poison, wantPoison)
	}
	must(c.AppliedMoreThanOnce == 0, "applied_more_than_once: %d events were applied more than once", c.AppliedMoreThanOnce)
	must(c.Lost == 0, "lost: %d events were neither applied nor dead-lettered", c.Lost)
	must(c.PoisonDeadLettered == c.Poison, "poison_dead_lettered: %d of %d poison events dead-lettered", c.PoisonDeadLettered, c.Poison)
	must(c.NonPoisonDeadLettered == 0, "non_poison_dead_lettered: %d healthy events dead-lettered", c.NonPoisonDeadLettered)
	must(c.PoisonApplied == 0, "poison_applied: %d poison events left a side effect", c.PoisonApplied)
	must(c.DuplicateDeadLetters == 0, "duplicate_dead_letters: %d events have more than one dead letter", c.DuplicateDeadLetters)
	must(c.PendingLeft == 0, "pending_left: %d outbox rows never finished", c.PendingLeft)
	must(c.LeasesLeft == 0, "leases_left: %d dispatched outbox rows still carry a lease", c.LeasesLeft)
	must(c.EventsWithoutOrder == 0, "events_without_order: %d events committed without their business row", c.EventsWithoutOrder)
	must(c.OrdersWithoutEvent == 0, "orders_without_event: %d business rows committed without their event", c.OrdersWithoutEvent)
	must(c.PhantomEffects == 0, "phantom_effects: %d applications of events that never committed", c.PhantomEffects)
	if checkOrder {
		must(c.OrderViolations == 0, "order_violations: %d per-key order violations", c.OrderViolations)
	}
	return v
}
