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
// claims before it, so it passes only the dead entries of the last moments. The bounds
// are an optimisation of one plain statement (the oldest ready rows, each key's head
// first) and must never change which rows that statement finds eligible; the differential
// test (differential_test.go) holds the two together.
//
// The hazard is the late commit: ids and available_at are taken at INSERT, rows become
// visible at COMMIT, so a row can appear below a bound learnt before it committed
// (reference/commit-order.md). A bound learnt from claim S is safe for a later claim C if
// every pending row C can see lies above it. A row C sees and S did not was written by a
// transaction still running at S's snapshot. Such a transaction either already had a
// transaction id then, and so is listed in S's snapshot (pg_snapshot_xip), or took its
// first id later, and then wrote its rows after S began, above S's newest id and no
// earlier than S's clock (less writerMargin, for the instant between a statement's start,
// or a nextval, and the transaction id it takes). So each claim returns its snapshot's
// running transaction ids, and the Store keeps them as writers, each with the lowest id
// and available_at its rows can carry (learnt from the newest claim whose own transaction
// id is below the writer's). The next claim is given the bounds of the newest claim's view
// together with those writers; in its own snapshot it checks which of them have ended
// since (pg_visible_in_snapshot) and lowers its bounds to theirs. So a transaction that
// commits seconds after its INSERT is seen by the first claim after its commit: in the
// ready walk, and in its key's head probe, so its key's later events wait for it. A
// writer the Store learnt of too late to know its bounds (older than every claim it
// remembers) lowers them to nothing: that claim walks everything once.
//
//   - readyFrom: the oldest ready row the last claim saw, but no later than its clock less
//     writerMargin;
//   - idFrom: the smaller of the last claim's lowest pending id (pendingFrom, found by a
//     short primary-key walk from the bound that claim was given) and the newest id of the
//     claim writerMargin before it (rows whose nextval came before their transaction id);
//   - a row made pending again (a redrive) keeps its old id, below any bound. Migration
//     0016 counts those; the statement compares the counter with the value the id bound
//     was learnt under and probes every key from its start if it moved, and the Store
//     then finds pendingFrom afresh (an unbounded minimum) in the next claim. The
//     transaction that reopened a row may still be running when the counter moves: every
//     writer that may have moved it (any writer, until a claim started after the move
//     reports its own transaction id) lowers the id bound to nothing when it ends.
//
// What the bounds cannot see is a row written with available_at in the past by hand, or
// by a statement that ran longer than writerMargin before it wrote its first row: a
// probe finds it. One statement looks for the oldest ready row below the ready bound,
// beside the claims rather than in one, and lowers the bound to it until a claim that
// walked from there has seen it. Unpinned it costs a few buffers (dead index entries are
// killed as they are passed); under a pin its cost is the unbounded walk's and grows with
// the pin, so it waits probeDuty times its own last duration (at least probeEveryMin)
// before the next: no more than 2% of a core however long the pin. Measured (pinned bench,
// 800 events/s): 0.5 s after two minutes of a pin, 1.2 s after three; so under a long pin
// such a row waits fifty times what the probe takes, 60 s at the most (probeTimeout) and
// then 50 minutes. Run inside a claim every 30 s it held the claims behind it for up to
// 3 s after four minutes of a pin at 800 events/s (p99 3.2 s, p50 85 ms; measured, pinned
// bench).
const (
	// walkLag is how much history the Store keeps: its writers' bounds are learnt from
	// the claims of the last walkLag.
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
	// readyFrom bounds the ready-index walk (zero: unbounded).
	readyFrom time.Time
	// found is the oldest ready row a probe found below the bound (zero: none pending):
	// readyFrom stays at or below it until a claim given a bound at or below it is applied.
	found time.Time
	// refind is set when the reopened counter moved: the next claims find pendingFrom
	// afresh and use no id bound, until the view of one started after the move (a number
	// above movedAt) that did so is applied.
	refind  bool
	movedAt uint64
	// suspectAll is set from a move of the counter until the view of a claim started
	// after it arrives; suspectBelow is the highest such claim's transaction id. A writer
	// below it, or any while suspectAll is set, may have reopened a row.
	suspectAll   bool
	suspectBelow int64
	// writers are the transactions running at the held view's snapshot, by transaction id.
	writers map[int64]writerBound
	// samples are the last claims' views, oldest first, back to the newest one at least
	// walkLag old.
	samples []walkSample
}

// writerBound is how low a running transaction's rows can lie: ids from id (0: any) and
// available_at from at (zero: any).
type writerBound struct {
	id int64
	at time.Time
}

type walkSample struct {
	at time.Time
	// maxID is the newest id the claim saw, pending the lowest pending id it saw or a
	// lower bound of it (0: unknown).
	maxID, pending int64
	reopened       int64
	// xid is the claim's own transaction id (0: unknown).
	xid int64
}

