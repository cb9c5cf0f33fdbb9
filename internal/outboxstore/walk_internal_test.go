package outboxstore

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster/clustertest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// walkRig drives a Store on a fake database clock, so the bounds' lag passes without
// sleeping: every insert, claim and mark happens at clock.
type walkRig struct {
	t     *testing.T
	db    *pgtest.DB
	s     *Store
	clock time.Time
}

func newWalkRig(t *testing.T) *walkRig {
	db := pgtest.New(t)
	s := NewStore(db.Pool)
	// The first claim walks everything; after it, only the bounded walks unless a test
	// asks for a full one.
	s.walks.fullEvery = time.Hour
	return &walkRig{t: t, db: db, s: s, clock: time.Now().Truncate(time.Second)}
}

// insert adds one event per key at the clock and returns their ids.
func (r *walkRig) insert(keys ...string) []outbox.ID {
	r.t.Helper()
	return r.insertAt(r.clock, keys)
}

// insertLate adds one event per key an hour before the clock: rows that appear below the
// bounds, as when their producer's transaction started long before it committed.
func (r *walkRig) insertLate(keys ...string) []outbox.ID {
	r.t.Helper()
	return r.insertAt(r.clock.Add(-time.Hour), keys)
}

func (r *walkRig) insertAt(at time.Time, keys []string) []outbox.ID {
	r.t.Helper()
	return outboxtest.Column[outbox.ID](r.t, r.db.Pool, `
INSERT INTO outbox (topic, partition_key, payload, available_at)
SELECT 'test.event', k, '{}', $2 FROM unnest($1::text[]) WITH ORDINALITY AS u(k, ord) ORDER BY ord
RETURNING id`, keys, at)
}

// claim leases one batch at the clock and returns its ids in claim order (sorted by id).
func (r *walkRig) claim() (Lease, []outbox.ID) {
	r.t.Helper()
	lease, err := NewLease()
	if err != nil {
		r.t.Fatal(err)
	}
	c, err := r.s.Claim(r.t.Context(), ClaimRequest{Lease: lease, Rows: 1000, KeyRun: 4, For: time.Minute, Now: &r.clock})
	if err != nil {
		r.t.Fatal(err)
	}
	ids := make([]outbox.ID, 0, c.Len())
	for _, m := range c.Messages {
		ids = append(ids, m.ID)
	}
	return lease, ids
}

// drain claims and marks until a claim comes back empty, and returns what it marked.
func (r *walkRig) drain() []outbox.ID {
	r.t.Helper()
	var all []outbox.ID
	for {
		lease, ids := r.claim()
		if len(ids) == 0 {
			return all
		}
		if _, err := r.s.MarkDispatched(r.t.Context(), lease, ids, &r.clock); err != nil {
			r.t.Fatal(err)
		}
		all = append(all, ids...)
	}
}

// rounds produces perRound events over keys once a second of the clock and drains them.
func (r *walkRig) rounds(n, perRound, keys int) {
	r.t.Helper()
	for range n {
		r.clock = r.clock.Add(time.Second)
		r.insert(roundKeys(perRound, keys)...)
		if got := r.drain(); len(got) != perRound {
			r.t.Fatalf("round drained %d events, want %d", len(got), perRound)
		}
	}
}

// roundKeys names perRound events' keys, spread over keys of them.
func roundKeys(perRound, keys int) []string {
	ks := make([]string, perRound)
	for i := range ks {
		ks[i] = "k" + string(rune('A'+i%keys/26)) + string(rune('a'+i%keys%26))
	}
	return ks
}

// buffers runs one claim of the next round under EXPLAIN (ANALYZE, BUFFERS), rolled back,
// with the bounds the Store would use (bounded false: none), and returns the buffers it
// touched.
func (r *walkRig) buffers(bounded bool) int {
	r.t.Helper()
	ctx := r.t.Context()
	p := walkParams{reopened: -1}
	if bounded {
		p, _ = r.s.walks.next(time.Now(), &r.clock)
	}
	tx, err := r.db.Pool.Begin(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	lease, err := NewLease()
	if err != nil {
		r.t.Fatal(err)
	}
	var plan []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+qClaim,
		claimArgs(1000, lease.Token, &r.clock, "1 minute", 1000, 4, int64(1)<<40, p)).Scan(&plan); err != nil {
		r.t.Fatal(err)
	}
	var out []struct {
		Plan struct {
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &out); err != nil || len(out) != 1 {
		r.t.Fatalf("EXPLAIN output %s: %v", plan, err)
	}
	return out[0].Plan.Hit + out[0].Plan.Read
}

// pin holds the database's xmin horizon for the rest of the test, as a long report or an
// idle-in-transaction session does: no dead tuple from now on can be removed.
func pin(t *testing.T, db *pgtest.DB) {
	t.Helper()
	ctx := t.Context()
	tx, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, "SELECT count(*) FROM dead_letters"); err != nil {
		t.Fatal(err)
	}
}

