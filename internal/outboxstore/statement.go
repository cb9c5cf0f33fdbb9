package outboxstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Every statement of a Store runs through exec or query, which add two things to it.
//
// A bound on the server. When ctx has a deadline and the Store runs on a pool, the
// statement goes out in one round trip behind set_config('statement_timeout', <what ctx
// has left>, true): pgx's default reaction to an expired context is to close the socket,
// which stops the client but not the backend, and a claim stuck on a lock or a pinned
// xmin horizon would hold its row locks and keep scanning until it finished; a relay
// frozen (Lambda) or killed mid-statement cannot cancel anything at all. The setting is
// transaction-local (the statement's implicit transaction), so it leaves no session state
// behind a transaction pooler, and it never raises a stricter statement_timeout the role
// or the session already has. One gap: the first use of a statement on a connection
// prepares it in a round trip of its own (pgx's statement cache), before the setting can
// run; parsing takes the table's lock, so that round trip can wait on a table lock with
// only the client's deadline (and pgx's cancel request) to end it. Every later use on that
// connection is covered. Measured on loopback (2-core shared VM): a mark of 1,000 ids took
// 0.46-0.67 ms without the setting and 0.63-1.3 ms with it, noisy; the round trip count is
// the same.
//
// One retry when the statement never ran. A warm pool hands out an idle connection
// without a ping when it was used less than a second ago (pgxpool's rule), so a session
// the server ended meanwhile (pg_terminate_backend, a failover, idle_session_timeout)
// fails the next statement although nothing is wrong with the database; a new connection
// refused with 28P01 after a password rotation fails it too (awsenv.Credentials re-reads
// the secret on the next attempt). Such a statement is run once more, on a connection
// that answered a ping. What counts as "never ran" is in gone.
//
// A mark or other fenced statement whose first attempt was cut off by an admin shutdown
// (57P01/57P02) should have been rolled back: the server ends a session at an interrupt
// check, and the implicit transaction commits at the Sync, with interrupts held (reasoned
// from the server's code paths, not measured). Were one to have committed nonetheless,
// its retry would change no row (the lease token is cleared) and the relay would count
// those rows as lease lost: a wrong count, never a wrong row.

// qStatementTimeout sets the statement_timeout of the current (implicit) transaction to
// $1 milliseconds, unless the session's own is already stricter. current_setting returns
// a value with a unit ('300ms', '1min') or '0'; each casts to interval.
const qStatementTimeout = `
SELECT set_config('statement_timeout', $1::bigint::text, true)
WHERE current_setting('statement_timeout')::interval = interval '0'
   OR current_setting('statement_timeout')::interval > $1::bigint * interval '1 millisecond'`

// ErrTimeout is wrapped in the error of a statement that ran out of time: its context's
// deadline, or the statement_timeout set from it. errors.As still finds the pgx error.
var ErrTimeout = errors.New("statement timed out")

// Admin-shutdown SQLSTATEs that end a session without running what it was sent (class
// 57, operator intervention).
const (
	codeAdminShutdown      = "57P01" // pg_terminate_backend, smart/fast shutdown
	codeCrashShutdown      = "57P02" // another backend crashed: every session is reset
	codeCannotConnectNow   = "57P03" // starting up or shutting down
	codeIdleSessionTimeout = "57P05" // idle_session_timeout (PostgreSQL 14+)
	codeQueryCanceled      = "57014" // statement_timeout or a cancel request
	codeInvalidPassword    = "28P01" // the server refused the password
)

// gone reports whether err says the statement never ran on a live session, so running it
// again on another connection cannot apply it twice: pgx sent nothing (SafeToRetry), no
// connection could be opened (a connect error, 28P01 included), or the server had ended
// the session (admin shutdown, crash, cannot connect now, idle session timeout).
func gone(err error) bool {
	if pgconn.SafeToRetry(err) {
		return true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeAdminShutdown, codeCrashShutdown, codeCannotConnectNow, codeIdleSessionTimeout:
			return true
		}
	}
	return false
}

