package deadletter_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// enqueue inserts an event and returns its id.
func enqueue(t *testing.T, db *pgtest.DB, topic, key, payload string) int64 {
	t.Helper()
	id, err := outbox.Enqueue(context.Background(), db.Pool, outbox.Event{
		Topic: topic, PartitionKey: key, Payload: json.RawMessage(payload), Headers: map[string]string{"X-Correlation-Id": "c-1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return int64(id)
}

// dispatch marks an outbox row dispatched, as the relay does after publishing.
func dispatch(t *testing.T, db *pgtest.DB, id int64) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), `UPDATE outbox SET dispatched_at = now(), attempts = 1 WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
}

// failure is what FromCallback makes of a callback for outbox row outboxID, generation 0.
func failure(outboxID int64, msgID string) deadletter.DeliveryFailure {
	gen := 0
	return deadletter.DeliveryFailure{
		QStashMessageID: msgID,
		DLQID:           "dlq-" + msgID,
		Status:          489,
		ResponseBody:    []byte(`{"error":"rejected"}`),
		Retried:         0,
		MaxRetries:      3,
		URL:             destination(outboxID, 0),
		OutboxID:        outbox.ID(outboxID),
		Generation:      &gen,
		SourceHeader:    map[string][]string{"upstash-forward-x-outbox-id": {itoa(outboxID)}, "Authorization": {"Bearer secret"}},
		SourceBody:      []byte(`{"order_id": "o-1"}`),
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// destination is the URL the relay publishes an event of outbox row id to.
func destination(id int64, gen int) string {
	return "https://hooks.example.com/events/order.created?outbox_id=" + itoa(id) + "&generation=" + strconv.Itoa(gen)
}

type outboxRow struct {
	dispatched, dead bool
	attempts, gen    int
	lastError        *string
	leased           bool
}

func readOutbox(t *testing.T, db *pgtest.DB, id int64) outboxRow {
	t.Helper()
	var r outboxRow
	err := db.Pool.QueryRow(context.Background(), `SELECT dispatched_at IS NOT NULL, dead_lettered_at IS NOT NULL, attempts, generation, last_error,
		lease_token IS NOT NULL OR locked_until IS NOT NULL FROM outbox WHERE id = $1`, id).
		Scan(&r.dispatched, &r.dead, &r.attempts, &r.gen, &r.lastError, &r.leased)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRecordIsIdempotentAndMarksOutbox(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	id := enqueue(t, db, "order.created", "order:1", `{"order_id":"o-1"}`)
	dispatch(t, db, id)

	r, err := deadletter.Record(ctx, db.Pool, failure(id, "msg-1"))
	if err != nil {
		t.Fatal(err)
	}
	if !r.Created || r.OutboxID != outbox.ID(id) || !r.OutboxMarked || r.LetterID == 0 {
		t.Fatalf("first record %+v", r)
	}
	again, err := deadletter.Record(ctx, db.Pool, failure(id, "msg-1"))
	if err != nil {
		t.Fatal(err)
	}
	if again.Created || again.LetterID != r.LetterID {
		t.Fatalf("second record %+v, want the same letter, not created", again)
	}
	if n := db.Count(t, `SELECT count(*) FROM dead_letters`); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}

	l, err := deadletter.Get(ctx, db.Pool, r.LetterID)
	if err != nil {
		t.Fatal(err)
	}
	if l.Source != deadletter.SourceDelivery || l.OutboxID != outbox.ID(id) || l.Topic != "order.created" || l.PartitionKey != "order:1" ||
		l.StatusCode != 489 || l.Attempts != 0 || l.QStashMessageID != "msg-1" || l.QStashDLQID != "dlq-msg-1" ||
		l.ResponseBody != `{"error":"rejected"}` || l.Resolved() {
		t.Fatalf("letter %+v", l)
	}
	var p map[string]string
	if err := json.Unmarshal(l.Payload, &p); err != nil || p["order_id"] != "o-1" {
		t.Fatalf("payload %s", l.Payload)
	}
	// Headers come from the outbox row, never from the callback (which may carry the
	// relay's Authorization).
	if l.Headers["X-Correlation-Id"] != "c-1" || l.Headers["Authorization"] != "" {
		t.Fatalf("headers %v", l.Headers)
	}
	o := readOutbox(t, db, id)
	if !o.dead || o.lastError == nil || *o.lastError != "qstash delivery failed: HTTP 489 after 0 of 3 retries" {
		t.Fatalf("outbox row %+v", o)
	}
}

func TestRecordWithoutOutboxRow(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	f := failure(424242, "msg-gone")
	f.Status = 0
	f.ResponseBody = []byte("bad \xff utf8 \x00 nul")
	r, err := deadletter.Record(ctx, db.Pool, f)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Created || r.OutboxMarked {
		t.Fatalf("record %+v", r)
	}
	l, err := deadletter.Get(ctx, db.Pool, r.LetterID)
	if err != nil {
		t.Fatal(err)
	}
	// The topic falls back to the destination URL; the payload is the delivered body.
	if l.Topic != "order.created" || l.Payload == nil || l.StatusCode != 0 || l.ResponseBody != "bad \uFFFD utf8  nul" {
		t.Fatalf("letter %+v", l)
	}
	if l.Error != "qstash delivery failed: no response after 0 of 3 retries" {
		t.Fatalf("error %q", l.Error)
	}

	// No outbox id at all still records (nothing is lost); no message id cannot.
	f = failure(0, "msg-anon")
	f.SourceHeader = nil
	if r, err := deadletter.Record(ctx, db.Pool, f); err != nil || !r.Created || r.OutboxID != 0 {
		t.Fatalf("anonymous failure: %+v %v", r, err)
	}
	f.QStashMessageID = ""
	if _, err := deadletter.Record(ctx, db.Pool, f); !errors.Is(err, deadletter.ErrInvalidFailure) {
		t.Fatalf("no message id: %v", err)
	}
}

func TestRecordJSONThatJSONBRejects(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	id := enqueue(t, db, "order.created", "k", `{"a":1}`)
	f := failure(id, "msg-nul")
	f.SourceBody = []byte(`{"a":"\u0000"}`) // valid JSON, rejected by jsonb
	r, err := deadletter.Record(context.Background(), db.Pool, f)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := deadletter.Get(context.Background(), db.Pool, r.LetterID)
	if string(l.Payload) != `{"a": 1}` {
		t.Fatalf("payload %s, want the outbox row's", l.Payload)
	}
}

func TestRecordStaleGenerationDoesNotStopRedrivenEvent(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	id := enqueue(t, db, "order.created", "k", `{"a":1}`)
	if _, err := db.Pool.Exec(context.Background(), `UPDATE outbox SET generation = 1 WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	f := failure(id, "msg-old") // generation 0
	r, err := deadletter.Record(context.Background(), db.Pool, f)
	if err != nil || !r.Created || r.OutboxMarked {
		t.Fatalf("stale callback: %+v %v; want recorded, outbox untouched", r, err)
	}
	if readOutbox(t, db, id).dead {
		t.Fatal("stale callback dead-lettered the redriven row")
	}
	f = failure(id, "msg-new")
	gen := 1
	f.Generation = &gen
	if r, err := deadletter.Record(context.Background(), db.Pool, f); err != nil || !r.OutboxMarked {
		t.Fatalf("current-generation callback: %+v %v", r, err)
	}
}

func TestRecordConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	id := enqueue(t, db, "order.created", "k", `{"a":1}`)
	errs := make(chan error, 6)
	created := make(chan bool, 6)
	for range 6 {
		go func() {
			r, err := deadletter.Record(context.Background(), db.Pool, failure(id, "msg-c"))
			errs <- err
			created <- r.Created
		}()
	}
	n := 0
	for range 6 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		if <-created {
			n++
		}
	}
	if n != 1 || db.Count(t, `SELECT count(*) FROM dead_letters`) != 1 {
		t.Fatalf("created %d times, %d rows", n, db.Count(t, `SELECT count(*) FROM dead_letters`))
	}
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	a := enqueue(t, db, "order.created", "order:1", `{}`)
	b := enqueue(t, db, "order.created", "order:2", `{}`)
	c := enqueue(t, db, "invoice.paid", "order:1", `{}`)
	var letters []int64
	for i, id := range []int64{a, b, c} {
		r, err := deadletter.Record(ctx, db.Pool, failure(id, "m"+itoa(int64(i))))
		if err != nil {
			t.Fatal(err)
		}
		letters = append(letters, r.LetterID)
	}
	// Spread created_at so time ranges are testable without sleeping.
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, id := range letters {
		if _, err := db.Pool.Exec(ctx, `UPDATE dead_letters SET created_at = $2 WHERE id = $1`, id, base.Add(time.Duration(i)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE dead_letters SET resolved_at = now(), resolution = 'manual' WHERE id = $1`, letters[1]); err != nil {
		t.Fatal(err)
	}
	ids := func(ls []deadletter.Letter) []int64 {
		var out []int64
		for _, l := range ls {
			out = append(out, l.ID)
		}
		return out
	}
	cases := []struct {
		name string
		f    deadletter.Filter
		want []int64
	}{
		{"open, newest first", deadletter.Filter{}, []int64{letters[2], letters[0]}},
		{"include resolved", deadletter.Filter{IncludeResolved: true}, []int64{letters[2], letters[1], letters[0]}},
		{"topic", deadletter.Filter{Topic: "order.created"}, []int64{letters[0]}},
		{"key", deadletter.Filter{PartitionKey: "order:1"}, []int64{letters[2], letters[0]}},
		{"since", deadletter.Filter{Since: base.Add(time.Hour), IncludeResolved: true}, []int64{letters[2], letters[1]}},
		{"until is exclusive", deadletter.Filter{Until: base.Add(time.Hour), IncludeResolved: true}, []int64{letters[0]}},
		{"ids include resolved", deadletter.Filter{IDs: []int64{letters[1]}}, []int64{letters[1]}},
		{"limit", deadletter.Filter{Limit: 1}, []int64{letters[2]}},
	}
	for _, c := range cases {
		got, err := deadletter.List(ctx, db.Pool, c.f)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !slices.Equal(ids(got), c.want) {
			t.Errorf("%s: got %v, want %v", c.name, ids(got), c.want)
		}
	}
	if _, err := deadletter.Get(ctx, db.Pool, 999999); !errors.Is(err, deadletter.ErrNotFound) {
		t.Fatalf("Get unknown: %v", err)
	}
}

func TestRedrive(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()

	// a: delivery dead letter; b: relay dead letter; c: outbox row deleted by retention.
	a := enqueue(t, db, "order.created", "order:1", `{"n":1}`)
	dispatch(t, db, a)
	ra, err := deadletter.Record(ctx, db.Pool, failure(a, "msg-a"))
	if err != nil {
		t.Fatal(err)
	}
	b := enqueue(t, db, "order.created", "order:2", `{"n":2}`)
	var lb int64
	if err := db.Pool.QueryRow(ctx, `WITH o AS (UPDATE outbox SET dead_lettered_at = now(), attempts = 12, last_error = 'publish failed' WHERE id = $1 RETURNING id, topic, partition_key, payload)
		INSERT INTO dead_letters (source, outbox_id, topic, partition_key, payload, error, attempts) SELECT 'relay', id, topic, partition_key, payload, 'publish failed', 12 FROM o RETURNING id`, b).Scan(&lb); err != nil {
		t.Fatal(err)
	}
	c := enqueue(t, db, "order.created", "order:3", `{"n":3}`)
	rc, err := deadletter.Record(ctx, db.Pool, failure(c, "msg-c"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, c); err != nil {
		t.Fatal(err)
	}

	if _, err := deadletter.Redrive(ctx, db.Pool, deadletter.Filter{}, nil); !errors.Is(err, deadletter.ErrEmptyFilter) {
		t.Fatalf("empty filter: %v", err)
	}

	plan, err := deadletter.Plan(ctx, db.Pool, deadletter.Filter{All: true})
	if err != nil {
		t.Fatal(err)
	}
	if !plan.DryRun || len(plan.Redriven) != 2 || !slices.Equal(plan.OutboxMissing, []int64{rc.LetterID}) {
		t.Fatalf("plan %+v", plan)
	}
	if o := readOutbox(t, db, a); !o.dead || o.gen != 0 {
		t.Fatalf("plan changed the outbox row: %+v", o)
	}

	res, err := deadletter.Redrive(ctx, db.Pool, deadletter.Filter{IDs: []int64{ra.LetterID, lb, rc.LetterID, 987654}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []deadletter.Redriven{{LetterID: ra.LetterID, OutboxID: outbox.ID(a), Generation: 1}, {LetterID: lb, OutboxID: outbox.ID(b), Generation: 1}}
	if !slices.Equal(res.Redriven, want) || !slices.Equal(res.OutboxMissing, []int64{rc.LetterID}) ||
		!slices.Equal(res.NotFound, []int64{987654}) || len(res.AlreadyResolved) != 0 || res.DryRun {
		t.Fatalf("redrive %+v", res)
	}
	for _, id := range []int64{a, b} {
		o := readOutbox(t, db, id)
		if o.dispatched || o.dead || o.attempts != 0 || o.gen != 1 || o.lastError != nil || o.leased {
			t.Fatalf("outbox row %d after redrive: %+v", id, o)
		}
	}
	var ready int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = ANY($1) AND available_at <= now()`, []int64{a, b}).Scan(&ready); err != nil || ready != 2 {
		t.Fatalf("ready rows %d %v", ready, err)
	}
	for _, id := range []int64{ra.LetterID, lb} {
		l, _ := deadletter.Get(ctx, db.Pool, id)
		if !l.Resolved() || l.Resolution != deadletter.ResolutionRedriven {
			t.Fatalf("letter %d not resolved: %+v", id, l)
		}
	}
	if l, _ := deadletter.Get(ctx, db.Pool, rc.LetterID); l.Resolved() {
		t.Fatal("letter with a missing outbox row was resolved")
	}

	// Again: a no-op that says so, and nothing changes.
	res, err = deadletter.Redrive(ctx, db.Pool, deadletter.Filter{IDs: []int64{ra.LetterID, lb}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Redriven) != 0 || !slices.Equal(res.AlreadyResolved, []int64{ra.LetterID, lb}) {
		t.Fatalf("second redrive %+v", res)
	}
	if o := readOutbox(t, db, a); o.gen != 1 {
		t.Fatalf("second redrive bumped the generation: %+v", o)
	}
	// A filter redrive does not touch resolved letters at all.
	res, err = deadletter.Redrive(ctx, db.Pool, deadletter.Filter{Topic: "order.created"}, nil)
	if err != nil || len(res.Redriven) != 0 || len(res.AlreadyResolved) != 0 || !slices.Equal(res.OutboxMissing, []int64{rc.LetterID}) {
		t.Fatalf("topic redrive %+v %v", res, err)
	}
}

func TestRedriveRowAlreadyPending(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	a, r1 := deadLetteredEvent(t, db)
	// A second failure of the same generation adds nothing: one open letter per generation.
	if dup, err := deadletter.Record(ctx, db.Pool, failure(a, "m2")); err != nil || dup.Created || dup.LetterID != r1.LetterID {
		t.Fatalf("second letter of generation 0: %+v %v; want letter %d, not created", dup, err, r1.LetterID)
	}
	f := failure(a, "m3") // a letter about another generation of the same row
	gen := 7
	f.Generation = &gen
	r2, _ := deadletter.Record(ctx, db.Pool, f)
	res, err := deadletter.Redrive(ctx, db.Pool, deadletter.Filter{IDs: []int64{r1.LetterID}}, nil)
	if err != nil || len(res.Redriven) != 1 {
		t.Fatalf("first %+v %v", res, err)
	}
	// The row is pending again (the event is on its way): the other letter resolves
	// without resetting the row a second time.
	res, err = deadletter.Redrive(ctx, db.Pool, deadletter.Filter{IDs: []int64{r2.LetterID}}, nil)
	if err != nil || len(res.Redriven) != 0 || len(res.AlreadyPending) != 1 || res.AlreadyPending[0].LetterID != r2.LetterID {
		t.Fatalf("second %+v %v", res, err)
	}
	if o := readOutbox(t, db, a); o.gen != 1 {
		t.Fatalf("generation %d, want 1", o.gen)
	}
}

func TestRecordSanitizesText(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	f := failure(0, "msg\x00-\xff")
	f.DLQID = "d\x00"
	r, err := deadletter.Record(context.Background(), db.Pool, f)
	if err != nil || !r.Created {
		t.Fatalf("record %+v %v", r, err)
	}
	l, _ := deadletter.Get(context.Background(), db.Pool, r.LetterID)
	if l.QStashMessageID != "msg-\uFFFD" || l.QStashDLQID != "d" {
		t.Fatalf("letter %+v", l)
	}
	if r2, err := deadletter.Record(context.Background(), db.Pool, f); err != nil || r2.Created {
		t.Fatalf("replay %+v %v", r2, err)
	}
}

// startedEarlier begins transactions that have been open for a while before their first
// statement of the caller's: a redrive of many letters, or one behind a lock.
type startedEarlier struct {
	pool *pgxpool.Pool
	open time.Duration
}

func (b startedEarlier) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, b.open.Seconds()); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return tx, nil
}

