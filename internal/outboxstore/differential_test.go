package outboxstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster/clustertest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// The claim's bounds (walk.go) are an optimisation of one plain statement: the ready rows
// each of whose earlier pending rows of its key is ready too (qReference). The
// differential test drives a Store through seeded random interleavings of what producers,
// relays and operators do to the outbox, and checks every claim against that statement,
// run in the claim's own snapshot:
//
//   - agreement: every row the claim took is eligible by the reference;
//   - order (fifo): with every row it took, the claim took every earlier pending row of its
//     key (no row leaves while an earlier one of its key is pending);
//   - liveness: a row the reference calls eligible is taken within a few claims (the
//     probe's period plus slack), however it became visible.
//
// The interleavings: producers that serialize per key (a key's next event is inserted
// only after its previous transaction ended), some of them holding their transaction open
// over many claims (late commits, seconds of the clock), savepoints rolled back, explicit
// available_at in the past and the future, redrives (autocommit and inside a long
// transaction), rows rescheduled and dead-lettered by the relay, two claims overlapping
// (the second one's snapshot taken while the first holds its locks), probes, and a pinned
// snapshot. A failure prints the seed; DIFFERENTIAL_SEED replays one, DIFFERENTIAL_FOR
// (a duration) runs fresh seeds until it has passed, on a cluster of its own (make
// differential), and its summary line
// is what docs/reliability.md quotes.

// qReference is the plain statement: the ready rows none of whose earlier pending rows of
// the key is not ready (backing off, or leased: a lease moves available_at to its end).
const qReference = `
SELECT o.id, o.partition_key FROM outbox o
WHERE o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL AND o.available_at <= $1
  AND NOT EXISTS (SELECT 1 FROM outbox e
                  WHERE e.partition_key = o.partition_key AND e.id < o.id
                    AND e.dispatched_at IS NULL AND e.dead_lettered_at IS NULL AND e.available_at > $1)
ORDER BY o.id`

// qPendingByKey is every pending row, for the order check.
const qPendingByKey = `
SELECT id, partition_key FROM outbox WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL ORDER BY id`

func TestDifferentialClaim(t *testing.T) {
	long := os.Getenv("DIFFERENTIAL_FOR") != ""
	if long {
		// The long run has a cluster of its own, with PostgreSQL's defaults (autovacuum
		// on): no other test's connections or transactions share it.
		t.Setenv("DATABASE_URL", clustertest.Start(t).URL)
	} else {
		t.Parallel()
	}
	seeds := []uint64{1, 2, 3}
	if s := os.Getenv("DIFFERENTIAL_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DIFFERENTIAL_SEED=%q: %v", s, err)
		}
		seeds = []uint64{seed}
	}
	var until time.Time
	if s := os.Getenv("DIFFERENTIAL_FOR"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("DIFFERENTIAL_FOR=%q: %v", s, err)
		}
		until = time.Now().Add(d)
		seeds = nil
	}
	steps := 400
	var total diffStats
	began := time.Now()
	// Up to eight producers and the pin hold a connection each across steps, and the
	// claims and the probe need theirs. One schema serves every seed, emptied in between.
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 16})
	run := func(seed uint64) {
		if _, err := db.Pool.Exec(t.Context(), `TRUNCATE outbox, dead_letters RESTART IDENTITY`); err != nil {
			t.Fatal(err)
		}
		st, err := runDifferential(t.Context(), db.Pool, seed, steps)
		total.add(st)
		if err != nil {
			t.Fatalf("seed %d (replay: DIFFERENTIAL_SEED=%d go test -run TestDifferentialClaim ./internal/outboxstore): %v", seed, seed, err)
		}
	}
	for _, seed := range seeds {
		run(seed)
	}
	for seed := uint64(time.Now().UnixNano()); !until.IsZero() && time.Now().Before(until); seed++ {
		run(seed)
	}
	t.Logf("differential: %d seeds, %d steps, %d claims (%d overlapping, %d probes), %d rows claimed, %d late commits, %d redrives, "+
		"longest wait of an eligible row %d claims, 0 disagreements, in %v",
		total.seeds, total.steps, total.claims, total.overlapping, total.probes, total.claimed, total.lateCommits, total.redrives,
		total.longestWait, time.Since(began).Round(time.Second))
}

type diffStats struct {
	seeds, steps, claims, overlapping, probes, claimed, lateCommits, redrives, longestWait int
}

func (d *diffStats) add(o diffStats) {
	d.seeds++
	d.steps += o.steps
	d.claims += o.claims
	d.overlapping += o.overlapping
	d.probes += o.probes
	d.claimed += o.claimed
	d.lateCommits += o.lateCommits
	d.redrives += o.redrives
	d.longestWait = max(d.longestWait, o.longestWait)
}

