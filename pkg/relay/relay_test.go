package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/pkg/publish"
	"github.com/outbox-relay/outbox-relay/pkg/relay"
)

// fakePublisher records every publish in order. fail decides each message's error.
type fakePublisher struct {
	mu     sync.Mutex
	log    []publishRecord
	fail   func(m outbox.Message) error
	before func(ctx context.Context, msgs []outbox.Message)
	after  func(msgs []outbox.Message)
}

type publishRecord struct {
	id      outbox.ID
	key     string
	dedupID string
	ok      bool
}

func (p *fakePublisher) Publish(ctx context.Context, msgs []outbox.Message) []publish.Result {
	if p.before != nil {
		p.before(ctx, msgs)
	}
	res := make([]publish.Result, len(msgs))
	p.mu.Lock()
	for i, m := range msgs {
		var err error
		if p.fail != nil {
			err = p.fail(m)
		}
		res[i] = publish.Result{Err: err, MessageID: "msg_" + m.ID.String()}
		p.log = append(p.log, publishRecord{id: m.ID, key: m.PartitionKey, dedupID: m.DeduplicationID(), ok: err == nil})
	}
	p.mu.Unlock()
	if p.after != nil {
		p.after(msgs)
	}
	return res
}

func (p *fakePublisher) records() []publishRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]publishRecord(nil), p.log...)
}

type httpError struct{ status int }

func (e *httpError) Error() string    { return fmt.Sprintf("qstash answered %d", e.status) }
func (e *httpError) HTTPStatus() int  { return e.status }
func (e *httpError) Permanent() bool  { return e.status >= 400 && e.status < 500 && e.status != 429 }
func (e *httpError) Temporary() bool  { return !e.Permanent() }
func (e *httpError) Is(t error) bool  { _, ok := t.(*httpError); return ok }
func (e *httpError) Unwrap() error    { return nil }
func (e *httpError) String() string   { return e.Error() }
func (e *httpError) GoString() string { return e.Error() }

func seed(t testing.TB, db *pgtest.DB, n int, key func(i int) string) []outbox.ID {
	t.Helper()
	ctx := context.Background()
	var ids []outbox.ID
	for start := 0; start < n; start += 1000 {
		evs := make([]outbox.Event, 0, 1000)
		for i := start; i < min(n, start+1000); i++ {
			evs = append(evs, outbox.Event{
				Topic:        "order.created",
				PartitionKey: key(i),
				Payload:      json.RawMessage(fmt.Sprintf(`{"order_id":"%d","amount_cents":100,"currency":"EUR"}`, i)),
			})
		}
		got, err := outbox.EnqueueBatch(ctx, db.Pool, evs)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got...)
	}
	return ids
}

func newRelay(t *testing.T, db *pgtest.DB, pub relay.Publisher, cfg relay.Config) *relay.Relay {
	t.Helper()
	r, err := relay.New(db.Pool, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

type rowState struct {
	dispatched, deadLettered, leased int
	pending                          int
}

func states(t *testing.T, db *pgtest.DB) rowState {
	t.Helper()
	var s rowState
	err := db.Pool.QueryRow(context.Background(), `
SELECT count(*) FILTER (WHERE dispatched_at IS NOT NULL),
       count(*) FILTER (WHERE dead_lettered_at IS NOT NULL),
       count(*) FILTER (WHERE lease_token IS NOT NULL),
       count(*) FILTER (WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL)
FROM outbox`).Scan(&s.dispatched, &s.deadLettered, &s.leased, &s.pending)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A fake clock for the relay's statements: tests move time instead of sleeping.
type clock struct{ ns atomic.Int64 }

func newClock() *clock               { c := &clock{}; c.ns.Store(time.Now().UnixNano()); return c }
func (c *clock) Now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *clock) Add(d time.Duration) { c.ns.Add(int64(d)) }

func TestDrainDispatchesEverything(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 250, func(i int) string { return fmt.Sprintf("k%d", i%37) })
	pub := &fakePublisher{}
	st, err := newRelay(t, db, pub, relay.Config{BatchSize: 100}).Drain(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Dispatched != 250 || st.Claimed != 250 {
		t.Fatalf("stats = %+v", st)
	}
	if s := states(t, db); s.dispatched != 250 || s.leased != 0 {
		t.Fatalf("states = %+v", s)
	}
	for _, r := range pub.records() {
		if r.dedupID != "outbox-"+r.id.String() {
			t.Fatalf("dedup id %q for %d", r.dedupID, r.id)
		}
	}
}

// A short batch whose keys' runs were cut at the per-key limit is not the end of the
// outbox: with 9 keys, one of them holding 10 events, a claim of 30 takes 4 of that key's
// and the drain must claim again for the other 6 rather than return with them pending.
func TestDrainClaimsAgainAfterACutRun(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency %d", concurrency), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			// 8 keys with 2 events, then one with 10: 26 rows, fewer than the batch.
			seed(t, db, 26, func(i int) string {
				if i < 16 {
					return fmt.Sprintf("k%d", i%8)
				}
				return "long"
			})
			pub := &fakePublisher{}
			st, err := newRelay(t, db, pub, relay.Config{BatchSize: 30, PublishConcurrency: concurrency}).Drain(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if s := states(t, db); st.Dispatched != 26 || s.dispatched != 26 {
				t.Fatalf("one drain dispatched %d (stats %+v), want all 26", s.dispatched, st)
			}
			assertKeyOrder(t, pub.records())
		})
	}
}