// Under a pinned horizon every event leased and marked leaves two dead entries in the
// partial indexes that no vacuum can remove. The bounded claim passes only those of the
// last walkLag; the unbounded one passes all of them. Counted in buffers, not timed.
// Both states of migration 0016's counter hold the bound: never used (it reads NULL;
// a claim once compared that with the 0 it reported and walked every key from its start)
// and moved by an earlier redrive.
//
// On a cluster of its own: transaction ids are the cluster's, and another test's
// transaction that began before the rig's first claim is a writer whose bounds it cannot
// know, so its end lowers one claim's bounds to nothing (walk.go). Not parallel:
// DATABASE_URL points pgtest at that cluster.
// TestProbeBelowTheReadyBound and TestClaimFindsRowsBelowItsBounds share the cluster for
// the same reason: they need a claim whose bounds nothing lowered.
func TestOnAClusterOfItsOwn(t *testing.T) {
	t.Setenv("DATABASE_URL", clustertest.Start(t).URL)
	t.Run("claim walks stay flat under a pinned horizon", testClaimWalksStayFlatUnderAPinnedHorizon)
	t.Run("claim finds rows below its bounds", testClaimFindsRowsBelowItsBounds)
	t.Run("probe below the ready bound", testProbeBelowTheReadyBound)
}

func testClaimWalksStayFlatUnderAPinnedHorizon(t *testing.T) {
	for _, redriven := range []bool{false, true} {
		t.Run(map[bool]string{false: "counter never used", true: "after a redrive"}[redriven], func(t *testing.T) {
			r := newWalkRig(t)
			if redriven {
				outboxtest.Exec(t, r.db.Pool, "SELECT nextval('outbox_reopened_seq')")
			}
			pin(t, r.db)
			claimWalksStayFlat(t, r)
		})
	}
}

func claimWalksStayFlat(t *testing.T, r *walkRig) {
	const perRound, keys = 300, 300
	// The measured claim takes a round on keys with history: their head probes pass
	// every dead entry of their key that the id bound does not skip.
	next := func() {
		r.clock = r.clock.Add(time.Second)
		r.insert(roundKeys(perRound, keys)...)
	}
	r.rounds(10, perRound, keys)
	next()
	early, earlyAll := r.buffers(true), r.buffers(false)
	r.drain()
	r.rounds(50, perRound, keys)
	next()
	late, lateAll := r.buffers(true), r.buffers(false)
	t.Logf("claim buffers after 3,000 events since the pin: %d bounded, %d unbounded; after 18,000: %d bounded, %d unbounded",
		early, earlyAll, late, lateAll)
	if late > early*3/2 {
		t.Errorf("bounded claim grew from %d to %d buffers with the events since the pin", early, late)
	}
	if lateAll < 2*earlyAll || lateAll < 2*late {
		t.Errorf("unbounded claim grew from %d to %d buffers only: the pin did not show", earlyAll, lateAll)
	}
}

// A row that appears below the bounds (available_at written in the past) is claimed
// together with its key's next event if that one is in range, and by the periodic
// unbounded claim otherwise.
func testClaimFindsRowsBelowItsBounds(t *testing.T) {
	r := newWalkRig(t)
	r.rounds(8, 50, 50)
	late := r.insertLate("late-alone", "late-pair")
	pair := r.insert("late-pair")

	_, ids := r.claim()
	if want := []outbox.ID{late[1], pair[0]}; !slices.Equal(ids, want) {
		t.Fatalf("bounded claim took %v, want the late row with its key's next event %v", ids, want)
	}
	r.s.walks.fullAt = time.Time{}
	if _, ids := r.claim(); !slices.Equal(ids, late[:1]) {
		t.Fatalf("unbounded claim took %v, want the late row %v", ids, late[:1])
	}
}

// The probe finds a row below the ready bound without a claim walking the whole index:
// the claims after it start their ready walk at that row.
func testProbeBelowTheReadyBound(t *testing.T) {
	r := newWalkRig(t)
	r.rounds(8, 50, 50)
	late := r.insertLate("late-alone")
	if _, ids := r.claim(); len(ids) != 0 {
		t.Fatalf("bounded claim took %v: the row was not below the bound, the test proves nothing", ids)
	}
	p, _ := r.s.walks.next(time.Now(), &r.clock)
	r.s.probeBelow(p.readyFrom.Time, &r.clock)
	if _, ids := r.claim(); !slices.Equal(ids, late) {
		t.Fatalf("claim after the probe took %v, want the late row %v", ids, late)
	}
}

