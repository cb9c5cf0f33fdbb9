package deadletter_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// TestRelayAndCallbackDeadLetterSameRowConcurrently: the relay gives up on a claimed row
// (its dead-letter statement) while QStash's failure callback for the same event
// generation is recorded, both released at the same instant; 100 times. Each time the
// event has exactly one open letter, the row is dead-lettered, and the relay still counts
// the row as its own (no lease reported lost). Without the unique open-letter index both
// writers inserted a letter.
func TestRelayAndCallbackDeadLetterSameRowConcurrently(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 4})
	ctx := context.Background()
	for i := range 100 {
		id := enqueue(t, db, "order.created", "race", `{"n":1}`)
		store, lease := claimAlone(t, db, id)
		start := make(chan struct{})
		var wg sync.WaitGroup
		var relayN int64
		var relayErr, cbErr error
		var rec deadletter.Recorded
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			relayN, relayErr = store.DeadLetter(ctx, lease, []outboxstore.Failure{{ID: outbox.ID(id), Error: "relay gave up", StatusCode: 400}}, nil)
		}()
		go func() {
			defer wg.Done()
			<-start
			rec, cbErr = deadletter.Record(ctx, db.Pool, failure(id, "msg-race-"+itoa(int64(i))))
		}()
		close(start)
		wg.Wait()
		if relayErr != nil || cbErr != nil {
			t.Fatalf("round %d: relay %v, callback %v", i, relayErr, cbErr)
		}
		if relayN != 1 {
			t.Fatalf("round %d: relay dead-lettered %d rows, want 1 (its lease held the row)", i, relayN)
		}
		if n := db.Count(t, `SELECT count(*) FROM dead_letters WHERE outbox_id = $1 AND resolved_at IS NULL`, id); n != 1 {
			t.Fatalf("round %d: %d open letters for outbox row %d, want 1 (callback created=%v)", i, n, id, rec.Created)
		}
		if !readOutbox(t, db, id).dead {
			t.Fatalf("round %d: row not dead-lettered", i)
		}
	}
}

// TestRelayDeadLetterKeepsCallbackLetter: the callback dead-lettered the row first; the
// relay's dead-letter statement then adds no letter and keeps the callback's error.
func TestRelayDeadLetterKeepsCallbackLetter(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	id := enqueue(t, db, "order.created", "k", `{"n":1}`)
	store, lease := claimAlone(t, db, id)
	f := failure(id, "msg-first")
	if r, err := deadletter.Record(ctx, db.Pool, f); err != nil || !r.Created || !r.OutboxMarked {
		t.Fatalf("callback %+v %v", r, err)
	}
	if n, err := store.DeadLetter(ctx, lease, []outboxstore.Failure{{ID: outbox.ID(id), Error: "relay gave up"}}, nil); err != nil || n != 1 {
		t.Fatalf("relay dead-letter: %d %v", n, err)
	}
	if n := db.Count(t, `SELECT count(*) FROM dead_letters`); n != 1 {
		t.Fatalf("%d letters, want the callback's only", n)
	}
	if o := readOutbox(t, db, id); o.lastError == nil || *o.lastError != f.ErrorText() {
		t.Fatalf("last_error %v, want the callback's %q", o.lastError, f.ErrorText())
	}
}

// legacyCallback is a failure callback for a delivery published before the identity moved
// into the URL: the id only in the reported source headers. The event was rejected (489):
// a transient failure would be rescheduled, not recorded.
func legacyCallback(outboxID int64, msgID, url string) []byte {
	b, _ := json.Marshal(map[string]any{
		"status": 489, "body": base64.StdEncoding.EncodeToString([]byte(`{}`)), "retried": 3, "maxRetries": 3,
		"dlqId": "1-0", "sourceMessageId": msgID, "url": url,
		"sourceHeader": map[string][]string{"Upstash-Forward-X-Outbox-Id": {itoa(outboxID)}, "Upstash-Forward-X-Outbox-Generation": {"0"}},
		"sourceBody":   base64.StdEncoding.EncodeToString([]byte(`{"n":1}`)),
	})
	return b
}

// TestCallbackIdentityFromSignedURL: the letter is linked to the outbox row named by the
// reported destination url's query, whatever the source headers say. A callback whose url
// has no identity is linked through its source headers only while the legacy window is
// open; after it, the letter is recorded unlinked and the row is left alone.
func TestCallbackIdentityFromSignedURL(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := newCallbackHandler(t, db, nil)
	ctx := context.Background()
	a := enqueue(t, db, "order.created", "a", `{"n":1}`)
	b := enqueue(t, db, "order.created", "b", `{"n":1}`)
	c := enqueue(t, db, "order.created", "c", `{"n":1}`)
	for _, id := range []int64{a, b, c} {
		dispatch(t, db, id)
	}
	linked := func(msgID string) int64 {
		t.Helper()
		var id *int64
		if err := db.Pool.QueryRow(ctx, `SELECT outbox_id FROM dead_letters WHERE qstash_message_id = $1`, msgID).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if id == nil {
			return 0
		}
		return *id
	}
	serve := func(body []byte) {
		t.Helper()
		if w := serveCallback(h, signedCallback(t, failureURL, body)); w.Code != http.StatusOK {
			t.Fatalf("status %d %s", w.Code, w.Body)
		}
	}

	serve(legacyCallback(b, "m-url", destination(a, 0))) // url says a, headers say b
	if got := linked("m-url"); got != a {
		t.Fatalf("letter linked to %d, want %d from the url", got, a)
	}
	if readOutbox(t, db, b).dead {
		t.Fatal("row named only by the source headers was dead-lettered")
	}

	const legacyURL = "https://hooks.example.com/events/order.created"
	if _, err := db.Pool.Exec(ctx, `UPDATE legacy_identity SET accept_until = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	serve(legacyCallback(b, "m-legacy-open", legacyURL))
	if got := linked("m-legacy-open"); got != b || !readOutbox(t, db, b).dead {
		t.Fatalf("legacy callback in the window: linked to %d, want %d and the row dead-lettered", got, b)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE legacy_identity SET accept_until = now()`); err != nil {
		t.Fatal(err)
	}
	serve(legacyCallback(c, "m-legacy-closed", legacyURL))
	if got := linked("m-legacy-closed"); got != 0 || readOutbox(t, db, c).dead {
		t.Fatalf("legacy callback after the window: linked to %d, want unlinked and the row untouched", got)
	}
}

// claimAlone claims the outbox row id, which must be the only one ready, under a new lease,
// as a relay does before publishing; the store returned acts as that relay.
func claimAlone(t *testing.T, db *pgtest.DB, id int64) (*outboxstore.Store, outboxstore.Lease) {
	t.Helper()
	store := outboxstore.NewStore(db.Pool)
	lease, err := outboxstore.NewLease()
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := store.Claim(context.Background(), outboxstore.ClaimRequest{Lease: lease, Rows: 1, KeyRun: 1, For: time.Minute})
	if err != nil || len(claimed.Messages) != 1 || int64(claimed.Messages[0].ID) != id {
		t.Fatalf("claim of row %d: %+v %v", id, claimed.Messages, err)
	}
	return store, lease
}

// publishOnce claims the outbox row id and marks it dispatched, as the relay does after
// QStash accepted it.
func publishOnce(t *testing.T, db *pgtest.DB, id int64) {
	t.Helper()
	store, lease := claimAlone(t, db, id)
	if n, err := store.MarkDispatched(context.Background(), lease, []outbox.ID{outbox.ID(id)}, nil); err != nil || n != 1 {
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