// The publish succeeds, then the relay dies before marking. After the lease ends another
// relay publishes the same row again with the same deduplication id, and it ends dispatched
// once.
func TestCrashBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ids := seed(t, db, 1, func(int) string { return "k" })

	crashing := &fakePublisher{after: func([]outbox.Message) { runtime.Goexit() }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = newRelay(t, db, crashing, relay.Config{}).Drain(context.Background())
	}()
	<-done
	if s := states(t, db); s.leased != 1 || s.dispatched != 0 {
		t.Fatalf("after crash: %+v, want the row still leased", s)
	}

	// A relay whose lease has not expired yet sees nothing to do.
	idle := &fakePublisher{}
	if st, err := newRelay(t, db, idle, relay.Config{}).Drain(context.Background()); err != nil || st.Claimed != 0 {
		t.Fatalf("claimed a leased row: %+v %v", st, err)
	}

	clk := newClock()
	clk.Add(relay.DefaultLease + time.Second)
	second := &fakePublisher{}
	st, err := newRelay(t, db, second, relay.Config{Now: clk.Now}).Drain(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Dispatched != 1 {
		t.Fatalf("second relay stats %+v", st)
	}
	first, again := crashing.records(), second.records()
	if len(first) != 1 || len(again) != 1 || first[0].dedupID != again[0].dedupID || again[0].id != ids[0] {
		t.Fatalf("publishes: first %+v, again %+v: want the same deduplication id twice", first, again)
	}
	if s := states(t, db); s.dispatched != 1 || s.leased != 0 {
		t.Fatalf("final %+v", s)
	}
	var attempts int
	if err := db.Pool.QueryRow(context.Background(), "SELECT attempts FROM outbox").Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 2 {
		t.Fatalf("attempts = %d, want 2", attempts)
	}
	// Nothing left for anyone.
	clk.Add(time.Hour)
	if st, _ := newRelay(t, db, idle, relay.Config{Now: clk.Now}).Drain(context.Background()); st.Claimed != 0 {
		t.Fatalf("dispatched row claimed again: %+v", st)
	}
}

