package deadletter_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// finalFailure is the failure callback QStash sends after a delivery's last retry: status
// (0: no response, a timeout or a refused connection) and the destination's headers.
func finalFailure(outboxID int64, gen int, msgID string, status int, header map[string][]string) []byte {
	b, _ := json.Marshal(map[string]any{
		"status": status, "header": header, "body": base64.StdEncoding.EncodeToString([]byte(`upstream down`)),
		"retried": 3, "maxRetries": 3, "dlqId": "dlq-" + msgID, "sourceMessageId": msgID,
		"url": destination(outboxID, gen), "method": "POST",
		"sourceBody": base64.StdEncoding.EncodeToString([]byte(`{"n":1}`)),
	})
	return b
}

// TestCallbackOutageReschedulesPoisonDeadLetters: a final failure the destination did not
// blame on the event (a 5xx, a timeout, a 429) puts the row back to pending under a new
// generation and writes no letter, however often QStash repeats the callback; a 489
// (with or without Upstash-NonRetryable-Error) or the header alone dead-letters the event,
// exactly once. A callback that beats the relay's mark reopens the row and takes its lease.
// The outage opens its topic's circuit.
func TestCallbackOutageReschedulesPoisonDeadLetters(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var outcomes []string
	h := newCallbackHandler(t, db, func(c *deadletter.CallbackConfig) { c.Observe = func(o string) { outcomes = append(outcomes, o) } })
	serve := func(body []byte, want int) {
		t.Helper()
		if w := serveCallback(h, signedCallback(t, failureURL, body)); w.Code != want {
			t.Fatalf("status %d %s, want %d", w.Code, w.Body, want)
		}
	}
	openLetters := func(id int64) int {
		return db.Count(t, `SELECT count(*) FROM dead_letters WHERE outbox_id = $1 AND resolved_at IS NULL`, id)
	}
	nonRetryable := map[string][]string{"Upstash-Nonretryable-Error": {"true"}}

	// The callback beat the relay's mark: the row is leased, still at the failed generation.
	// It is reopened and loses the lease, so the relay's mark (fenced by it) changes nothing.
	early := enqueue(t, db, "order.created", "unmarked", `{"n":1}`)
	store, lease := claimAlone(t, db, early)
	serve(finalFailure(early, 0, "msg-early", 500, nil), http.StatusOK)
	if row := readOutbox(t, db, early); row.leased || row.gen != 1 || row.dead || row.dispatched || openLetters(early) != 0 {
		t.Fatalf("early callback: row %+v, want pending at generation 1 without a lease", row)
	}
	if n, err := store.MarkDispatched(context.Background(), lease, []outbox.ID{outbox.ID(early)}, nil); err != nil || n != 0 {
		t.Fatalf("the relay's late mark changed %d rows (%v), want none: its lease is gone", n, err)
	}

	outages := []struct {
		name   string
		status int
	}{{"HTTP 500", 500}, {"HTTP 503", 503}, {"timeout", 0}, {"HTTP 429", 429}}
	for i, o := range outages {
		id := enqueue(t, db, "order.created", "outage", `{"n":1}`)
		dispatch(t, db, id)
		msg := "msg-outage-" + itoa(int64(i))
		serve(finalFailure(id, 0, msg, o.status, map[string][]string{"Content-Type": {"text/plain"}}), http.StatusOK)
		row := readOutbox(t, db, id)
		if row.dispatched || row.dead || row.gen != 1 || row.attempts != 0 || row.leased || row.lastError == nil ||
			!strings.Contains(*row.lastError, "qstash delivery failed") {
			t.Fatalf("%s: row after the callback %+v, want pending at generation 1 with the failure as last_error", o.name, row)
		}
		// QStash retries a callback it thinks failed: the row has left generation 0, so the
		// repeat is history (a resolved letter), never a second reopen or an open letter.
		serve(finalFailure(id, 0, msg, o.status, nil), http.StatusOK)
		if row := readOutbox(t, db, id); row.gen != 1 || row.dispatched {
			t.Fatalf("%s: repeated callback moved the row on: %+v", o.name, row)
		}
		if n := openLetters(id); n != 0 {
			t.Fatalf("%s: %d open letters for an outage", o.name, n)
		}
	}
	// The outage opened its topic's circuit (the relay holds the topic and probes it); each
	// reopen counted once, the repeats not at all.
	if n := db.Count(t, `SELECT failures FROM outbox_circuits WHERE topic = 'order.created' AND probe_id IS NULL AND probe_at > now()`); n != len(outages)+1 {
		t.Fatalf("circuit counted %d failures, want %d (the outages and the early callback)", n, len(outages)+1)
	}
	wantOutcomes := "rescheduled," + strings.Repeat("rescheduled,superseded,", len(outages))

	poisons := []struct {
		name   string
		status int
		header map[string][]string
	}{{"489 + header", 489, nonRetryable}, {"489 alone", 489, nil}, {"header alone", 400, nonRetryable}}
	for i, p := range poisons {
		id := enqueue(t, db, "order.created", "poison", `{"n":1}`)
		dispatch(t, db, id)
		msg := "msg-poison-" + itoa(int64(i))
		for range 2 {
			serve(finalFailure(id, 0, msg, p.status, p.header), http.StatusOK)
		}
		if row := readOutbox(t, db, id); !row.dead || row.gen != 0 {
			t.Fatalf("%s: row %+v, want dead-lettered at generation 0", p.name, row)
		}
		if n := db.Count(t, `SELECT count(*) FROM dead_letters WHERE outbox_id = $1`, id); n != 1 || openLetters(id) != 1 {
			t.Fatalf("%s: %d letters, want exactly one, open", p.name, n)
		}
		wantOutcomes += "recorded,duplicate,"
	}

	// No outbox row (retention deleted it, or an unknown id): only a letter keeps it.
	serve(finalFailure(1<<40, 0, "msg-gone", 500, nil), http.StatusOK)
	if n := db.Count(t, `SELECT count(*) FROM dead_letters WHERE qstash_message_id = 'msg-gone' AND resolved_at IS NULL`); n != 1 {
		t.Fatalf("%d letters for a failure without a row, want 1", n)
	}
	wantOutcomes += "recorded"
	if got := strings.Join(outcomes, ","); got != wantOutcomes {
		t.Fatalf("outcomes\n%s\nwant\n%s", got, wantOutcomes)
	}
}

