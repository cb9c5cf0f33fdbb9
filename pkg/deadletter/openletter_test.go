package deadletter_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
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
	store := outboxstore.NewStore(db.Pool)
	for i := range 100 {
		id := enqueue(t, db, "order.created", "race", `{"n":1}`)
		lease, err := outboxstore.NewLease()
		if err != nil {
			t.Fatal(err)
		}
		claimed, err := store.Claim(ctx, outboxstore.ClaimRequest{Lease: lease, Rows: 1, KeyRun: 1, For: time.Minute})
		msgs := claimed.Messages
		if err != nil || len(msgs) != 1 || int64(msgs[0].ID) != id {
			t.Fatalf("round %d: claim %v %v", i, msgs, err)
		}
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
	store := outboxstore.NewStore(db.Pool)
	id := enqueue(t, db, "order.created", "k", `{"n":1}`)
	lease, _ := outboxstore.NewLease()
	if _, err := store.Claim(ctx, outboxstore.ClaimRequest{Lease: lease, Rows: 1, KeyRun: 1, For: time.Minute}); err != nil {
		t.Fatal(err)
	}
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
// into the URL: the id only in the reported source headers.
func legacyCallback(outboxID int64, msgID, url string) []byte {
	b, _ := json.Marshal(map[string]any{
		"status": 500, "body": base64.StdEncoding.EncodeToString([]byte(`{}`)), "retried": 3, "maxRetries": 3,
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