// SessionLost reports whether err is the loss of a session rather than an answer of the
// database: what gone accepts, or an error that is no server error at all (a reset or
// closed connection while the answer was awaited). The statement may have run; a fenced
// one (a mark, conditioned on the lease) can be run again safely, which the relay does.
func SessionLost(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrTimeout) {
		return false
	}
	if gone(err) {
		return true
	}
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr)
}

// bounded says how a statement ran: start is when it was sent, limit the server-side
// statement_timeout set for it (0: none).
type bounded struct {
	start time.Time
	limit time.Duration
}

// classify wraps ErrTimeout into err when the statement ran out of time: ctx's deadline
// passed, or the server's timeout (SQLSTATE 57014 once limit has elapsed; an earlier 57014
// is someone's cancel request).
func (b bounded) classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w after %v: %w", ErrTimeout, time.Since(b.start).Round(time.Millisecond), err)
	}
	var pgErr *pgconn.PgError
	if b.limit > 0 && errors.As(err, &pgErr) && pgErr.Code == codeQueryCanceled && time.Since(b.start) >= b.limit {
		return fmt.Errorf("%w after %v (statement_timeout): %w", ErrTimeout, b.limit, err)
	}
	return err
}

// serverBound is the statement_timeout for a statement under ctx: what ctx has left,
// rounded down to the millisecond, at least 1 ms; 0 when ctx has no deadline or db is
// not a pool (a pgx.Tx would keep the setting for the rest of its transaction).
func serverBound(ctx context.Context, db any) time.Duration {
	switch db.(type) {
	case *pgxpool.Pool, *pgxpool.Conn:
	default:
		return 0
	}
	dl, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	return max(time.Until(dl).Truncate(time.Millisecond), time.Millisecond)
}

// execOnce runs one statement on db.
func execOnce(ctx context.Context, db querier, sql string, args []any) (pgconn.CommandTag, error) {
	b := bounded{start: time.Now(), limit: serverBound(ctx, db)}
	if b.limit == 0 {
		tag, err := db.Exec(ctx, sql, args...)
		return tag, b.classify(err)
	}
	var batch pgx.Batch
	batch.Queue(qStatementTimeout, b.limit.Milliseconds())
	batch.Queue(sql, args...)
	br := db.(batcher).SendBatch(ctx, &batch)
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, b.classify(err)
}

// querier is what a Store runs statements on: outbox.Querier.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// batcher sends the bounded statement in one round trip: *pgxpool.Pool and *pgxpool.Conn.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// exec runs a statement that returns no rows, retried once if it never ran (see gone).
func (s *Store) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := execOnce(ctx, s.db, sql, args)
	if err == nil || !gone(err) || ctx.Err() != nil {
		return tag, err
	}
	conn, cerr := s.live(ctx)
	if cerr != nil {
		return tag, fmt.Errorf("%w (retry: %w)", err, cerr)
	}
	if conn == nil {
		return tag, err
	}
	defer conn.Release()
	return execOnce(ctx, conn, sql, args)
}

