package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Linger drains, then waits for a NOTIFY on Channel (or PollInterval, the safety net for a
// lost notification) and drains again, until until or ctx's deadline margin. It gives
// sub-second latency although the schedule fires once a minute. Without a listening
// connection (e.g. a pooler that drops LISTEN) it polls. Cancelling ctx is a clean stop:
// the batches in flight are marked and Linger returns nil.
func (r *Relay) Linger(ctx context.Context, until time.Time) (Stats, error) {
	return r.linger(ctx, ctx, until)
}

// Run drains continuously until stop is cancelled, for a long-lived process. A batch in
// flight when stop is cancelled is published and marked before Run returns (its work is
// not interrupted); no new batch is claimed. It returns nil on a clean stop.
func (r *Relay) Run(stop context.Context) (Stats, error) {
	st, err := r.linger(stop, context.WithoutCancel(stop), time.Time{})
	if stop.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return st, nil
	}
	return st, err
}

// linger stops claiming when stop is done or until passes (zero: never); work is the
// context batches run under.
func (r *Relay) linger(stop, work context.Context, until time.Time) (Stats, error) {
	start := time.Now()
	var total Stats
	defer func() { total.Duration = time.Since(start) }()
	l := newListener(r)
	defer l.close()

	for {
		if stop.Err() != nil || (!until.IsZero() && !time.Now().Before(until)) {
			return total, nil
		}
		// Drain under work (so in-flight publishes are not cut off) but stop between
		// batches as soon as stop is done.
		err := r.drain(stop, work, &total)
		if err != nil && stop.Err() != nil && errors.Is(err, context.Canceled) {
			// Stopped while claiming: the claim overlaps the publishes of earlier batches,
			// so a stop often lands in it. Every batch claimed was marked; rows a cancelled
			// claim may have leased are ready again when the lease ends.
			return total, nil
		}
		if err != nil || total.StoppedAtDeadline || !total.PausedUntil.IsZero() {
			return total, err
		}
		wait := r.cfg.PollInterval
		if !until.IsZero() {
			wait = min(wait, time.Until(until))
		}
		if dl, ok := work.Deadline(); ok {
			wait = min(wait, time.Until(dl)-r.cfg.DeadlineMargin)
		}
		if wait > 0 {
			l.wait(stop, wait)
		}
	}
}

// listener holds one dedicated connection in LISTEN. Notifications are hints: every
// failure falls back to polling, and the connection is re-established on the next wait.
type listener struct {
	r    *Relay
	pool *pgxpool.Pool
	conn *pgxpool.Conn
}

func newListener(r *Relay) *listener {
	l := &listener{r: r}
	if p, ok := r.db.(*pgxpool.Pool); ok {
		l.pool = p
	}
	return l
}

func (l *listener) connect(ctx context.Context) error {
	if l.pool == nil {
		return errors.New("LISTEN needs a *pgxpool.Pool")
	}
	c, err := l.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire listen connection: %w", err)
	}
	if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{l.r.cfg.Channel}.Sanitize()); err != nil {
		c.Release()
		return fmt.Errorf("listen on %s: %w", l.r.cfg.Channel, err)
	}
	l.conn = c
	return nil
}

// wait returns when a notification arrives, d passes, or stop is done.
func (l *listener) wait(stop context.Context, d time.Duration) {
	ctx, cancel := context.WithTimeout(stop, d)
	defer cancel()
	if l.conn == nil {
		if err := l.connect(ctx); err != nil {
			if l.pool != nil && ctx.Err() == nil {
				l.r.log.Warn("relay falls back to polling", "error", err.Error())
			}
			<-ctx.Done()
			return
		}
	}
	_, err := l.conn.Conn().WaitForNotification(ctx)
	if err != nil && ctx.Err() == nil {
		// The connection broke (idle reaper, failover): drop it and poll until the next wait.
		l.r.log.Warn("listen connection lost; polling", "error", err.Error())
		l.drop()
		<-ctx.Done()
	}
}

func (l *listener) drop() {
	if l.conn != nil {
		// A LISTENing session must not go back to the pool.
		_ = l.conn.Hijack().Close(context.Background())
		l.conn = nil
	}
}

func (l *listener) close() { l.drop() }
