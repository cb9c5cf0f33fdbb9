package relay_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// The payloads being published at once stay within MaxInFlightBytes (plus the one event a
// claim may take past its budget), though PublishConcurrency would allow eight batches,
// and batches the byte budget cut short do not end the drain: every event goes out once.
func TestDrainBoundsBytesInFlight(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// 60 events of ~1,012 bytes, one key each.
	outboxtest.Exec(t, db.Pool, `
INSERT INTO outbox (topic, partition_key, payload)
SELECT 'order.created', 'k-' || g, jsonb_build_object('pad', repeat('x', 1000)) FROM generate_series(1, 60) g`)
	const batchBytes, inFlightBytes, event = 2500, 5000, 1012
	var mu sync.Mutex
	var cur, peak int64
	pub := &fakePublisher{before: func(ctx context.Context, msgs []outbox.Message) {
		var n int64
		for _, m := range msgs {
			n += int64(len(m.Payload))
		}
		mu.Lock()
		cur += n
		peak = max(peak, cur)
		mu.Unlock()
		// Held long enough for the drain to claim again if the budget let it.
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
		mu.Lock()
		cur -= n
		mu.Unlock()
	}}
	cfg := relay.Config{BatchSize: 100, PublishConcurrency: 8, MaxBatchBytes: batchBytes, MaxInFlightBytes: inFlightBytes}
	st := drain(t.Context(), t, newRelay(t, db, pub, cfg))
	if st.Dispatched != 60 || len(pub.log) != 60 {
		t.Fatalf("dispatched %d, published %d; want 60", st.Dispatched, len(pub.log))
	}
	if peak > inFlightBytes+event {
		t.Errorf("%d payload bytes published at once, over the %d-byte budget and one event", peak, inFlightBytes)
	}
	if peak < inFlightBytes/2 {
		t.Errorf("at most %d payload bytes published at once: batches did not overlap", peak)
	}
}