// live returns a pool connection that answered a ping, for a retry; nil (and no error)
// when the Store does not run on a pool. Every idle connection the server ended fails its
// ping and is dropped, so at most MaxConns pings precede a new connection.
func (s *Store) live(ctx context.Context) (*pgxpool.Conn, error) {
	pool, ok := s.db.(*pgxpool.Pool)
	if !ok {
		return nil, nil
	}
	var err error
	refused := false
	for range int(pool.Config().MaxConns) + 2 {
		var conn *pgxpool.Conn
		if conn, err = pool.Acquire(ctx); err != nil {
			// A new connection refused with 28P01 after a password rotation: the pool's
			// connect hook re-reads the secret before the next attempt (awsenv.Credentials),
			// so one more is worth it. Seen: a warm relay invoked within a second of the
			// rotation met a dead session, then the refusal, and failed its drain.
			var pgErr *pgconn.PgError
			if !refused && errors.As(err, &pgErr) && pgErr.Code == codeInvalidPassword && ctx.Err() == nil {
				refused = true
				continue
			}
			return nil, err
		}
		if err = conn.Ping(ctx); err == nil {
			return conn, nil
		}
		conn.Release() // a failed ping closed it: the pool destroys it
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("find a live database connection: %w", err)
}

// query runs a statement that returns rows. If it never ran (see gone) and no row came
// back, it is run once more, on the first call to Next that finds the failure; a claim
// that returned rows is never re-run, since its rows are leased.
//
// prelude, when set, runs first in the statement's implicit transaction (a set_config of
// a planner setting, local to it: see qClaimPlanner); it needs a db that sends batches.
func (s *Store) query(ctx context.Context, prelude, sql string, args ...any) (pgx.Rows, error) {
	r := &retryRows{s: s, ctx: ctx, prelude: prelude, sql: sql, args: args}
	if err := r.open(s.db); err != nil {
		if !r.retryable(err) {
			return nil, err
		}
		if err := r.retry(); err != nil {
			r.release() // the retry's connection, if its statement failed on it
			return nil, err
		}
	}
	return r, nil
}

// retryRows is the rows of query: pgx.Rows, with the bounded batch behind it closed with
// them, and the one retry.
type retryRows struct {
	pgx.Rows
	s       *Store
	ctx     context.Context
	prelude string
	sql     string
	args    []any

	b       bounded
	br      pgx.BatchResults // the batch behind Rows, if any
	conn    *pgxpool.Conn    // the retry's connection, if any
	seen    bool             // a row came back
	retried bool
	err     error // an error of the retry's setup, reported by Err
}

// open sends the statement on db.
func (r *retryRows) open(db querier) error {
	r.b = bounded{start: time.Now(), limit: serverBound(r.ctx, db)}
	sender, batches := db.(batcher)
	if r.b.limit == 0 && (r.prelude == "" || !batches) {
		rows, err := db.Query(r.ctx, r.sql, r.args...)
		if err != nil {
			return r.b.classify(err)
		}
		r.Rows = rows
		return nil
	}
	var batch pgx.Batch
	if r.b.limit > 0 {
		batch.Queue(qStatementTimeout, r.b.limit.Milliseconds())
	}
	if r.prelude != "" {
		batch.Queue(r.prelude)
	}
	batch.Queue(r.sql, r.args...)
	r.br = sender.SendBatch(r.ctx, &batch)
	for range len(batch.QueuedQueries) - 1 {
		if _, err := r.br.Exec(); err != nil {
			_ = r.br.Close()
			r.br = nil
			return r.b.classify(err)
		}
	}
	rows, err := r.br.Query()
	if err != nil {
		_ = r.br.Close()
		r.br = nil
		return r.b.classify(err)
	}
	r.Rows = rows
	return nil
}

func (r *retryRows) retryable(err error) bool {
	return !r.retried && !r.seen && gone(err) && r.ctx.Err() == nil
}

// retry closes what the first attempt left open and sends the statement again on a live
// connection.
func (r *retryRows) retry() error {
	r.retried = true
	r.release()
	conn, err := r.s.live(r.ctx)
	if err != nil {
		return err
	}
	if conn == nil {
		return errors.New("no pool to retry on")
	}
	r.conn = conn
	return r.open(conn)
}

// release closes the rows, the batch and the retry's connection.
func (r *retryRows) release() {
	if r.Rows != nil {
		r.Rows.Close()
	}
	if r.br != nil {
		_ = r.br.Close()
		r.br = nil
	}
	if r.conn != nil {
		r.conn.Release()
		r.conn = nil
	}
}

func (r *retryRows) Next() bool {
	if r.err != nil {
		return false
	}
	if r.Rows.Next() {
		r.seen = true
		return true
	}
	if err := r.Rows.Err(); err != nil && r.retryable(err) {
		first := err
		if err := r.retry(); err != nil {
			r.err = fmt.Errorf("%w (retry: %w)", first, err)
			return false
		}
		return r.Next()
	}
	return false
}

// Err returns the statement's error, ErrTimeout wrapped in when it ran out of time.
func (r *retryRows) Err() error {
	if r.err != nil {
		return r.err
	}
	return r.b.classify(r.Rows.Err())
}

// Close closes the rows and everything behind them; it is safe to call more than once.
func (r *retryRows) Close() {
	r.release()
}
