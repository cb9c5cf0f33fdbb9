package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
)

// DrainAwake is DrainIdle for a relay that producers wake (the relay Lambda's kicks,
// package kick): while it drains it keeps a promise in outbox_relay_awake (migration
// 0022) that a claim of its own starts after an instant about idle ahead, so a producer
// committing meanwhile finds the promise and sends no invoke. When it would return it
// deletes the promise, waits out what is left of it and claims once more: every event
// committed before the promise's end is claimed, whichever producer skipped its kick for
// it. If that claim finds events it stays, promising again. Without the table (before
// 0022) it is DrainIdle. Stats and seen are DrainIdle's, over the whole call.
func (r *Relay) DrainAwake(ctx context.Context, idle time.Duration, from IdleFrom) (Stats, time.Time, error) {
	start := time.Now()
	var total Stats
	defer func() { total.Duration = time.Since(start) }()
	for {
		p := r.promise(ctx, idle)
		if from == IdleFromStart {
			p.found(start)
		}
		st, seen, err := r.drainIdle(ctx, idle, from, p.found)
		total.merge(st)
		left, promised := p.end(ctx)
		if !promised || err != nil || seen.IsZero() {
			return total, seen, err
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl)-left < r.cfg.DeadlineMargin {
			// Too late to claim again: the promise was capped to end before the deadline
			// margin (see keep), so the claims that ran until then kept it.
			return total, time.Time{}, nil
		}
		if left > 0 {
			t := time.NewTimer(left)
			select {
			case <-ctx.Done():
				t.Stop()
				return total, time.Time{}, nil
			case <-t.C:
			}
		}
		st, seen, err = r.drainIdle(ctx, 0, IdleFromEvents, nil)
		total.merge(st)
		if err != nil || seen.IsZero() || st.Claimed == 0 {
			return total, seen, err
		}
		// Events came while the promise ran out: stay for them, promising again.
		from, start = IdleFromEvents, time.Now()
	}
}

// merge adds a later drain's stats to s: counts add up, how it ended is the later one's.
func (s *Stats) merge(o Stats) {
	s.add(o)
	s.StoppedAtDeadline, s.PausedUntil = o.StoppedAtDeadline, o.PausedUntil
}

// minPromise: a promise shorter than this is not written (it would end before a producer
// could read it).
const minPromise = 20 * time.Millisecond

// promise is one DrainAwake round's row in outbox_relay_awake. A goroutine writes it: the
// drain tells found when it finds events, and the row's end is moved to the idle gap
// after that whenever less than half a gap of it was left, so a busy relay writes about
// two statements per gap, none on the claim's path.
type promise struct {
	r        *Relay
	ctx      context.Context
	idle     time.Duration
	deadline time.Time

	mu        sync.Mutex
	token     string
	lastFound time.Time
	// until: when the written promise ends, by this clock (a lower bound: the database
	// started its clock after we read ours).
	until time.Time
	off   bool

	signal chan struct{}
	stop   chan struct{}
	done   chan struct{}
}

func (r *Relay) promise(ctx context.Context, idle time.Duration) *promise {
	p := &promise{r: r, ctx: context.WithoutCancel(ctx), idle: idle, signal: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	if dl, ok := ctx.Deadline(); ok {
		p.deadline = dl
	}
	go p.keep()
	return p
}

// found is the drain's report that a drain that found events ended at at.
func (p *promise) found(at time.Time) {
	p.mu.Lock()
	p.lastFound = at
	due := !p.off && p.until.Sub(at) < p.idle/2
	p.mu.Unlock()
	if due {
		select {
		case p.signal <- struct{}{}:
		default:
		}
	}
}

// keep writes the promise whenever found says it is due.
func (p *promise) keep() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-p.signal:
		}
		p.mu.Lock()
		lastFound, token := p.lastFound, p.token
		p.mu.Unlock()
		now := time.Now()
		d := lastFound.Add(p.idle).Sub(now)
		if !p.deadline.IsZero() {
			// Claims stop DeadlineMargin before the deadline: the promise ends a second
			// before that, so the claims before the margin keep it.
			d = min(d, p.deadline.Sub(now)-p.r.cfg.DeadlineMargin-time.Second)
		}
		if d < minPromise {
			continue
		}
		ctx, cancel := context.WithTimeout(p.ctx, promiseTimeout)
		var err error
		if token == "" {
			token, err = p.r.store.Promise(ctx, d)
		} else {
			err = p.r.store.KeepPromise(ctx, token, d)
		}
		cancel()
		p.mu.Lock()
		if err == nil {
			p.token, p.until = token, now.Add(d)
		}
		if errors.Is(err, outboxstore.ErrNoPromises) {
			p.off = true
		}
		p.mu.Unlock()
		if err != nil {
			// Kickers then send their kicks: a lapse costs invocations, not events.
			if !p.off || !p.r.noPromisesLogged.Swap(true) {
				p.r.log.WarnContext(ctx, "relay could not promise its next claim; producers' kicks are sent", slog.Any("error", err))
			}
			if p.off {
				return
			}
		}
	}
}

// promiseTimeout bounds one promise statement.
const promiseTimeout = 2 * time.Second

// end stops the writer and deletes the promise; left is how long it still ran, and
// promised false when none was written.
func (p *promise) end(ctx context.Context) (left time.Duration, promised bool) {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	token := p.token
	p.mu.Unlock()
	if token == "" {
		return 0, false
	}
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), promiseTimeout)
	defer cancel()
	left, err := p.r.store.EndPromise(ectx, token)
	if err != nil {
		// The row stays until its end passes, which is at most a gap away: keep it.
		p.r.log.WarnContext(ctx, "relay could not end its promise; claiming once more after it", slog.Any("error", err))
		return p.idle, true
	}
	return left, true
}