// A redriven event is ready from the moment of its update, not from its transaction's
// start: a relay's claims walk the ready index from a bound learnt from the claims before
// them (internal/outboxstore, walk.go), and a row stamped with a time they had passed is
// found only by the probe beside them, seconds later.
func TestRedriveStampsTheUpdatesTime(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	a, letter := deadLetteredEvent(t, db)
	var before time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	const open = 300 * time.Millisecond
	res, err := deadletter.Redrive(ctx, startedEarlier{db.Pool, open}, deadletter.Filter{IDs: []int64{letter.LetterID}}, nil)
	if err != nil || len(res.Redriven) != 1 {
		t.Fatalf("redrive: %+v, %v", res, err)
	}
	var availableAt time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT available_at FROM outbox WHERE id = $1`, a).Scan(&availableAt); err != nil {
		t.Fatal(err)
	}
	if availableAt.Before(before.Add(open)) {
		t.Errorf("available_at %v is %v after the redrive's transaction began, want at least %v (the update's time)", availableAt, availableAt.Sub(before), open)
	}
}

// deadLetteredEvent enqueues an event, dispatches it and records a failure of it (message
// "m1"): an open dead letter of a finished row.
func deadLetteredEvent(t *testing.T, db *pgtest.DB) (outboxID int64, letter deadletter.Recorded) {
	t.Helper()
	outboxID = enqueue(t, db, "order.created", "k", `{}`)
	dispatch(t, db, outboxID)
	letter, err := deadletter.Record(t.Context(), db.Pool, failure(outboxID, "m1"))
	if err != nil || !letter.Created {
		t.Fatalf("record: %+v, %v", letter, err)
	}
	return outboxID, letter
}
