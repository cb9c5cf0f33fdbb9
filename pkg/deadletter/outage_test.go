package deadletter_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// outageConsumer is the real webhook on the outbox's database (so the relay sees its
// commits), behind a switch that makes it answer 500 to everything: the consumer's outage.
type outageConsumer struct {
	*httptest.Server
	down     atomic.Bool
	attempts atomic.Int64
	// poisonFixed: the poison event's handler stops rejecting it (a fix was deployed).
	poisonFixed atomic.Bool

	mu      sync.Mutex
	applied []appliedEvent
}

type appliedEvent struct {
	key     string
	id, gen int
	at      time.Time
}

func newOutageConsumer(t *testing.T, db *pgtest.DB, poison string) *outageConsumer {
	t.Helper()
	c := &outageConsumer{}
	c.Server = httptest.NewUnstartedServer(nil)
	handler := func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		if d.MessageID == poison && !c.poisonFixed.Load() {
			return webhook.Permanent(errors.New("poison: the handler cannot apply this event"))
		}
		id, _ := strconv.Atoi(d.MessageID)
		c.mu.Lock()
		c.applied = append(c.applied, appliedEvent{key: d.Headers.Get("X-Partition-Key"), id: id, gen: d.Generation, at: time.Now()})
		c.mu.Unlock()
		return nil
	}
	wh, err := webhook.New(webhook.Config{Pool: db.Pool, Verifier: verifier(t), Handlers: webhook.Handlers{"order.created": handler},
		PublicBaseURL: "http://" + c.Listener.Addr().String(), Logger: quiet(), SharesOutbox: true})
	if err != nil {
		t.Fatal(err)
	}
	c.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.attempts.Add(1)
		if c.down.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		wh.ServeHTTP(w, r)
	})
	c.Start()
	t.Cleanup(c.Close)
	return c
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConsumerOutageCostsAWait is the whole path under a consumer outage: the real relay,
// publisher, local QStash (its backoff scaled to nothing, so every ladder runs out at
// once), failure callback and webhook. While the consumer is down no event is
// dead-lettered: each final failure reopens its event, the topic's circuit opens, and the
// relay holds the events in the outbox, probing. When the consumer is back, every event
// is applied, in key order in fifo mode; the one poison event among them is dead-lettered
// exactly once, and redriven after its fix it is delivered under a new deduplication id.
func TestConsumerOutageCostsAWait(t *testing.T) {
	t.Parallel()
	for _, mode := range []publish.Ordering{publish.OrderingFIFO, publish.OrderingPublish} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			qs := qstashtest.NewTestServer(t, qstashtest.Options{})

			callbackSrv := httptest.NewUnstartedServer(nil)
			callbackURL := "http://" + callbackSrv.Listener.Addr().String() + "/failure"
			callbackSrv.Config.Handler = newCallbackHandler(t, db, func(c *deadletter.CallbackConfig) {
				c.FailureURL = callbackURL
				c.Probes = deadletter.ProbeSchedule{Wait: 20 * time.Millisecond, MaxWait: 200 * time.Millisecond}
			})
			callbackSrv.Start()
			t.Cleanup(callbackSrv.Close)

			const keys, perKey = 5, 8
			var evs []outbox.Event
			for i := range keys * perKey {
				key := fmt.Sprintf("k%d", i%keys)
				evs = append(evs, outbox.Event{Topic: "order.created", PartitionKey: key, Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, i)),
					Headers: map[string]string{"X-Partition-Key": key}})
			}
			evs = append(evs, outbox.Event{Topic: "order.created", PartitionKey: "poison", Payload: json.RawMessage(`{"seq":-1}`),
				Headers: map[string]string{"X-Partition-Key": "poison"}})
			ids, err := outbox.EnqueueBatch(ctx, db.Pool, evs)
			if err != nil {
				t.Fatal(err)
			}
			poison := ids[len(ids)-1]
			cons := newOutageConsumer(t, db, poison.String())
			cons.down.Store(true)

			pub, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: cons.URL,
				FailureCallbackURL: callbackURL, Ordering: mode, FIFOQueues: 3})
			if err != nil {
				t.Fatal(err)
			}
			r, err := relay.New(db.Pool, pub, relay.Config{BatchSize: 16, Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			relayDone := make(chan struct{})
			go func() { // the relay's schedule: a drain every few milliseconds
				defer close(relayDone)
				for ctx.Err() == nil {
					_, _ = r.Drain(ctx)
					time.Sleep(10 * time.Millisecond)
				}
			}()
			defer func() { cancel(); <-relayDone }()

			count := func(sql string, args ...any) int { return db.Count(t, sql, args...) }
			t.Cleanup(func() {
				if !t.Failed() {
					return
				}
				for _, q := range []string{
					`SELECT topic, failures, probe_failures, probe_id, probe_at - now(), probe_sent_at FROM outbox_circuits`,
					`SELECT dispatched_at IS NOT NULL, dead_lettered_at IS NOT NULL, last_error, count(*), min(generation), max(generation), max(available_at - now()) FROM outbox GROUP BY 1, 2, 3`,
					`SELECT outbox_id, error, resolved_at IS NOT NULL FROM dead_letters`,
				} {
					rows, _ := db.Pool.Query(context.Background(), q)
					for rows.Next() {
						v, _ := rows.Values()
						t.Logf("%v", v)
					}
				}
				cons.mu.Lock()
				t.Logf("applied %d, attempts %d", len(cons.applied), cons.attempts.Load())
				cons.mu.Unlock()
			})
			// The outage: QStash's ladders run out, the circuit opens, probes fail, and the
			// backlog ends up in the outbox (at most the probe in flight is in QStash).
			waitFor(t, "the outage absorbed by the outbox", time.Minute, func() bool {
				return count(`SELECT count(*) FROM outbox_circuits WHERE probe_failures >= 2`) == 1 &&
					count(`SELECT count(*) FROM outbox WHERE dispatched_at IS NOT NULL`) <= 1
			})
			// Resolved superseded letters are history (a failed delivery of a generation its
			// event has left); a dead letter is open.
			if n := count(`SELECT count(*) FROM dead_letters WHERE resolved_at IS NULL`); n != 0 {
				t.Fatalf("%d events dead-lettered by the outage", n)
			}

			cons.down.Store(false)
			waitFor(t, "every event applied after the recovery", time.Minute, func() bool {
				cons.mu.Lock()
				defer cons.mu.Unlock()
				return len(cons.applied) == keys*perKey && count(`SELECT count(*) FROM outbox_circuits`) == 0 &&
					count(`SELECT count(*) FROM outbox WHERE id = $1 AND dead_lettered_at IS NOT NULL`, poison) == 1
			})
			if n := count(`SELECT count(*) FROM dead_letters WHERE outbox_id = $1 AND resolved_at IS NULL`, poison); n != 1 {
				t.Fatalf("poison event has %d open letters, want exactly 1", n)
			}
			if n := count(`SELECT count(*) FROM dead_letters WHERE resolved_at IS NULL OR resolution <> 'superseded'`); n != 1 {
				t.Fatalf("%d letters, want the poison's only", n)
			}
			cons.mu.Lock()
			last := map[string]int{}
			for _, a := range cons.applied {
				if mode == publish.OrderingFIFO && a.id <= last[a.key] {
					t.Fatalf("key %s: event %d applied after %d", a.key, a.id, last[a.key])
				}
				last[a.key] = a.id
			}
			cons.mu.Unlock()
			t.Logf("%s: %d consumer attempts for %d events", mode, cons.attempts.Load(), len(ids))

			// The poison's fix is deployed; the redrive sends it under a new generation.
			cons.poisonFixed.Store(true)
			if _, err := deadletter.Redrive(ctx, db.Pool, deadletter.Filter{All: true}, nil); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the redriven poison event applied", 30*time.Second, func() bool {
				cons.mu.Lock()
				defer cons.mu.Unlock()
				return len(cons.applied) == keys*perKey+1
			})
			cons.mu.Lock()
			got := cons.applied[len(cons.applied)-1]
			cons.mu.Unlock()
			if got.id != int(poison) || got.gen < 1 {
				t.Fatalf("last applied %+v, want the poison %d at a later generation", got, poison)
			}
		})
	}
}