// walkParams are what qClaim's bounds are built from.
type walkParams struct {
	readyFrom pgtype.Timestamptz
	// idFrom bounds the head probes (0: none).
	idFrom int64
	// pendingFrom starts the walk for the lowest pending id (invalid: find it afresh).
	pendingFrom pgtype.Int8
	// reopened is the counter's value idFrom holds for (-1: none).
	reopened int64
	// writers, writerIDs and writerAts are the writers of the held view and their bounds.
	writers, writerIDs []int64
	writerAts          []pgtype.Timestamptz
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
	// xid is the claim's transaction id (0: unknown); xip are the transaction ids running
	// at its snapshot.
	xid int64
	xip []int64
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
		w.samples, w.readyFrom, w.found, w.writers = nil, time.Time{}, time.Time{}, nil
	}
	p := walkParams{reopened: -1}
	for x, b := range w.writers {
		id := b.id
		if w.suspectAll || x < w.suspectBelow {
			id = 0
		}
		at := pgtype.Timestamptz{Time: b.at, Valid: true}
		if b.at.IsZero() {
			at = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
		}
		p.writers, p.writerIDs, p.writerAts = append(p.writers, x), append(p.writerIDs, id), append(p.writerAts, at)
	}
	bound := w.idBound()
	if bound > 0 && !w.refind {
		p.pendingFrom = pgtype.Int8{Int64: bound, Valid: true}
		if last := w.samples[len(w.samples)-1]; last.reopened >= 0 { // < 0: no counter (0016 not applied)
			p.idFrom, p.reopened = bound, last.reopened
		}
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
	return p, w.started
}

// idBound is the id bound learnt from the held view (0: none yet): its lowest pending
// id, but no higher than the newest id of the claim writerMargin before it.
func (w *walks) idBound() int64 {
	if len(w.samples) == 0 {
		return 0
	}
	last := w.samples[len(w.samples)-1]
	early, ok := w.before(last.at.Add(-writerMargin))
	if !ok || last.pending <= 0 || early.maxID <= 0 {
		return 0
	}
	return min(last.pending, early.maxID)
}

// before returns the newest sample taken at or before t.
func (w *walks) before(t time.Time) (walkSample, bool) {
	for i := len(w.samples) - 1; i >= 0; i-- {
		if !w.samples[i].at.After(t) {
			return w.samples[i], true
		}
	}
	return walkSample{}, false
}

// writerBoundOf is how low the rows of transaction x can lie: it took its id after the
// newest remembered claim whose own id is below x began, so its rows lie above the newest
// id of the claim writerMargin before that one, with available_at no earlier than that
// claim's clock less writerMargin. Zero when no claim that old is remembered.
func (w *walks) writerBoundOf(x int64) writerBound {
	for i := len(w.samples) - 1; i >= 0; i-- {
		s := w.samples[i]
		if s.xid <= 0 || s.xid >= x {
			continue
		}
		early, ok := w.before(s.at.Add(-writerMargin))
		if !ok {
			return writerBound{}
		}
		return writerBound{id: early.maxID, at: s.at.Add(-writerMargin)}
	}
	return writerBound{}
}

// offer records what claim number n saw, unless a later claim's view is held already.
// p is what the claim was given.
func (w *walks) offer(n uint64, p walkParams, v walkView) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n <= w.applied {
		return
	}
	w.applied = n
	moved := len(w.samples) > 0 && v.reopened != w.samples[len(w.samples)-1].reopened
	switch {
	case moved:
		w.refind, w.movedAt, w.suspectAll = true, w.started, true
	case n > w.movedAt:
		// A claim started after the move: it was given no id bound and found pendingFrom
		// afresh, and every writer that moved the counter had its transaction id by then.
		if !p.pendingFrom.Valid {
			w.refind = false
		}
		if w.suspectAll && v.xid > 0 {
			w.suspectAll, w.suspectBelow = false, max(w.suspectBelow, v.xid)
		}
	}

	writers := make(map[int64]writerBound, len(v.xip))
	for _, x := range v.xip {
		b, ok := w.writers[x]
		if !ok {
			b = w.writerBoundOf(x)
		}
		writers[x] = b
	}
	w.writers = writers

	w.readyFrom = v.dbNow.Add(-writerMargin)
	if v.readyFrom.Valid && v.readyFrom.Time.Before(w.readyFrom) {
		w.readyFrom = v.readyFrom.Time
	}
	if !w.found.IsZero() {
		if p.readyFrom.Valid && !p.readyFrom.Time.After(w.found) {
			w.found = time.Time{} // this claim walked from below the find and saw what remains
		} else if w.found.Before(w.readyFrom) {
			w.readyFrom = w.found
		}
	}

	s := walkSample{at: v.dbNow, maxID: v.maxID.Int64, reopened: v.reopened, xid: v.xid}
	switch {
	case v.pendingFrom.Valid:
		s.pending = v.pendingFrom.Int64
	case v.maxID.Valid:
		// Nothing pending: the next pending row is a new one.
		s.pending = v.maxID.Int64 + 1
	}
	w.samples = append(w.samples, s)
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

// probed ends a probe that took took: at, when valid, is the oldest ready row below the
// bound it was given, which the next claims' ready walk now starts from.
func (w *walks) probed(at pgtype.Timestamptz, took time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.probing, w.probeTook = false, took
	if !at.Valid {
		return
	}
	if w.readyFrom.IsZero() || at.Time.Before(w.readyFrom) {
		w.readyFrom = at.Time
	}
	if w.found.IsZero() || at.Time.Before(w.found) {
		w.found = at.Time
	}
}
