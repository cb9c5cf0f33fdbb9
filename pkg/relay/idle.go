package relay

import (
	"context"
	"time"
)

// IdleFrom says where DrainIdle's idle gap starts counting.
type IdleFrom int

const (
	// IdleFromStart: the gap also runs from the call, so a relay that finds nothing still
	// stays idle long for events to come. A kicked relay runs so: a producer that kicked
	// less than a gap ago skips its kick (package kick), relying on the relay it woke to
	// see its commit.
	IdleFromStart IdleFrom = iota
	// IdleFromEvents: the gap runs only once a claim found events; a first drain that finds
	// nothing returns at once. A scheduled backstop tick runs so: finding the outbox idle
	// costs one claim, not a gap of open session.
	IdleFromEvents
)

// DrainIdle drains, keeps draining while events keep arriving, and returns once idle has
// passed with no claim finding events (counted as from says), after a last claim that
// began once the gap was over: every event committed before DrainIdle's end is claimed by
// it. While it waits it polls, then sleeps on LISTEN/NOTIFY as Linger does, on a session
// it closes before returning. Like Drain it stops claiming DeadlineMargin before ctx's
// deadline (Stats.StoppedAtDeadline), and every batch it claimed is published and marked
// before it returns. Cancelling ctx is a clean stop, as for Linger.
//
// seen is when the last claim began, when DrainIdle returned because it found the outbox
// idle: every event committed before seen was claimed. It is zero when DrainIdle stopped
// for another reason (the deadline, an error, a pause, ctx). A kick sent before seen
// needs no new drain (the relay Lambda answers it without a database session).
func (r *Relay) DrainIdle(ctx context.Context, idle time.Duration, from IdleFrom) (st Stats, seen time.Time, err error) {
	return r.drainIdle(ctx, idle, from, nil)
}

// drainIdle is DrainIdle telling found when a drain found events.
func (r *Relay) drainIdle(ctx context.Context, idle time.Duration, from IdleFrom, found func(time.Time)) (Stats, time.Time, error) {
	end := lingerEnd{idle: idle, idleAfterEvents: from == IdleFromEvents, found: found}
	if idle <= 0 {
		// One drain: the end is the first drain that comes back idle.
		end = lingerEnd{idle: time.Nanosecond, idleAfterEvents: true}
	}
	return r.lingerIdle(ctx, end)
}

// lingerIdle is linger with an idle end, reporting when its last claim began if it
// returned idle.
func (r *Relay) lingerIdle(ctx context.Context, end lingerEnd) (Stats, time.Time, error) {
	end.seen = new(time.Time)
	st, err := r.linger(ctx, ctx, end)
	if err != nil || ctx.Err() != nil || st.StoppedAtDeadline || !st.PausedUntil.IsZero() {
		return st, time.Time{}, err
	}
	return st, *end.seen, nil
}
