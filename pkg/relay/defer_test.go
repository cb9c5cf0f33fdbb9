package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// deferLines returns the relay's "publishing deferred" log lines.
func deferLines(b *logtest.Buffer) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, "publishing deferred") {
			out = append(out, l)
		}
	}
	return out
}

// attempts returns every row's attempts column, by id.
func attempts(t *testing.T, db *pgtest.DB) map[outbox.ID]int {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), "SELECT id, attempts FROM outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[outbox.ID]int{}
	for rows.Next() {
		var id outbox.ID
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	return out
}

// assertAttempts fails the test unless every row has spent want attempts; when says at
// which point of the test.
func assertAttempts(t *testing.T, db *pgtest.DB, want int, when string) {
	t.Helper()
	for id, n := range attempts(t, db) {
		if n != want {
			t.Fatalf("row %d has %d attempts %s, want %d", id, n, when, want)
		}
	}
}

// assertNoDeadLetters fails the test if dead_letters holds a row.
func assertNoDeadLetters(t *testing.T, db *pgtest.DB) {
	t.Helper()
	if n := db.Count(t, "SELECT count(*) FROM dead_letters"); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
}

// A used-up quota whose reset lies beyond the drain's deadline: the claimed rows go back
// with no attempt spent, nothing is dead-lettered, the drain stops at once instead of
// claiming and deferring again, and a later drain before the reset claims nothing.
func TestDeferredQuotaPastDeadlineStopsDrain(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 300, outboxtest.Mod(7))
	reset := time.Now().Add(time.Hour)
	pub := &fakePublisher{fail: func(outbox.Message) error {
		return &publish.DeferError{Reason: publish.DeferQuota, Until: reset, Err: errors.New("qstash api: 429 daily quota exceeded")}
	}}
	logger, logs := logtest.New()
	r := newRelay(t, db, pub, relay.Config{BatchSize: 100, PublishConcurrency: 1, Logger: logger})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for range 12 { // more drains than MaxAttempts: none may spend an attempt
		st := drain(ctx, t, r)
		if !st.PausedUntil.Equal(reset) {
			t.Fatalf("PausedUntil = %v, want the quota reset %v (stats %+v)", st.PausedUntil, reset, st)
		}
	}
	if offered := len(pub.records()); offered != 7 {
		t.Fatalf("%d messages offered to the publisher, want the first wave of the first batch (7 keys): the relay kept publishing while paused", offered)
	}
	assertAttempts(t, db, 0, "after deferrals")
	if s := states(t, db); s.pending != 300 || s.leased != 0 || s.deadLettered != 0 {
		t.Fatalf("states %+v", s)
	}
	assertNoDeadLetters(t, db)
	lines := deferLines(logs)
	if len(lines) != 1 || !strings.Contains(lines[0], `"reason":"quota"`) || !strings.Contains(lines[0], "daily quota exceeded") {
		t.Fatalf("deferral log lines = %q, want one naming the reason and the error", lines)
	}
}

// Stats and the first drain: every message of the deferred call is counted by reason and
// released; the batch's other waves are not sent.
func TestDeferredStatsByReason(t *testing.T) {
	t.Parallel()
	for _, reason := range []string{publish.DeferQuota, publish.DeferDeployment, publish.DeferOutage} {
		t.Run(reason, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			seed(t, db, 40, outboxtest.Mod(10)) // 4 waves of 10
			pub := &fakePublisher{fail: func(outbox.Message) error {
				return &publish.DeferError{Reason: reason, Until: time.Now().Add(time.Hour), Err: errors.New("refused")}
			}}
			st := drainFor(t, newRelay(t, db, pub, relay.Config{BatchSize: 100, Logger: quiet()}), time.Minute)
			got := map[string]int{publish.DeferQuota: st.DeferredQuota, publish.DeferDeployment: st.DeferredDeployment, publish.DeferOutage: st.DeferredOutage}
			if got[reason] != 10 || st.Released != 40 || st.PublishCalls != 1 || st.Dispatched+st.Retried+st.DeadLettered != 0 {
				t.Fatalf("stats %+v: want 10 deferred (%s) in one call, 40 released", st, reason)
			}
		})
	}
}