func TestDeliveryFailurePermanent(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status int
		header map[string][]string
		want   bool
	}{
		{489, nil, true},
		{500, map[string][]string{"upstash-nonretryable-error": {" TRUE "}}, true},
		{500, map[string][]string{"Upstash-NonRetryable-Error": {"false"}}, false},
		{500, nil, false},
		{0, nil, false},
		{404, nil, false},
	}
	for _, c := range cases {
		if got := (deadletter.DeliveryFailure{Status: c.status, ResponseHeader: c.header}).Permanent(); got != c.want {
			t.Errorf("status %d header %v: Permanent %v, want %v", c.status, c.header, got, c.want)
		}
	}
}

// TestReopenBeforeMigration0018: on a schema without the circuit table (the failure
// function deployed before `migrate up`), a transient failure is still rescheduled, only
// no circuit is opened.
func TestReopenBeforeMigration0018(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	if _, err := db.Pool.Exec(context.Background(), `DROP TABLE outbox_circuits`); err != nil {
		t.Fatal(err)
	}
	id := enqueue(t, db, "order.created", "k", `{"n":1}`)
	dispatch(t, db, id)
	gen := 0
	r, err := deadletter.Reopen(context.Background(), db.Pool, deadletter.DeliveryFailure{QStashMessageID: "m", Status: 503,
		OutboxID: outbox.ID(id), Generation: &gen}, deadletter.ProbeSchedule{})
	if err != nil || r.State != deadletter.ReopenDone || r.Generation != 1 {
		t.Fatalf("reopen %+v %v", r, err)
	}
}