// txRouter is the Store's database in the differential test: a statement runs in the
// transaction its context carries (so the claim shares the reference's snapshot), and on
// the pool otherwise (the probe).
type txRouter struct{ pool *pgxpool.Pool }

type txKey struct{}

func (r txRouter) db(ctx context.Context) outbox.Querier {
	if tx, ok := ctx.Value(txKey{}).(pgx.Tx); ok {
		return tx
	}
	return r.pool
}

func (r txRouter) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return r.db(ctx).Exec(ctx, sql, args...)
}

func (r txRouter) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return r.db(ctx).Query(ctx, sql, args...)
}

func (r txRouter) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return r.db(ctx).QueryRow(ctx, sql, args...)
}

// producer is one key's producer: at most one transaction open at a time.
type producer struct {
	key string
	tx  pgx.Tx
	// closeAt is the step at which the open transaction ends; abort rolls it back.
	closeAt int
	abort   bool
}

// differential is one seeded run.
type differential struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	rnd   *rand.Rand
	s     *Store
	clock time.Time
	step  int
	prods []*producer
	pin   pgx.Tx
	// pinUntil is the step at which the pin ends.
	pinUntil int
	// eligibleSince is, per row the reference calls eligible, the claim count when it first did.
	eligibleSince map[outbox.ID]int
	// deadLettered are rows the relay dead-lettered, for redrives.
	deadLettered []outbox.ID
	probeEvery   int
	// final settles every claimed row as dispatched (the run's last claims).
	final bool
	st    diffStats
}

