package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
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

// qInsertSQL and plainEvent add the same event: by plain SQL, which knows nothing of the
// relay, and through the producer API.
const qInsertSQL = `INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', 'k', '{}')`

var plainEvent = outbox.Event{Topic: "t", PartitionKey: "k", Payload: json.RawMessage(`{}`)}

// lingerInBackground runs Linger for a minute with a one-minute poll interval, so only a
// wake-up can publish an event within the tests' deadlines. It returns the published ids
// and stops the relay at the end of the test.
func lingerInBackground(t *testing.T, db *pgtest.DB) <-chan outbox.ID {
	t.Helper()
	published := make(chan outbox.ID, 100)
	pub := &fakePublisher{after: func(msgs []outbox.Message) {
		for _, m := range msgs {
			published <- m.ID
		}
	}}
	r := newRelay(t, db, pub, relay.Config{PollInterval: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := r.Linger(ctx, time.Now().Add(time.Minute))
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return published
}

func expectPublished(t *testing.T, published <-chan outbox.ID, what string) outbox.ID {
	t.Helper()
	select {
	case id := <-published:
		return id
	case <-time.After(20 * time.Second):
		t.Fatalf("%s not published within 20 s (the poll interval is a minute)", what)
		return 0
	}
}

// Linger wakes on NOTIFY: with a 1-minute poll interval, an event enqueued through the
// producer API while it waits is still published at once.
func TestLingerWakesOnNotify(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	published := lingerInBackground(t, db)
	// Enqueue repeatedly until the first one is seen: the relay may not be listening yet
	// when the first insert commits (NOTIFY is a hint, not a queue).
	deadline := time.After(20 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-published:
			return
		case <-tick.C:
			if _, err := outbox.Enqueue(t.Context(), db.Pool, plainEvent); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("no event published while lingering")
		}
	}
}

// An idle relay falls asleep (holds the sleeper lock) and a plain SQL INSERT, which knows
// nothing of the relay, wakes it through the trigger's NOTIFY; once busy it releases the
// lock, and sleeps again when idle.
func TestLingerSleepingRelayWokenBySQLInsert(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	published := lingerInBackground(t, db)
	waitAsleep(t, db, 1)

	for range 2 {
		outboxtest.Exec(t, db.Pool, qInsertSQL)
		expectPublished(t, published, "a plain SQL insert into a sleeping relay's outbox")
		waitAsleep(t, db, 1)
	}
}

// The lost wake-up: a producer inserts while the relay is awake (its trigger finds no
// sleeper and sends nothing) and commits only after the relay has gone idle. The relay must
// not fall asleep on that event: its lock attempt fails while the producer's transaction is
// open, it keeps polling, and the event goes out long before the one-minute poll.
func TestLingerDoesNotSleepThroughAnOpenProducer(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	tx := outboxtest.Begin(t, db.Pool)
	if _, err := outbox.Enqueue(ctx, tx, plainEvent); err != nil {
		t.Fatal(err)
	}
	published := lingerInBackground(t, db)
	// Long past the relay's fast polls: without the producer's shared lock it would be
	// asleep by now, and the commit below would send no NOTIFY.
	time.Sleep(300 * time.Millisecond)
	if n := len(sleepers(t, db)); n != 0 {
		t.Fatalf("%d relays asleep while a producer that found none is still open", n)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	expectPublished(t, published, "the event of a producer that committed after the relay went idle")
	waitAsleep(t, db, 1)
}

// A relay whose listening connection dies while asleep leaves nobody marked asleep (the lock
// is the session's), so producers stop notifying; the relay listens again, sleeps on its new
// connection and is woken there.
func TestLingerSleeperLockDiesWithItsConnection(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	published := lingerInBackground(t, db)
	waitAsleep(t, db, 1)
	old := sleepers(t, db)[0]
	outboxtest.Terminate(t, db.Pool, old)
	testwait.Eventually(t, 10*time.Second, func() bool { s := sleepers(t, db); return len(s) == 1 && s[0] != old }, "a relay asleep on a new connection (the old was pid %d)", old)
	outboxtest.Exec(t, db.Pool, qInsertSQL)
	expectPublished(t, published, "an insert after the listening connection was replaced")
}

// sleepers returns the backend pids holding the sleeper lock of this schema's outbox.
func sleepers(t *testing.T, db *pgtest.DB) []int32 {
	t.Helper()
	return outboxtest.Column[int32](t, db.Pool, `SELECT pid FROM pg_locks WHERE locktype = 'advisory'
		AND classid = 1868724343 AND objid = 'outbox'::regclass::oid AND objsubid = 2 AND mode = 'ExclusiveLock' AND granted`)
}

// waitAsleep waits until n relays hold the sleeper lock.
func waitAsleep(t *testing.T, db *pgtest.DB, n int) {
	t.Helper()
	testwait.Eventually(t, 10*time.Second, func() bool { return len(sleepers(t, db)) == n }, "%d relay(s) asleep", n)
}

// A sleeping relay that producers keep busy wakes for good: it polls and lets go of the
// sleeper lock, so their inserts stop sending NOTIFY. When they stop, it sleeps again.
// Publishing is slow while they insert (a millisecond a message), so the relay's drain
// always has a batch in flight and never ends by itself: it must wake from inside it.
func TestLingerBusyRelayStopsTheNotifications(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	published := lingerInBackground(t, db)
	var slow atomic.Bool
	slow.Store(true)
	go func() {
		for range published {
			if slow.Load() {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	waitAsleep(t, db, 1)

	stop := insertWithoutPause(t, db, func(int) string { return qInsertSQL })
	waitAsleep(t, db, 0)
	stop()
	slow.Store(false)
	waitAsleep(t, db, 1)
}

// Under producers that never let up, Linger stops claiming at until: its drain ends there
// (the batches in flight are marked) instead of lasting as long as events keep coming, so
// a scheduled relay hands over to the next invocation on time.
func TestLingerReturnsAtUntilUnderLoad(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pub := &fakePublisher{before: func(context.Context, []outbox.Message) { time.Sleep(5 * time.Millisecond) }}
	r := newRelay(t, db, pub, relay.Config{PollInterval: time.Minute, DeadlineMargin: time.Second})
	// A key per event, so that every claim finds rows while batches publish.
	defer insertWithoutPause(t, db, func(int) string {
		return `INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', md5(random()::text), '{}')`
	})()

	until := time.Now().Add(time.Second)
	lctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // a relay that overruns fails, not hangs
	defer cancel()
	st, err := r.Linger(lctx, until)
	if late := time.Since(until); late > 2*time.Second {
		t.Errorf("Linger returned %v after until", late)
	}
	if err != nil || st.Claimed == 0 {
		t.Errorf("Linger: %+v, %v; want events claimed", st, err)
	}
}

// insertWithoutPause runs insert(session) on four sessions (0-3), each again as soon as it
// returns, until the function it returns is called (which waits for them). Stopping lets each session's
// last insert finish instead of cancelling it: a cancelled insert can still commit after
// Exec returns, so a row would turn up after stop and after the caller's final drain.
func insertWithoutPause(t *testing.T, db *pgtest.DB, insert func(session int) string) (stop func()) {
	t.Helper()
	var stopped atomic.Bool
	var wg sync.WaitGroup
	for session := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sql := insert(session)
			for !stopped.Load() && t.Context().Err() == nil {
				if _, err := db.Pool.Exec(t.Context(), sql); err != nil && t.Context().Err() == nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	return func() { stopped.Store(true); wg.Wait() }
}

// A lingering relay claims again while its batches publish: over a few hot keys, with a
// round trip per call, a key is never in two calls at once and each key's events are
// attempted in id order (fifo), so those claims skip the keys held by the batches in flight.
func TestLingerClaimsWhilePublishingKeepKeyOrder(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 12})
	fake := &fakePublisher{}
	guard := &keyGuard{t: t, inner: fake, delay: func() time.Duration { return 3 * time.Millisecond }}
	r := newRelay(t, db, guard, relay.Config{PollInterval: time.Minute, Ordering: publish.OrderingFIFO, Logger: quiet()})
	// Each session writes its own keys, a new one every 100 ms: per-key order is id order
	// only among producers that serialize (docs/producing.md), one session's inserts commit
	// in id order, and a claim while a batch is in flight always finds keys it does not hold.
	stop := insertWithoutPause(t, db, func(session int) string {
		return fmt.Sprintf(`INSERT INTO outbox (topic, partition_key, payload)
			VALUES ('t', 'hot-%d-' || (extract(epoch FROM clock_timestamp()) * 10)::bigint, '{}')`, session)
	})
	if _, err := r.Linger(t.Context(), time.Now().Add(1500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	stop()
	if _, err := r.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s := states(t, db); s.pending != 0 || s.dispatched == 0 {
		t.Fatalf("states %+v, want every event dispatched", s)
	}
	if guard.maxInFlight() < 2 {
		t.Fatalf("at most %d calls in flight: the relay did not claim while publishing", guard.maxInFlight())
	}
	assertAttemptOrder(t, fake.records(), true)
}
