package inbox_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/inbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

func hash(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// setup returns a database with an effects table the work writes to.
func setup(t *testing.T) *pgtest.DB {
	t.Helper()
	db := pgtest.New(t)
	outboxtest.Exec(t, db.Pool, `CREATE TABLE effects (message_id text NOT NULL)`)
	return db
}

func effect(id string) inbox.Work {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, id)
		return err
	}
}

func TestHandleOnceProcessesThenReportsDuplicate(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := t.Context()

	for i, want := range []inbox.Outcome{inbox.Processed, inbox.Duplicate, inbox.Duplicate} {
		got, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "c", ID: "m1", PayloadHash: hash("p")}, effect("m1"))
		if err != nil || got != want {
			t.Fatalf("delivery %d: got (%v, %v), want (%v, nil)", i, got, err, want)
		}
	}
	if n := db.Count(t, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	// The same id under another consumer is another message.
	if got, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "other", ID: "m1", PayloadHash: hash("p")}, effect("m1")); err != nil || got != inbox.Processed {
		t.Fatalf("other consumer: got (%v, %v)", got, err)
	}
	var stored []byte
	if err := db.Pool.QueryRow(ctx, `SELECT payload_hash FROM processed_messages WHERE consumer='c' AND message_id='m1'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if string(stored) != string(hash("p")) {
		t.Fatalf("stored hash %x, want %x", stored, hash("p"))
	}
}

func TestHandleOnceWorkErrorRollsBackEverything(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := t.Context()
	boom := errors.New("boom")

	got, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "c", ID: "m1", PayloadHash: hash("p")}, func(ctx context.Context, tx pgx.Tx) error {
		if err := effect("m1")(ctx, tx); err != nil {
			return err
		}
		return boom // after writing
	})
	if !errors.Is(err, boom) || got != 0 {
		t.Fatalf("got (%v, %v), want (0, boom)", got, err)
	}
	if n := db.Count(t, `SELECT count(*) FROM effects`); n != 0 {
		t.Fatalf("effects = %d after failed work, want 0", n)
	}
	if n := db.Count(t, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("processed_messages = %d after failed work, want 0", n)
	}
	// The retry runs the work again and commits.
	if got, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "c", ID: "m1", PayloadHash: hash("p")}, effect("m1")); err != nil || got != inbox.Processed {
		t.Fatalf("retry: got (%v, %v)", got, err)
	}
	if n := db.Count(t, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("effects = %d after retry, want 1", n)
	}
}

func TestHandleOnceConflictingPayload(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := t.Context()

	if _, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "c", ID: "m1", PayloadHash: hash("a")}, effect("m1")); err != nil {
		t.Fatal(err)
	}
	ran := false
	got, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "c", ID: "m1", PayloadHash: hash("b")}, func(context.Context, pgx.Tx) error { ran = true; return nil })
	if got != inbox.Conflict || !errors.Is(err, inbox.ErrPayloadConflict) {
		t.Fatalf("got (%v, %v), want (Conflict, ErrPayloadConflict)", got, err)
	}
	if ran {
		t.Fatal("work ran on a conflicting payload")
	}
	// Without a hash on either side there is nothing to compare: a duplicate.
	if got, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "c", ID: "m1", PayloadHash: nil}, effect("m1")); err != nil || got != inbox.Duplicate {
		t.Fatalf("nil hash: got (%v, %v), want Duplicate", got, err)
	}
	if _, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "c", ID: "m2", PayloadHash: nil}, effect("m2")); err != nil {
		t.Fatal(err)
	}
	if got, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "c", ID: "m2", PayloadHash: hash("x")}, effect("m2")); err != nil || got != inbox.Duplicate {
		t.Fatalf("stored nil hash: got (%v, %v), want Duplicate", got, err)
	}
}

// TestHandleOnceRecordsRetried: the delivery's retry count is stored with the message; an
// absent or implausible count (the header is not signed) is stored as unknown and does not
// fail the delivery.
func TestHandleOnceRecordsRetried(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := t.Context()
	ptr := func(v int) *int { return &v }
	for id, retried := range map[string]*int{
		"first": ptr(0), "third": ptr(2), "unknown": nil, "negative": ptr(-1), "huge": ptr(1 << 40),
	} {
		if out, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "c", ID: id, PayloadHash: hash(id), Retried: retried}, effect(id)); err != nil || out != inbox.Processed {
			t.Fatalf("%s: %v %v", id, out, err)
		}
	}
	rows, err := db.Pool.Query(ctx, `SELECT message_id, coalesce(retried, -1) FROM processed_messages`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { got[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"first": 0, "third": 2, "unknown": -1, "negative": -1, "huge": -1}
	if !maps.Equal(got, want) {
		t.Fatalf("retried %v, want %v", got, want)
	}
}

func TestHandleOnceRejectsEmptyIDs(t *testing.T) {
	t.Parallel()
	db := setup(t)
	for _, c := range [][2]string{{"", "m"}, {"c", ""}} {
		if _, err := inbox.HandleOnce(t.Context(), db.Pool, inbox.Message{Consumer: c[0], ID: c[1], PayloadHash: nil}, effect("x")); err == nil {
			t.Fatalf("HandleOnce(%q, %q) accepted empty ids", c[0], c[1])
		}
	}
}

func TestHandleOnceConcurrentDeliveriesOneEffect(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := t.Context()

	const n = 8
	var wg sync.WaitGroup
	outcomes := make([]inbox.Outcome, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			outcomes[i], errs[i] = inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "c", ID: "m1", PayloadHash: hash("p")}, effect("m1"))
		}()
	}
	close(start)
	wg.Wait()
	processed := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("delivery %d: %v", i, errs[i])
		}
		if outcomes[i] == inbox.Processed {
			processed++
		}
	}
	if processed != 1 {
		t.Fatalf("processed %d times, want 1 (outcomes %v)", processed, outcomes)
	}
	if c := db.Count(t, `SELECT count(*) FROM effects`); c != 1 {
		t.Fatalf("effects = %d, want 1", c)
	}
}

// TestHandleOnceSecondDeliveryWaitsForFirst pins the interleaving: the second delivery
// starts while the first holds its uncommitted record, must block on it, and then sees a
// duplicate if the first commits, or processes if the first rolls back.
func TestHandleOnceSecondDeliveryWaitsForFirst(t *testing.T) {
	t.Parallel()
	for _, firstCommits := range []bool{true, false} {
		name := map[bool]string{true: "first commits", false: "first rolls back"}[firstCommits]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := setup(t)
			ctx := t.Context()
			xid := make(chan string, 1)
			release := make(chan struct{})
			firstErr := errors.New("first delivery failed")

			type result struct {
				o   inbox.Outcome
				err error
			}
			first := make(chan result, 1)
			go func() {
				o, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "c", ID: "m1", PayloadHash: hash("p")}, func(ctx context.Context, tx pgx.Tx) error {
					if err := effect("first")(ctx, tx); err != nil {
						return err
					}
					var id string
					if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&id); err != nil {
						return err
					}
					xid <- id
					<-release
					if !firstCommits {
						return firstErr
					}
					return nil
				})
				first <- result{o, err}
			}()
			firstXID := <-xid

			second := make(chan result, 1)
			go func() {
				o, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "c", ID: "m1", PayloadHash: hash("p")}, effect("second"))
				second <- result{o, err}
			}()
			// Wait until the second delivery is blocked on the first's transaction.
			testwait.Eventually(t, 10*time.Second, func() bool {
				var waiting bool
				err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
					WHERE locktype = 'transactionid' AND transactionid = $1::text::xid AND NOT granted)`, firstXID).Scan(&waiting)
				if err != nil {
					t.Fatal(err)
				}
				if waiting {
					return true
				}
				select {
				case r := <-second:
					t.Fatalf("second delivery finished while the first was uncommitted: %+v", r)
				default:
				}
				return false
			}, "the second delivery to wait on the first")
			close(release)

			r1, r2 := <-first, <-second
			effects := outboxtest.Column[string](t, db.Pool, `SELECT message_id FROM effects`)
			if firstCommits {
				if r1.err != nil || r1.o != inbox.Processed || r2.err != nil || r2.o != inbox.Duplicate {
					t.Fatalf("first %+v, second %+v; want Processed, Duplicate", r1, r2)
				}
				if len(effects) != 1 || effects[0] != "first" {
					t.Fatalf("effects %v, want [first]", effects)
				}
			} else {
				if !errors.Is(r1.err, firstErr) || r2.err != nil || r2.o != inbox.Processed {
					t.Fatalf("first %+v, second %+v; want error, Processed", r1, r2)
				}
				if len(effects) != 1 || effects[0] != "second" {
					t.Fatalf("effects %v, want [second]", effects)
				}
			}
		})
	}
}

func TestHandleOnceDatabaseDown(t *testing.T) {
	t.Parallel()
	db := setup(t)
	db.Pool.Close()
	if _, err := inbox.HandleOnce(t.Context(), db.Pool, inbox.Message{Consumer: "c", ID: "m1", PayloadHash: nil}, effect("m1")); err == nil {
		t.Fatal("HandleOnce on a closed pool returned nil error")
	}
}

func TestOutcomeString(t *testing.T) {
	t.Parallel()
	for o, want := range map[inbox.Outcome]string{inbox.Processed: "processed", inbox.Duplicate: "duplicate", inbox.Conflict: "conflict", 0: "unknown"} {
		if o.String() != want {
			t.Errorf("%d.String() = %q, want %q", o, o.String(), want)
		}
	}
}