// The quota resets while the drain still has time: the relay waits for the reset, then
// publishes everything, and the deferred claim cost no attempt.
func TestDeferredQuotaResumesAfterReset(t *testing.T) {
	t.Parallel()
	forConcurrencies(t, func(t *testing.T, db *pgtest.DB, conc int) {
		seed(t, db, 200, outboxtest.Mod(13))
		reset := 300 * time.Millisecond
		var calls atomic.Int32
		deferFirst := &callCounter{inner: &fakePublisher{}, calls: &calls, refuse: func(n int32) error {
			if n == 1 {
				return &publish.DeferError{Reason: publish.DeferQuota, Until: time.Now().Add(reset), Err: errors.New("qstash api: 429 quota")}
			}
			return nil
		}}
		st := drainFor(t, newRelay(t, db, deferFirst, relay.Config{BatchSize: 50, PublishConcurrency: conc, Logger: quiet()}), time.Minute)
		if st.Dispatched != 200 || st.DeferredQuota == 0 || !st.PausedUntil.IsZero() {
			t.Fatalf("stats %+v", st)
		}
		assertAttempts(t, db, 1, "(the deferred claim must not count)")
		assertNoDeadLetters(t, db)
		if conc > 1 {
			return // calls of batches already in flight may start during the deferral
		}
		times := deferFirst.after()
		for _, at := range times[1:] {
			if d := at.t.Sub(times[0].t); d < reset {
				t.Fatalf("call %d went out %v after the deferral, before the %v reset", at.n, d, reset)
			}
		}
	})
}

// A deployment fault names no reset: the relay pauses DeferPause, doubling, and publishes
// once the fault is fixed; the log line carries the publisher's error text.
func TestDeferredDeploymentBacksOff(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 30, outboxtest.Mod(30))
	var calls atomic.Int32
	pub := &callCounter{inner: &fakePublisher{}, calls: &calls, refuse: func(n int32) error {
		if n <= 3 {
			return &publish.DeferError{Reason: publish.DeferDeployment, Err: errors.New("qstash api: 404 Not Found: check QSTASH_URL")}
		}
		return nil
	}}
	logger, logs := logtest.New()
	start := time.Now()
	st := drainFor(t, newRelay(t, db, pub, relay.Config{DeferPause: 20 * time.Millisecond, Logger: logger}), time.Minute)
	if st.Dispatched != 30 || st.DeferredDeployment != 90 || calls.Load() != 4 {
		t.Fatalf("stats %+v after %d calls", st, calls.Load())
	}
	// Pauses of 20, 40 and 80 ms.
	if el := time.Since(start); el < 140*time.Millisecond {
		t.Fatalf("drain took %v: the pauses did not double from DeferPause", el)
	}
	lines := deferLines(logs)
	if len(lines) != 1 || !strings.Contains(lines[0], "QSTASH_URL") || !strings.Contains(lines[0], `"reason":"deployment"`) {
		t.Fatalf("log lines %q: want one per drain naming QSTASH_URL", lines)
	}
	assertNoDeadLetters(t, db)
}

// callCounter fails a whole Publish call (every message) with refuse(n) for the n-th call,
// otherwise passes it to inner; it records when each call started.
type callCounter struct {
	inner  relay.Publisher
	refuse func(n int32) error
	calls  *atomic.Int32

	mu    sync.Mutex
	times []callTime
}

type callTime struct {
	n int32
	t time.Time
}

func (c *callCounter) Publish(ctx context.Context, msgs []outbox.Message) []publish.Result {
	n := c.calls.Add(1)
	c.mu.Lock()
	c.times = append(c.times, callTime{n, time.Now()})
	c.mu.Unlock()
	if err := c.refuse(n); err != nil {
		res := make([]publish.Result, len(msgs))
		for i := range res {
			res[i].Err = err
		}
		return res
	}
	return c.inner.Publish(ctx, msgs)
}

func (c *callCounter) after() []callTime {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]callTime(nil), c.times...)
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// An outage ends by itself: its pause doubles from DeferPause like a deployment fault's
// but never past MaxOutagePause, where a deployment fault may pause up to MaxDeferPause.
func TestOutagePauseIsCapped(t *testing.T) {
	t.Parallel()
	for reason, want := range map[string]time.Duration{publish.DeferOutage: relay.MaxOutagePause, publish.DeferDeployment: 2 * time.Hour} {
		t.Run(reason, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			seed(t, db, 10, outboxtest.Mod(10))
			pub := &fakePublisher{fail: func(outbox.Message) error {
				return &publish.DeferError{Reason: reason, Err: errors.New("refused")}
			}}
			start := time.Now()
			st := drainFor(t, newRelay(t, db, pub, relay.Config{DeferPause: 2 * time.Hour, Logger: quiet()}), 30*time.Second)
			if p := st.PausedUntil.Sub(start); p < want-time.Second || p > want+5*time.Second {
				t.Fatalf("paused %v after one %s deferral, want %v (stats %+v)", p, reason, want, st)
			}
			if reason == publish.DeferOutage && st.DeferredOutage != 10 {
				t.Fatalf("stats %+v: want 10 deferred for the outage", st)
			}
		})
	}
}
