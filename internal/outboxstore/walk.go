package outboxstore

import (
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Under a pinned xmin horizon (a long report, an idle-in-transaction session, a replica
// with hot_standby_feedback) Postgres removes no dead index entry, and every event the
// relay leases and marks leaves two in the outbox's partial indexes. An unbounded claim
// walks them all, from the start of the ready index and from the start of every key in
// the head probes: 195 ms per claim after 120,000 events under a pin, growing for as long
// as the pin lasts. The claim therefore starts its walks at lower bounds learnt from the
// claims before it, so it passes only the dead entries of the last few seconds:
//
//   - the ready index from readyFrom: the oldest ready row the last claim saw, but never
//     later than the oldest instant a row it could not see may carry (below);
//   - each head probe from the smaller of the smallest pending id (pendingFrom, found by a
//     short primary-key walk from the last one) and the newest id as it was walkLag ago,
//     so that the head probes of a key's later events still see an earlier event that a
//     producer committed late; a row below the bound is its own head (see qClaim), so it
//     is never starved, only ordered by the rows around it;
//   - the statement itself checks migration 0016's counter of reopened rows (a redrive)
//     against the value the id bound was learnt under, and probes every key from its start
//     if it moved; while it moved within the last walkLag the Store asks for no id bound,
//     and once it is still again pendingFrom is found afresh, so a redriven event blocks
//     its key's later ones as before.
//
// A claim's cost under a pin is the dead entries its walks pass, so the ready bound is
// kept as late as the rows a claim cannot see allow. Those were written by transactions
// still running when its snapshot was taken, every one of them holding a transaction id
// at or above the snapshot's xmin; a transaction that has written nothing (the report or
// pg_dump that pins the horizon, a replica's feedback) holds none and does not count. Each
// claim records its database clock and its own transaction id; an earlier claim whose id
// is below the xmin started before every such writer took its id, and a row written
// since carries available_at no earlier than that claim's clock (migration 0017 writes the
// INSERT's time; the relay's retries and releases and a redrive write the update's own
// time, clock_timestamp()), less writerMargin for the instant between reading the clock
// and taking the id. So the
// bound is that claim's clock less writerMargin, and never earlier than walkLag before
// the newest claim: a writer open longer (an idle-in-transaction session that wrote,
// another database's batch job: transaction ids are the cluster's) leaves the bound at
// walkLag, as before, and a row committed later than that is the probe's (below).
// Measured (pinned bench, 800 events/s, pg_stat_statements): with walkLag alone a claim
// passed the dead entries of a whole second, 1,900 buffers against 500 unpinned; with the
// writers' bound 420-625 buffers and 1.4-1.7 ms per claim over a two-minute pin, against
// 500 and 1.1 ms before it.
//
// The lag is what a row may take from its available_at to its commit and still be in
// range; since migration 0017 available_at defaults to the INSERT statement's time, not
// the transaction's start, so that is the time from the insert to the commit.
//
// What the bounds cannot see (a row committed more than walkLag after its INSERT whose
// key had no other event in the window, an available_at written in the past by hand) a
// probe finds: one statement looks for the oldest ready row below the ready bound, beside
// the claims rather than in one, and lowers the bound to it. Unpinned it costs a few
// buffers (dead index entries are killed as they are passed); under a pin its cost is the
// unbounded walk's and grows with the pin, so it waits probeDuty times its own last
// duration (at least probeEveryMin) before the next: no more than 2% of a core however
// long the pin. Measured (pinned bench, 800 events/s): 0.5 s after two minutes of a pin,
// 1.2 s after three; an interval capped at a minute would have kept a backend busy for
// most of a two-hour pin. So under a long pin a row only the probe can find waits longer:
// fifty times what the probe takes, 60 s at the most (probeTimeout) and then 50 minutes.
// Run inside a claim every 30 s it held the claims behind it for up to 3 s after four
// minutes of a pin at 800 events/s (p99 3.2 s, p50 85 ms; measured, pinned bench).
const (
	walkLag       = time.Second
	writerMargin  = 50 * time.Millisecond
	probeEveryMin = 5 * time.Second
	probeDuty     = 50
)

// probeEvery is how long to wait for the next probe after one that took took.
func probeEvery(took time.Duration) time.Duration {
	return max(probeDuty*took, probeEveryMin)
}

// walks holds one Store's bounds. Claims run concurrently (batches in flight); each
// takes the bounds as they are and offers what it saw, and the view of the latest claim
// to start wins, so an older view never replaces a newer one.
type walks struct {
	mu sync.Mutex
	// started counts claims; applied is the number of the claim whose view is held.
	started, applied uint64
	// fullAt is when the last unbounded walk started, a claim's or a probe's (the relay's
	// clock); probeTook is how long the last probe took; fullEvery, when set (tests),
	// replaces probeEvery's interval; probing is set while a probe runs.
	fullAt    time.Time
	probeTook time.Duration
	fullEvery time.Duration
	probing   bool
	// readyFrom bounds the ready-index walk (invalid: unbounded).
	readyFrom time.Time
	// pendingFrom is the smallest pending id seen (0: unknown, find it afresh).
	pendingFrom int64
	// refind is set when the reopened counter moved: pendingFrom is found afresh once the
	// counter has been still for walkLag.
	refind bool
	// samples are the last claims' (database clock, newest id, reopened counter), oldest
	// first, back to the newest one at least walkLag old.
	samples []walkSample
}

type walkSample struct {
	at       time.Time
	maxID    int64
	reopened int64
	// xid is the claim's own transaction id (0: unknown).
	xid int64
}

// walkParams are qClaim's $8 to $11.
type walkParams struct {
	readyFrom   pgtype.Timestamptz
	idFrom      int64
	pendingFrom pgtype.Int8
	// reopened is the counter's value idFrom holds for (-1: none).
	reopened int64
	// probeBelow, when set, asks the caller to look for ready rows below it, apart from
	// the claim (see probed).
	probeBelow time.Time
}

// walkView is what one claim saw, read from its first row.
type walkView struct {
	dbNow       time.Time
	readyFrom   pgtype.Timestamptz
	pendingFrom pgtype.Int8
	maxID       pgtype.Int8
	reopened    int64
	// xid is the claim's transaction id, xmin its snapshot's (0: unknown).
	xid, xmin int64
}

// next returns the bounds for a claim starting now (the relay's clock) with the caller's
// database clock override (nil in production), and the claim's number for offer.
func (w *walks) next(now time.Time, dbNow *time.Time) (walkParams, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.started++
	every := w.fullEvery
	if every == 0 {
		every = probeEvery(w.probeTook)
	}
	if dbNow != nil && len(w.samples) > 0 && dbNow.Before(w.samples[len(w.samples)-1].at) {
		// A test's clock went back: what was learnt at a later instant bounds nothing.
		w.samples, w.readyFrom, w.pendingFrom = nil, time.Time{}, 0
	}
	p := walkParams{reopened: -1}
	if w.pendingFrom > 0 && !(w.refind && w.stillFor(walkLag)) {
		p.pendingFrom = pgtype.Int8{Int64: w.pendingFrom, Valid: true}
	}
	if w.fullAt.IsZero() || w.readyFrom.IsZero() {
		// Nothing learnt yet (a new Store, a clock gone back): this claim walks everything.
		w.fullAt = now
		return p, w.started
	}
	if now.Sub(w.fullAt) >= every && !w.probing {
		w.fullAt, w.probing = now, true
		p.probeBelow = w.readyFrom
	}
	p.readyFrom = pgtype.Timestamptz{Time: w.readyFrom, Valid: true}
	if lagged, ok := w.lagged(); ok && w.pendingFrom > 0 && !w.refind && w.stillFor(walkLag) &&
		w.samples[len(w.samples)-1].reopened >= 0 { // < 0: no counter (0016 not applied)
		p.idFrom = min(w.pendingFrom, lagged.maxID)
		p.reopened = w.samples[len(w.samples)-1].reopened
	}
	return p, w.started
}

// lagged returns the newest sample at least walkLag older than the newest one.
func (w *walks) lagged() (walkSample, bool) {
	if len(w.samples) == 0 {
		return walkSample{}, false
	}
	cut := w.samples[len(w.samples)-1].at.Add(-walkLag)
	for i := len(w.samples) - 1; i >= 0; i-- {
		if !w.samples[i].at.After(cut) {
			return w.samples[i], true
		}
	}
	return walkSample{}, false
}

// stillFor reports whether the reopened counter has not moved over the last d of
// samples (and there are samples that old).
func (w *walks) stillFor(d time.Duration) bool {
	if len(w.samples) == 0 {
		return false
	}
	last := w.samples[len(w.samples)-1]
	cut := last.at.Add(-d)
	for i := len(w.samples) - 1; i >= 0; i-- {
		if w.samples[i].reopened != last.reopened {
			return false
		}
		if !w.samples[i].at.After(cut) {
			return true
		}
	}
	return false
}

// offer records what claim number n saw, unless a later claim's view is held already.
// p is what the claim was given: a pendingFrom found afresh ends a refind.
func (w *walks) offer(n uint64, p walkParams, v walkView) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n <= w.applied {
		return
	}
	w.applied = n
	if len(w.samples) > 0 && v.reopened != w.samples[len(w.samples)-1].reopened {
		w.refind = true
	} else if w.refind && !p.pendingFrom.Valid && w.stillFor(walkLag) {
		w.refind = false
	}
	w.readyFrom = w.unseenFrom(v)
	if v.readyFrom.Valid && v.readyFrom.Time.Before(w.readyFrom) {
		w.readyFrom = v.readyFrom.Time
	}
	switch {
	case v.pendingFrom.Valid:
		w.pendingFrom = v.pendingFrom.Int64
	case v.maxID.Valid:
		// Nothing pending: the next pending row is a new one.
		w.pendingFrom = v.maxID.Int64 + 1
	default:
		w.pendingFrom = 0
	}
	w.samples = append(w.samples, walkSample{at: v.dbNow, maxID: v.maxID.Int64, reopened: v.reopened, xid: v.xid})
	// Keep the newest sample at least walkLag old and everything after it.
	cut := v.dbNow.Add(-walkLag)
	keep := 0
	for i := len(w.samples) - 1; i >= 0; i-- {
		if !w.samples[i].at.After(cut) {
			keep = i
			break
		}
	}
	w.samples = w.samples[keep:]
}

// unseenFrom is the oldest available_at a row the claim that saw v could not see may
// carry (see walks): the clock of the newest earlier claim whose transaction id is below
// v's xmin, less writerMargin, but no earlier than walkLag before v's clock.
func (w *walks) unseenFrom(v walkView) time.Time {
	from := v.dbNow.Add(-walkLag)
	if v.xmin <= 0 {
		return from
	}
	for i := len(w.samples) - 1; i >= 0; i-- {
		if s := w.samples[i]; s.xid > 0 && s.xid < v.xmin && !s.at.After(v.dbNow) {
			if b := s.at.Add(-writerMargin); b.After(from) {
				return b
			}
			return from
		}
	}
	return from
}

// probed ends a probe that took took: at, when valid, is the oldest ready row below the
// bound it was given, which the next claims' ready walk now starts from.
func (w *walks) probed(at pgtype.Timestamptz, took time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.probing, w.probeTook = false, took
	if at.Valid && (w.readyFrom.IsZero() || at.Time.Before(w.readyFrom)) {
		w.readyFrom = at.Time
	}
}
