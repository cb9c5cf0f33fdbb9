package relay_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// keyGuard is a publisher that fails the test when two Publish calls in progress at the
// same time carry events of the same key (a key whose head is in flight was claimed
// again), and records the highest number of calls in progress at once.
type keyGuard struct {
	t     *testing.T
	inner relay.Publisher
	delay func() time.Duration

	mu      sync.Mutex
	active  map[string]int
	calls   int
	maxCall int
	// overlapped is closed when two calls are first in progress at once. Until then a
	// call waits for that (at most overlapWait): pipelining shows deterministically, and
	// a relay that does not pipeline only makes the test slower, then fail.
	overlapped chan struct{}
}

const overlapWait = time.Second

func (g *keyGuard) Publish(ctx context.Context, msgs []outbox.Message) []publish.Result {
	g.mu.Lock()
	if g.active == nil {
		g.active = map[string]int{}
	}
	keys := map[string]bool{}
	for _, m := range msgs {
		keys[m.PartitionKey] = true
	}
	for k := range keys {
		if g.active[k] > 0 {
			g.t.Errorf("key %s is in two Publish calls at once", k)
		}
		g.active[k]++
	}
	g.calls++
	g.maxCall = max(g.maxCall, g.calls)
	if g.overlapped == nil {
		g.overlapped = make(chan struct{})
	}
	overlapped := g.overlapped
	if g.calls == 2 && g.maxCall == 2 {
		select {
		case <-overlapped:
		default:
			close(overlapped)
		}
	}
	g.mu.Unlock()
	select {
	case <-overlapped:
	case <-time.After(overlapWait):
	}
	if g.delay != nil {
		time.Sleep(g.delay()) // the queue's round trip
	}
	res := g.inner.Publish(ctx, msgs)
	g.mu.Lock()
	for k := range keys {
		g.active[k]--
	}
	g.calls--
	g.mu.Unlock()
	return res
}

func (g *keyGuard) maxInFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.maxCall
}

// Two pipelined relays (4 batches in flight each) over few hot keys, with a round trip
// per call and 20% retryable failures: a key is never in two calls at once, every event
// ends dispatched exactly once, and in fifo mode an event is never attempted before every
// earlier event of its key is published.
func TestPipelinedRelaysKeepKeyOrder(t *testing.T) {
	t.Parallel()
	for _, ordering := range []publish.Ordering{publish.OrderingFIFO, publish.OrderingPublish} {
		t.Run(string(ordering), func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 12})
			const keys, perKey = 24, 20 // more keys than a batch: several batches of distinct keys fit in flight
			seed(t, db, keys*perKey, func(i int) string { return fmt.Sprintf("hot-%d", i%keys) })
			rng := newLockedRand(7, 11)
			fake := &fakePublisher{fail: failShare(rng, 0.2)}
			guard := &keyGuard{t: t, inner: fake, delay: func() time.Duration {
				return time.Duration(2000+rng.IntN(8000)) * time.Microsecond
			}}
			clk := newClock()
			// A seeded source is not safe for concurrent use: each relay must call its own for
			// one batch at a time (the race detector catches it otherwise). The two relays
			// have one source each: nothing serializes calls across relays.
			jitters := [2]*rand.Rand{rand.New(rand.NewPCG(3, 5)), rand.New(rand.NewPCG(13, 17))}
			ctx := t.Context()
			for round := 0; round < 300 && states(t, db).pending > 0; round++ {
				var wg sync.WaitGroup
				for i := range 2 {
					cfg := relay.Config{BatchSize: 16, MaxAttempts: 100, Ordering: ordering, PublishConcurrency: 4, Now: clk.Now,
						Rand: jitters[i].Float64, Logger: quiet()}
					wg.Go(func() {
						if _, err := newRelay(t, db, guard, cfg).Drain(ctx); err != nil {
							t.Error(err)
						}
					})
				}
				wg.Wait()
				clk.Add(2 * relay.DefaultBackoffMax)
			}
			if s := states(t, db); s.dispatched != keys*perKey || s.leased != 0 {
				t.Fatalf("states %+v", s)
			}
			if guard.maxInFlight() < 2 {
				t.Fatalf("at most %d calls in flight: the relays did not pipeline", guard.maxInFlight())
			}
			// In publish mode a key's run shares one call, so a later event may succeed while an
			// earlier one is retried: only fifo promises the attempt order.
			assertAttemptOrder(t, fake.records(), ordering == publish.OrderingFIFO)
		})
	}
}

