package deadletter_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// TestConsumerOutageScenario measures a consumer outage (issue 43), when OUTAGE_SCENARIO
// is set (it runs for minutes): events at OUTAGE_RATE a second (default 50) over 20 keys,
// the consumer (the real webhook, sharing the outbox's database) answering 500 to
// everything for OUTAGE_MINUTES production minutes (default 10), in OUTAGE_ORDERING
// (publish or fifo), with QSTASH_RETRY_DELAY OUTAGE_RETRY_DELAY (default 20s; "default"
// for QStash's backoff). Time is production-equivalent: the local QStash's backoff runs 20x
// faster (TimeScale 0.05), and so do the outage, the retry delay and the circuit's probe
// schedule; the relay's own latencies (claim, publish, its one-second circuit refresh)
// and the drain's throughput are real, so they count 20x in the figures.
func TestConsumerOutageScenario(t *testing.T) {
	if os.Getenv("OUTAGE_SCENARIO") == "" {
		t.Skip("set OUTAGE_SCENARIO=1 to measure a consumer outage (minutes)")
	}
	const scale = 0.05
	real := func(prod time.Duration) time.Duration { return time.Duration(float64(prod) * scale) }
	prod := func(real time.Duration) time.Duration { return time.Duration(float64(real) / scale) }
	minutes, _ := strconv.Atoi(os.Getenv("OUTAGE_MINUTES"))
	minutes = max(minutes, 1)
	if os.Getenv("OUTAGE_MINUTES") == "" {
		minutes = 10
	}
	rate, _ := strconv.Atoi(os.Getenv("OUTAGE_RATE"))
	if rate <= 0 {
		rate = 50
	}
	mode := publish.Ordering(os.Getenv("OUTAGE_ORDERING"))
	if mode == "" {
		mode = publish.OrderingPublish
	}
	retryDelay := 20 * time.Second
	switch v := os.Getenv("OUTAGE_RETRY_DELAY"); v {
	case "":
	case "default":
		retryDelay = 0
	default:
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		retryDelay = d
	}

	db := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	qs := qstashtest.NewTestServer(t, qstashtest.Options{TimeScale: scale})
	var callbacks atomic.Int64
	callbackSrv := httptest.NewUnstartedServer(nil)
	callbackURL := "http://" + callbackSrv.Listener.Addr().String() + "/failure"
	cb := newCallbackHandler(t, db, func(c *deadletter.CallbackConfig) {
		c.FailureURL = callbackURL
		c.Probes = deadletter.ProbeSchedule{Wait: real(deadletter.CircuitProbeWait), MaxWait: real(deadletter.CircuitProbeMaxWait)}
	})
	callbackSrv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		callbacks.Add(1)
		cb.ServeHTTP(w, r)
	})
	callbackSrv.Start()
	t.Cleanup(callbackSrv.Close)
	cons := newOutageConsumer(t, db, "none")
	// The production delay: the server scales Upstash-Retry-Delay by its TimeScale.
	pub, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: cons.URL,
		FailureCallbackURL: callbackURL, Ordering: mode, FIFOQueues: 8, RetryDelay: retryDelay})
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(db.Pool, pub, relay.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	relayDone := make(chan struct{})
	go func() {
		defer close(relayDone)
		for ctx.Err() == nil {
			_, _ = r.Drain(ctx)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer func() { cancel(); <-relayDone }()

	// The producers: rate events a second, round-robin over 20 keys, one per transaction.
	var produced atomic.Int64
	prodCtx, stopProducing := context.WithCancel(ctx)
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-prodCtx.Done():
				return
			case <-tick.C:
			}
			key := fmt.Sprintf("k%d", i%20)
			if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: "order.created", PartitionKey: key,
				Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, i)), Headers: map[string]string{"X-Partition-Key": key}}); err != nil {
				return
			}
			produced.Add(1)
		}
	}()

	warm := real(5 * time.Minute)
	time.Sleep(warm)
	down := time.Now()
	cons.down.Store(true)
	var openedAt time.Time
	for time.Since(down) < real(time.Duration(minutes)*time.Minute) {
		if openedAt.IsZero() && db.Count(t, `SELECT count(*) FROM outbox_circuits`) > 0 {
			openedAt = time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	up := time.Now()
	cons.down.Store(false)
	time.Sleep(real(5 * time.Minute))
	stopProducing()
	<-prodDone
	total := int(produced.Load())
	waitFor(t, "every event applied", 10*time.Minute, func() bool {
		cons.mu.Lock()
		defer cons.mu.Unlock()
		return len(cons.applied) >= total
	})

	// Figures, from the consumer's commits and the outbox.
	var ids []int64
	created := map[int64]time.Time{}
	rows, err := db.Pool.Query(ctx, `SELECT id, created_at FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		created[id] = at
	}
	cons.mu.Lock()
	applied := slices.Clone(cons.applied)
	cons.mu.Unlock()
	first := map[int64]time.Time{}
	violations := 0
	last := map[string]int{}
	for _, a := range applied {
		if _, ok := first[int64(a.id)]; !ok {
			first[int64(a.id)] = a.at
		}
		if a.id < last[a.key] {
			violations++
		}
		last[a.key] = max(last[a.key], a.id)
	}
	var late []time.Duration // recovery to delivery, events produced during the outage
	for _, id := range ids {
		if c := created[id]; c.After(down) && c.Before(up) {
			late = append(late, max(first[id].Sub(up), 0))
		}
	}
	slices.Sort(late)
	pct := func(p float64) time.Duration {
		if len(late) == 0 {
			return 0
		}
		return prod(late[min(len(late)-1, int(p*float64(len(late))))])
	}
	dead := db.Count(t, `SELECT count(*) FROM dead_letters WHERE resolved_at IS NULL`)
	reopened := db.Count(t, `SELECT count(*) FROM outbox WHERE generation > 0`)
	visible := "never"
	if !openedAt.IsZero() {
		visible = prod(openedAt.Sub(down)).Round(time.Second).String()
	}
	billed := cons.attempts.Load() + callbacks.Load()
	t.Logf("consumer outage: %s mode, %d production minutes down, %d events/s, retry delay %v, %d events (%d during the outage)",
		mode, minutes, rate, retryDelay, total, len(late))
	t.Logf("  dead-lettered %d; per-key order violations %d; events rescheduled at least once %d", dead, violations, reopened)
	t.Logf("  billed: %d delivery attempts + %d failure callbacks = %.2f per event", cons.attempts.Load(), callbacks.Load(), float64(billed)/float64(total))
	t.Logf("  recovery to delivery (production-equivalent): p50 %v, p99 %v, max %v", pct(0.5).Round(time.Second), pct(0.99).Round(time.Second), pct(1).Round(time.Second))
	t.Logf("  circuit opened %s after the outage began (production-equivalent)", visible)
	if dead != 0 || (mode == publish.OrderingFIFO && violations != 0) {
		t.Errorf("the outage cost events: %d dead-lettered, %d order violations", dead, violations)
	}
}
