package outboxstore_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// onePool opens a one-connection pool on db's schema. noPing keeps pgxpool from pinging
// an idle connection before handing it out, as it does not for one used less than a
// second ago: the test need not race that second.
func onePool(t *testing.T, db *pgtest.DB, noPing bool, params map[string]string) *pgxpool.Pool {
	t.Helper()
	return openPool(t, db, noPing, params, nil)
}

func openPool(t *testing.T, db *pgtest.DB, noPing bool, params map[string]string, tune func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return pgtest.OpenPool(t, db.URL, func(cfg *pgxpool.Config) {
		if tune != nil {
			tune(cfg)
		}
		cfg.MaxConns = 1
		if noPing {
			cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		}
		maps.Copy(cfg.ConnConfig.RuntimeParams, params)
	})
}

// terminate ends the pool's one session from db's admin pool and waits until it is gone.
func terminate(t *testing.T, db *pgtest.DB, pool *pgxpool.Pool) {
	t.Helper()
	var pid int32
	if err := pool.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	outboxtest.Terminate(t, db.Pool, pid)
}

// A session the server ended right after its last use (57P01, pg_terminate_backend) is
// still idle in the pool; the next claim and the next mark run once more on a live
// connection instead of failing. Both ways a statement goes out are covered: with a
// deadline (behind the statement_timeout setting, in one batch) and without.
func TestStatementRetriedWhenTheSessionWasEnded(t *testing.T) {
	t.Parallel()
	for _, bounded := range []bool{true, false} {
		name := map[bool]string{true: "with deadline", false: "without deadline"}[bounded]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			insertReady(t, db, 20, func(i int) string { return "k" + string(rune('a'+i)) })
			pool := onePool(t, db, true, nil)
			s := outboxstore.NewStore(pool)
			ctx := t.Context()
			if bounded {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Minute)
				defer cancel()
			}

			terminate(t, db, pool)
			lease, _ := outboxstore.NewLease()
			c, err := s.Claim(ctx, outboxstore.ClaimRequest{Lease: lease, Rows: 10, KeyRun: 1, For: time.Minute})
			if err != nil {
				t.Fatalf("claim after the session was ended: %v", err)
			}
			if c.Len() != 10 {
				t.Fatalf("claimed %d rows, want 10", c.Len())
			}
			ids := make([]outbox.ID, 0, len(c.Messages))
			for _, m := range c.Messages {
				ids = append(ids, m.ID)
			}

			terminate(t, db, pool)
			n, err := s.MarkDispatched(ctx, lease, ids, nil)
			if err != nil || n != 10 {
				t.Fatalf("mark after the session was ended: %d rows, %v; want 10", n, err)
			}
			if got := pool.Stat().NewConnsCount(); got != 3 {
				t.Fatalf("%d connections opened, want 3 (one, then one per ended session)", got)
			}
		})
	}
}