// A redriven event lies below the id bound. While it is pending (here backing off), its
// key's later events must wait for it, both in the claim that first meets the reopened
// counter and after the Store has found its bounds again.
func TestClaimRedrivenRowBelowItsBoundHoldsItsKey(t *testing.T) {
	t.Parallel()
	r := newWalkRig(t)
	ctx := t.Context()
	first := r.insert("redriven")[0]
	outboxtest.Exec(t, r.db.Pool, `UPDATE outbox SET dead_lettered_at = $2 WHERE id = $1`, first, r.clock)
	r.rounds(8, 50, 50)
	if p, _ := r.s.walks.next(time.Now(), &r.clock); p.idFrom <= int64(first) {
		t.Fatalf("id bound %d is not above the dead-lettered row %d: the test proves nothing", p.idFrom, first)
	}
	later := r.insert("redriven")[0]
	outboxtest.Exec(t, r.db.Pool, `UPDATE outbox SET dead_lettered_at = NULL, available_at = $2 WHERE id = $1`,
		first, r.clock.Add(time.Hour))
	for round := range 10 {
		r.clock = r.clock.Add(time.Second)
		r.insert("other")
		lease, ids := r.claim()
		if slices.Contains(ids, later) {
			t.Fatalf("round %d: event %d of a key whose redriven event %d is backing off was claimed", round, later, first)
		}
		if _, err := r.s.MarkDispatched(ctx, lease, ids, &r.clock); err != nil {
			t.Fatal(err)
		}
	}
	r.clock = r.clock.Add(time.Hour)
	if _, ids := r.claim(); !slices.Equal(ids, []outbox.ID{first, later}) {
		t.Fatalf("after the backoff the claim took %v, want %v", ids, []outbox.ID{first, later})
	}
}

// Under a pin the ready walk trails the last claim by writerMargin, whatever is open: a
// producer transaction that wrote before the claims is one of the claims' writers, and
// the first claim after its commit lowers its bounds to the writer's and takes the row,
// with no probe (the rig runs none), and with its key's next event behind it.
func TestClaimAfterALateCommit(t *testing.T) {
	t.Parallel()
	r := newWalkRig(t)
	pin(t, r.db)
	// step inserts an event, advances the clock by d and claims and marks what is ready;
	// it returns the ids claimed.
	step := func(d time.Duration) []outbox.ID {
		r.t.Helper()
		r.insert("step")
		r.clock = r.clock.Add(d)
		return r.drain()
	}
	for range 5 {
		step(10 * time.Millisecond)
	}
	writer := outboxtest.Begin(t, r.db.Pool)
	written := r.clock
	var id outbox.ID
	if err := writer.QueryRow(t.Context(), `INSERT INTO outbox (topic, partition_key, payload, available_at)
VALUES ('test.event', 'writer', '{}', $1) RETURNING id`, written).Scan(&id); err != nil {
		t.Fatal(err)
	}
	for i := range 15 {
		if got := step(100 * time.Millisecond); slices.Contains(got, id) {
			t.Fatalf("step %d claimed the uncommitted row %d", i, id)
		}
	}
	if lag := r.clock.Sub(r.s.walks.readyFrom); lag > 2*writerMargin {
		t.Fatalf("ready bound %v behind the clock with a writer open, want at most %v", lag, 2*writerMargin)
	}
	if p, _ := r.s.walks.next(time.Now(), &r.clock); p.idFrom <= int64(id) {
		t.Fatalf("id bound %d is not above the open writer's row %d: the test proves nothing", p.idFrom, id)
	}
	if err := writer.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	next := r.insert("writer")[0]
	lease, got := r.claim()
	if !slices.Contains(got, id) || !slices.Contains(got, next) {
		t.Fatalf("the claim after the writer's commit took %v, want its row %d and its key's next %d", got, id, next)
	}
	if _, err := r.s.MarkDispatched(t.Context(), lease, got, &r.clock); err != nil {
		t.Fatal(err)
	}
}

