package outboxstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// BenchmarkClaim measures one claim of 1,000 rows (8 batches in flight, the relay's
// defaults) over 1,000 keys with ~300-byte payloads: the normal case, which the byte
// budget must not slow.
func BenchmarkClaim(b *testing.B) {
	const batch, rows = 1000, 20_000
	db := pgtest.New(b)
	ctx := context.Background()
	s := outboxstore.NewStore(db.Pool)
	load := func() {
		if _, err := db.Pool.Exec(ctx, `TRUNCATE outbox`); err != nil {
			b.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `
INSERT INTO outbox (topic, partition_key, payload, available_at)
SELECT 'order.created', 'cust-' || (g % 1000),
       jsonb_build_object('order_id', 'ord-' || g, 'amount_cents', g % 10000, 'currency', 'EUR', 'note', repeat('x', 220)),
       now() - interval '1 hour' + g * interval '1 millisecond'
FROM generate_series(1, $1::int) g`, rows); err != nil {
			b.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE outbox`); err != nil {
			b.Fatal(err)
		}
	}
	left := 0
	for b.Loop() {
		if left < batch {
			b.StopTimer()
			load()
			left = rows
			b.StartTimer()
		}
		lease, err := outboxstore.NewLease()
		if err != nil {
			b.Fatal(err)
		}
		c, err := s.Claim(ctx, outboxstore.ClaimRequest{Lease: lease, Rows: batch, KeyRun: 8, For: time.Minute})
		if err != nil || c.Len() == 0 {
			b.Fatalf("claimed %d: %v", c.Len(), err)
		}
		left -= c.Len()
		// Marked untimed, so the keys are free for the next claim, as in a drain.
		b.StopTimer()
		ids := make([]outbox.ID, len(c.Messages))
		for i, m := range c.Messages {
			ids[i] = m.ID
		}
		if _, err := s.MarkDispatched(ctx, lease, ids, nil); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