// TestCallbackKeyOrderReopensWithoutACircuit: a delivery the webhook held behind its key's
// failed previous event (503 {"error":"key_order"}) until QStash gave up goes back to the
// outbox under a new generation, but opens no circuit: the consumer answered, it is up.
// Any other 503 is an outage and opens one.
func TestCallbackKeyOrderReopensWithoutACircuit(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := newCallbackHandler(t, db, nil)
	failure := func(id int64, msg, body string) []byte {
		b, _ := json.Marshal(map[string]any{
			"status": 503, "header": map[string][]string{"Retry-After": {"5"}}, "body": base64.StdEncoding.EncodeToString([]byte(body)),
			"retried": 3, "maxRetries": 3, "dlqId": "dlq-" + msg, "sourceMessageId": msg,
			"url": destination(id, 0), "method": "POST", "sourceBody": base64.StdEncoding.EncodeToString([]byte(`{"n":1}`)),
		})
		return b
	}
	held := enqueue(t, db, "order.created", "k", `{"n":1}`)
	dispatch(t, db, held)
	if w := serveCallback(h, signedCallback(t, failureURL, failure(held, "msg-held", `{"error":"key_order"}`))); w.Code != http.StatusOK {
		t.Fatalf("status %d %s", w.Code, w.Body)
	}
	if row := readOutbox(t, db, held); row.dispatched || row.dead || row.gen != 1 {
		t.Fatalf("row after a key_order failure %+v, want pending at generation 1", row)
	}
	if n := db.Count(t, `SELECT count(*) FROM outbox_circuits`); n != 0 {
		t.Fatalf("%d circuits open after a key_order failure, want none", n)
	}
	down := enqueue(t, db, "order.created", "j", `{"n":1}`)
	dispatch(t, db, down)
	if w := serveCallback(h, signedCallback(t, failureURL, failure(down, "msg-down", `{"error":"database_unavailable"}`))); w.Code != http.StatusOK {
		t.Fatalf("status %d %s", w.Code, w.Body)
	}
	if n := db.Count(t, `SELECT count(*) FROM outbox_circuits`); n != 1 {
		t.Fatalf("%d circuits open after an outage's 503, want 1", n)
	}
}

// probing opens the circuit of order.created with the failure of its event first, then
// records a probe (another event) as published an hour ago, as the relay records it.
func probing(t *testing.T, db *pgtest.DB, h http.Handler) (first, probe int64) {
	t.Helper()
	first = enqueue(t, db, "order.created", "a", `{"n":1}`)
	dispatch(t, db, first)
	if w := serveCallback(h, signedCallback(t, failureURL, finalFailure(first, 0, "msg-first", 500, nil))); w.Code != http.StatusOK {
		t.Fatalf("first failure: %d %s", w.Code, w.Body)
	}
	probe = enqueue(t, db, "order.created", "b", `{"n":2}`)
	dispatch(t, db, probe)
	if _, err := db.Pool.Exec(context.Background(), `UPDATE outbox_circuits SET probe_id = $1, probe_generation = 0, probe_sent_at = now() - interval '1 hour'`, probe); err != nil {
		t.Fatal(err)
	}
	return first, probe
}

// TestFailureWhileProbingRestartsTheProbeHorizon: a transient failure of another event of
// the topic, reported while the circuit's probe is in flight, restarts the probe's horizon
// (probe_sent_at): the consumer still fails, so a probe queued behind retried messages (a
// FIFO queue) is not counted as delivered when the horizon passes. The probe's own
// failure frees the slot as before.
func TestFailureWhileProbingRestartsTheProbeHorizon(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := newCallbackHandler(t, db, nil)
	_, probe := probing(t, db, h)
	other := enqueue(t, db, "order.created", "c", `{"n":3}`)
	dispatch(t, db, other)
	if w := serveCallback(h, signedCallback(t, failureURL, finalFailure(other, 0, "msg-other", 503, nil))); w.Code != http.StatusOK {
		t.Fatalf("other failure: %d %s", w.Code, w.Body)
	}
	if n := db.Count(t, `SELECT count(*) FROM outbox_circuits WHERE probe_id = $1 AND probe_sent_at > now() - interval '1 minute'`, probe); n != 1 {
		t.Fatalf("the probe's horizon did not restart on a failure reported while it was in flight")
	}
	if w := serveCallback(h, signedCallback(t, failureURL, finalFailure(probe, 0, "msg-probe", 500, nil))); w.Code != http.StatusOK {
		t.Fatalf("probe failure: %d %s", w.Code, w.Body)
	}
	if n := db.Count(t, `SELECT count(*) FROM outbox_circuits WHERE probe_id IS NULL AND probe_failures = 1`); n != 1 {
		t.Fatalf("the probe's failure did not free its slot")
	}
}

