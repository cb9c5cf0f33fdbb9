package chaos_test

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/health"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster"
	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster/clustertest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// newDatabase creates a migrated database on c and returns its URL.
func newDatabase(t *testing.T, c *pgcluster.Cluster, name string) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	url := strings.Replace(c.URL, "/postgres?", "/"+name+"?", 1)
	pool := openPool(t, url, 4, nil)
	if _, err := postgres.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	return url
}

func openPool(t *testing.T, url string, maxConns int32, params map[string]string) *pgxpool.Pool {
	t.Helper()
	return pgtest.OpenPool(t, url, func(cfg *pgxpool.Config) {
		cfg.MaxConns = maxConns
		maps.Copy(cfg.ConnConfig.RuntimeParams, params)
	})
}

// recordingPublisher publishes through the real Publisher to the local QStash server and
// records which ids QStash accepted, so the test can check that no row is marked
// dispatched without a publish. before, if set, runs before each call (to inject faults).
type recordingPublisher struct {
	inner  relay.Publisher
	before func(call int)
	mu     sync.Mutex
	calls  int
	ok     map[outbox.ID]int
}

func (p *recordingPublisher) Publish(ctx context.Context, msgs []outbox.Message) []publish.Result {
	p.mu.Lock()
	p.calls++
	call := p.calls
	p.mu.Unlock()
	if p.before != nil {
		p.before(call)
	}
	res := p.inner.Publish(ctx, msgs)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, r := range res {
		if r.Err == nil {
			p.ok[msgs[i].ID]++
		}
	}
	return res
}

func (p *recordingPublisher) published() map[outbox.ID]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[outbox.ID]int, len(p.ok))
	for k, v := range p.ok {
		out[k] = v
	}
	return out
}

// newRecordingPublisher publishes to a local QStash server that delivers to a sink.
func newRecordingPublisher(t *testing.T) *recordingPublisher {
	t.Helper()
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(sink.Close)
	qs := qstashtest.NewTestServer(t, qstashtest.Options{})
	pub, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: sink.URL})
	if err != nil {
		t.Fatal(err)
	}
	return &recordingPublisher{inner: pub, ok: map[outbox.ID]int{}}
}

// rowStates counts outbox rows by state: dispatched, dead-lettered, leased (pending with a
// lease token), pending without a lease; and checks every dispatched row was published.
type rowStates struct {
	dispatched, dead, leased, free int
	dispatchedUnpublished          []outbox.ID
	negativeAttempts               int
}

