package relay_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
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

// lockedRand is a seeded source that relays publishing at once may share: a *rand.Rand is
// not safe for concurrent use.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newLockedRand(seed1, seed2 uint64) *lockedRand {
	return &lockedRand{r: rand.New(rand.NewPCG(seed1, seed2))}
}

func (l *lockedRand) Float64() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}

func (l *lockedRand) IntN(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.IntN(n)
}

// failShare returns a fakePublisher fail func that fails about share of the messages, at
// random, with a retryable 503.
func failShare(rng *lockedRand, share float64) func(outbox.Message) error {
	return func(outbox.Message) error {
		if rng.Float64() < share {
			return &httpError{status: 503}
		}
		return nil
	}
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
	return outboxtest.Enqueue(t, db.Pool, outboxtest.Orders(0, n, key))
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
	err := db.Pool.QueryRow(t.Context(), `
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
	seed(t, db, 250, outboxtest.Mod(37))
	pub := &fakePublisher{}
	st := drain(t.Context(), t, newRelay(t, db, pub, relay.Config{BatchSize: 100}))
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
	forConcurrencies(t, func(t *testing.T, db *pgtest.DB, conc int) {
		// 8 keys with 2 events, then one with 10: 26 rows, fewer than the batch.
		seed(t, db, 26, func(i int) string {
			if i < 16 {
				return fmt.Sprintf("k%d", i%8)
			}
			return "long"
		})
		pub := &fakePublisher{}
		st := drain(t.Context(), t, newRelay(t, db, pub, relay.Config{BatchSize: 30, PublishConcurrency: conc}))
		if s := states(t, db); st.Dispatched != 26 || s.dispatched != 26 {
			t.Fatalf("one drain dispatched %d (stats %+v), want all 26", s.dispatched, st)
		}
		assertKeyOrder(t, pub.records())
	})
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
		_, _ = newRelay(t, db, crashing, relay.Config{}).Drain(t.Context())
	}()
	<-done
	if s := states(t, db); s.leased != 1 || s.dispatched != 0 {
		t.Fatalf("after crash: %+v, want the row still leased", s)
	}

	// A relay whose lease has not expired yet sees nothing to do.
	idle := &fakePublisher{}
	if st, err := newRelay(t, db, idle, relay.Config{}).Drain(t.Context()); err != nil || st.Claimed != 0 {
		t.Fatalf("claimed a leased row: %+v %v", st, err)
	}

	clk := newClock()
	clk.Add(relay.DefaultLease + time.Second)
	second := &fakePublisher{}
	st := drain(t.Context(), t, newRelay(t, db, second, relay.Config{Now: clk.Now}))
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
	if err := db.Pool.QueryRow(t.Context(), "SELECT attempts FROM outbox").Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 2 {
		t.Fatalf("attempts = %d, want 2", attempts)
	}
	// Nothing left for anyone.
	clk.Add(time.Hour)
	if st, _ := newRelay(t, db, idle, relay.Config{Now: clk.Now}).Drain(t.Context()); st.Claimed != 0 {
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
			ctx := t.Context()

			inPublish := make(chan struct{})
			proceed := make(chan struct{})
			var once sync.Once
			a := &fakePublisher{
				before: func(context.Context, []outbox.Message) { once.Do(func() { close(inPublish) }); <-proceed },
				fail:   func(outbox.Message) error { return late.err },
			}
			aDone := drainInBackground(ctx, newRelay(t, db, a, relay.Config{BatchSize: 10}))
			<-inPublish

			takeOver(t, db, 3)
			before := dispatchedAt(t, db)
			close(proceed)
			assertFenced(t, db, aDone, 3)
			for i, ts := range dispatchedAt(t, db) {
				if !ts.Equal(before[i]) {
					t.Fatalf("dispatched_at of row %d rewritten by the stale relay", i)
				}
			}
		})
	}
}

// takeOver runs relay B, whose clock is past the default lease, so it claims every row
// relay A still holds, and fails the test unless B dispatches n.
func takeOver(t *testing.T, db *pgtest.DB, n int) {
	t.Helper()
	clk := newClock()
	clk.Add(relay.DefaultLease + time.Second)
	st, err := newRelay(t, db, &fakePublisher{}, relay.Config{BatchSize: 10, Now: clk.Now, Logger: quiet()}).Drain(t.Context())
	if err != nil || st.Dispatched != n {
		t.Fatalf("relay B: %+v %v", st, err)
	}
}

// assertFenced checks relay A's Drain once its late outcomes are in: they changed nothing.
// It returns A's stats; every one of the n rows is dispatched (by B), none leased or dead.
func assertFenced(t *testing.T, db *pgtest.DB, a <-chan drainResult, n int) relay.Stats {
	t.Helper()
	ra := <-a
	if ra.err != nil {
		t.Fatal(ra.err)
	}
	if ra.st.LeaseLost == 0 || ra.st.Dispatched+ra.st.Retried+ra.st.DeadLettered+ra.st.Released != 0 {
		t.Fatalf("relay A changed rows after losing its leases: %+v", ra.st)
	}
	if s := states(t, db); s.dispatched != n || s.deadLettered != 0 || s.leased != 0 {
		t.Fatalf("states after A's late outcomes: %+v", s)
	}
	if d := db.Count(t, "SELECT count(*) FROM dead_letters"); d != 0 {
		t.Fatalf("%d dead letters from stale leases", d)
	}
	return ra.st
}

// dispatchedAt returns every row's dispatched_at, in id order.
func dispatchedAt(t *testing.T, db *pgtest.DB) []time.Time {
	t.Helper()
	return outboxtest.Column[time.Time](t, db.Pool, "SELECT dispatched_at FROM outbox ORDER BY id")
}

// Four relays drain 10,000 events at once: each event is published exactly once (a row
// claimed under two live leases would be published twice), all dispatched, none dead.
func TestConcurrentRelays(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 12})
	const n = 10000
	seed(t, db, n, func(i int) string { return fmt.Sprintf("key-%d", i%500) })
	pub := &fakePublisher{}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
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

// assertAttemptOrder fails the test if an event is published twice or, when fifo, attempted
// after a later event of its key was published; it returns the number of failed attempts.
func assertAttemptOrder(t *testing.T, recs []publishRecord, fifo bool) (failures int) {
	t.Helper()
	published := map[string]outbox.ID{}
	done := map[outbox.ID]bool{}
	for _, r := range recs {
		if prev, ok := published[r.key]; ok && r.id < prev && fifo {
			t.Fatalf("key %s: event %d attempted after %d was published", r.key, r.id, prev)
		}
		if !r.ok {
			failures++
			continue
		}
		if done[r.id] {
			t.Fatalf("event %d published twice", r.id)
		}
		done[r.id] = true
		published[r.key] = r.id
	}
	return failures
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
			pub := &fakePublisher{fail: failShare(newLockedRand(42, uint64(relays)), 0.3)}
			clk := newClock()
			cfg := relay.Config{BatchSize: 64, MaxAttempts: 100, Now: clk.Now}
			ctx := t.Context()
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
			failures := assertAttemptOrder(t, recs, true)
			if failures == 0 {
				t.Fatal("no failures were injected")
			}
		})
	}
}

func TestPermanentErrorsAndExhaustedRetriesDeadLetter(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ids := seed(t, db, 3, outboxtest.Mod(3))
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
	ctx := t.Context()
	for range 3 {
		drain(ctx, t, newRelay(t, db, pub, cfg))
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
	if got[0].id != permanent || got[0].attempts != 1 || got[0].status != 400 || got[0].errText != "qstash answered 400" || got[0].source != "relay" || got[0].orderID != "o-0" {
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
	st := drain(t.Context(), t, newRelay(t, db, pub, relay.Config{}))
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
	ctx := t.Context()
	r := newRelay(t, db, pub, relay.Config{BatchSize: 50})
	for range 3 {
		drain(ctx, t, r)
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
	st := drain(t.Context(), t, newRelay(t, db, pub, relay.Config{BatchSize: 200}))
	if st.Batches != 1 || st.Dispatched != 120 || st.PublishCalls != 120 {
		t.Fatalf("stats %+v", st)
	}
	assertKeyOrder(t, pub.records())
}

// Drain stops claiming before its deadline and leaves nothing leased.
func TestDrainHonoursDeadline(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 2000, outboxtest.Mod(2000))
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
	forConcurrencies(t, func(t *testing.T, db *pgtest.DB, conc int) {
		seed(t, db, 500, outboxtest.Mod(500))
		stop, cancel := context.WithCancel(t.Context())
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

// forConcurrencies runs test as a parallel subtest, on a database of its own, for the
// serial relay (PublishConcurrency 1) and a pipelined one (4).
func forConcurrencies(t *testing.T, test func(t *testing.T, db *pgtest.DB, conc int)) {
	for _, conc := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency %d", conc), func(t *testing.T) {
			t.Parallel()
			test(t, pgtest.New(t), conc)
		})
	}
}

// drain runs one Drain of r under ctx and fails the test on an error.
func drain(ctx context.Context, t *testing.T, r *relay.Relay) relay.Stats {
	t.Helper()
	st, err := r.Drain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// drainFor is drain under a context that ends after d: for a drain that may wait (for a
// quota's reset, a deferral's pause) and must end even if the relay waits too long.
func drainFor(t *testing.T, r *relay.Relay, d time.Duration) relay.Stats {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	return drain(ctx, t, r)
}

// drainWithin is drainFor that also fails the test if Drain returns after its deadline.
func drainWithin(t *testing.T, r *relay.Relay, d time.Duration) relay.Stats {
	t.Helper()
	deadline := time.Now().Add(d)
	st := drainFor(t, r, d)
	if time.Now().After(deadline) {
		t.Fatalf("Drain returned %v after its deadline", time.Since(deadline))
	}
	return st
}

// drainResult is what a Drain run in the background returned.
type drainResult struct {
	st  relay.Stats
	err error
}

// drainInBackground starts one Drain of r under ctx and returns where its result arrives:
// for a relay whose publishes the test holds while another relay takes its rows over.
func drainInBackground(ctx context.Context, r *relay.Relay) <-chan drainResult {
	done := make(chan drainResult, 1)
	go func() {
		st, err := r.Drain(ctx)
		done <- drainResult{st, err}
	}()
	return done
}
