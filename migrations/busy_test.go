package migrations_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// producerLockTimeout is the producers' own lock_timeout in these tests: longer than the
// migration's (200 ms), shorter than the open transaction (holdFor). Without the
// migration's lock_timeout, 0006's ALTER TABLE would queue behind the open transaction
// and every producer INSERT behind it, until this ran out.
const (
	producerLockTimeout = "1500ms"
	holdFor             = 3 * time.Second
)

// holdOutbox opens a transaction that has inserted into the outbox and stays open, like a
// producer's long business transaction; end commits it.
func holdOutbox(t *testing.T, pool *pgxpool.Pool) (end func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (topic, partition_key, payload) VALUES ('t', 'held', '{}')`); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	end = func() {
		once.Do(func() {
			if err := tx.Commit(ctx); err != nil {
				t.Errorf("commit the held transaction: %v", err)
			}
		})
	}
	t.Cleanup(end)
	return end
}

// produce inserts events until stop is closed, each in its own transaction with the
// producers' lock_timeout, counting commits and keeping the errors.
func produce(pool *pgxpool.Pool, stop <-chan struct{}, commits *atomic.Int64, errs chan<- error) {
	ctx := context.Background()
	for {
		select {
		case <-stop:
			return
		default:
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+producerLockTimeout+`'`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO outbox (topic, partition_key, payload, headers) VALUES ('t', 'k', '{}', '{"x": "y"}')`)
			return err
		})
		if err != nil {
			errs <- err
			return
		}
		commits.Add(1)
	}
}

// TestMigrateBesideAnOpenOutboxTransaction: a database at 0005 (so 0006, whose first step
// needs an ACCESS EXCLUSIVE lock on the outbox, is pending) has a producer transaction
// open on the outbox while `migrate up` runs and other producers keep inserting. The
// migration's lock waits end at its lock_timeout, are logged and retried, so the producers
// keep committing (none reaches its own lock_timeout); once the open transaction commits
// the migration gets its locks and completes.
func TestMigrateBesideAnOpenOutboxTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{NoMigrate: true, MaxConns: 8})
	migrateTo(t, db.Pool, 5)
	end := holdOutbox(t, db.Pool)

	stop := make(chan struct{})
	var commits atomic.Int64
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { produce(db.Pool, stop, &commits, errs) })
	}
	logger, logs := logtest.New()
	type result struct {
		applied []int64
		err     error
	}
	done := make(chan result, 1)
	go func() {
		applied, err := postgres.MigrateWithOptions(t.Context(), db.Pool, postgres.MigrateOptions{
			Logger: logger, LockTimeout: 200 * time.Millisecond, LockBackoff: 100 * time.Millisecond,
			MaxLockBackoff: 200 * time.Millisecond, LockAttempts: 100})
		done <- result{applied, err}
	}()

	time.Sleep(holdFor)
	during := commits.Load()
	select {
	case r := <-done:
		t.Fatalf("migration finished while the outbox transaction was open: %v %v", r.applied, r.err)
	default:
	}
	end()
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("migration did not finish after the open transaction ended")
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("producer: %v", err)
	}
	if r.err != nil || len(r.applied) == 0 || r.applied[0] != 6 {
		t.Fatalf("migrate: %v %v, want 0006 onwards applied", r.applied, r.err)
	}
	waits := strings.Count(logs.String(), `"msg":"migration waits for a lock"`)
	t.Logf("producers committed %d events while the transaction was open (%s); the migration logged %d lock waits", during, holdFor, waits)
	if during < 10 {
		t.Errorf("producers committed %d events in %s beside the migration, want them to keep going", during, holdFor)
	}
	if waits < 2 || !strings.Contains(logs.String(), `"version":6`) || !strings.Contains(logs.String(), `"oldest_xact_query"`) {
		t.Errorf("want lock waits of 0006 logged with the oldest transaction:\n%s", logs)
	}
}

// TestMigrateLockWaitIsBounded: a transaction that never ends makes Migrate give up after
// its attempts, with the lock timeout as the error; the migration is not applied and the
// next run applies it.
func TestMigrateLockWaitIsBounded(t *testing.T) {
	t.Parallel()
	db := deployed(t, 5)
	end := holdOutbox(t, db.Pool)
	logger, logs := logtest.New()
	opts := postgres.MigrateOptions{Logger: logger, LockTimeout: 100 * time.Millisecond, LockBackoff: 50 * time.Millisecond, LockAttempts: 3}
	_, err := postgres.MigrateWithOptions(t.Context(), db.Pool, opts)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("migrate beside a transaction that never ends: %v, want lock_not_available", err)
	}
	if n := strings.Count(logs.String(), `"msg":"migration waits for a lock"`); n != 2 {
		t.Errorf("%d lock waits logged, want 2 (3 attempts)", n)
	}
	end()
	if applied, err := postgres.MigrateWithOptions(t.Context(), db.Pool, opts); err != nil || len(applied) == 0 || applied[0] != 6 {
		t.Fatalf("migrate after the transaction ended: %v %v", applied, err)
	}
}