func readStates(t *testing.T, pool *pgxpool.Pool, published map[outbox.ID]int) rowStates {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id, dispatched_at IS NOT NULL, dead_lettered_at IS NOT NULL, lease_token IS NOT NULL, attempts FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	var s rowStates
	for rows.Next() {
		var id outbox.ID
		var disp, dead, leased bool
		var attempts int
		if err := rows.Scan(&id, &disp, &dead, &leased, &attempts); err != nil {
			t.Fatal(err)
		}
		switch {
		case disp:
			s.dispatched++
			if published[id] == 0 {
				s.dispatchedUnpublished = append(s.dispatchedUnpublished, id)
			}
		case dead:
			s.dead++
		case leased:
			s.leased++
		default:
			s.free++
		}
		if attempts < 0 {
			s.negativeAttempts++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return s
}

// later is a relay clock past every lease taken so far: rows a failed drain left leased
// are claimable again without the test sleeping through the lease.
func later(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }

// TestDatabaseFaults runs the database-fault scenarios on one throwaway cluster, one
// database each, one after the other (the restart would disturb the others).
func TestDatabaseFaults(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	t.Run("restart while draining", func(t *testing.T) { testRestartWhileDraining(t, c) })
	t.Run("pool exhausted", func(t *testing.T) { testPoolExhausted(t, c) })
	t.Run("statement timeout", func(t *testing.T) { testStatementTimeout(t, c) })
	t.Run("xmin horizon held", func(t *testing.T) { testXminHorizonHeld(t, c) })
}

// Postgres restarted (fast shutdown: every connection cut) while a relay drains: the drain
// returns an error instead of hanging or panicking; no row is dispatched that QStash did
// not accept; rows leased by the cut batch wait for their lease; the next drain, once the
// lease has passed, finishes everything.
func testRestartWhileDraining(t *testing.T, c *pgcluster.Cluster) {
	url := newDatabase(t, c, "restart")
	pool := openPool(t, url, 4, nil)
	const n = 3000
	outboxtest.Enqueue(t, pool, outboxtest.Orders(0, n, outboxtest.Mod(50)))
	pub := newRecordingPublisher(t)
	restarted := make(chan error, 1)
	pub.before = func(call int) {
		if call == 5 {
			// Stop the server in the middle of the drain (fast: every connection cut) and
			// start it again only after the mark timeout: the publish in flight completes and
			// its mark meets the stopped server, whatever else is in flight meanwhile.
			if err := c.Stop(); err != nil {
				restarted <- err
				return
			}
			go func() {
				time.Sleep(3 * time.Second)
				restarted <- c.Start(context.Background())
			}()
		}
	}
	r, err := relay.New(pool, pub, relay.Config{BatchSize: 100, MarkTimeout: 2 * time.Second, PublishTimeout: 5 * time.Second, Lease: 30 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := r.Drain(ctx)
	if err == nil {
		t.Fatalf("drain across a restart returned no error (stats %+v)", st)
	}
	t.Logf("drain error (expected): %v", err)
	if !strings.Contains(err.Error(), "outbox") {
		t.Errorf("error %q does not say which step failed", err)
	}
	if err := <-restarted; err != nil {
		t.Fatalf("restart: %v", err)
	}
	s := readStates(t, pool, pub.published())
	if len(s.dispatchedUnpublished) > 0 || s.dead > 0 || s.negativeAttempts > 0 {
		t.Fatalf("after the restart: %d rows dispatched without a publish, %d dead-lettered, %d negative attempts",
			len(s.dispatchedUnpublished), s.dead, s.negativeAttempts)
	}
	if s.dispatched+s.leased+s.free != n {
		t.Fatalf("states %+v do not add up to %d", s, n)
	}
	t.Logf("after the restart: %d dispatched, %d leased by the cut batch, %d untouched", s.dispatched, s.leased, s.free)

	// The next run: leased rows are held until the lease ends, then everything completes.
	r2, err := relay.New(pool, pub, relay.Config{BatchSize: 100, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Drain(ctx); err != nil {
		t.Fatalf("drain after the restart: %v", err)
	}
	if s.leased > 0 {
		if mid := readStates(t, pool, pub.published()); mid.leased != s.leased {
			t.Fatalf("leased rows changed before their lease ended: %d, was %d", mid.leased, s.leased)
		}
	}
	r3, err := relay.New(pool, pub, relay.Config{BatchSize: 100, Now: later(time.Minute), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r3.Drain(ctx); err != nil {
		t.Fatalf("drain after the lease: %v", err)
	}
	end := readStates(t, pool, pub.published())
	if end.dispatched != n || len(end.dispatchedUnpublished) > 0 {
		t.Fatalf("after recovery: %+v, want all %d dispatched and published", end, n)
	}
}

// A pool with no free connection: the claim waits for one and fails with the context's
// error, changing nothing; a pool that runs dry between publish and mark fails the mark
// as a whole (no half-marked batch), and the rows recover after the lease.
func testPoolExhausted(t *testing.T, c *pgcluster.Cluster) {
	url := newDatabase(t, c, "exhausted")
	seed := openPool(t, url, 2, nil)
	const n = 200
	outboxtest.Enqueue(t, seed, outboxtest.Orders(0, n, outboxtest.Mod(10)))
	pool := openPool(t, url, 1, nil)
	pub := newRecordingPublisher(t)
	r, err := relay.New(pool, pub, relay.Config{BatchSize: 50, MarkTimeout: 500 * time.Millisecond, PublishTimeout: 2 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}

	held, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// A deadline would make Drain decline to claim at all (DeadlineMargin); a caller
	// giving up is a cancellation.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(500*time.Millisecond, cancel)
	_, err = r.Drain(ctx)
	held.Release()
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "claim outbox batch") {
		t.Fatalf("claim on an exhausted pool: %v, want claim outbox batch: ... context canceled", err)
	}
	t.Logf("claim error (expected): %v", err)
	if s := readStates(t, seed, nil); s.free != n {
		t.Fatalf("a failed claim changed rows: %+v", s)
	}

	// Exhausted between publish and mark.
	var grab sync.Once
	var midHeld *pgxpool.Conn
	defer func() {
		if midHeld != nil {
			midHeld.Release()
		}
	}()
	pub.before = func(int) {
		grab.Do(func() {
			var err error
			if midHeld, err = pool.Acquire(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	_, err = r.Drain(context.Background())
	if err == nil || !strings.Contains(err.Error(), "record batch outcome") {
		t.Fatalf("mark on an exhausted pool: %v, want a record batch outcome error", err)
	}
	t.Logf("mark error (expected): %v", err)
	midHeld.Release()
	midHeld = nil
	s := readStates(t, seed, pub.published())
	if s.dispatched != 0 || s.leased != 50 || s.free != n-50 {
		t.Fatalf("half-applied batch: %+v, want 0 dispatched, 50 leased, %d untouched", s, n-50)
	}
	r2, _ := relay.New(pool, pub, relay.Config{BatchSize: 50, Now: later(time.Minute), Logger: quiet()})
	if _, err := r2.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if end := readStates(t, seed, pub.published()); end.dispatched != n || len(end.dispatchedUnpublished) > 0 {
		t.Fatalf("after recovery: %+v", end)
	}
}

// statement_timeout on the relay's sessions: a claim blocked by a lock fails with SQLSTATE
// 57014 and changes nothing; a mark blocked past the timeout fails the whole mark.
func testStatementTimeout(t *testing.T, c *pgcluster.Cluster) {
	url := newDatabase(t, c, "timeout")
	admin := openPool(t, url, 2, nil)
	const n = 120
	outboxtest.Enqueue(t, admin, outboxtest.Orders(0, n, outboxtest.Mod(12)))
	pool := openPool(t, url, 4, map[string]string{"statement_timeout": "300"})
	pub := newRecordingPublisher(t)
	r, err := relay.New(pool, pub, relay.Config{BatchSize: 40, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	lock := func() pgx.Tx {
		tx, err := admin.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE outbox IN SHARE MODE`); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	tx := lock()
	_, err = r.Drain(ctx)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" || !strings.Contains(err.Error(), "claim outbox batch") {
		t.Fatalf("claim under a lock with statement_timeout: %v, want claim outbox batch: ... (SQLSTATE 57014)", err)
	}
	_ = tx.Rollback(ctx)
	if s := readStates(t, admin, nil); s.free != n {
		t.Fatalf("a timed-out claim changed rows: %+v", s)
	}

	var once sync.Once
	var held pgx.Tx
	pub.before = func(int) { once.Do(func() { held = lock() }) }
	_, err = r.Drain(ctx)
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" || !strings.Contains(err.Error(), "record batch outcome") {
		t.Fatalf("mark under a lock with statement_timeout: %v, want record batch outcome: ... (SQLSTATE 57014)", err)
	}
	_ = held.Rollback(ctx)
	// Every batch that was claimed was published (the relay pipelines, so there may be more
	// than one) and none of them could be marked.
	published := pub.published()
	s := readStates(t, admin, published)
	if s.dispatched != 0 || s.leased < 40 || s.leased != len(published) {
		t.Fatalf("half-applied batch after a timed-out mark: %+v, want 0 dispatched and all %d published rows (at least one batch of 40) still leased", s, len(published))
	}
	r2, _ := relay.New(pool, pub, relay.Config{BatchSize: 40, Now: later(time.Minute), Logger: quiet()})
	if _, err := r2.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if end := readStates(t, admin, pub.published()); end.dispatched != n || len(end.dispatchedUnpublished) > 0 {
		t.Fatalf("after recovery: %+v", end)
	}
}

// A forgotten open transaction holds the xmin horizon: the relay keeps draining (its claim
// does not depend on VACUUM), and the health report names the transaction and its age.
func testXminHorizonHeld(t *testing.T, c *pgcluster.Cluster) {
	url := newDatabase(t, c, "horizon")
	ctx := context.Background()
	holder := openPool(t, url, 1, map[string]string{"application_name": "forgotten-report"})
	tx, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var one int
	if err := tx.QueryRow(ctx, `SELECT 1 FROM outbox LIMIT 1`).Scan(&one); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	pool := openPool(t, url, 4, nil)
	const n = 2000
	for range 4 {
		outboxtest.Enqueue(t, pool, outboxtest.Orders(0, n/4, outboxtest.Mod(20)))
	}
	pub := newRecordingPublisher(t)
	r, err := relay.New(pool, pub, relay.Config{BatchSize: 100, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Drain(ctx); err != nil {
		t.Fatalf("drain with the horizon held: %v", err)
	}
	if s := readStates(t, pool, pub.published()); s.dispatched != n {
		t.Fatalf("with the horizon held: %+v, want %d dispatched", s, n)
	}
	rep, err := health.Collect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	h := rep.Horizon
	if h.OpenTransactions < 1 || h.OldestTransactionApp != "forgotten-report" || h.BackendXminAge < 1 {
		t.Fatalf("health does not report the held horizon: %+v", h)
	}
	st, reasons := rep.Check(health.Thresholds{MaxTransactionAge: time.Millisecond, MaxXminAge: 1})
	if st != health.Degraded || len(reasons) < 2 {
		t.Fatalf("Check = %v %v, want degraded naming the transaction and the horizon", st, reasons)
	}
	t.Logf("health: %v %q", st, reasons)
}
