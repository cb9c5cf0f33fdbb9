package qstash_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/localqstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// TestRelayDrainsThroughQStash is the end-to-end path: real outbox rows in Postgres, the
// relay engine, this Publisher, the local QStash server with failing first deliveries, and
// a webhook endpoint that verifies every signature. Every event arrives; in FIFO mode each
// key's events arrive in id order.
func TestRelayDrainsThroughQStash(t *testing.T) {
	t.Parallel()
	for _, mode := range []publish.Ordering{publish.OrderingFIFO, publish.OrderingPublish} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			ctx := context.Background()
			const keys, perKey = 20, 25
			var evs []outbox.Event
			for i := 0; i < keys*perKey; i++ {
				key := fmt.Sprintf("customer-%d", i%keys)
				payload, _ := json.Marshal(map[string]any{"order_id": fmt.Sprintf("o-%d", i), "seq": i})
				evs = append(evs, outbox.Event{Topic: "order.created", PartitionKey: key, Payload: payload,
					Headers: map[string]string{"X-Partition-Key": key, "X-Correlation-Id": fmt.Sprintf("c-%d", i)}})
			}
			ids, err := outbox.EnqueueBatch(ctx, db.Pool, evs)
			if err != nil {
				t.Fatal(err)
			}
			cons := newConsumer(t, failFirst30(5))
			srv := qstashtest.NewTestServer(t, qstashtest.Options{Faults: qstashtest.Faults{DelayRate: 0.2, MaxDelay: 2 * time.Millisecond}})
			cfg := qstash.PublisherConfig{
				BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: cons.URL + "/", Ordering: mode, FIFOQueues: 4,
			}
			if mode == publish.OrderingPublish {
				cfg.FlowControlParallelism = 4
			}
			pub := newPublisher(t, cfg)
			r, err := relay.New(db.Pool, pub, relay.Config{BatchSize: 100, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			st, err := r.Drain(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Dispatched != len(ids) || st.DeadLettered != 0 {
				t.Fatalf("drain stats %+v, want %d dispatched", st, len(ids))
			}
			var left int
			if err := db.Pool.QueryRow(ctx, `select count(*) from outbox where dispatched_at is null`).Scan(&left); err != nil || left != 0 {
				t.Fatalf("%d rows undispatched (%v)", left, err)
			}
			localqstash.WaitIdle(t, srv)
			got, bad := cons.snapshot()
			if len(bad) > 0 || len(got) != len(ids) {
				t.Fatalf("%d accepted of %d, bad signatures %v", len(got), len(ids), bad)
			}
			msgs := make([]outbox.Message, len(ids))
			for i, id := range ids {
				msgs[i] = outbox.Message{ID: id}
			}
			if mode == publish.OrderingFIFO {
				checkPerKeyOrder(t, got, msgs)
			}
		})
	}
}