// writerBoundOf without a database: a writer's rows lie above the newest id of the claim
// writerMargin before the newest claim whose transaction id is below the writer's, and
// no earlier than that claim's clock less writerMargin.
func TestWriterBound(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	w := &walks{samples: []walkSample{
		{at: ms(0), xid: 100, maxID: 1000}, {at: ms(30), xid: 150, maxID: 1100},
		{at: ms(300), xid: 200, maxID: 2000}, {at: ms(600), xid: 300, maxID: 3000}, {at: ms(900), xid: 0, maxID: 4000},
	}}
	for _, tc := range []struct {
		name   string
		xid    int64
		wantID int64
		wantAt time.Time
	}{
		{"newer than every claim", 301, 2000, ms(550)},
		{"between two claims", 250, 1100, ms(250)},
		{"older than every claim: anything", 90, 0, time.Time{}},
		{"no claim writerMargin before the one below it: anything", 120, 0, time.Time{}},
	} {
		if got := w.writerBoundOf(tc.xid); got.id != tc.wantID || !got.at.Equal(tc.wantAt) {
			t.Errorf("%s: %+v, want id %d at %v", tc.name, got, tc.wantID, tc.wantAt)
		}
	}
}

// The bounds' bookkeeping without a database: what next asks for after a sequence of
// claims' views.
func TestWalkBounds(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	// at counts in fifths of walkLag (200 ms, more than writerMargin).
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * walkLag / 5) }
	view := func(s int, pending, maxID, reopened int64) walkView {
		return walkView{dbNow: at(s), pendingFrom: pgInt8(pending), maxID: pgInt8(maxID), reopened: reopened}
	}
	type step struct {
		view walkView
		// want: the id bound and whether pendingFrom is passed, for a claim after view.
		idFrom      int64
		pendingFrom bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"no id bound until a view is writerMargin old", []step{
			{view(0, 10, 100, 0), 0, false},
			{view(1, 50, 200, 0), 50, true},   // min(pending 50, max id writerMargin before 100)
			{view(2, 290, 300, 0), 200, true}, // the view at 1 is the newest one writerMargin old
			{view(6, 400, 900, 0), 300, true},
			{view(7, 400, 900, 0), 400, true}, // pending is below the earlier max id
		}},
		{"a reopened row drops the id bound, then pendingFrom is found afresh", []step{
			{view(0, 10, 100, 7), 0, false},
			{view(6, 150, 300, 7), 100, true},
			{view(7, 310, 400, 8), 0, false}, // counter moved: no id bound, pendingFrom afresh
			{view(8, 5, 500, 8), 5, true},    // found afresh: the redriven row 5
		}},
		{"nothing pending: the next pending row is a new one", []step{
			{walkView{dbNow: at(0), maxID: pgInt8(100)}, 0, false},
			{walkView{dbNow: at(6), maxID: pgInt8(200)}, 100, true}, // pending 201 (max id + 1), above the earlier max id
		}},
		{"no counter (0016 not applied): no id bound, pendingFrom walked", []step{
			{view(0, 10, 100, -1), 0, false},
			{view(1, 50, 200, -1), 0, true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w walks
			w.fullEvery = time.Hour
			w.next(t0, nil) // the first claim is the unbounded one
			for i, s := range tc.steps {
				p, n := w.next(t0, nil)
				w.offer(n, p, s.view)
				got, _ := w.next(t0, nil)
				if got.idFrom != s.idFrom || got.pendingFrom.Valid != s.pendingFrom {
					t.Fatalf("after view %d: idFrom %d, pendingFrom passed %v; want %d, %v", i, got.idFrom, got.pendingFrom.Valid, s.idFrom, s.pendingFrom)
				}
			}
		})
	}

	t.Run("writers: their bounds, kept while they run, nothing for one that may have reopened a row", func(t *testing.T) {
		var w walks
		w.fullEvery = time.Hour
		w.next(t0, nil)
		offer := func(v walkView) walkParams {
			p, n := w.next(t0, nil)
			w.offer(n, p, v)
			got, _ := w.next(t0, nil)
			return got
		}
		v := func(s int, xid int64, reopened int64, xip ...int64) walkView {
			x := view(s, 1000+int64(s), 100*int64(s+1), reopened)
			x.xid, x.xip = xid, xip
			return x
		}
		bounds := func(p walkParams) map[int64]int64 {
			m := map[int64]int64{}
			for i, x := range p.writers {
				m[x] = p.writerIDs[i]
			}
			return m
		}
		offer(v(0, 10, 0))
		offer(v(1, 20, 0))
		// Writer 25 took its id after the claim with id 20 began: its rows lie above the
		// newest id of the claim writerMargin before that one (100).
		if got := bounds(offer(v(2, 30, 0, 25))); got[25] != 100 || len(got) != 1 {
			t.Fatalf("writers %v, want 25 above 100", got)
		}
		// Still running: the bound it was given first stays.
		if got := bounds(offer(v(3, 40, 0, 25, 35))); got[25] != 100 || got[35] != 200 {
			t.Fatalf("writers %v, want 25 above 100 and 35 above 200", got)
		}
		// The counter moves: any running writer may have reopened a row, until a claim
		// started after the move reports its transaction id (50).
		if got := bounds(offer(v(4, 45, 1, 25, 35, 44))); got[25] != 0 || got[35] != 0 || got[44] != 0 {
			t.Fatalf("writers after the move %v, want every bound 0", got)
		}
		if got := bounds(offer(v(5, 50, 1, 25, 49, 55))); got[25] != 0 || got[49] != 0 || got[55] == 0 {
			t.Fatalf("writers after a claim started after the move %v, want 25 and 49 at 0, 55 bounded", got)
		}
		// Writer 25 ended: it is no longer passed.
		if got := bounds(offer(v(6, 60, 1, 55))); len(got) != 1 {
			t.Fatalf("writers %v, want only 55", got)
		}
	})

	t.Run("an older claim's view does not replace a newer one", func(t *testing.T) {
		var w walks
		p1, n1 := w.next(t0, nil)
		p2, n2 := w.next(t0, nil)
		w.offer(n2, p2, view(10, 500, 600, 0))
		w.offer(n1, p1, view(9, 100, 200, 0))
		if last := w.samples[len(w.samples)-1]; last.pending != 500 {
			t.Fatalf("pending %d, want the newer claim's 500", last.pending)
		}
	})
	t.Run("a probe's find holds until a claim walked from it", func(t *testing.T) {
		var w walks
		w.fullEvery = time.Hour
		w.next(t0, nil)
		p0, n0 := w.next(t0, nil)
		w.offer(n0, p0, view(0, 10, 100, 0))
		late := at(-50)
		// A claim started before the probe ended, then the probe, then that claim's view.
		p1, n1 := w.next(t0, nil)
		w.probed(pgtype.Timestamptz{Time: late, Valid: true}, time.Millisecond)
		w.offer(n1, p1, view(1, 10, 100, 0))
		p2, n2 := w.next(t0, nil)
		if !p2.readyFrom.Time.Equal(late) {
			t.Fatalf("ready bound %v after a claim that began before the probe, want the find %v", p2.readyFrom.Time, late)
		}
		w.offer(n2, p2, view(2, 10, 100, 0))
		if p3, _ := w.next(t0, nil); !p3.readyFrom.Time.Equal(at(2).Add(-writerMargin)) {
			t.Fatalf("ready bound %v after a claim walked from the find, want the clock less writerMargin", p3.readyFrom.Time)
		}
	})
	t.Run("a test clock that goes back forgets the bounds", func(t *testing.T) {
		var w walks
		w.fullEvery = time.Hour
		w.next(t0, nil)
		for s := 0; s <= 10; s += 5 {
			p, n := w.next(t0, nil)
			w.offer(n, p, view(s, 100, 200, 0))
		}
		back := at(-60)
		if p, _ := w.next(t0, &back); p.readyFrom.Valid || p.idFrom != 0 || p.pendingFrom.Valid {
			t.Fatalf("bounds after the clock went back: %+v", p)
		}
	})
}

