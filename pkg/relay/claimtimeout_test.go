package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// A claim stuck behind a lock gives up at ClaimTimeout although the drain's context has
// no deadline (outboxctl relay's), with an error that says it timed out and why a claim
// gets that slow; nothing is leased.
func TestClaimGivesUpAtItsTimeout(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 20, outboxtest.Mod(20))
	pub := &fakePublisher{}
	const bound = 500 * time.Millisecond
	r := newRelay(t, db, pub, relay.Config{BatchSize: 10, ClaimTimeout: bound, Logger: quiet()})
	ctx := t.Context()
	tx := db.LockTable(t, "outbox")

	start := time.Now()
	done := drainInBackground(ctx, r)
	var res drainResult
	select {
	case res = <-done:
	case <-time.After(bound + 10*time.Second):
		_ = tx.Rollback(ctx) // let the drain end before the test does
		<-done
		t.Fatalf("the claim behind a lock was still running %v after it started, ClaimTimeout %v", time.Since(start), bound)
	}
	took := time.Since(start)
	_ = tx.Rollback(ctx)
	msg := fmt.Sprint(res.err)
	if !errors.Is(res.err, outboxstore.ErrTimeout) || !strings.Contains(msg, "claim outbox batch: statement timed out after") ||
		!strings.Contains(msg, "the claim timeout, 500ms") || !strings.Contains(msg, "xmin horizon") {
		t.Fatalf("drain error %q, want a claim timeout that names its bound and the likely cause", msg)
	}
	if took > bound+2*time.Second {
		t.Fatalf("the claim gave up after %v, ClaimTimeout %v", took, bound)
	}
	if s := states(t, db); s.leased != 0 || res.st.Claimed != 0 || len(pub.records()) != 0 {
		t.Fatalf("after a timed-out claim: states %+v, stats %+v, %d publishes", s, res.st, len(pub.records()))
	}
}

// ClaimTimeout defaults to what the lease leaves after a publish and a mark, and cannot
// be set beyond it.
func TestClaimTimeoutFromTheLease(t *testing.T) {
	t.Parallel()
	if got := (relay.Config{}).WithDefaults().ClaimTimeout; got != relay.DefaultLease-relay.DefaultPublishTimeout-relay.DefaultMarkTimeout {
		t.Fatalf("default ClaimTimeout %v", got)
	}
	cfg := relay.Config{Lease: 20 * time.Second, PublishTimeout: 5 * time.Second, MarkTimeout: 5 * time.Second, ClaimTimeout: 11 * time.Second}
	if err := cfg.WithDefaults().Validate(); err == nil || !strings.Contains(err.Error(), "ClaimTimeout") {
		t.Fatalf("ClaimTimeout beyond the lease's room: %v", err)
	}
	cfg.ClaimTimeout = 10 * time.Second
	if err := cfg.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
}

// A warm pool's idle session ended by the server right after its last use (within the
// second in which pgxpool hands it out without a ping) does not fail the next drain: its
// claim runs once more on a live connection.
func TestDrainAfterTheIdleSessionWasEnded(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := pgtest.OpenPool(t, db.URL, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 2
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false } // "within a second"
	})
	pub := &fakePublisher{}
	r, err := relay.New(pool, pub, relay.Config{PublishConcurrency: 1, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	seed(t, db, 10, outboxtest.Mod(10))
	if st, err := r.Drain(ctx); err != nil || st.Dispatched != 10 {
		t.Fatalf("first drain: %v, %+v", err, st)
	}
	var pids []int32
	for _, c := range pool.AcquireAllIdle(ctx) {
		pids = append(pids, int32(c.Conn().PgConn().PID()))
		c.Release()
	}
	outboxtest.Terminate(t, db.Pool, pids...)
	seed(t, db, 10, outboxtest.Mod(10))
	if st, err := r.Drain(ctx); err != nil || st.Dispatched != 10 {
		t.Fatalf("drain after the idle session was ended: %v, %+v", err, st)
	}
}
