package relay_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// A batch that kills its process does not kill every process after it. One event takes
// down any relay that publishes it, with every batch it has in flight (a publisher that
// panics on it and in every call still publishing, as a process killed for memory or by
// the Lambda deadline would leave them: leased and unmarked). Each run is a fresh process
// after the last one's lease has ended. Before, every process claimed the dead batch
// again and died with it, and nothing more was ever dispatched. Now the rows of the dead
// batch come back one per claim, each published with no other batch in flight, so only
// the guilty row dies again, alone, and after three deaths it is dead-lettered with that
// reason; every other event is dispatched (none dies three times beside it).
func TestRelayIsolatesTheEventItDiesHolding(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ids := seed(t, db, 30, outboxtest.Mod(10))
	guilty := ids[4]
	clk := newClock()
	var mu sync.Mutex
	var withGuilty [][]outbox.ID // the publish calls that held it
	var dying *relay.Relay       // the process the guilty event is killing
	var current *relay.Relay     // the process running
	pub := &fakePublisher{before: func(_ context.Context, msgs []outbox.Message) {
		mu.Lock()
		killer := slices.ContainsFunc(msgs, func(m outbox.Message) bool { return m.ID == guilty })
		if killer {
			call := make([]outbox.ID, 0, len(msgs))
			for _, m := range msgs {
				call = append(call, m.ID)
			}
			withGuilty = append(withGuilty, call)
			dying = current
		}
		mu.Unlock()
		if killer {
			panic("the relay's process dies holding its batches")
		}
		// Long enough for the batches of one process to overlap; a batch still
		// publishing when its process dies dies with it.
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		dead := dying != nil && dying == current
		mu.Unlock()
		if dead {
			panic("the relay's process is gone")
		}
	}}
	deaths := 0
	for run := 0; ; run++ {
		if run == 10 {
			t.Fatalf("after 10 runs (%d deaths): %+v", deaths, states(t, db))
		}
		clk.Add(time.Minute) // the last process's lease (30s) has ended
		r := newRelay(t, db, pub, relay.Config{BatchSize: 100, PublishConcurrency: 4, Now: clk.Now})
		mu.Lock()
		current = r
		mu.Unlock()
		if drainOrDie(t, r) {
			deaths++
			continue
		}
		break
	}
	if s := states(t, db); s.dispatched != 29 || s.deadLettered != 1 || s.pending != 0 || s.leased != 0 {
		t.Fatalf("rows %+v after %d deaths; want 29 dispatched, the guilty one dead-lettered", s, deaths)
	}
	var reason string
	if err := db.Pool.QueryRow(t.Context(), `SELECT error FROM dead_letters WHERE outbox_id = $1`, guilty).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "the relay died 3 times while holding this row") {
		t.Fatalf("dead letter's error %q", reason)
	}
	mu.Lock()
	defer mu.Unlock()
	if deaths != 3 || len(withGuilty) != 3 || len(withGuilty[0]) < 2 {
		t.Fatalf("%d deaths, publish calls holding the guilty event %v; want 3, the first one with others", deaths, withGuilty)
	}
	for _, call := range withGuilty[1:] {
		if !slices.Equal(call, []outbox.ID{guilty}) {
			t.Fatalf("publish calls holding the guilty event %v: after its first death it must be alone", withGuilty)
		}
	}
	for _, id := range ids {
		if id != guilty && !slices.ContainsFunc(pub.records(), func(p publishRecord) bool { return p.id == id && p.ok }) {
			t.Errorf("event %d never published", id)
		}
	}
}

// drainOrDie drains r and reports whether its process died (Drain ended in a panic, the
// batch's lease left to run out).
func drainOrDie(t *testing.T, r *relay.Relay) (died bool) {
	t.Helper()
	defer func() {
		if recover() != nil {
			died = true
		}
	}()
	drain(t.Context(), t, r)
	return false
}

