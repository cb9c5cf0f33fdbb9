package health_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/health"
	"github.com/outbox-relay/outbox-relay/v3/internal/health/healthtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

func exec(t *testing.T, db *pgtest.DB, sql string, args ...any) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// seed writes one row of every state the report distinguishes.
func seed(t *testing.T, db *pgtest.DB) {
	t.Helper()
	// 3 pending and ready, the oldest created 10 minutes ago; one of them flapping.
	exec(t, db, `INSERT INTO outbox (topic, partition_key, payload, created_at, available_at, attempts)
		VALUES ('order.created', 'k1', '{}', now() - interval '10 minutes', now() - interval '10 minutes', 5),
		       ('order.created', 'k2', '{}', now() - interval '1 minute', now(), 0),
		       ('order.created', 'k3', '{}', now(), now(), 0)`)
	// leased (live) and stuck (expired) leases.
	exec(t, db, `INSERT INTO outbox (topic, partition_key, payload, attempts, lease_token, locked_until, available_at)
		VALUES ('order.created', 'k4', '{}', 1, gen_random_uuid(), now() + interval '30 seconds', now() + interval '30 seconds'),
		       ('order.created', 'k5', '{}', 1, gen_random_uuid(), now() - interval '2 minutes', now() - interval '2 minutes')`)
	// dispatched: 4 two minutes ago, 1 two hours ago (outside the hour).
	exec(t, db, `INSERT INTO outbox (topic, partition_key, payload, dispatched_at)
		SELECT 'order.created', 'd' || g, '{}', now() - interval '2 minutes' FROM generate_series(1, 4) g`)
	exec(t, db, `INSERT INTO outbox (topic, partition_key, payload, dispatched_at) VALUES ('order.created', 'old', '{}', now() - interval '2 hours')`)
	// dead letters: 2 relay order.created, 1 delivery invoice.paid, 1 resolved (not counted).
	exec(t, db, `INSERT INTO dead_letters (source, topic, error) VALUES
		('relay', 'order.created', 'boom'), ('relay', 'order.created', 'boom'),
		('delivery', 'invoice.paid', 'HTTP 489')`)
	exec(t, db, `INSERT INTO dead_letters (source, topic, error, resolved_at, resolution) VALUES ('relay', 'x', 'e', now(), 'discarded')`)
	exec(t, db, `INSERT INTO processed_messages (consumer, message_id) SELECT 'webhook', g::text FROM generate_series(1, 50) g`)
}

func TestCollectSeededStates(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	seed(t, db)

	r, err := health.Collect(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	q := r.Queue
	if q.Pending != 5 || q.Ready != 3 || q.Leased != 1 || q.StuckLeases != 1 || q.Flapping != 1 || q.MaxAttempts != 5 {
		t.Fatalf("queue = %+v", q)
	}
	if q.OldestPendingAgeSeconds < 599 || q.OldestPendingAgeSeconds > 700 || q.OldestPendingID == 0 {
		t.Fatalf("oldest pending age %v id %d", q.OldestPendingAgeSeconds, q.OldestPendingID)
	}
	if len(r.DispatchedPerMinute) != 60 || r.DispatchedLastHour != 4 {
		t.Fatalf("dispatched per minute %v (last hour %d)", r.DispatchedPerMinute, r.DispatchedLastHour)
	}
	// The 4 dispatches landed 2 minutes before now: index 57, or 56/58 at a minute edge.
	if n := r.DispatchedPerMinute[56] + r.DispatchedPerMinute[57] + r.DispatchedPerMinute[58]; n != 4 {
		t.Fatalf("dispatches not two minutes back: %v", r.DispatchedPerMinute)
	}
	want := []health.DeadLetterGroup{{Source: "relay", Topic: "order.created", Count: 2}, {Source: "delivery", Topic: "invoice.paid", Count: 1}}
	if len(r.DeadLetters) != 2 || r.DeadLettersUnresolved != 3 {
		t.Fatalf("dead letters %+v", r.DeadLetters)
	}
	for i, g := range want {
		if got := r.DeadLetters[i]; got.Source != g.Source || got.Topic != g.Topic || got.Count != g.Count || got.OldestAt.IsZero() {
			t.Fatalf("dead letter group %d = %+v, want %+v", i, got, g)
		}
	}
	if r.Outbox.TableBytes <= 0 || r.Outbox.IndexBytes <= 0 || r.Outbox.TotalBytes < r.Outbox.TableBytes+r.Outbox.IndexBytes {
		t.Fatalf("outbox sizes %+v", r.Outbox)
	}
	if r.ProcessedMessages.TotalBytes <= 0 {
		t.Fatalf("processed_messages sizes %+v", r.ProcessedMessages)
	}

	st, reasons := r.Check(health.Thresholds{MaxTransactionAge: time.Hour, MaxXminAge: -1})
	if st != health.Unhealthy {
		t.Fatalf("status %v, reasons %v", st, reasons)
	}
	joined := strings.Join(reasons, "\n")
	for _, w := range []string{"oldest pending event", "3 unresolved dead letters", "1 leases expired", "1 pending events have failed more than 3 times"} {
		if !strings.Contains(joined, w) {
			t.Errorf("reasons lack %q:\n%s", w, joined)
		}
	}

	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"queue", "dispatched_per_minute", "dead_letters_unresolved", "outbox_table", "processed_messages_table", "xmin_horizon"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, b)
		}
	}
}

