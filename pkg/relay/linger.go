package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Linger drains, then waits for new events and drains again, until until or ctx's deadline
// margin. It gives sub-second latency although the schedule fires once a minute. While
// events keep coming it polls every few milliseconds; once idle it goes to sleep, woken by
// a NOTIFY on Channel (or PollInterval, which also catches retries coming due). Producers
// send that NOTIFY only while a relay sleeps (migration 0014), so a busy relay costs their
// commits nothing. Without a listening connection (e.g. a pooler that drops LISTEN) it
// polls, backing off to PollInterval. Cancelling ctx is a clean stop: the batches in flight
// are marked and Linger returns nil.
//
// Linger stops claiming DeadlineMargin before ctx's deadline, whatever until says: a
// Lambda invocation with a 50 s timeout, a 2 s reserve and the default 15 s margin lingers
// 33 s at most, and events committed after that wait for the next invocation. On Lambda,
// DrainIdle with a kick after each commit (package kick) leaves no such hole.
func (r *Relay) Linger(ctx context.Context, until time.Time) (Stats, error) {
	return r.linger(ctx, ctx, lingerEnd{until: until})
}

// Run drains continuously until stop is cancelled, for a long-lived process, waking as
// Linger does. A batch in flight when stop is cancelled is published and marked before Run
// returns (its work is not interrupted); no new batch is claimed. It returns nil on a clean
// stop.
func (r *Relay) Run(stop context.Context) (Stats, error) {
	st, err := r.linger(stop, context.WithoutCancel(stop), lingerEnd{})
	if stop.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return st, nil
	}
	return st, err
}

// The idle schedule. After a drain that claimed rows the relay polls again after
// fastPoll, the wait doubling after every empty poll; after sleepAfter of empty polls it
// goes to sleep. While it polls, producers send nothing, so under load they never take the
// notify lock; an idle relay sleeps within a few milliseconds, after which every insert
// reaches it by NOTIFY. A sleeping relay stays asleep while it drains what the
// notifications announce (no lock round trips at a moderate rate), and wakes for good, back
// to polling, when a notification follows a drain that found events within busyGap:
// producers are committing faster than it goes round. An empty poll is one claim that
// finds nothing (an index probe).
//
// Measured at 800 events/s in 100 commits a second (e2e bench, 20 s, throwaway cluster
// with the defaults, shared 2-core machine, in turns with the NOTIFY on every insert):
// these values p50 / p99 5.1 / 34.0 and 4.4 / 39.1 ms, the NOTIFY on every insert 5.2 /
// 25.3 and 4.8 / 28.6. Releasing the lock at every wake-up and sleeping after 7 ms of
// polls, the relay seldom slept (an empty claim took a millisecond or more, so the next
// commit came first) and events waited for the next poll: 8.0 / 71.8 and 7.4 / 30.6 ms.
const (
	fastPoll   = time.Millisecond
	sleepAfter = 2 * time.Millisecond
	busyGap    = time.Millisecond
)

// lingerEnd says when linger stops claiming, besides stop and the deadline margin.
type lingerEnd struct {
	// until: a fixed end (zero: none).
	until time.Time
	// idle > 0: end once idle has passed since the last drain that found events (or since
	// the start), and only after a drain that began at or after that instant found
	// nothing, so every event committed before the end is claimed.
	idle time.Duration
	// idleAfterEvents: a first drain that finds nothing ends at once.
	idleAfterEvents bool
	// seen, if set, receives when the last drain began.
	seen *time.Time
	// found, if set, is told when a drain that found events ended (the idle gap's new
	// start).
	found func(at time.Time)
}

// lingerClock tracks a linger's end: until, fixed or moved by each drain that finds events.
type lingerClock struct {
	end   lingerEnd
	until time.Time
	// lastFound is when the last drain that found events ended (or the start);
	// lastDrain when the last drain began (its claims' snapshots are taken after it).
	lastFound, lastDrain time.Time
}

// over reports, before a drain, whether the linger is over.
func (c *lingerClock) over() bool {
	if c.end.idle == 0 {
		return !c.until.IsZero() && !time.Now().Before(c.until)
	}
	c.until = c.lastFound.Add(c.end.idle)
	return !c.lastDrain.Before(c.until)
}

// began records a drain's start.
func (c *lingerClock) began() {
	c.lastDrain = time.Now()
	if c.end.seen != nil {
		*c.end.seen = c.lastDrain
	}
}