func runDifferential(ctx context.Context, pool *pgxpool.Pool, seed uint64, steps int) (diffStats, error) {
	d := &differential{
		ctx: ctx, pool: pool, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		s: NewStore(txRouter{pool: pool}), clock: time.Now().Truncate(time.Millisecond),
		eligibleSince: map[outbox.ID]int{},
	}
	d.s.walks.fullEvery = time.Hour // probes only when the run asks for one
	d.probeEvery = 3 + d.rnd.IntN(8)
	for k := range 3 + d.rnd.IntN(6) {
		d.prods = append(d.prods, &producer{key: "k" + strconv.Itoa(k)})
	}
	defer d.close()
	for d.step = 0; d.step < steps; d.step++ {
		d.st.steps++
		d.clock = d.clock.Add(time.Duration(d.rnd.IntN(400)) * time.Millisecond)
		if err := d.act(); err != nil {
			return d.st, fmt.Errorf("step %d: %w", d.step, err)
		}
	}
	// Every producer ends, the pin too, and a few claims take whatever is left: nothing
	// eligible may stay behind.
	for _, p := range d.prods {
		p.closeAt, p.abort = 0, false
		if err := d.endTx(p); err != nil {
			return d.st, err
		}
	}
	d.endPin()
	d.clock = d.clock.Add(time.Hour) // past every backoff
	d.final = true
	for range d.probeEvery + 3 {
		if err := d.claim(false); err != nil {
			return d.st, fmt.Errorf("final claims: %w", err)
		}
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL`).Scan(&left); err != nil {
		return d.st, err
	}
	if left > 0 {
		return d.st, fmt.Errorf("%d rows still pending after the final claims", left)
	}
	return d.st, nil
}

func (d *differential) close() {
	for _, p := range d.prods {
		if p.tx != nil {
			_ = p.tx.Rollback(context.Background())
		}
	}
	d.endPin()
}

// act does one random thing.
func (d *differential) act() error {
	for _, p := range d.prods {
		if p.tx != nil && d.step >= p.closeAt {
			if err := d.endTx(p); err != nil {
				return err
			}
		}
	}
	if d.pin != nil && d.step >= d.pinUntil {
		d.endPin()
	}
	p := d.prods[d.rnd.IntN(len(d.prods))]
	switch r := d.rnd.IntN(100); {
	case r < 30:
		return d.claim(d.rnd.IntN(5) == 0)
	case r < 55:
		if p.tx != nil {
			return nil // the key's producer is busy: producers serialize per key
		}
		return d.insert(d.pool, p.key, d.availableAt())
	case r < 68:
		if p.tx != nil {
			return d.savepoint(p)
		}
		return d.begin(p)
	case r < 75:
		return d.redrive(p)
	case r < 78:
		if d.pin == nil {
			tx, err := d.pool.BeginTx(d.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			if err != nil {
				return err
			}
			if _, err := tx.Exec(d.ctx, `SELECT count(*) FROM outbox`); err != nil {
				return err
			}
			d.pin, d.pinUntil = tx, d.step+d.rnd.IntN(100)
		}
	}
	return nil
}

// availableAt is mostly the clock (the column's default in production), sometimes the
// past or the future.
func (d *differential) availableAt() time.Time {
	switch d.rnd.IntN(10) {
	case 0:
		return d.clock.Add(-time.Duration(d.rnd.IntN(20_000)) * time.Millisecond)
	case 1:
		return d.clock.Add(time.Duration(d.rnd.IntN(3_000)) * time.Millisecond)
	}
	return d.clock
}

func (d *differential) insert(db outbox.Querier, key string, at time.Time) error {
	_, err := db.Exec(d.ctx, `INSERT INTO outbox (topic, partition_key, payload, available_at) VALUES ('test.event', $1, '{}', $2)`, key, at)
	return err
}

// begin opens a transaction for p's key that inserts now and ends several claims later:
// a late commit, or now and then a rollback.
func (d *differential) begin(p *producer) error {
	tx, err := d.pool.Begin(d.ctx)
	if err != nil {
		return err
	}
	p.tx, p.closeAt, p.abort = tx, d.step+1+d.rnd.IntN(40), d.rnd.IntN(8) == 0
	return d.insert(tx, p.key, d.availableAt())
}

// savepoint inserts in p's open transaction under a savepoint it rolls back, or keeps.
func (d *differential) savepoint(p *producer) error {
	if _, err := p.tx.Exec(d.ctx, `SAVEPOINT s`); err != nil {
		return err
	}
	if err := d.insert(p.tx, p.key, d.clock); err != nil {
		return err
	}
	if d.rnd.IntN(2) == 0 {
		_, err := p.tx.Exec(d.ctx, `ROLLBACK TO SAVEPOINT s`)
		return err
	}
	_, err := p.tx.Exec(d.ctx, `RELEASE SAVEPOINT s`)
	return err
}

// endTx ends p's transaction; a committing producer at once inserts its key's next event,
// as a producer that serializes its key does.
func (d *differential) endTx(p *producer) error {
	if p.tx == nil {
		return nil
	}
	tx := p.tx
	p.tx = nil
	if p.abort {
		return tx.Rollback(d.ctx)
	}
	if err := tx.Commit(d.ctx); err != nil {
		return err
	}
	d.st.lateCommits++
	return d.insert(d.pool, p.key, d.clock)
}

// redrive makes a dead-lettered row pending again, as `dlq redrive` does: in autocommit,
// or inside p's open transaction when the row is p's key's.
func (d *differential) redrive(p *producer) error {
	if len(d.deadLettered) == 0 {
		return nil
	}
	i := d.rnd.IntN(len(d.deadLettered))
	id := d.deadLettered[i]
	var key string
	if err := d.pool.QueryRow(d.ctx, `SELECT partition_key FROM outbox WHERE id = $1`, id).Scan(&key); err != nil {
		return err
	}
	var db outbox.Querier = d.pool
	owner := d.prods[0]
	for _, q := range d.prods {
		if q.key == key {
			owner = q
		}
	}
	if owner.tx != nil {
		if owner != p {
			return nil // its key's producer is busy
		}
		db = owner.tx
	}
	d.deadLettered = slices.Delete(d.deadLettered, i, i+1)
	d.st.redrives++
	_, err := db.Exec(d.ctx, `UPDATE outbox SET dead_lettered_at = NULL, last_error = NULL, generation = generation + 1,
    available_at = $2 WHERE id = $1`, id, d.clock)
	return err
}

func (d *differential) endPin() {
	if d.pin != nil {
		_ = d.pin.Rollback(context.Background())
		d.pin = nil
	}
}

// claimTx is one claim in its own REPEATABLE READ transaction, with the reference read in
// the same snapshot first.
type claimTx struct {
	tx       pgx.Tx
	lease    Lease
	claimed  []outbox.ID
	eligible map[outbox.ID]bool
	pending  map[string][]outbox.ID
}

func (d *differential) openClaim() (*claimTx, error) {
	tx, err := d.pool.BeginTx(d.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return nil, err
	}
	c := &claimTx{tx: tx, eligible: map[outbox.ID]bool{}, pending: map[string][]outbox.ID{}}
	if err := eachRow(d.ctx, tx, func(id outbox.ID, _ string) { c.eligible[id] = true }, qReference, d.clock); err != nil {
		return c, err
	}
	if err := eachRow(d.ctx, tx, func(id outbox.ID, key string) { c.pending[key] = append(c.pending[key], id) }, qPendingByKey); err != nil {
		return c, err
	}
	if c.lease, err = NewLease(); err != nil {
		return c, err
	}
	if d.st.claims%d.probeEvery == d.probeEvery-1 {
		d.s.walks.mu.Lock()
		d.s.walks.fullAt = time.Unix(1, 0) // due: this claim starts a probe
		d.s.walks.mu.Unlock()
		d.st.probes++
	}
	d.st.claims++
	got, err := d.s.Claim(context.WithValue(d.ctx, txKey{}, tx), ClaimRequest{Lease: c.lease, Rows: 1000, KeyRun: 4, For: time.Minute, Now: &d.clock})
	if err != nil {
		return c, err
	}
	for _, m := range got.Messages {
		c.claimed = append(c.claimed, m.ID)
	}
	return c, d.check(c)
}

// eachRow runs query in tx and calls f with each row's id and partition key.
func eachRow(ctx context.Context, tx pgx.Tx, f func(outbox.ID, string), query string, args ...any) error {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id outbox.ID
		var key string
		if err := rows.Scan(&id, &key); err != nil {
			return err
		}
		f(id, key)
	}
	return rows.Err()
}

// check holds one claim against the reference in its snapshot.
func (d *differential) check(c *claimTx) error {
	taken := map[outbox.ID]bool{}
	for _, id := range c.claimed {
		taken[id] = true
		if !c.eligible[id] {
			return fmt.Errorf("claim took row %d, which the reference does not call eligible (eligible: %v)", id, keysOf(c.eligible))
		}
	}
	for key, ids := range c.pending {
		gap := false
		for _, id := range ids {
			switch {
			case !taken[id]:
				gap = true
			case gap:
				return fmt.Errorf("claim took row %d of key %s while an earlier row of its key was pending and not taken (pending: %v, taken: %v)",
					id, key, ids, c.claimed)
			}
		}
	}
	return nil
}

func keysOf(m map[outbox.ID]bool) []outbox.ID {
	ids := make([]outbox.ID, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// claim runs one claim (overlap: a second one whose snapshot is taken while the first
// holds its locks), commits, settles the rows as a relay does (most dispatched, some
// rescheduled, some dead-lettered) and checks liveness.
func (d *differential) claim(overlap bool) error {
	a, err := d.openClaim()
	if err != nil {
		return errors.Join(err, rollback(a))
	}
	claims := []*claimTx{a}
	if overlap {
		d.st.overlapping++
		b, err := d.openClaim()
		if err != nil {
			return errors.Join(err, rollback(a), rollback(b))
		}
		claims = append(claims, b)
	}
	taken := map[outbox.ID]bool{}
	for _, c := range claims {
		if err := c.tx.Commit(d.ctx); err != nil {
			return err
		}
		for _, id := range c.claimed {
			taken[id] = true
		}
		d.st.claimed += len(c.claimed)
	}
	// Liveness: rows the reference called eligible in every claim's snapshot, and not
	// taken, age by one claim.
	for id := range a.eligible {
		if taken[id] {
			delete(d.eligibleSince, id)
			continue
		}
		if _, ok := d.eligibleSince[id]; !ok {
			d.eligibleSince[id] = d.st.claims
		}
	}
	for id, since := range d.eligibleSince {
		if !a.eligible[id] || taken[id] {
			delete(d.eligibleSince, id)
			continue
		}
		wait := d.st.claims - since
		d.st.longestWait = max(d.st.longestWait, wait)
		if wait > d.probeEvery+3 {
			return fmt.Errorf("row %d eligible by the reference for %d claims and not taken (probe every %d claims)", id, wait, d.probeEvery)
		}
	}
	for _, c := range claims {
		if err := d.settle(c); err != nil {
			return err
		}
	}
	return nil
}

func rollback(c *claimTx) error {
	if c == nil || c.tx == nil {
		return nil
	}
	return c.tx.Rollback(context.Background())
}

// settle marks a claim's rows as a relay does: per key, in id order, each row dispatched,
// or rescheduled (and the key's later rows released behind it), or dead-lettered.
func (d *differential) settle(c *claimTx) error {
	var done []outbox.ID
	var retries []Retry
	var dead []Failure
	var release []outbox.ID
	held := map[string]bool{}
	byKey := map[outbox.ID]string{}
	for key, ids := range c.pending {
		for _, id := range ids {
			byKey[id] = key
		}
	}
	for _, id := range c.claimed {
		key := byKey[id]
		switch r := d.rnd.IntN(20); {
		case d.final:
			done = append(done, id)
		case held[key]:
			release = append(release, id)
		case r == 0:
			retries = append(retries, Retry{ID: id, Delay: time.Duration(d.rnd.IntN(3000)) * time.Millisecond, Error: "transient"})
			held[key] = true
		case r == 1:
			dead = append(dead, Failure{ID: id, Error: "permanent"})
			d.deadLettered = append(d.deadLettered, id)
		default:
			done = append(done, id)
		}
	}
	if _, err := d.s.MarkDispatched(d.ctx, c.lease, done, &d.clock); err != nil {
		return err
	}
	if _, err := d.s.Reschedule(d.ctx, c.lease, retries, &d.clock); err != nil {
		return err
	}
	if _, err := d.s.DeadLetter(d.ctx, c.lease, dead, &d.clock); err != nil {
		return err
	}
	_, err := d.s.Release(d.ctx, c.lease, release, &d.clock)
	return err
}