// TestProcessedMessagesEstimate: the row estimate follows the statistics collector, which
// flushes asynchronously; poll until it reports the inserted rows.
func TestProcessedMessagesEstimate(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	exec(t, db, `INSERT INTO processed_messages (consumer, message_id) SELECT 'webhook', g::text FROM generate_series(1, 200) g`)
	exec(t, db, `ANALYZE processed_messages`)
	testwait.EventuallyNil(t, 10*time.Second, func() error {
		r, err := health.Collect(context.Background(), db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		if r.ProcessedMessages.RowsEstimate != 200 {
			return fmt.Errorf("processed_messages estimate %d, want 200", r.ProcessedMessages.RowsEstimate)
		}
		return nil
	})
}

func TestCollectEmptyIsHealthy(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	r, err := health.Collect(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	// Other tests share the server, so the horizon checks are relaxed here; they have
	// their own test below.
	st, reasons := r.Check(health.Thresholds{MaxTransactionAge: -1, MaxXminAge: -1})
	if st != health.Healthy || len(reasons) != 0 || r.Queue.Pending != 0 || r.DeadLetters == nil {
		t.Fatalf("status %v %v, report %+v", st, reasons, r)
	}
}

// TestOpenTransactionHoldsHorizon opens a transaction that takes a snapshot on another
// connection and keeps it open; the report names it and Check degrades.
func TestOpenTransactionHoldsHorizon(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	pid := healthtest.HoldSnapshot(t, db, "health-test-holder").PID
	// Make the horizon age measurable: other transactions consume ids after the snapshot.
	for range 3 {
		exec(t, db, `INSERT INTO processed_messages (consumer, message_id) VALUES ('c', gen_random_uuid()::text)`)
	}

	testwait.EventuallyNil(t, 10*time.Second, func() error {
		r, err := health.Collect(ctx, db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		h := r.Horizon
		if h.OpenTransactions < 1 || h.BackendXminAge < 3 || h.XminHorizonAge < h.BackendXminAge || h.OldestTransactionAgeSeconds <= 0.05 {
			return fmt.Errorf("open transaction (pid %d) not seen: %+v", pid, h)
		}
		st, reasons := r.Check(health.Thresholds{MaxTransactionAge: 50 * time.Millisecond, MaxXminAge: 2, MaxDeadLetters: -1})
		joined := strings.Join(reasons, "\n")
		if st != health.Degraded || !strings.Contains(joined, "a transaction has been open for") || !strings.Contains(joined, "xmin horizon") {
			t.Fatalf("status %v reasons %v", st, reasons)
		}
		return nil
	})
}

func TestBacklog(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	g, err := health.Backlog(ctx, db.Pool)
	if err != nil || g != (health.BacklogGauge{}) {
		t.Fatalf("empty backlog: %+v %v", g, err)
	}
	seed(t, db)
	g, err = health.Backlog(ctx, db.Pool)
	// The oldest row was tried (5 attempts): late since its creation.
	if err != nil || g.Pending != 5 || !near(g.Lateness, 10*time.Minute) || !near(g.OldestCreatedAge, 10*time.Minute) {
		t.Fatalf("backlog: %+v %v", g, err)
	}
}

func near(d, want time.Duration) bool { return d >= want && d < want+time.Minute }

// Lateness counts an event from when it is due: a delayed event and the later events of
// its key it holds back are not late, however old; a ready event is late from its
// available_at; a tried event (its available_at moved by a backoff) from its creation.
func TestBacklogLateness(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	// Key d: created 30 minutes ago, due in an hour; two later events held behind it.
	exec(t, db, `INSERT INTO outbox (topic, partition_key, payload, created_at, available_at)
		VALUES ('t', 'd', '{}', now() - interval '30 minutes', now() + interval '1 hour'),
		       ('t', 'd', '{}', now() - interval '20 minutes', now() - interval '20 minutes'),
		       ('t', 'd', '{}', now() - interval '20 minutes', now() - interval '20 minutes')`)
	g, err := health.Backlog(ctx, db.Pool)
	if err != nil || g.Pending != 3 || g.Lateness != 0 || !near(g.OldestCreatedAge, 30*time.Minute) {
		t.Fatalf("only a delay pending: %+v %v, want lateness 0", g, err)
	}
	// Key r: due 2 minutes ago (created 9 minutes ago with a 7-minute delay), never tried.
	exec(t, db, `INSERT INTO outbox (topic, partition_key, payload, created_at, available_at)
		VALUES ('t', 'r', '{}', now() - interval '9 minutes', now() - interval '2 minutes')`)
	if g, err = health.Backlog(ctx, db.Pool); err != nil || !near(g.Lateness, 2*time.Minute) {
		t.Fatalf("ready event: %+v %v, want 2m late", g, err)
	}
	// Key b: tried twice, backing off until later; created 5 minutes ago.
	exec(t, db, `INSERT INTO outbox (topic, partition_key, payload, created_at, available_at, attempts)
		VALUES ('t', 'b', '{}', now() - interval '5 minutes', now() + interval '10 minutes', 2)`)
	if g, err = health.Backlog(ctx, db.Pool); err != nil || !near(g.Lateness, 5*time.Minute) {
		t.Fatalf("backing-off event: %+v %v, want 5m late", g, err)
	}
}

func TestCheckThresholds(t *testing.T) {
	t.Parallel()
	base := health.Report{}
	cases := []struct {
		name string
		mod  func(*health.Report)
		th   health.Thresholds
		want health.Status
	}{
		{"empty", func(*health.Report) {}, health.Thresholds{}, health.Healthy},
		{"age at default limit", func(r *health.Report) { r.Queue.OldestPendingAgeSeconds = 300 }, health.Thresholds{}, health.Healthy},
		{"age above default", func(r *health.Report) { r.Queue.OldestPendingAgeSeconds = 301 }, health.Thresholds{}, health.Unhealthy},
		{"age check disabled", func(r *health.Report) { r.Queue.OldestPendingAgeSeconds = 1e6 }, health.Thresholds{MaxOldestPendingAge: -1}, health.Healthy},
		{"deep but young backlog", func(r *health.Report) { r.Queue.Pending = 1e7; r.Queue.OldestPendingAgeSeconds = 20 }, health.Thresholds{}, health.Healthy},
		{"dead letter", func(r *health.Report) { r.DeadLettersUnresolved = 1 }, health.Thresholds{}, health.Degraded},
		{"dead letters tolerated", func(r *health.Report) { r.DeadLettersUnresolved = 5 }, health.Thresholds{MaxDeadLetters: 5}, health.Healthy},
		{"stuck lease", func(r *health.Report) { r.Queue.StuckLeases = 1 }, health.Thresholds{}, health.Degraded},
		{"flapping", func(r *health.Report) { r.Queue.Flapping = 2 }, health.Thresholds{}, health.Degraded},
		{"flapping disabled", func(r *health.Report) { r.Queue.Flapping = 2 }, health.Thresholds{MaxFlapping: -1}, health.Healthy},
		{"old transaction", func(r *health.Report) { r.Horizon.OldestTransactionAgeSeconds = 301 }, health.Thresholds{}, health.Degraded},
		{"old prepared", func(r *health.Report) {
			r.Horizon.PreparedTransactions = 1
			r.Horizon.OldestPreparedAgeSeconds = 400
		}, health.Thresholds{}, health.Degraded},
		{"xmin horizon", func(r *health.Report) { r.Horizon.XminHorizonAge = health.DefaultMaxXminAge + 1 }, health.Thresholds{}, health.Degraded},
		{"worst wins", func(r *health.Report) { r.DeadLettersUnresolved = 1; r.Queue.OldestPendingAgeSeconds = 1000 }, health.Thresholds{}, health.Unhealthy},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := base
			c.mod(&r)
			st, reasons := r.Check(c.th)
			if st != c.want || (st == health.Healthy) != (len(reasons) == 0) {
				t.Fatalf("status %v reasons %v, want %v", st, reasons, c.want)
			}
		})
	}
}

// TestCollectBeforeMigration0018: a schema without the circuit table has no circuits, and
// the report's transaction stays usable (the console reads more in it).
func TestCollectBeforeMigration0018(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `DROP TABLE outbox_circuits`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rep, err := health.Collect(ctx, tx)
	if err != nil || len(rep.Circuits) != 0 || rep.Circuits == nil {
		t.Fatalf("report %+v %v", rep.Circuits, err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("transaction after the report: %v", err)
	}
}