// drained records what a drain found and reports whether the linger ends there: a first
// drain that found nothing when the gap counts only after events.
func (c *lingerClock) drained(found bool, total *Stats) bool {
	if found {
		c.lastFound = time.Now()
		if c.end.found != nil {
			c.end.found(c.lastFound)
		}
	}
	return !found && c.end.idleAfterEvents && total.Claimed == 0
}

// linger stops claiming when stop is done or end says so; work is the context batches run
// under.
func (r *Relay) linger(stop, work context.Context, end lingerEnd) (Stats, error) {
	start := time.Now()
	var total Stats
	defer func() { total.Duration = time.Since(start) }()
	l := newListener(r)
	defer l.close()
	clock := lingerClock{end: end, until: end.until, lastFound: start}
	drainStop := stop
	if !end.until.IsZero() {
		var cancel context.CancelFunc
		drainStop, cancel = context.WithDeadline(stop, end.until)
		defer cancel()
	}

	poll := pollPace{next: fastPoll}
	for {
		if clock.over() || stop.Err() != nil {
			return total, nil
		}
		claimed := total.Claimed
		clock.began()
		pace := drainPace{poll: fastPoll}
		if l.asleep {
			// A drain that keeps finding events while its batches publish can last as long
			// as the producers keep up: wake at once, so they stop notifying.
			pace.busy = func() { l.wake(stop) }
		}
		// Drain under work (so in-flight publishes are not cut off) but stop between
		// batches as soon as stop is done or until passes.
		err := r.drain(drainStop, work, &total, pace)
		if err != nil && stop.Err() != nil && errors.Is(err, context.Canceled) {
			// Stopped while claiming: the claim overlaps the publishes of earlier batches,
			// so a stop often lands in it. Every batch claimed was marked; rows a cancelled
			// claim may have leased are ready again when the lease ends.
			return total, nil
		}
		if err != nil || total.StoppedAtDeadline || !total.PausedUntil.IsZero() {
			return total, err
		}
		found := total.Claimed > claimed
		if clock.drained(found, &total) {
			return total, nil
		}
		if found && !l.asleep {
			poll = pollPace{next: fastPoll}
		}
		wait := r.cfg.PollInterval
		if !l.asleep {
			if poll.idle >= sleepAfter && l.sleep(stop) {
				// Asleep from now on; this drain sees every event whose producer found
				// the relay awake (see sleep).
				continue
			}
			wait = min(poll.next, wait)
		}
		if !clock.until.IsZero() {
			wait = min(wait, time.Until(clock.until))
		}
		if dl, ok := work.Deadline(); ok {
			wait = min(wait, time.Until(dl)-r.cfg.DeadlineMargin)
		}
		if wait <= 0 {
			continue
		}
		poll.wait(stop, l, wait, found)
	}
}

// pollPace is an awake relay's polling: the next wait, and how long it has polled in vain.
type pollPace struct {
	next, idle time.Duration
}

// wait waits up to d for a notification and paces what follows; found: the drain before
// it found events.
func (p *pollPace) wait(stop context.Context, l *listener, d time.Duration, found bool) {
	waited := time.Now()
	notified := l.wait(stop, d)
	switch {
	case l.asleep && notified && found && time.Since(waited) < busyGap:
		// Producers commit faster than the relay goes round: poll instead, so that
		// they stop notifying.
		l.wake(stop)
		*p = pollPace{next: fastPoll}
	case l.asleep && notified:
		// Every event committed before this notification is seen by the next claim.
		l.discard()
	case notified:
		*p = pollPace{next: fastPoll}
	case !l.asleep:
		p.idle += time.Since(waited)
		p.next *= 2
	}
}

// wakeLockKey is the first half of the sleeper lock's key (the outbox's oid is the second,
// so relays of different schemas do not share it); migration 0014's trigger asks for the
// same key.
const wakeLockKey int32 = 1868724343

const (
	// qSleep takes the sleeper lock unless a relay sleeps already or a producer that found
	// no sleeper has not committed yet (it holds the key in shared mode until then).
	qSleep = `SELECT pg_try_advisory_lock($1, 'outbox'::regclass::oid::int)`
	qWake  = `SELECT pg_advisory_unlock($1, 'outbox'::regclass::oid::int)`
)

