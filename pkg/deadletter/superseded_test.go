package deadletter_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
)

// publishOnce claims the outbox row id and marks it dispatched, as the relay does after
// QStash accepted it.
func publishOnce(t *testing.T, db *pgtest.DB, id int64) {
	t.Helper()
	ctx := context.Background()
	store := outboxstore.NewStore(db.Pool)
	lease, err := outboxstore.NewLease()
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := store.Claim(ctx, outboxstore.ClaimRequest{Lease: lease, Rows: 1, KeyRun: 1, For: time.Minute})
	if err != nil || len(claimed.Messages) != 1 || int64(claimed.Messages[0].ID) != id {
		t.Fatalf("claim: %+v %v", claimed.Messages, err)
	}
	if n, err := store.MarkDispatched(ctx, lease, []outbox.ID{outbox.ID(id)}, nil); err != nil || n != 1 {
		t.Fatalf("mark dispatched: %d %v", n, err)
	}
}

// TestLateCallbackOfRedrivenEventIsSuperseded: an event published at generation 0 is
// dead-lettered by its failure callback (generation 0 current: an open letter), redriven
// (generation 1) and delivered. A failure callback about generation 0 that arrives now is
// recorded resolved as superseded, as DLQ sync records it: no open letter, the delivered
// row untouched, and redriving that letter changes nothing. Before, it opened a letter
// whose redrive put the delivered row back to pending at generation 2.
func TestLateCallbackOfRedrivenEventIsSuperseded(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	var outcomes []string
	h := newCallbackHandler(t, db, func(c *deadletter.CallbackConfig) { c.Observe = func(o string) { outcomes = append(outcomes, o) } })
	id := enqueue(t, db, "order.created", "order:1", `{"order_id":"o-1"}`)
	publishOnce(t, db, id)

	if w := serveCallback(h, signedCallback(t, failureURL, callbackBody(id, "msg-g0-a"))); w.Code != 200 || !strings.Contains(w.Body.String(), "recorded") {
		t.Fatalf("current-generation callback: %d %s", w.Code, w.Body)
	}
	open, err := deadletter.List(ctx, db.Pool, deadletter.Filter{})
	if err != nil || len(open) != 1 || open[0].Resolved() || !readOutbox(t, db, id).dead {
		t.Fatalf("current-generation callback: open letters %+v %v, row %+v; want one open letter, row dead-lettered", open, err, readOutbox(t, db, id))
	}
	if res, err := deadletter.Redrive(ctx, db.Pool, deadletter.Filter{IDs: []int64{open[0].ID}}, nil); err != nil || len(res.Redriven) != 1 {
		t.Fatalf("redrive: %+v %v", res, err)
	}
	publishOnce(t, db, id) // generation 1 delivered
	delivered := readOutbox(t, db, id)
	if !delivered.dispatched || delivered.dead || delivered.gen != 1 {
		t.Fatalf("row after redelivery %+v", delivered)
	}

	w := serveCallback(h, signedCallback(t, failureURL, callbackBody(id, "msg-g0-b")))
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"superseded"`) {
		t.Fatalf("late callback: %d %s", w.Code, w.Body)
	}
	if n := db.Count(t, `SELECT count(*) FROM dead_letters WHERE resolved_at IS NULL`); n != 0 {
		t.Fatalf("%d open letters after the late callback, want 0", n)
	}
	var late deadletter.Letter
	all, err := deadletter.List(ctx, db.Pool, deadletter.Filter{IncludeResolved: true})
	for _, l := range all {
		if l.QStashMessageID == "msg-g0-b" {
			late = l
		}
	}
	if err != nil || late.ID == 0 || !late.Resolved() || late.Resolution != deadletter.ResolutionSuperseded {
		t.Fatalf("late letter %+v %v; want recorded resolved %q", late, err, deadletter.ResolutionSuperseded)
	}
	if o := readOutbox(t, db, id); o != delivered {
		t.Fatalf("late callback changed the delivered row: %+v, was %+v", o, delivered)
	}

	res, err := deadletter.Redrive(ctx, db.Pool, deadletter.Filter{IDs: []int64{late.ID}}, nil)
	if err != nil || len(res.Redriven)+len(res.AlreadyPending)+len(res.Superseded) != 0 || !slices.Equal(res.AlreadyResolved, []int64{late.ID}) {
		t.Fatalf("redrive of the late letter: %+v %v; want already resolved", res, err)
	}
	if o := readOutbox(t, db, id); o != delivered {
		t.Fatalf("redrive of the late letter changed the delivered row: %+v, was %+v", o, delivered)
	}
	if got := strings.Join(outcomes, ","); got != "recorded,superseded" {
		t.Fatalf("callback outcomes %s; want the first recorded, the late one superseded", got)
	}
}

// TestRedriveSkipsSupersededOpenLetter: a letter about generation 0 left open (recorded
// before late callbacks were recorded superseded) while its row has been redriven and
// delivered at generation 1. Plan and Redrive report it superseded; Redrive resolves it so
// and never resets the row.
func TestRedriveSkipsSupersededOpenLetter(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	id := enqueue(t, db, "order.created", "order:1", `{"order_id":"o-1"}`)
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox SET generation = 1, dispatched_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	var letter int64
	if err := db.Pool.QueryRow(ctx, `INSERT INTO dead_letters (source, outbox_id, topic, error, generation, qstash_message_id)
		VALUES ('delivery', $1, 'order.created', 'qstash delivery failed: HTTP 500 after 3 of 3 retries', 0, 'msg-old') RETURNING id`, id).Scan(&letter); err != nil {
		t.Fatal(err)
	}
	delivered := readOutbox(t, db, id)
	want := []deadletter.Redriven{{LetterID: letter, OutboxID: outbox.ID(id), Generation: 1}}

	plan, err := deadletter.Plan(ctx, db.Pool, deadletter.Filter{All: true})
	if err != nil || len(plan.Redriven)+len(plan.AlreadyPending) != 0 || !slices.Equal(plan.Superseded, want) {
		t.Fatalf("plan %+v %v; want superseded %+v", plan, err, want)
	}
	res, err := deadletter.Redrive(ctx, db.Pool, deadletter.Filter{All: true}, nil)
	if err != nil || len(res.Redriven)+len(res.AlreadyPending) != 0 || !slices.Equal(res.Superseded, want) {
		t.Fatalf("redrive %+v %v; want superseded %+v", res, err, want)
	}
	if o := readOutbox(t, db, id); o != delivered {
		t.Fatalf("redrive reset the delivered row: %+v, was %+v", o, delivered)
	}
	l, err := deadletter.Get(ctx, db.Pool, letter)
	if err != nil || !l.Resolved() || l.Resolution != deadletter.ResolutionSuperseded {
		t.Fatalf("letter %+v %v; want resolved %q", l, err, deadletter.ResolutionSuperseded)
	}
}