// Relay A has three batches in flight when their leases expire; relay B takes every row
// over and dispatches it. A's late outcomes, batch by batch, change nothing.
func TestPipelinedLostLeasesAreFenced(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 30, outboxtest.Mod(30))
	ctx := t.Context()
	var inPublish atomic.Int32
	proceed := make(chan struct{})
	a := &fakePublisher{
		before: func(context.Context, []outbox.Message) { inPublish.Add(1); <-proceed },
		fail: func(m outbox.Message) error {
			return []error{nil, errors.New("timeout"), &httpError{status: 400}}[m.ID%3]
		},
	}
	aDone := drainInBackground(ctx, newRelay(t, db, a, relay.Config{BatchSize: 10, PublishConcurrency: 4, Logger: quiet()}))
	testwait.Eventually(t, 10*time.Second, func() bool { return inPublish.Load() == 3 }, "three batches in publish")

	takeOver(t, db, 30)
	close(proceed)
	if st := assertFenced(t, db, aDone, 30); st.Batches != 3 || st.LeaseLost != 30 {
		t.Fatalf("relay A: %+v, want three batches of leases lost", st)
	}
}

// The deadline rule with several batches in flight: Drain stops claiming when the time
// left cannot cover a publish and a mark, returns before its deadline, and every batch it
// claimed is marked (nothing leased, the database agrees with its counts).
func TestPipelinedDrainHonoursDeadline(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 3000, outboxtest.Mod(3000))
	guard := &keyGuard{t: t, inner: &fakePublisher{}, delay: func() time.Duration { return 200 * time.Millisecond }}
	cfg := relay.Config{BatchSize: 10, PublishConcurrency: 4, Lease: 5 * time.Second, PublishTimeout: 500 * time.Millisecond,
		MarkTimeout: time.Second, Logger: quiet()} // a generous mark budget: see TestDrainHonoursDeadline
	st := drainWithin(t, newRelay(t, db, guard, cfg), 4*time.Second)
	if !st.StoppedAtDeadline || guard.maxInFlight() < 3 {
		t.Fatalf("stats %+v, %d calls in flight at most", st, guard.maxInFlight())
	}
	if s := states(t, db); s.leased != 0 || s.dispatched != st.Dispatched || st.Dispatched != st.Claimed {
		t.Fatalf("states %+v after deadline stop, stats %+v", s, st)
	}
}

// ctx is cancelled while three batches are in flight and their publishes succeed anyway
// (the queue had accepted them): Drain returns only after all three are marked dispatched.
func TestPipelinedCancelMarksWhatWasPublished(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 100, outboxtest.Mod(100))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var inPublish atomic.Int32
	pub := &fakePublisher{before: func(pctx context.Context, _ []outbox.Message) {
		if inPublish.Add(1) == 3 {
			cancel()
		}
		<-pctx.Done() // answered only after the cancellation
	}}
	st := drain(ctx, t, newRelay(t, db, pub, relay.Config{BatchSize: 10, PublishConcurrency: 3, Logger: quiet()}))
	if st.Batches != 3 || st.Dispatched != 30 {
		t.Fatalf("stats %+v: want the three batches in flight marked dispatched", st)
	}
	if s := states(t, db); s.leased != 0 || s.dispatched != 30 || s.pending != 70 {
		t.Fatalf("states %+v", s)
	}
}
