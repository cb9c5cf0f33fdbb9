package relay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// handedOver records, per id, when the relay handed an event to QStash and in which call.
type handedOver struct {
	mu    sync.Mutex
	inner relay.Publisher
	calls int
	at    map[outbox.ID]time.Time
	call  map[outbox.ID]int
}

func (h *handedOver) Publish(ctx context.Context, msgs []outbox.Message) []publish.Result {
	h.mu.Lock()
	h.calls++
	for _, m := range msgs {
		if _, ok := h.at[m.ID]; !ok {
			h.at[m.ID], h.call[m.ID] = time.Now(), h.calls
		}
	}
	h.mu.Unlock()
	return h.inner.Publish(ctx, msgs)
}

func (h *handedOver) get(id outbox.ID) (time.Time, int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.at[id]
	return at, h.call[id], ok
}

// The black-box case of issue 40: a lingering relay in fifo mode through the local QStash,
// a steady load of autocommit inserts, and one producer that serializes its key: it
// inserts R, works for three seconds inside its transaction, commits, and at once inserts
// the key's next event L. R must go to QStash before L (or in the same call, ahead of it),
// and soon after its commit although the outbox never runs dry. Before the claim learnt
// its writers (walk.go), L went first in every round and R waited for a quiet moment.
func TestLateCommitKeepsOrderUnderLoad(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 12})
	_, pub := localQStash(t, qstashtest.Options{})
	h := &handedOver{inner: pub, at: map[outbox.ID]time.Time{}, call: map[outbox.ID]int{}}
	r := newRelay(t, db, h, relay.Config{PollInterval: 50 * time.Millisecond, Ordering: publish.OrderingFIFO, Logger: quiet()})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := r.Linger(ctx, time.Now().Add(time.Minute))
		done <- err
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Error(err)
		}
	}()
	stop := insertWithoutPause(t, db, func(session int) string {
		return fmt.Sprintf(`INSERT INTO outbox (topic, partition_key, payload)
			VALUES ('t', 'load-%d-' || (random() * 50)::int, '{}')`, session)
	})
	defer stop()

	const rounds = 2
	for round := range rounds {
		key := fmt.Sprintf("late-%d", round)
		tx, err := db.Pool.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var late, next outbox.ID
		if err := tx.QueryRow(t.Context(), `INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', $1, '{}') RETURNING id`, key).Scan(&late); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second) // the producer's work inside its transaction: the scenario, not a wait
		if err := tx.Commit(t.Context()); err != nil {
			t.Fatal(err)
		}
		committed := time.Now()
		if err := db.Pool.QueryRow(t.Context(), `INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', $1, '{}') RETURNING id`, key).Scan(&next); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, _, lateOut := h.get(late)
			_, _, nextOut := h.get(next)
			if lateOut && nextOut {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: after 20 s under load, R (%d) handed over %v, L (%d) %v", round, late, lateOut, next, nextOut)
			}
			time.Sleep(10 * time.Millisecond)
		}
		lateAt, lateCall, _ := h.get(late)
		nextAt, nextCall, _ := h.get(next)
		if nextCall < lateCall || (nextCall == lateCall && nextAt.Before(lateAt)) {
			t.Fatalf("round %d: L (%d) went to QStash in call %d, before R (%d) in call %d", round, next, nextCall, late, lateCall)
		}
		if wait := lateAt.Sub(committed); wait > 2*time.Second {
			t.Errorf("round %d: R handed over %v after its commit, with the outbox busy", round, wait)
		}
		t.Logf("round %d: R handed over %v after its commit, L in call %d after R's %d", round, lateAt.Sub(committed).Round(time.Millisecond), nextCall, lateCall)
	}
	if n := states(t, db).deadLettered; n != 0 {
		t.Fatalf("%d rows dead-lettered", n)
	}
}