// A statement whose error says it ran (a constraint, a syntax error, a cancel) is not
// retried: only errors that prove it never ran are (the retry of a claim that had run
// would lease a second batch).
func TestStatementNotRetriedWhenItRan(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	insertReady(t, db, 5, func(i int) string { return "k" })
	pool := onePool(t, db, true, nil)
	s := outboxstore.NewStore(pool)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	lease, _ := outboxstore.NewLease()
	if c, err := s.Claim(ctx, outboxstore.ClaimRequest{Lease: lease, Rows: 5, KeyRun: 5, For: time.Minute}); err != nil || c.Len() != 5 {
		t.Fatalf("claim: %d rows, %v", c.Len(), err)
	}
	// pg_cancel_backend from outside while the mark waits on a row lock: 57014 before any
	// time limit passed is not a timeout and not retried.
	tx := outboxtest.Begin(t, db.Pool)
	if _, err := tx.Exec(ctx, `SELECT id FROM outbox FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	var pid int32
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		waitWaiting(t, db, pid)
		_, _ = db.Pool.Exec(context.Background(), `SELECT pg_cancel_backend($1)`, pid)
	}()
	_, err := s.Release(ctx, lease, []outbox.ID{1, 2, 3}, nil)
	<-done
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" || errors.Is(err, outboxstore.ErrTimeout) {
		t.Fatalf("cancelled statement: %v, want SQLSTATE 57014 and no ErrTimeout", err)
	}
	if got := pool.Stat().NewConnsCount(); got != 1 {
		t.Fatalf("%d connections opened: the cancelled statement was retried", got)
	}
}

// waitWaiting waits until backend pid waits on a lock.
func waitWaiting(t *testing.T, db *pgtest.DB, pid int32) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		if err := db.Pool.QueryRow(context.Background(),
			`SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting); err != nil {
			t.Error(err)
			return
		}
		if waiting {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Errorf("backend %d never waited on a lock", pid)
}

// deaf is a context watcher that does nothing when the context ends: a client that cannot
// cancel its statement (a frozen Lambda environment, a killed process, a pooler that
// drops cancel requests). pgx's own closes the socket and sends a cancel request.
type deaf struct{}

func (deaf) HandleCancel(context.Context) {}
func (deaf) HandleUnwatchAfterCancel()    {}

// A claim stuck behind a lock gives up at its bound even when its client cannot cancel it:
// the server ends it (the statement_timeout sent with it) and the error wraps ErrTimeout.
// Without that setting the statement would wait for the lock, with the client waiting on
// it. The setting is local to the claim's transaction: the session's own statement_timeout
// is back to its default afterwards, and a session whose own is stricter keeps it.
func TestStatementBoundOnTheServer(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := openPool(t, db, false, nil, func(c *pgxpool.Config) {
		c.ConnConfig.BuildContextWatcherHandler = func(*pgconn.PgConn) ctxwatch.Handler { return deaf{} }
	})
	s := outboxstore.NewStore(pool)
	bg := context.Background()
	// A connection prepares a statement on its first use, in a round trip of its own that
	// no statement_timeout of the statement's covers (see statement.go): this claim, on an
	// empty table, is that first use.
	warm, cancelWarm := context.WithTimeout(bg, time.Minute)
	defer cancelWarm()
	lease, _ := outboxstore.NewLease()
	if _, err := s.Claim(warm, outboxstore.ClaimRequest{Lease: lease, Rows: 5, KeyRun: 1, For: time.Minute}); err != nil {
		t.Fatal(err)
	}
	insertReady(t, db, 5, func(i int) string { return "k" })

	tx := db.LockTable(t, "outbox")
	// Without a server-side bound the claim would wait for this.
	release := time.AfterFunc(20*time.Second, func() { _ = tx.Rollback(bg) })
	t.Cleanup(func() {
		if release.Stop() {
			_ = tx.Rollback(bg)
		}
	})
	const bound = 400 * time.Millisecond
	ctx, cancel := context.WithTimeout(bg, bound)
	defer cancel()
	start := time.Now()
	_, err := s.Claim(ctx, outboxstore.ClaimRequest{Lease: lease, Rows: 5, KeyRun: 1, For: time.Minute})
	took := time.Since(start)
	if !errors.Is(err, outboxstore.ErrTimeout) || !strings.HasPrefix(err.Error(), "claim outbox batch: statement timed out after ") {
		t.Fatalf("claim behind a lock: %v, want claim outbox batch: statement timed out after ...", err)
	}
	if took > bound+2*time.Second {
		t.Fatalf("claim gave up after %v, bound %v", took, bound)
	}
	if !release.Stop() {
		t.Fatal("the lock was released by the test's own timer")
	}
	_ = tx.Rollback(bg)

	// Local to the claim's transaction.
	ctx2, cancel2 := context.WithTimeout(bg, time.Minute)
	defer cancel2()
	if c, err := s.Claim(ctx2, outboxstore.ClaimRequest{Lease: lease, Rows: 5, KeyRun: 1, For: time.Minute}); err != nil || c.Len() != 5 {
		t.Fatalf("claim: %d rows, %v", c.Len(), err)
	}
	var setting string
	if err := pool.QueryRow(bg, `SHOW statement_timeout`).Scan(&setting); err != nil || setting != "0" {
		t.Fatalf("statement_timeout after a bounded claim: %q %v, want the default 0", setting, err)
	}

	// A stricter session setting wins over the context's minute.
	strict := outboxstore.NewStore(onePool(t, db, false, map[string]string{"statement_timeout": "200"}))
	db.LockTable(t, "outbox")
	start = time.Now()
	lease, _ = outboxstore.NewLease()
	_, err = strict.Claim(ctx2, outboxstore.ClaimRequest{Lease: lease, Rows: 5, KeyRun: 1, For: time.Minute})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" || time.Since(start) > 5*time.Second {
		t.Fatalf("claim under a session statement_timeout of 200 ms: %v after %v, want SQLSTATE 57014 at once", err, time.Since(start))
	}
}
