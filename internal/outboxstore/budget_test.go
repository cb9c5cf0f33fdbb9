package outboxstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
)

// The byte budget cuts a claim after the rows whose payloads fill it, keeps every key's
// events in order, says More so the drain goes on, and still moves one event larger than
// the budget; every event is claimed once.
func TestClaimByteBudget(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	// 20 events of ~1 kB over 5 keys: small enough to be stored uncompressed.
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO outbox (topic, partition_key, payload, available_at)
SELECT 'test.event', 'k-' || (g % 5), jsonb_build_object('pad', repeat('x', 1000)), now() - interval '1 hour' + g * interval '1 millisecond'
FROM generate_series(1, 20) g`); err != nil {
		t.Fatal(err)
	}
	s := outboxstore.NewStore(db.Pool)
	claim := func(maxBytes int64) outboxstore.Claimed {
		t.Helper()
		lease, err := outboxstore.NewLease()
		if err != nil {
			t.Fatal(err)
		}
		c, err := s.Claim(ctx, outboxstore.ClaimRequest{Lease: lease, Rows: 100, KeyRun: 4, MaxBytes: maxBytes, For: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	seen := map[outbox.ID]bool{}
	last := map[string]outbox.ID{}
	record := func(c outboxstore.Claimed) {
		t.Helper()
		var bytes int64
		for _, m := range c.Messages {
			if seen[m.ID] || m.ID < last[m.PartitionKey] {
				t.Fatalf("event %d claimed twice or out of its key's order", m.ID)
			}
			seen[m.ID], last[m.PartitionKey] = true, m.ID
			bytes += int64(len(m.Payload))
		}
		if bytes != c.Bytes {
			t.Fatalf("Bytes %d, payloads %d", c.Bytes, bytes)
		}
	}
	// 3,500 bytes hold three of the ~1,012-byte payloads and start a fourth.
	for i := 0; i < 5; i++ {
		c := claim(3500)
		record(c)
		// The last four fit without a cut.
		if cut := i < 4; c.Len() != 4 || c.BytesCut != cut || c.More != cut || c.Bytes > 3500+1100 {
			t.Fatalf("claim %d: %d rows, %d bytes, cut %v, more %v; want 4 rows, cut and more %v", i, c.Len(), c.Bytes, c.BytesCut, c.More, cut)
		}
	}
	if len(seen) != 20 {
		t.Fatalf("%d of 20 claimed", len(seen))
	}

	// One event over the budget still moves, alone (hex digits: Postgres cannot compress
	// them, so the stored size is the size).
	if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox (topic, partition_key, payload) VALUES
		('test.event', 'big', jsonb_build_object('pad', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 160) i))),
		('test.event', 'after', '{}')`); err != nil {
		t.Fatal(err)
	}
	c := claim(1000)
	record(c)
	if c.Len() != 1 || c.Bytes < 5000 || !c.More {
		t.Fatalf("over-budget event: %d rows, %d bytes, more %v; want it alone, more", c.Len(), c.Bytes, c.More)
	}
	c = claim(1000)
	record(c)
	if c.Len() != 1 || c.BytesCut || c.Messages[0].PartitionKey != "after" {
		t.Fatalf("the event after it: %d rows, cut %v", c.Len(), c.BytesCut)
	}
}