// An event larger than the relay may ever hold (MaxInFlightBytes) is dead-lettered at its
// claim with that reason, never published, and its key's later event waits for the dead
// letter, then goes; the other events are dispatched.
func TestRelayDeadLettersAnEventItCannotHold(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// ~64 kB of hex digits (Postgres cannot compress them) between small events, the one
	// after it on its key.
	outboxtest.Exec(t, db.Pool, `INSERT INTO outbox (topic, partition_key, payload) VALUES
		('order.created', 'a', '{"n": 1}'),
		('order.created', 'big', jsonb_build_object('pad', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 2000) i))),
		('order.created', 'big', '{"n": 3}'), ('order.created', 'b', '{"n": 4}')`)
	pub := &fakePublisher{}
	st := drain(t.Context(), t, newRelay(t, db, pub, relay.Config{BatchSize: 10, MaxBatchBytes: 20_000, MaxInFlightBytes: 40_000}))
	if s := states(t, db); st.DeadLettered != 1 || s.dispatched != 3 || s.deadLettered != 1 || s.pending != 0 {
		t.Fatalf("stats %+v, rows %+v; want the 64 kB event dead-lettered, the 3 others dispatched", st, s)
	}
	var reason string
	if err := db.Pool.QueryRow(t.Context(), `SELECT error FROM dead_letters WHERE outbox_id = 2`).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "larger than the relay can hold (40000 bytes") {
		t.Fatalf("dead letter's error %q", reason)
	}
	for _, p := range pub.records() {
		if p.id == 2 {
			t.Fatal("the event the relay cannot hold was published")
		}
	}
}

// A row at its last life (relays died holding it MaxDeaths-1 times) is never held while
// other batches of the process are in flight: one of them may kill the process, and that
// death would be the row's last. Here the process dies (a batch's publisher panics, and
// every publish after it) just after the drain claimed such a row beside that batch.
// Before, the row waited under its lease for the batch, was counted dead with the process
// and dead-lettered at the next claim, a healthy event; now it is handed back before the
// wait and the next process publishes it alone.
func TestRelayHoldsNoLastLifeBesideOtherBatches(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ids := seed(t, db, 10, outboxtest.Mod(10))
	last := ids[5]
	const token = "00000000-0000-0000-0000-00000000dead"
	// A suspect with one death: the claim that takes it counts its second, the last
	// before the third dead-letters it (MaxDeaths 3). Suspects end a batch before them,
	// so the drain claims ids[0:5] first and this row next, alone, while they publish.
	if _, err := db.Pool.Exec(t.Context(),
		`UPDATE outbox SET lease_token = $2, relay_deaths = 1, attempts = 2 WHERE id = $1`, last, token); err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	var mu sync.Mutex
	var dying, current *relay.Relay
	pub := &fakePublisher{before: func(ctx context.Context, msgs []outbox.Message) {
		mu.Lock()
		dead := dying != nil && dying == current
		first := dying == nil && msgs[0].ID == ids[0]
		mu.Unlock()
		if dead {
			panic("the relay's process is gone")
		}
		if !first {
			return
		}
		// The process dies once the drain has claimed the row beside this batch.
		for deadline := time.Now().Add(10 * time.Second); ; {
			var claimed bool
			if err := db.Pool.QueryRow(ctx, `SELECT lease_token <> $2 FROM outbox WHERE id = $1`, last, token).Scan(&claimed); err != nil {
				panic(err)
			}
			if claimed {
				break
			}
			if time.Now().After(deadline) {
				panic("the drain never claimed the last-life row beside its first batch")
			}
			time.Sleep(5 * time.Millisecond)
		}
		mu.Lock()
		dying = current
		mu.Unlock()
		panic("the relay's process dies holding its batches")
	}}
	for run := 0; ; run++ {
		if run == 5 {
			t.Fatalf("after 5 runs: %+v", states(t, db))
		}
		clk.Add(time.Minute) // the last process's lease (30s) has ended
		r := newRelay(t, db, pub, relay.Config{BatchSize: 100, PublishConcurrency: 4, Now: clk.Now})
		mu.Lock()
		current = r
		mu.Unlock()
		if !drainOrDie(t, r) {
			break
		}
		if run > 0 {
			t.Fatalf("run %d died; only the first may", run)
		}
	}
	if s := states(t, db); s.dispatched != 10 || s.deadLettered != 0 || s.pending != 0 || s.leased != 0 {
		t.Fatalf("rows %+v; want all 10 dispatched: the row was not in the process when it died", s)
	}
	if !slices.ContainsFunc(pub.records(), func(p publishRecord) bool { return p.id == last && p.ok }) {
		t.Fatal("the last-life row was never published")
	}
}