// Relay A's lease expires while its publish hangs; relay B takes the row over and
// dispatches it. A's late outcome, whatever it is, changes nothing.
func TestStaleLeaseIsFenced(t *testing.T) {
	t.Parallel()
	for _, late := range []struct {
		name string
		err  error
	}{
		{"late success", nil},
		{"late retryable failure", errors.New("timeout")},
		{"late permanent failure", &httpError{status: 400}},
	} {
		t.Run(late.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			seed(t, db, 3, func(int) string { return "k" })
			ctx := context.Background()

			inPublish := make(chan struct{})
			proceed := make(chan struct{})
			var once sync.Once
			a := &fakePublisher{
				before: func(context.Context, []outbox.Message) { once.Do(func() { close(inPublish) }); <-proceed },
				fail:   func(outbox.Message) error { return late.err },
			}
			type result struct {
				st  relay.Stats
				err error
			}
			aDone := make(chan result, 1)
			go func() {
				st, err := newRelay(t, db, a, relay.Config{BatchSize: 10}).Drain(ctx)
				aDone <- result{st, err}
			}()
			<-inPublish

			clk := newClock()
			clk.Add(relay.DefaultLease + time.Second)
			b := &fakePublisher{}
			stB, err := newRelay(t, db, b, relay.Config{BatchSize: 10, Now: clk.Now}).Drain(ctx)
			if err != nil || stB.Dispatched != 3 {
				t.Fatalf("relay B: %+v %v", stB, err)
			}
			var before []time.Time
			rows, _ := db.Pool.Query(ctx, "SELECT dispatched_at FROM outbox ORDER BY id")
			for rows.Next() {
				var ts time.Time
				_ = rows.Scan(&ts)
				before = append(before, ts)
			}
			rows.Close()

			close(proceed)
			ra := <-aDone
			if ra.err != nil {
				t.Fatal(ra.err)
			}
			if ra.st.LeaseLost == 0 || ra.st.Dispatched+ra.st.Retried+ra.st.DeadLettered+ra.st.Released != 0 {
				t.Fatalf("relay A changed rows after losing its lease: %+v", ra.st)
			}
			s := states(t, db)
			if s.dispatched != 3 || s.deadLettered != 0 || s.leased != 0 {
				t.Fatalf("states after A's late outcome: %+v", s)
			}
			var letters int
			_ = db.Pool.QueryRow(ctx, "SELECT count(*) FROM dead_letters").Scan(&letters)
			if letters != 0 {
				t.Fatalf("%d dead letters from a stale lease", letters)
			}
			rows, _ = db.Pool.Query(ctx, "SELECT dispatched_at FROM outbox ORDER BY id")
			for i := 0; rows.Next(); i++ {
				var ts time.Time
				_ = rows.Scan(&ts)
				if !ts.Equal(before[i]) {
					t.Fatalf("dispatched_at of row %d rewritten by the stale relay", i)
				}
			}
			rows.Close()
		})
	}
}

// Four relays drain 10,000 events at once: each event is published exactly once (a row
// claimed under two live leases would be published twice), all dispatched, none dead.
func TestConcurrentRelays(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 12})
	const n = 10000
	seed(t, db, n, func(i int) string { return fmt.Sprintf("key-%d", i%500) })
	pub := &fakePublisher{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := relay.New(db.Pool, pub, relay.Config{BatchSize: 100})
			if err != nil {
				errs <- err
				return
			}
			// A concurrent relay may see a short batch while others hold the rest; keep
			// going until nothing is pending.
			for ctx.Err() == nil {
				if _, err := r.Drain(ctx); err != nil {
					errs <- err
					return
				}
				var pending int
				if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE dispatched_at IS NULL").Scan(&pending); err != nil {
					errs <- err
					return
				}
				if pending == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := make(map[outbox.ID]int, n)
	for _, r := range pub.records() {
		seen[r.id]++
		if seen[r.id] > 1 {
			t.Fatalf("event %d published twice: claimed by two live leases", r.id)
		}
	}
	if len(seen) != n {
		t.Fatalf("published %d distinct events, want %d", len(seen), n)
	}
	if s := states(t, db); s.dispatched != n || s.deadLettered != 0 || s.leased != 0 {
		t.Fatalf("states %+v", s)
	}
	assertKeyOrder(t, pub.records())
}

// assertKeyOrder checks that successful publishes of each key are strictly increasing.
func assertKeyOrder(t *testing.T, recs []publishRecord) {
	t.Helper()
	last := map[string]outbox.ID{}
	for _, r := range recs {
		if !r.ok {
			continue
		}
		if prev, ok := last[r.key]; ok && r.id <= prev {
			t.Fatalf("key %s: event %d published after %d", r.key, r.id, prev)
		}
		last[r.key] = r.id
	}
}