func pgInt8(v int64) pgtype.Int8 { return pgtype.Int8{Int64: v, Valid: true} }

// Binaries deployed before `migrate up` ran 0016 (no counter of reopened rows) claim as
// before, without an id bound, rather than failing every claim.
func TestClaimWithoutTheReopenedCounter(t *testing.T) {
	t.Parallel()
	r := newWalkRig(t)
	outboxtest.Exec(t, r.db.Pool, `DROP TRIGGER outbox_reopened ON outbox;
DROP FUNCTION outbox_count_reopened(); DROP SEQUENCE outbox_reopened_seq`)
	r.rounds(8, 50, 50)
	if p, _ := r.s.walks.next(time.Now(), &r.clock); p.idFrom != 0 || !p.readyFrom.Valid {
		t.Fatalf("bounds without the counter: %+v, want the ready bound and no id bound", p)
	}
}

// The probe's interval follows its cost: a cheap probe (unpinned) every probeEveryMin, a
// slow one (a long pin) at most a fiftieth of the time, however slow.
func TestProbeEvery(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ took, want time.Duration }{
		{0, probeEveryMin},
		{2 * time.Millisecond, probeEveryMin},
		{400 * time.Millisecond, 20 * time.Second},
		{5 * time.Second, 250 * time.Second},
		{time.Minute, 50 * time.Minute},
	} {
		if got := probeEvery(c.took); got != c.want {
			t.Errorf("probeEvery(%v) = %v, want %v", c.took, got, c.want)
		}
	}
}