// listener holds one dedicated connection in LISTEN, on which the relay holds the sleeper
// lock while it sleeps. Notifications are hints: every failure falls back to polling, and
// the connection is re-established on the next wait. Dropping the connection releases the
// lock, so a relay that dies leaves nobody marked asleep.
type listener struct {
	r    *Relay
	pool *pgxpool.Pool
	conn *pgxpool.Conn
	// asleep: this connection holds the sleeper lock, producers NOTIFY.
	asleep bool
	// polling: the last attempt to listen failed and was logged; cleared on success, so a
	// relay without LISTEN logs once, not at every poll.
	polling bool
}

func newListener(r *Relay) *listener {
	return &listener{r: r, pool: r.db}
}

// listen makes sure the connection is listening; false means poll.
func (l *listener) listen(ctx context.Context) bool {
	if l.conn != nil {
		return true
	}
	c, err := l.pool.Acquire(ctx)
	if err == nil {
		if _, err = c.Exec(ctx, "LISTEN "+pgx.Identifier{l.r.cfg.Channel}.Sanitize()); err != nil {
			c.Release()
			err = fmt.Errorf("listen on %s: %w", l.r.cfg.Channel, err)
		}
	} else {
		err = fmt.Errorf("acquire listen connection: %w", err)
	}
	if err != nil {
		if !l.polling && ctx.Err() == nil {
			l.polling = true
			l.r.log.WarnContext(ctx, "relay falls back to polling", "error", err.Error())
		}
		return false
	}
	l.conn, l.polling = c, false
	return true
}

// sleep takes the sleeper lock, after which producers' inserts NOTIFY. It reports false,
// and the relay keeps polling, without a listening connection, while another relay sleeps,
// or while a producer that inserted when no relay slept has not committed. That last case
// is what makes a wake-up impossible to lose: once the lock is taken, every event whose
// producer sent no NOTIFY is committed, and the drain that follows sees it.
func (l *listener) sleep(ctx context.Context) bool {
	if !l.listen(ctx) {
		return false
	}
	var ok bool
	if err := l.conn.QueryRow(ctx, qSleep, wakeLockKey).Scan(&ok); err != nil {
		l.lost(ctx, err)
		return false
	}
	l.asleep = ok
	return ok
}

// wake releases the sleeper lock, so producers stop notifying, and discards the
// notifications already received.
func (l *listener) wake(ctx context.Context) {
	if !l.asleep {
		return
	}
	l.asleep = false
	var held bool
	if err := l.conn.QueryRow(ctx, qWake, wakeLockKey).Scan(&held); err != nil {
		l.lost(ctx, err) // closing the session releases the lock too
		return
	}
	if !held {
		// The lock was taken on another server session: a transaction pooler between
		// relay and database. It would stay held there, and producers would notify for
		// ever; closing this connection cannot release it either, so say so.
		l.r.log.WarnContext(ctx, "sleeper lock was not held by the listening session: is the relay behind a transaction pooler? producers may keep sending NOTIFY; connect the relay directly or through a session pooler")
		l.drop()
		return
	}
	l.discard()
}

// discard drops the notifications already received: the claim that follows serves every
// event committed before them (each was sent after its producer's commit).
func (l *listener) discard() {
	if l.conn == nil {
		return
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for {
		// Buffered notifications come back first; then the cancelled context ends the
		// call without touching the connection.
		if n, _ := l.conn.Conn().WaitForNotification(done); n == nil {
			return
		}
	}
}

// wait returns true when a notification arrives, false when d passes, stop is done or the
// connection breaks (the relay is then awake: the next drain and polls cover the events
// whose producers notified the dead session).
func (l *listener) wait(stop context.Context, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(stop, d)
	defer cancel()
	if !l.listen(ctx) {
		<-ctx.Done()
		return false
	}
	_, err := l.conn.Conn().WaitForNotification(ctx)
	if err != nil && ctx.Err() == nil {
		l.lost(ctx, err)
	}
	return err == nil
}

// lost drops a connection that broke (idle reaper, failover); the relay polls until the
// next wait re-establishes it. An error caused by stop is no news.
func (l *listener) lost(ctx context.Context, err error) {
	if ctx.Err() == nil {
		l.r.log.WarnContext(ctx, "listen connection lost; polling", "error", err.Error())
	}
	l.drop()
}

func (l *listener) drop() {
	l.asleep = false
	if l.conn != nil {
		// A LISTENing session (holding the sleeper lock, maybe) must not go back to the pool.
		_ = l.conn.Hijack().Close(context.Background())
		l.conn = nil
	}
}

func (l *listener) close() { l.drop() }
