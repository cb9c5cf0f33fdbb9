package awsenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// codeInvalidPassword is SQLSTATE 28P01: the server refused the password.
const codeInvalidPassword = "28P01"

// IsAuthFailure reports whether err is the server refusing the password (SQLSTATE 28P01),
// as it does for every new connection once a rotated secret has changed it.
func IsAuthFailure(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == codeInvalidPassword
}

// Credentials keeps the user and password of a pool's new connections current. Secrets
// Manager rotates database secrets (every 7 days for an RDS-managed one) while a warm
// Lambda environment or a long-lived relay keeps its pool: RDS rotation changes the
// password and leaves open sessions alone, so connections already open keep working, but
// every new one is refused (SQLSTATE 28P01) until the secret is re-read.
//
// The re-read is tied to the refusal itself, wherever a connection is opened: NewPool
// installs a connect hook that notes a refusal of the credentials in use, and the pool's
// next connection attempt re-reads the secret (once for all attempts that saw the same
// refusal) before it dials. So the caller that met the refusal sees the 28P01 once, and
// a retry, its own (outboxstore retries a statement once on a connect error) or the next
// one, connects with the new password. A warm pool whose idle sessions predate the
// rotation is covered too: the first connection it opens after the rotation triggers the
// re-read, not a Ready that happened to find an idle session. RDS IAM tokens need none of
// this: a fresh token is built for every connection.
//
// A Credentials is safe for concurrent use. Pass it in PoolConfig.Credentials.
type Credentials struct {
	read func(ctx context.Context) (string, error)

	mu       sync.Mutex
	user     string
	password string
	set      bool
	gen      uint64        // counts successful reads
	want     uint64        // new connections need gen >= want: a refusal of generation want-1 was seen
	inflight chan struct{} // closed when the read in flight ends
	lastErr  error         // that read's error
}

// NewCredentials returns Credentials that re-read the connection string with read (for
// example Resolver.DatabaseURLReader) when the server refuses the password. Only the user
// and password of what read returns are used: host, database and options stay as the pool
// was opened with.
func NewCredentials(read func(ctx context.Context) (string, error)) *Credentials {
	return &Credentials{read: read}
}

// Reads returns how many times the secret was re-read.
func (c *Credentials) Reads() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// beforeConnect puts the current user and password into a new connection's config (pgxpool
// passes a copy per connection); before the first refresh the pool's own are kept. When a
// connection with the current credentials was refused since the last read, it re-reads
// them first; a failed re-read fails this connection attempt with the read's error, so
// the caller learns why the password is still refused.
func (c *Credentials) beforeConnect(ctx context.Context, cc *pgx.ConnConfig, log *slog.Logger) error {
	c.mu.Lock()
	seen, stale := c.gen, c.gen < c.want
	c.mu.Unlock()
	if stale {
		if err := c.refresh(ctx, seen, log); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.set {
		cc.User, cc.Password = c.user, c.password
	}
	return nil
}

// usedKey carries the user and password a connection attempt used from TraceConnectStart
// to TraceConnectEnd.
type usedKey struct{}

type used struct{ user, password string }

// connectTracer is the pgx connect hook that sees every refusal: pgxpool offers no other
// place where a failed connection attempt is visible.
type connectTracer struct{ c *Credentials }

// TraceQueryStart and TraceQueryEnd do nothing: pgx's tracer slot is typed as a query
// tracer, and the connect hooks are found on it by interface assertion.
func (connectTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (connectTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t connectTracer) TraceConnectStart(ctx context.Context, data pgx.TraceConnectStartData) context.Context {
	return context.WithValue(ctx, usedKey{}, used{data.ConnConfig.User, data.ConnConfig.Password})
}

// TraceConnectEnd notes a refusal of the credentials in use, so the next attempt re-reads
// them. A refusal of credentials a read has already replaced (an attempt that started
// before the read ended) asks for nothing: the next attempt uses the new ones.
func (t connectTracer) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	if !IsAuthFailure(data.Err) {
		return
	}
	u, _ := ctx.Value(usedKey{}).(used)
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.set || (u.user == c.user && u.password == c.password) {
		c.want = max(c.want, c.gen+1)
	}
}

// refresh re-reads the secret unless a read finished after generation seen (the value the
// caller's failed attempt used), and waits for a read already in flight rather than
// starting a second one.
// The caller that reads logs the outcome on log (one line per read).
func (c *Credentials) refresh(ctx context.Context, seen uint64, log *slog.Logger) error {
	c.mu.Lock()
	if c.gen > seen {
		c.mu.Unlock()
		return nil
	}
	if ch := c.inflight; ch != nil {
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.lastErr
	}
	ch := make(chan struct{})
	c.inflight = ch
	c.mu.Unlock()

	// The read outlives a caller that gives up: the others wait for it.
	dsn, err := c.read(context.WithoutCancel(ctx))
	var cc *pgx.ConnConfig
	if err == nil {
		if cc, err = pgx.ParseConfig(dsn); err != nil {
			// pgx's parse errors may quote the string, password included.
			err = errors.New("the re-read database secret is not a valid Postgres connection string")
		}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		c.user, c.password, c.set = cc.User, cc.Password, true
		c.gen++
	}
	c.lastErr = err
	c.inflight = nil
	close(ch)
	if err != nil {
		err = fmt.Errorf("re-read database credentials: %w", err)
		log.ErrorContext(ctx, "database refused the password; re-reading the secret failed, new connections fail until a re-read succeeds", slog.Any("error", err))
		return err
	}
	log.InfoContext(ctx, "database refused the password; secret re-read, new connections use it", slog.Uint64("reads", c.gen))
	return nil
}

// Ready makes sure pool can hand out a connection: it acquires one (opening it if none is
// idle) and releases it. When the server refuses the password it tries once more: that
// attempt re-reads the secret first (see Credentials). Call it where work begins (an
// invocation, a request); a refusal met later, on a connection the work opens, is handled
// the same way.
//
// A nil Credentials (nothing to re-read: a plain DATABASE_URL) does nothing.
func (c *Credentials) Ready(ctx context.Context, pool *pgxpool.Pool) error {
	if c == nil {
		return nil
	}
	conn, err := pool.Acquire(ctx)
	if err == nil {
		conn.Release()
		return nil
	}
	if !IsAuthFailure(err) {
		return fmt.Errorf("acquire database connection: %w", err)
	}
	conn, err = pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire database connection after re-reading the credentials: %w", err)
	}
	conn.Release()
	return nil
}

// Handler returns h behind Ready: each request first makes sure the pool can connect. A
// Ready that fails is not answered here: h meets the same error and answers it (a
// receiver's 500, which QStash retries). A nil Credentials returns h.
func (c *Credentials) Handler(pool *pgxpool.Pool, h http.Handler) http.Handler {
	if c == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = c.Ready(r.Context(), pool)
		h.ServeHTTP(w, r)
	})
}