// 30% of publishes fail retryably at random; per key, successful publishes stay in id
// order, nothing is attempted ahead of an earlier pending event, and all end dispatched.
func TestPerKeyOrderSurvivesRetries(t *testing.T) {
	t.Parallel()
	for _, relays := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d relays", relays), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			const keys, perKey = 20, 50
			seed(t, db, keys*perKey, func(i int) string { return fmt.Sprintf("order:%d", i%keys) })
			var rngMu sync.Mutex
			rng := rand.New(rand.NewPCG(42, uint64(relays)))
			pub := &fakePublisher{fail: func(outbox.Message) error {
				rngMu.Lock()
				defer rngMu.Unlock()
				if rng.Float64() < 0.3 {
					return &httpError{status: 503}
				}
				return nil
			}}
			clk := newClock()
			cfg := relay.Config{BatchSize: 64, MaxAttempts: 100, Now: clk.Now}
			ctx := context.Background()
			for round := 0; round < 200; round++ {
				var wg sync.WaitGroup
				for range relays {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if _, err := newRelay(t, db, pub, cfg).Drain(ctx); err != nil {
							t.Error(err)
						}
					}()
				}
				wg.Wait()
				if states(t, db).pending == 0 {
					break
				}
				clk.Add(2 * relay.DefaultBackoffMax) // every backoff has elapsed
			}
			if s := states(t, db); s.dispatched != keys*perKey || s.deadLettered != 0 {
				t.Fatalf("states %+v", s)
			}
			recs := pub.records()
			assertKeyOrder(t, recs)
			// Stronger: an event is never even attempted before every earlier event of its key
			// has been published.
			done := map[outbox.ID]bool{}
			byKey := map[string][]outbox.ID{}
			for _, r := range recs {
				byKey[r.key] = append(byKey[r.key], r.id)
			}
			_ = byKey
			published := map[string]outbox.ID{}
			failures := 0
			for _, r := range recs {
				if prev, ok := published[r.key]; ok && r.id < prev {
					t.Fatalf("key %s: event %d attempted after %d was published", r.key, r.id, prev)
				}
				if r.ok {
					if done[r.id] {
						t.Fatalf("event %d published twice", r.id)
					}
					done[r.id] = true
					published[r.key] = r.id
				} else {
					failures++
				}
			}
			if failures == 0 {
				t.Fatal("no failures were injected")
			}
		})
	}
}

func TestPermanentErrorsAndExhaustedRetriesDeadLetter(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ids := seed(t, db, 3, func(i int) string { return fmt.Sprintf("k%d", i) })
	permanent, flaky := ids[0], ids[1]
	pub := &fakePublisher{fail: func(m outbox.Message) error {
		switch m.ID {
		case permanent:
			return &httpError{status: 400}
		case flaky:
			return &httpError{status: 503}
		}
		return nil
	}}
	clk := newClock()
	cfg := relay.Config{MaxAttempts: 3, Now: clk.Now}
	ctx := context.Background()
	for range 3 {
		if _, err := newRelay(t, db, pub, cfg).Drain(ctx); err != nil {
			t.Fatal(err)
		}
		clk.Add(2 * relay.DefaultBackoffMax)
	}
	rows, err := db.Pool.Query(ctx, "SELECT outbox_id, source, error, attempts, status_code, payload->>'order_id' FROM dead_letters ORDER BY outbox_id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	type letter struct {
		id       outbox.ID
		source   string
		errText  string
		attempts int
		status   int
		orderID  string
	}
	var got []letter
	for rows.Next() {
		var l letter
		if err := rows.Scan(&l.id, &l.source, &l.errText, &l.attempts, &l.status, &l.orderID); err != nil {
			t.Fatal(err)
		}
		got = append(got, l)
	}
	if len(got) != 2 {
		t.Fatalf("dead letters = %+v, want 2", got)
	}
	if got[0].id != permanent || got[0].attempts != 1 || got[0].status != 400 || got[0].errText != "qstash answered 400" || got[0].source != "relay" || got[0].orderID != "0" {
		t.Fatalf("permanent letter = %+v", got[0])
	}
	if got[1].id != flaky || got[1].attempts != 3 || got[1].status != 503 || got[1].errText != "retry budget exhausted after 3 attempts: qstash answered 503" {
		t.Fatalf("exhausted letter = %+v", got[1])
	}
	if s := states(t, db); s.deadLettered != 2 || s.dispatched != 1 || s.leased != 0 {
		t.Fatalf("states %+v", s)
	}
}

