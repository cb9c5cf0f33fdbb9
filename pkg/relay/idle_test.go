package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

type idleRun struct {
	st      relay.Stats
	seen    time.Time
	err     error
	elapsed time.Duration
}

// drainIdleInBackground runs DrainIdle on r under ctx and reports how it ended.
func drainIdleInBackground(ctx context.Context, r *relay.Relay, gap time.Duration, from relay.IdleFrom) <-chan idleRun {
	done := make(chan idleRun, 1)
	go func() {
		start := time.Now()
		st, seen, err := r.DrainIdle(ctx, gap, from)
		done <- idleRun{st, seen, err, time.Since(start)}
	}()
	return done
}

// TestDrainIdleStaysWhileEventsArrive: a kicked relay (IdleFromStart) that finds nothing
// stays the gap; an event committed inside it is dispatched by the same call, which then
// stays a gap after it and returns.
func TestDrainIdleStaysWhileEventsArrive(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pub := &fakePublisher{}
	// A one-minute poll: only the NOTIFY or the fast polls can find the late event.
	r := newRelay(t, db, pub, relay.Config{PollInterval: time.Minute})
	const gap = time.Second
	start := time.Now()
	done := drainIdleInBackground(t.Context(), r, gap, relay.IdleFromStart)
	time.Sleep(gap / 2) // the event must come inside the gap: it is what is tested
	committed := time.Now()
	if _, err := outbox.Enqueue(t.Context(), db.Pool, plainEvent); err != nil {
		t.Fatal(err)
	}
	var run idleRun
	select {
	case run = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("DrainIdle did not return within 20 s")
	}
	if run.err != nil || run.st.Dispatched != 1 {
		t.Fatalf("DrainIdle: %+v %v", run.st, run.err)
	}
	if min := committed.Sub(start) + gap; run.elapsed < min || run.elapsed > min+3*time.Second {
		t.Fatalf("returned after %v, want about %v (the gap after the event)", run.elapsed, min)
	}
	// The last claim began once the gap after the event was over.
	if run.seen.Before(committed.Add(gap)) || run.seen.After(start.Add(run.elapsed)) {
		t.Fatalf("seen %v, want within [%v, %v]", run.seen, committed.Add(gap), start.Add(run.elapsed))
	}
}

// TestDrainIdleScheduledTickLeavesAtOnce: a backstop tick (IdleFromEvents) that finds
// the outbox empty returns after one claim, not after the gap; one that finds events stays
// the gap after them.
func TestDrainIdleScheduledTickLeavesAtOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	r := newRelay(t, db, &fakePublisher{}, relay.Config{PollInterval: time.Minute})
	const gap = 3 * time.Second
	run := <-drainIdleInBackground(t.Context(), r, gap, relay.IdleFromEvents)
	if run.err != nil || run.st.Claimed != 0 || run.elapsed >= gap {
		t.Fatalf("empty tick: %+v %v after %v, want at once", run.st, run.err, run.elapsed)
	}
	if _, err := outbox.Enqueue(t.Context(), db.Pool, plainEvent); err != nil {
		t.Fatal(err)
	}
	run = <-drainIdleInBackground(t.Context(), r, gap, relay.IdleFromEvents)
	if run.err != nil || run.st.Dispatched != 1 || run.elapsed < gap {
		t.Fatalf("tick with an event: %+v %v after %v, want the %v gap", run.st, run.err, run.elapsed, gap)
	}
}

// TestDrainIdleKeepsTheDeadlineRule: producers commit without pause and the gap never
// passes, so the call ends at the deadline margin: it returns before the deadline with
// every claimed row published and marked.
func TestDrainIdleKeepsTheDeadlineRule(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pub := &fakePublisher{}
	// Short timeouts, so that a short deadline leaves room to publish (the default margin
	// is their sum).
	const margin = 2 * time.Second
	r := newRelay(t, db, pub, relay.Config{PollInterval: time.Minute, PublishTimeout: time.Second, MarkTimeout: time.Second})
	// A key per event: same-key events wait for each other, so they would be released.
	stop := insertWithoutPause(t, db, func(int) string {
		return `INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', md5(random()::text), '{}')`
	})
	ctx, cancel := context.WithTimeout(t.Context(), margin+2*time.Second)
	defer cancel()
	deadline, _ := ctx.Deadline()
	run := <-drainIdleInBackground(ctx, r, time.Hour, relay.IdleFromStart)
	returned := time.Now()
	stop()
	if run.err != nil || !run.st.StoppedAtDeadline || run.st.Dispatched == 0 || !run.seen.IsZero() {
		t.Fatalf("DrainIdle: %+v %v", run.st, run.err)
	}
	if returned.After(deadline) {
		t.Fatalf("returned %v after the deadline", returned.Sub(deadline))
	}
	if s := states(t, db); s.leased != 0 || s.dispatched != run.st.Dispatched || len(pub.records()) != run.st.Dispatched {
		t.Fatalf("rows %+v, %d published, stats %+v: every claimed row must be published and marked", s, len(pub.records()), run.st)
	}
	testwait.Eventually(t, 10*time.Second, func() bool { return len(sleepers(t, db)) == 0 }, "the listening session to close")
}