// TestSupersededFailureRestartsTheProbeHorizon: the failure of a delivery whose row has
// moved on (put back behind its key's failed event, its queued copy still retried) is the
// consumer failing too: it restarts the horizon of the probe in flight, though it reopens
// nothing and is not counted among the circuit's failures. In fifo mode most of an
// outage's failures are such; before, a probe queued behind them went minutes without a
// counted failure and the relay closed the circuit at its horizon.
func TestSupersededFailureRestartsTheProbeHorizon(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := newCallbackHandler(t, db, nil)
	first, probe := probing(t, db, h)
	// first's next delivery under generation 0, still queued behind it, fails too.
	if w := serveCallback(h, signedCallback(t, failureURL, finalFailure(first, 0, "msg-first-queued", 500, nil))); w.Code != http.StatusOK {
		t.Fatalf("superseded failure: %d %s", w.Code, w.Body)
	}
	if n := db.Count(t, `SELECT count(*) FROM outbox_circuits WHERE probe_id = $1 AND probe_sent_at > now() - interval '1 minute' AND failures = 1`, probe); n != 1 {
		t.Fatalf("the probe's horizon did not restart on a superseded failure, or it counted as a failure of its own")
	}
	if n := db.Count(t, `SELECT count(*) FROM outbox WHERE id = $1 AND generation = 1`, first); n != 1 {
		t.Fatalf("the superseded failure moved its row on again")
	}
}

// TestReopenRetriesADeadlock: a reopen locks the failed row, then its key's later rows;
// another session (a concurrent reopen of the topic, a relay's mark) that holds a later
// row and then wants the failed one deadlocks with it. Postgres aborts the reopen's
// statement, which changed nothing, and Reopen runs it again once the other session is
// through. Seen in CI as `dlq sync` failing with 40P01 while the failure callback reopened
// events of the same topic.
func TestReopenRetriesADeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	failed := enqueue(t, db, "order.created", "k", `{"n":1}`)
	dispatch(t, db, failed)
	later := enqueue(t, db, "order.created", "k", `{"n":2}`)
	dispatch(t, db, later)

	other, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	// The reopen's session must be the one that finds the deadlock (after the default
	// deadlock_timeout, 1 s), so that it is the one aborted.
	if _, err := other.Exec(ctx, `SET LOCAL deadlock_timeout = '60s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, `SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE`, later); err != nil {
		t.Fatal(err)
	}
	type result struct {
		r   deadletter.Rescheduled
		err error
	}
	done := make(chan result, 1)
	go func() {
		gen := 0
		r, err := deadletter.Reopen(ctx, db.Pool, deadletter.DeliveryFailure{QStashMessageID: "m", Status: 503,
			OutboxID: outbox.ID(failed), Generation: &gen}, deadletter.ProbeSchedule{})
		done <- result{r, err}
	}()
	// Once the reopen waits for the later row, take the failed one: a deadlock.
	testwait.Eventually(t, 10*time.Second, func() bool {
		return db.Count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%WITH RECURSIVE cur%'`) > 0
	}, "the reopen never waited for the later row")
	if _, err := other.Exec(ctx, `SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE`, failed); err != nil {
		t.Fatalf("the other session lost the deadlock: %v", err)
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || res.r.State != deadletter.ReopenDone || res.r.Generation != 1 {
		t.Fatalf("reopen after a deadlock: %+v %v", res.r, res.err)
	}
	if row := readOutbox(t, db, later); row.dispatched || row.gen != 1 {
		t.Fatalf("the key's later row %+v, want it back to pending at generation 1", row)
	}
}
