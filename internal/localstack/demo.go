package localstack

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// Demo tables live in the stack's own schema next to the migrated ones. demo_effects has no
// unique constraint on purpose: a second application of one event would show up as a
// second row, so "applied exactly once" is measured, not assumed.
const qDemoSchema = `
CREATE TABLE IF NOT EXISTS demo_orders (
    id            text PRIMARY KEY,
    customer      text NOT NULL,
    amount_cents  bigint NOT NULL,
    poison        boolean NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS demo_effects (
    seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox_id     bigint NOT NULL,
    partition_key text NOT NULL,
    applied_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);`

// CreateDemoTables creates the demo's business and effect tables and the example
// consumer's (examples/orders).
func CreateDemoTables(ctx context.Context, db *pgxpool.Pool) error {
	if err := orders.Migrate(ctx, db); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, qDemoSchema); err != nil {
		return fmt.Errorf("create demo tables: %w", err)
	}
	return nil
}

// DemoHandler is the example order.created handler plus an effect row per application, in
// the same transaction, so the summary can count applications per event.
func DemoHandler(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
	if err := orders.OrderCreated(ctx, tx, d); err != nil {
		return err
	}
	key := d.Headers.Get("X-Partition-Key")
	if _, err := tx.Exec(ctx, `INSERT INTO demo_effects (outbox_id, partition_key) VALUES ($1::bigint, $2)`, d.MessageID, key); err != nil {
		return fmt.Errorf("record demo effect: %w", err)
	}
	return nil
}

// ProducerConfig shapes the demo load.
type ProducerConfig struct {
	// Events is how many orders (and events) to write.
	Events int
	// Rate is events per second; 0 means as fast as the database takes them.
	Rate float64
	// Keys is how many customers (partition keys) the orders spread over.
	Keys int
	// PoisonPercent: exactly floor(Events*PoisonPercent/100) events carry an amount of 0,
	// which the order.created handler rejects as permanent; they are spread across keys.
	PoisonPercent float64
	// OnProduced is called after each committed order (progress).
	OnProduced func(n int)
	// Tracer, when set, wraps each business transaction in a "place order" span, as a
	// traced service would; Enqueue records it in the event's headers.
	Tracer trace.Tracer
	// Waker, when set, is kicked after each commit (outbox.BeginFunc).
	Waker outbox.Waker
}

// PoisonCount is the exact number of poison events a config produces.
func (c ProducerConfig) PoisonCount() int {
	return int(float64(c.Events) * c.PoisonPercent / 100)
}

// poisonSet picks PoisonCount distinct event indices, one in each of PoisonCount equal
// slices of the sequence, shifted within its slice so consecutive poison events land on
// different keys (an unshifted stride that is a multiple of Keys would hit one key only).
func (c ProducerConfig) poisonSet() map[int]bool {
	p := c.PoisonCount()
	set := make(map[int]bool, p)
	if p == 0 {
		return set
	}
	gap := c.Events / p
	for j := 0; j < p; j++ {
		set[j*c.Events/p+j%gap] = true
	}
	return set
}

// Produce writes each order and its event in one business transaction.
func Produce(ctx context.Context, db *pgxpool.Pool, cfg ProducerConfig) (int, error) {
	if cfg.Keys < 1 {
		cfg.Keys = 1
	}
	var tick *time.Ticker
	if cfg.Rate > 0 {
		tick = time.NewTicker(time.Duration(float64(time.Second) / cfg.Rate))
		defer tick.Stop()
	}
	poisonAt := cfg.poisonSet()
	for i := 0; i < cfg.Events; i++ {
		if tick != nil {
			select {
			case <-ctx.Done():
				return i, ctx.Err()
			case <-tick.C:
			}
		} else if ctx.Err() != nil {
			return i, ctx.Err()
		}
		orderID := fmt.Sprintf("o-%07d", i)
		customer := fmt.Sprintf("customer-%d", i%cfg.Keys)
		poison := poisonAt[i]
		amount := int64(1000 + i%5000)
		if poison {
			amount = 0
		}
		payload, _ := json.Marshal(map[string]any{"order_id": orderID, "amount_cents": amount, "currency": "EUR", "customer": customer})
		err := placeOrder(ctx, db, cfg, orderID, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO demo_orders (id, customer, amount_cents, poison) VALUES ($1, $2, $3, $4)`, orderID, customer, amount, poison); err != nil {
				return err
			}
			_, err := outbox.Enqueue(ctx, tx, outbox.Event{
				Topic:        "order.created",
				PartitionKey: customer,
				Payload:      payload,
				Headers:      map[string]string{"X-Partition-Key": customer, "X-Correlation-Id": orderID},
			})
			return err
		})
		if err != nil {
			return i, fmt.Errorf("produce order %s: %w", orderID, err)
		}
		if cfg.OnProduced != nil {
			cfg.OnProduced(i + 1)
		}
	}
	return cfg.Events, nil
}

// placeOrder runs one business transaction, inside a "place order" span when cfg.Tracer is
// set, and kicks cfg.Waker after its commit.
func placeOrder(ctx context.Context, db *pgxpool.Pool, cfg ProducerConfig, orderID string, fn func(context.Context, pgx.Tx) error) error {
	if cfg.Tracer != nil {
		var span trace.Span
		ctx, span = cfg.Tracer.Start(ctx, "place order", trace.WithAttributes(attribute.String("demo.order_id", orderID)))
		defer span.End()
	}
	return outbox.BeginFunc(ctx, db, cfg.Waker, func(tx pgx.Tx) error { return fn(ctx, tx) })
}