// A dead-lettered head unblocks its key: the next event goes out.
func TestDeadLetteredHeadUnblocksKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ids := seed(t, db, 3, func(int) string { return "same" })
	pub := &fakePublisher{fail: func(m outbox.Message) error {
		if m.ID == ids[0] {
			return &httpError{status: 422}
		}
		return nil
	}}
	st, err := newRelay(t, db, pub, relay.Config{}).Drain(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.DeadLettered != 1 || st.Dispatched != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// A key whose head is backing off holds its own events back without starving other keys,
// even when its ready events fill the front of the ready index.
func TestBlockedKeyDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	hot := seed(t, db, 300, func(int) string { return "hot" })
	seed(t, db, 50, func(i int) string { return fmt.Sprintf("cold-%d", i) })
	pub := &fakePublisher{fail: func(m outbox.Message) error {
		if m.ID == hot[0] {
			return errors.New("connection reset")
		}
		return nil
	}}
	ctx := context.Background()
	r := newRelay(t, db, pub, relay.Config{BatchSize: 50})
	for range 3 {
		if _, err := r.Drain(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var coldPending, hotDispatched int
	_ = db.Pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE partition_key <> 'hot' AND dispatched_at IS NULL), count(*) FILTER (WHERE partition_key = 'hot' AND dispatched_at IS NOT NULL) FROM outbox").Scan(&coldPending, &hotDispatched)
	if coldPending != 0 {
		t.Fatalf("%d cold events starved behind a blocked hot key", coldPending)
	}
	if hotDispatched != 0 {
		t.Fatalf("%d hot events dispatched while the hot head is backing off", hotDispatched)
	}
}

// A hot key's run goes out in id order within one batch, one wave per event.
func TestHotKeyRunInOneBatch(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 120, func(int) string { return "hot" })
	pub := &fakePublisher{}
	st, err := newRelay(t, db, pub, relay.Config{BatchSize: 200}).Drain(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Batches != 1 || st.Dispatched != 120 || st.PublishCalls != 120 {
		t.Fatalf("stats %+v", st)
	}
	assertKeyOrder(t, pub.records())
}

// Drain stops claiming before its deadline and leaves nothing leased.
func TestDrainHonoursDeadline(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 2000, func(i int) string { return fmt.Sprintf("k%d", i) })
	pub := &fakePublisher{before: func(ctx context.Context, _ []outbox.Message) {
		select {
		case <-time.After(300 * time.Millisecond):
		case <-ctx.Done():
		}
	}}
	// The mark's budget is generous: a 300 ms one ran out once under -race with every
	// package's tests sharing two cores. 2,000 events need about 7.5 s at 8 batches of 10
	// per 300 ms, so the drain still stops at its deadline.
	cfg := relay.Config{BatchSize: 10, Lease: 5 * time.Second, PublishTimeout: 500 * time.Millisecond, MarkTimeout: time.Second}
	st := drainWithin(t, newRelay(t, db, pub, cfg), 4*time.Second)
	if !st.StoppedAtDeadline || st.Dispatched == 0 {
		t.Fatalf("stats %+v", st)
	}
	if s := states(t, db); s.leased != 0 || s.dispatched != st.Dispatched {
		t.Fatalf("states %+v after deadline stop, stats %+v", s, st)
	}
}

func TestRunStopsCleanly(t *testing.T) {
	t.Parallel()
	for _, conc := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency %d", conc), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			seed(t, db, 500, func(i int) string { return fmt.Sprintf("k%d", i) })
			stop, cancel := context.WithCancel(context.Background())
			var calls atomic.Int32
			pub := &fakePublisher{before: func(ctx context.Context, _ []outbox.Message) {
				if calls.Add(1) == 2 {
					cancel() // SIGTERM while a batch is in flight
				}
				if ctx.Err() != nil {
					t.Error("in-flight publish was cancelled by the stop signal")
				}
			}}
			st, err := newRelay(t, db, pub, relay.Config{BatchSize: 50, PublishConcurrency: conc}).Run(stop)
			if err != nil {
				t.Fatal(err)
			}
			s := states(t, db)
			if s.leased != 0 || s.dispatched != st.Dispatched || st.Dispatched != 50*int(calls.Load()) {
				t.Fatalf("after stop: states %+v, stats %+v, %d publish calls", s, st, calls.Load())
			}
			// Serially, the stop lands during the second batch; pipelined, the batches
			// already claimed when it lands are finished too, and no more.
			if conc == 1 && st.Dispatched != 100 || st.Dispatched > 50*(1+conc) {
				t.Fatalf("dispatched %d at concurrency %d", st.Dispatched, conc)
			}
		})
	}
}

// drainWithin runs one Drain under a context that ends after d and fails the test if Drain
// returns after that deadline or with an error.
func drainWithin(t *testing.T, r *relay.Relay, d time.Duration) relay.Stats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	deadline, _ := ctx.Deadline()
	st, err := r.Drain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if time.Now().After(deadline) {
		t.Fatalf("Drain returned %v after its deadline", time.Since(deadline))
	}
	return st
}
