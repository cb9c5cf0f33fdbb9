package retention_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck/configchecktest"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/retention"
)

var day = 24 * time.Hour

type fixture struct {
	db   *pgtest.DB
	now  time.Time
	keep map[string]int64 // label -> outbox id that must survive
	gone map[string]int64 // label -> outbox id that must be deleted
}

func (f *fixture) at(d time.Duration) time.Time { return f.now.Add(-d) }

// row inserts an outbox row with the given timestamps (nil: NULL) and returns its id.
func (f *fixture) row(t *testing.T, dispatched, deadLettered *time.Time, leased bool) int64 {
	t.Helper()
	var id int64
	err := f.db.Pool.QueryRow(t.Context(), `
		INSERT INTO outbox (topic, partition_key, payload, created_at, available_at, dispatched_at, dead_lettered_at, lease_token, locked_until)
		VALUES ('t', 'k', '{}', $1, $1, $2, $3, CASE WHEN $4 THEN gen_random_uuid() END, CASE WHEN $4 THEN $5::timestamptz + interval '30 seconds' END)
		RETURNING id`, f.at(30*day), dispatched, deadLettered, leased, f.now).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (f *fixture) letter(t *testing.T, outboxID int64, source string, resolved *time.Time) {
	t.Helper()
	outboxtest.Exec(t, f.db.Pool, `
		INSERT INTO dead_letters (source, outbox_id, topic, error, created_at, resolved_at, resolution)
		VALUES ($1, $2, 't', 'e', $3, $4, CASE WHEN $4::timestamptz IS NOT NULL THEN 'discarded' END)`,
		source, outboxID, f.at(30*day), resolved)
}

func ptr(t time.Time) *time.Time { return &t }

func newFixture(t *testing.T) *fixture {
	db := pgtest.New(t)
	f := &fixture{db: db, now: time.Now().UTC().Truncate(time.Second), keep: map[string]int64{}, gone: map[string]int64{}}
	week, ttl := 7*day, 14*day

	f.gone["dispatched just past retention"] = f.row(t, ptr(f.at(week+time.Minute)), nil, false)
	f.keep["dispatched just inside retention"] = f.row(t, ptr(f.at(week-time.Minute)), nil, false)
	f.keep["pending, old"] = f.row(t, nil, nil, false)
	f.keep["leased, old"] = f.row(t, nil, nil, true)

	id := f.row(t, nil, ptr(f.at(30*day)), false)
	f.letter(t, id, "relay", nil)
	f.keep["relay dead letter unresolved"] = id

	id = f.row(t, nil, ptr(f.at(30*day)), false)
	f.letter(t, id, "relay", ptr(f.at(week+time.Minute)))
	f.gone["relay dead letter resolved before cutoff"] = id

	id = f.row(t, nil, ptr(f.at(30*day)), false)
	f.letter(t, id, "relay", ptr(f.at(week-time.Minute)))
	f.keep["relay dead letter resolved after cutoff"] = id

	id = f.row(t, nil, ptr(f.at(30*day)), false)
	f.letter(t, id, "relay", ptr(f.at(20*day)))
	f.letter(t, id, "relay", nil)
	f.keep["relay dead letters, one unresolved"] = id

	id = f.row(t, nil, ptr(f.at(30*day)), false)
	f.keep["dead-lettered, no letter row"] = id

	id = f.row(t, ptr(f.at(30*day)), ptr(f.at(29*day)), false)
	f.letter(t, id, "delivery", nil)
	f.keep["delivery dead letter unresolved"] = id

	id = f.row(t, ptr(f.at(30*day)), ptr(f.at(29*day)), false)
	f.letter(t, id, "delivery", ptr(f.at(10*day)))
	f.gone["delivery dead letter resolved"] = id

	id = f.row(t, ptr(f.at(30*day)), ptr(f.at(2*day)), false)
	f.letter(t, id, "delivery", ptr(f.at(day)))
	f.keep["delivery failure inside retention"] = id

	outboxtest.Exec(t, db.Pool, `INSERT INTO processed_messages (consumer, message_id, processed_at) VALUES
		('webhook', 'old', $1), ('webhook', 'new', $2)`, f.at(ttl+time.Minute), f.at(ttl-time.Minute))
	return f
}

func (f *fixture) cfg() retention.Config {
	return retention.Config{Now: func() time.Time { return f.now }}
}

func (f *fixture) ids(t *testing.T) []int64 {
	t.Helper()
	return outboxtest.Column[int64](t, f.db.Pool, `SELECT id FROM outbox ORDER BY id`)
}

func TestRunBoundaries(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()

	plan, err := retention.Plan(ctx, f.db.Pool, f.cfg())
	if err != nil {
		t.Fatal(err)
	}
	if plan.OutboxDeleted != int64(len(f.gone)) || plan.ProcessedDeleted != 1 {
		t.Fatalf("plan = %+v, want %d outbox and 1 processed", plan, len(f.gone))
	}
	if n := len(f.ids(t)); n != len(f.gone)+len(f.keep) {
		t.Fatalf("Plan deleted rows: %d left", n)
	}

	res, err := retention.Run(ctx, f.db.Pool, f.cfg())
	if err != nil {
		t.Fatal(err)
	}
	if res.OutboxDeleted != int64(len(f.gone)) || res.ProcessedDeleted != 1 || !res.Complete {
		t.Fatalf("result = %+v, want %d outbox, 1 processed, complete", res, len(f.gone))
	}
	left := f.ids(t)
	for label, id := range f.keep {
		if !slices.Contains(left, id) {
			t.Errorf("%s (id %d) was deleted", label, id)
		}
	}
	for label, id := range f.gone {
		if slices.Contains(left, id) {
			t.Errorf("%s (id %d) was kept", label, id)
		}
	}
	if processed := outboxtest.Column[string](t, f.db.Pool, `SELECT message_id FROM processed_messages`); !slices.Equal(processed, []string{"new"}) {
		t.Fatalf("processed_messages left: %v", processed)
	}
	// Dead letters are the audit trail: retention never deletes them.
	if letters := f.db.Count(t, `SELECT count(*) FROM dead_letters`); letters != 8 {
		t.Fatalf("dead letters %d, want 8", letters)
	}

	again, err := retention.Run(ctx, f.db.Pool, f.cfg())
	if err != nil || again.OutboxDeleted != 0 || again.ProcessedDeleted != 0 {
		t.Fatalf("second run %+v %v", again, err)
	}
}

func TestRunBatchesAreBounded(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	outboxtest.Exec(t, db.Pool, `INSERT INTO outbox (topic, partition_key, payload, dispatched_at)
		SELECT 't', 'k' || g, '{}', now() - interval '8 days' - g * interval '1 second' FROM generate_series(1, 25) g`)
	outboxtest.Exec(t, db.Pool, `INSERT INTO processed_messages (consumer, message_id, processed_at)
		SELECT 'c', g::text, now() - interval '15 days' FROM generate_series(1, 12) g`)
	// One batch per table: exactly BatchSize rows each, oldest first, and not complete.
	res, err := retention.Run(ctx, db.Pool, retention.Config{BatchSize: 10, MaxBatches: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.OutboxDeleted != 10 || res.ProcessedDeleted != 10 || res.Complete || res.Batches != 3 {
		t.Fatalf("one bounded batch per step: %+v", res)
	}
	var maxLeft int
	if err := db.Pool.QueryRow(ctx, `SELECT max(substr(partition_key, 2)::int) FROM outbox`).Scan(&maxLeft); err != nil || maxLeft != 15 {
		t.Fatalf("the 10 oldest rows (k16..k25) should be gone first; the oldest left is k%d (%v)", maxLeft, err)
	}
	res, err = retention.Run(ctx, db.Pool, retention.Config{BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	// 15 outbox rows: 10 + 5 (short: stop); dead-lettered: 1 empty batch; 2 processed: 1.
	if res.OutboxDeleted != 15 || res.ProcessedDeleted != 2 || !res.Complete || res.Batches != 4 {
		t.Fatalf("continuation: %+v", res)
	}
}

// TestRunSkipsLockedRows: a row another transaction holds is skipped at once, never
// waited for, so retention cannot queue behind (or block) a redrive.
func TestRunSkipsLockedRows(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	var held int64
	if err := db.Pool.QueryRow(ctx, `INSERT INTO outbox (topic, partition_key, payload, dispatched_at)
		VALUES ('t', 'a', '{}', now() - interval '8 days'), ('t', 'b', '{}', now() - interval '8 days') RETURNING id`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	tx := outboxtest.Begin(t, db.Pool)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE`, held); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := retention.Run(rctx, db.Pool, retention.Config{})
	if err != nil || res.OutboxDeleted != 1 || !res.Complete {
		t.Fatalf("run beside a locked row: %+v %v", res, err)
	}
	var left int64
	if err := tx.QueryRow(ctx, `SELECT id FROM outbox`).Scan(&left); err != nil || left != held {
		t.Fatalf("locked row %d should remain, found %d (%v)", held, left, err)
	}
}

func TestRunStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	res, err := retention.Run(ctx, db.Pool, retention.Config{})
	if err != nil || res.Complete || res.Batches != 0 {
		t.Fatalf("cancelled run: %+v %v", res, err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	err := retention.Config{OutboxRetention: time.Second, DedupeTTL: -time.Hour, BatchSize: retention.MaxBatchSize + 1, MaxBatches: -1}.WithDefaults().Validate()
	configchecktest.RequireFields(t, err, "retention", "OutboxRetention", "DedupeTTL", "BatchSize", "MaxBatches")
	if _, err := retention.Run(t.Context(), nil, retention.Config{BatchSize: -1}); err == nil {
		t.Fatal("Run accepted an invalid config")
	}
}
