package relay

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// Relay drains one outbox table through one Publisher. It is safe to run many relays, in
// one process or many, against the same table.
type Relay struct {
	store *outboxstore.Store
	pub   Publisher
	db    *pgxpool.Pool
	cfg   Config
	log   *slog.Logger
	// destination names the batch spans (traceDestination).
	destination string

	// inFlight is how many batches one drain may have in flight: PublishConcurrency, or
	// fewer when the pool cannot give each its connection.
	inFlight int

	mu sync.Mutex
	// pausedUntil: no claim before this instant (a deferred publish); deferStreak counts
	// consecutive deferrals without an Until, doubling the pause.
	pausedUntil time.Time
	deferStreak int

	randMu sync.Mutex

	// circuits is this relay's view of the destinations whose consumer is down (circuit.go).
	circuits *breaker
	// noPromisesLogged: DrainAwake said once that the database lacks migration 0022.
	noPromisesLogged atomic.Bool
}

// New returns a Relay over db and pub, or the config's errors. The relay needs a pool, not
// one connection: each batch in flight is marked on a connection of its own, and Linger
// holds one more in LISTEN.
func New(db *pgxpool.Pool, pub Publisher, cfg Config) (*Relay, error) {
	if cfg.Ordering == "" {
		cfg.Ordering = orderingOf(pub)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if db == nil || pub == nil {
		return nil, errors.New("relay: database and publisher are required")
	}
	r := &Relay{store: outboxstore.NewStore(db), pub: pub, db: db, cfg: cfg, log: cfg.Logger, inFlight: cfg.PublishConcurrency,
		destination: traceDestination(pub)}
	r.circuits = &breaker{store: r.store, log: r.log, horizon: r.cfg.ProbeHorizon, refresh: r.cfg.CircuitRefresh}
	// One connection claims while each batch in flight may hold one to be marked: a batch
	// waiting for a connection would eat into its mark budget.
	if n := int(db.Config().MaxConns) - 1; n < r.inFlight {
		r.inFlight = max(n, 1)
	}
	return r, nil
}

// orderingOf is the ordering pub states (an Ordering method, as *qstash.Publisher has).
// A publisher that does not say may feed a queue that keeps order, so it gets waves: they
// keep per-key order whatever the queue does, where one call per batch would let a key's
// later event overtake an earlier one that failed.
func orderingOf(pub Publisher) publish.Ordering {
	if o, ok := pub.(interface{ Ordering() publish.Ordering }); ok {
		return o.Ordering()
	}
	return publish.OrderingFIFO
}

// Stats counts what a drain did.
type Stats struct {
	// Batches counts claims that leased at least one row.
	Batches      int
	Claimed      int
	Dispatched   int
	Retried      int
	DeadLettered int
	// Released were claimed but not sent (held behind a failed same-key event, deferred,
	// or out of time); they are pending again with their attempt uncounted.
	Released int
	// DeferredQuota, DeferredDeployment and DeferredOutage count messages the queue did
	// not take for a reason outside them (DeferError.Reason DeferQuota, DeferDeployment,
	// DeferOutage); they are included in Released.
	DeferredQuota      int
	DeferredDeployment int
	DeferredOutage     int
	// LeaseLost counts rows whose outcome was discarded because another relay had taken
	// them over after this relay's lease expired.
	LeaseLost int
	// PublishCalls and PublishLatency describe Publisher.Publish calls; at most
	// maxLatencySamples latencies are kept.
	PublishCalls   int
	PublishLatency []time.Duration
	// StoppedAtDeadline is true when Drain stopped because its deadline was near, not
	// because a batch came back short.
	StoppedAtDeadline bool
	// PausedUntil is set when Drain stopped early because publishing is deferred until
	// this instant, beyond what its deadline allows.
	PausedUntil time.Time
	Duration    time.Duration

	// more: the last claim may have left ready rows behind (see outboxstore.Claimed).
	more bool
	// deferred is the first deferral seen, for the drain's one log line.
	deferred *publish.DeferError
}

const maxLatencySamples = 100

// statsCounter is one count of Stats under its name.
type statsCounter struct {
	name string
	n    *int
}

// counters is the one list of Stats' counts, in the order every report shows them: their
// snake_case names are the drain's log keys, the relay Lambda's result members and, as
// outbox.relay.<name>, the batch span's attributes; the metrics are their CamelCase forms
// (publish_calls is none: PublishLatency counts the calls). A counter added to Stats goes
// here, and every report has it.
func (s *Stats) counters() [11]statsCounter {
	return [...]statsCounter{
		{"claimed", &s.Claimed}, {"dispatched", &s.Dispatched}, {"retried", &s.Retried},
		{"dead_lettered", &s.DeadLettered}, {"released", &s.Released}, {"lease_lost", &s.LeaseLost},
		{"deferred_quota", &s.DeferredQuota}, {"deferred_deployment", &s.DeferredDeployment},
		{"deferred_outage", &s.DeferredOutage}, {"batches", &s.Batches}, {"publish_calls", &s.PublishCalls},
	}
}

// Counts yields every count of s (Claimed, Dispatched, ..., Batches, PublishCalls) under
// its snake_case name ("claimed", "dead_lettered", "publish_calls"), always in the same
// order; the names are stable: logs, metrics and the relay function's result use them.
func (s Stats) Counts() iter.Seq2[string, int] {
	return func(yield func(string, int) bool) {
		for _, c := range s.counters() {
			if !yield(c.name, *c.n) {
				return
			}
		}
	}
}

func (s *Stats) add(o Stats) {
	sum, more := s.counters(), o.counters()
	for i, c := range sum {
		*c.n += *more[i].n
	}
	for _, l := range o.PublishLatency {
		if len(s.PublishLatency) < maxLatencySamples {
			s.PublishLatency = append(s.PublishLatency, l)
		}
	}
	if s.deferred == nil {
		s.deferred = o.deferred
	}
}

// LogValue renders the counts (Counts) and how the drain ended for slog.
func (s Stats) LogValue() slog.Value {
	attrs := make([]slog.Attr, 0, len(s.counters())+3)
	for name, n := range s.Counts() {
		attrs = append(attrs, slog.Int(name, n))
	}
	attrs = append(attrs, slog.Bool("stopped_at_deadline", s.StoppedAtDeadline),
		slog.Int64("duration_ms", s.Duration.Milliseconds()))
	if !s.PausedUntil.IsZero() {
		attrs = append(attrs, slog.Time("paused_until", s.PausedUntil))
	}
	return slog.GroupValue(attrs...)
}

// Drain runs batches until a claim comes back short with nothing else in flight (fewer
// rows than BatchSize and every ready row seen, or nothing claimable at all), ctx is done,
// less than DeadlineMargin is left before ctx's deadline, or publishing is deferred past
// it. Up to PublishConcurrency batches are in flight at once. Every batch that was claimed
// is published and marked before Drain returns: its outcome statements run even if ctx is
// cancelled meanwhile. An error (database down) stops new claims; unmarked rows stay
// leased and become ready again when the lease ends.
func (r *Relay) Drain(ctx context.Context) (Stats, error) {
	start := time.Now()
	var total Stats
	err := r.drain(ctx, ctx, &total, drainPace{})
	total.Duration = time.Since(start)
	return total, err
}

type batchDone struct {
	st  Stats
	err error
	// bytes are the batch's payload bytes, counted against MaxInFlightBytes until it is done.
	bytes int64
	// aborted: the batch's goroutine ended without finishing (a panic, whose value is
	// panicked, or runtime.Goexit); the drain stops and ends its caller the same way.
	aborted  bool
	panicked any
}

// drain claims batches under work, each published and marked on its own goroutine, until
// a claim comes back short with nothing in flight, stop is done, work's deadline is
// within DeadlineMargin, or publishing is paused past it. It returns when every batch it
// claimed is marked. The payloads in flight stay within MaxInFlightBytes: a claim takes
// at most what is left of it (and MaxBatchBytes), and with less than a quarter of a
// batch's budget left the drain waits for a batch to finish instead of claiming a sliver.
//
// After a short claim, a lingering relay's drain (pace.poll > 0) claims again once a batch
// finishes or poll has passed, whichever is first: events committed while a batch
// publishes go out without waiting for its mark (measured at 800 events/s, one per
// transaction, on 2 cores: e2e p50 5.0-5.4 -> 3.6-3.8 ms, worst pinned window p99 32-42 ->
// 24-27 ms). Drain's waits for the batch, and a short batch with nothing else in flight
// ends the drain. pace.busy, if set, is called once, when a claim finds rows while a batch
// is in flight or comes back full: producers commit faster than a batch goes round.
func (r *Relay) drain(stop, work context.Context, total *Stats, pace drainPace) error {
	// Buffered for every batch in flight, so a finishing batch never blocks.
	d := &drainer{r: r, total: total, done: make(chan batchDone, r.inFlight)}
	defer d.budget.log(r)
	for len(d.errs) == 0 && stop.Err() == nil {
		if d.inFlight >= r.inFlight {
			d.collect(<-d.done)
			continue
		}
		left := r.cfg.MaxInFlightBytes - d.inFlightBytes
		if d.inFlight > 0 && left < max(r.cfg.MaxBatchBytes/4, 1) {
			d.budget.waits++
			d.collect(<-d.done)
			continue
		}
		if until := r.paused(); time.Now().Before(until) {
			if !d.waitPause(stop, work, until) {
				break
			}
			continue
		}
		if r.nearDeadline(work) {
			total.StoppedAtDeadline = true
			break
		}
		lease, c, claimedAt, err := r.claim(work, min(r.cfg.MaxBatchBytes, left))
		if err != nil {
			d.errs = append(d.errs, err)
			break
		}
		d.budget.claimed(c, d.inFlightBytes)
		if c.Len() == 0 && d.inFlight == 0 {
			break
		}
		if c.Len() > 0 {
			if c.Isolated && len(c.Messages) == 1 && c.Deaths+1 >= r.cfg.MaxDeaths {
				d.startAlone(work, lease, c, claimedAt)
			} else {
				d.start(work, lease, c, claimedAt)
			}
			if pace.busy != nil && (c.More || d.inFlight > 1) {
				pace.busy()
				pace.busy = nil
			}
		}
		switch {
		case c.More:
		case pace.poll > 0:
			d.wait(stop, pace.poll)
		case c.Len() == 0:
			// Keys held by the batches in flight become claimable when they are marked.
			d.collect(<-d.done)
		case d.inFlight == 1:
			// A short batch while nothing else was in flight: every ready row was seen,
			// unless a dead letter in this batch frees its key's later events.
			b := <-d.done
			d.collect(b)
			if !b.st.more {
				return d.finish()
			}
		}
	}
	return d.finish()
}

// drainPace is how a drain goes on after a short claim; the zero value is Drain's.
type drainPace struct {
	poll time.Duration
	busy func()
}

// drainer is one drain's state: the batches in flight and what the finished ones did.
type drainer struct {
	r     *Relay
	total *Stats
	done  chan batchDone

	inFlight      int
	inFlightBytes int64
	budget        budgetUse
	errs          []error
	// logged: the drain's one deferral line is written.
	logged bool
	// abort is the first batch whose goroutine ended without finishing.
	abort *batchDone
}

// start publishes and marks a claimed batch on its own goroutine, which reports on done
// however it ends.
func (d *drainer) start(work context.Context, lease outboxstore.Lease, c outboxstore.Claimed, claimedAt time.Time) {
	d.inFlight++
	d.inFlightBytes += c.Bytes
	go func() {
		b := batchDone{aborted: true, bytes: c.Bytes}
		defer func() {
			if b.aborted {
				b.panicked = recover()
			}
			d.done <- b
		}()
		b.st, b.err = d.r.process(work, lease, c, claimedAt)
		b.aborted = false
	}()
}

// startAlone publishes and marks a batch of one row that relays died holding
// MaxDeaths-1 times (outboxstore.Claimed.Deaths) with no other batch in flight: if it
// kills this process too, it is dead-lettered, and no other row died with it (a row
// that died beside it twice would be next). Rows with fewer deaths are claimed alone but
// go beside other batches: a row that dies beside the guilty one gains a death, not a
// dead letter.
//
// A row claimed so while batches are in flight is handed back first (Store.Unclaim), and
// the drain claims again once they are done: held through the wait, it would share the
// death of a process killed by one of them, and this death is its last.
func (d *drainer) startAlone(work context.Context, lease outboxstore.Lease, c outboxstore.Claimed, claimedAt time.Time) {
	handedBack := d.inFlight > 0 && d.r.unclaim(work, lease, c)
	for d.inFlight > 0 {
		d.collect(<-d.done)
	}
	if handedBack {
		return
	}
	d.start(work, lease, c, claimedAt)
	d.collect(<-d.done)
}

// unclaim hands c's rows back (see startAlone) and reports whether they were; if not,
// the lease still holds them.
func (r *Relay) unclaim(ctx context.Context, lease outboxstore.Lease, c outboxstore.Claimed) bool {
	ids := make([]outbox.ID, len(c.Messages))
	for i, m := range c.Messages {
		ids[i] = m.ID
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.MarkTimeout)
	defer cancel()
	n, err := retryOutcome(mctx, func() (int64, error) { return r.store.Unclaim(mctx, lease, ids, r.now()) })
	if err != nil {
		r.log.WarnContext(ctx, "a row relays died holding was not handed back; it waits for the batches in flight under its lease", "error", err)
		return false
	}
	return n == int64(len(ids))
}

// collect accounts for a finished batch.
func (d *drainer) collect(b batchDone) {
	d.inFlight--
	d.inFlightBytes -= b.bytes
	d.total.add(b.st)
	if b.err != nil {
		d.errs = append(d.errs, b.err)
	}
	if b.aborted {
		if d.abort == nil {
			d.abort = &b
		}
		d.errs = append(d.errs, errors.New("relay batch aborted"))
	}
	if def := b.st.deferred; def != nil && !d.logged {
		d.logged = true
		d.r.log.Warn("publishing deferred: the queue refused the request for a reason outside the messages; they are back in the outbox with no attempt spent",
			"reason", def.Reason, "until", d.r.paused(), "error", def.Error())
	}
}

// waitPause waits for a deferral's pause to end, stop, or a batch to finish (collected).
// It returns false, without waiting, when nothing could be claimed after the pause before
// work's deadline.
func (d *drainer) waitPause(stop, work context.Context, until time.Time) bool {
	if dl, ok := work.Deadline(); ok && until.After(dl.Add(-d.r.cfg.DeadlineMargin)) {
		d.total.PausedUntil = until
		return false
	}
	d.wait(stop, time.Until(until))
	return true
}

// wait waits for stop, for wait to pass, or for a batch to finish (collected).
func (d *drainer) wait(stop context.Context, wait time.Duration) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-stop.Done():
	case <-t.C:
	case b := <-d.done:
		d.collect(b)
	}
}

// finish waits for every batch in flight and returns the drain's errors. If a batch's
// goroutine aborted, it then ends the caller the same way, as if the batch had run on the
// caller's goroutine.
func (d *drainer) finish() error {
	for d.inFlight > 0 {
		d.collect(<-d.done)
	}
	if d.abort != nil {
		if d.abort.panicked != nil {
			panic(d.abort.panicked)
		}
		runtime.Goexit()
	}
	return errors.Join(d.errs...)
}

// budgetUse counts, for one drain, how the byte budgets shaped it.
type budgetUse struct {
	// cut: claims the byte budget ended before BatchSize rows; waits: times the drain
	// waited for a batch to finish because MaxInFlightBytes was (nearly) used up.
	cut, waits int
	// peak is the most payload bytes in flight at once; largest the largest claim.
	peak, largest int64
}

func (u *budgetUse) claimed(c outboxstore.Claimed, inFlightBytes int64) {
	if c.BytesCut {
		u.cut++
	}
	u.largest = max(u.largest, c.Bytes)
	u.peak = max(u.peak, inFlightBytes+c.Bytes)
}

// log writes one line per drain the budgets shaped: how to tell that a drain was slowed
// by memory, not by the database or the queue.
func (u *budgetUse) log(r *Relay) {
	if u.cut == 0 && u.waits == 0 {
		return
	}
	r.log.Info("byte budget limited the drain: batches were cut short or waited for memory; raise the function's memory (and IN_FLIGHT_BYTES) to drain large payloads faster",
		"batches_cut", u.cut, "in_flight_waits", u.waits, "peak_in_flight_bytes", u.peak, "largest_batch_bytes", u.largest,
		"max_batch_bytes", r.cfg.MaxBatchBytes, "max_in_flight_bytes", r.cfg.MaxInFlightBytes)
}

func (r *Relay) nearDeadline(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && time.Until(dl) < r.cfg.DeadlineMargin
}

func (r *Relay) now() *time.Time {
	if r.cfg.Now == nil {
		return nil
	}
	t := r.cfg.Now()
	return &t
}

// paused returns the instant before which nothing is claimed (zero: not paused).
func (r *Relay) paused() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pausedUntil
}

// deferUntil pauses claiming after a deferral: until d.Until, or a pause doubling from
// DeferPause when it names none, never longer than maxDeferPause, or MaxOutagePause for
// an outage.
func (r *Relay) deferUntil(d *publish.DeferError) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	limit := maxDeferPause
	if d.Reason == publish.DeferOutage {
		limit = MaxOutagePause
	}
	until := d.Until
	if until.IsZero() || !until.After(now) {
		pause := r.cfg.DeferPause << min(r.deferStreak, 20)
		if pause <= 0 || pause > limit {
			pause = limit
		}
		r.deferStreak++
		until = now.Add(pause)
	}
	until = minTime(until, now.Add(limit))
	if until.After(r.pausedUntil) {
		r.pausedUntil = until
	}
}

// rand calls Config.Rand for one batch at a time: batches in flight share it, and a
// caller's source (a seeded *rand.Rand) need not be safe for concurrent use.
func (r *Relay) rand() float64 {
	r.randMu.Lock()
	defer r.randMu.Unlock()
	return r.cfg.Rand()
}

// published ends a deferral streak: the queue takes messages again.
func (r *Relay) published() {
	r.mu.Lock()
	r.deferStreak = 0
	r.mu.Unlock()
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (r *Relay) claim(ctx context.Context, maxBytes int64) (outboxstore.Lease, outboxstore.Claimed, time.Time, error) {
	lease, err := outboxstore.NewLease()
	if err != nil {
		return lease, outboxstore.Claimed{}, time.Time{}, err
	}
	claimedAt := time.Now()
	// The claim's own bound: a drain's context has the Lambda deadline or none at all
	// (outboxctl relay), and a claim with none kept a process alive for minutes after
	// SIGTERM behind a pinned xmin horizon.
	cctx, cancel := context.WithTimeout(ctx, r.cfg.ClaimTimeout)
	defer cancel()
	// Closing a circuit whose probe was delivered wakes the events held behind it: read
	// before the claim, so the claim can take them (cached: at most one read a second),
	// within the claim's bound.
	r.circuits.current(cctx)
	// An event over MaxInFlightBytes is more than the drain may ever hold: the claim hands
	// it back to be dead-lettered rather than let it kill this process and the next.
	c, err := r.store.Claim(cctx, outboxstore.ClaimRequest{Lease: lease, Rows: r.cfg.BatchSize, KeyRun: r.inFlight, MaxBytes: maxBytes,
		MaxEventBytes: r.cfg.MaxInFlightBytes, MaxDeaths: r.cfg.MaxDeaths, For: r.cfg.Lease, Now: r.now()})
	if err != nil && outboxstore.SessionLost(err) {
		// The claim may have committed without its rows reaching us: give them back now,
		// on another connection, rather than let them wait for the lease and then count as
		// a relay death.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.MarkTimeout)
		if _, rerr := retryOutcome(rctx, func() (int64, error) { return r.store.ReleaseLease(rctx, lease) }); rerr != nil {
			r.log.WarnContext(ctx, "rows of a claim cut off not released; they come back when the lease ends", "error", rerr)
		}
		rcancel()
	}
	if errors.Is(err, outboxstore.ErrTimeout) && ctx.Err() == nil {
		err = fmt.Errorf("%w (the claim timeout, %v, is what the lease leaves after a publish and a mark; "+
			"a claim this slow usually walks dead rows vacuum cannot remove yet, held back by a long-open transaction or a "+
			"replication slot pinning the xmin horizon (outboxctl status names it), or waits on a lock on the outbox table)",
			err, r.cfg.ClaimTimeout)
	}
	return lease, c, claimedAt, err
}

// process publishes and marks one claimed batch, inside a batch span when tracing is on.
func (r *Relay) process(ctx context.Context, lease outboxstore.Lease, c outboxstore.Claimed, claimedAt time.Time) (Stats, error) {
	if r.cfg.Tracer != nil {
		return r.processTraced(ctx, lease, c, claimedAt)
	}
	return r.processBatch(ctx, lease, c, claimedAt)
}

// processBatch publishes and marks one claimed batch.
func (r *Relay) processBatch(ctx context.Context, lease outboxstore.Lease, c outboxstore.Claimed, claimedAt time.Time) (Stats, error) {
	st := Stats{Batches: 1, Claimed: c.Len(), more: c.More}
	// Publishing stops early enough that the outcome statements finish before the lease
	// ends (so no other relay takes the rows over meanwhile) and before ctx's deadline.
	pubDeadline := claimedAt.Add(r.cfg.Lease - r.cfg.MarkTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Add(-r.cfg.MarkTimeout).Before(pubDeadline) {
		pubDeadline = dl.Add(-r.cfg.MarkTimeout)
	}
	// Events of destinations whose consumer is down stay in the outbox (circuit.go).
	hold := r.holdOpenCircuits(ctx, r.cfg.ClaimTimeout, &c)
	out, unblocked := r.publishBatch(ctx, c, pubDeadline, &st)
	st.more = st.more || unblocked

	// The batch's outcome is recorded even if ctx was cancelled after the claim: marking
	// what was published avoids a duplicate publish; only a crash skips this.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.MarkTimeout)
	defer cancel()
	var err error
	if r.cfg.Tracer != nil {
		err = r.recordTraced(mctx, lease, out, &st)
	} else {
		err = r.record(mctx, lease, out, &st)
	}
	if herr := r.settleCircuits(mctx, lease, hold, out.published, &st); herr != nil {
		err = errors.Join(err, fmt.Errorf("record batch outcome: %w", herr))
	}
	return st, err
}

// publishBatch hands a claimed batch to the publisher: one call in publish mode, waves in
// fifo mode. Undecodable rows are dead-lettered, and in either mode an event whose earlier
// same-key event failed in this batch is released unsent, so it is never published before
// that failure is recorded. unblocked reports released events that are claimable again
// once the batch is marked (a dead letter frees their key, or a deferral's pause ends).
// The decisions are the pure steps in waves.go; this loop adds time, the pause and the
// publisher.
func (r *Relay) publishBatch(ctx context.Context, c outboxstore.Claimed, deadline time.Time, st *Stats) (out marks, unblocked bool) {
	pending, released := holdUndecodable(c.Undecodable, c.Messages)
	out.dead = append(out.dead, c.Undecodable...)
	out.released = released
	unblocked = len(released) > 0
	fifo := r.cfg.Ordering == publish.OrderingFIFO
	runs := keyRuns(pending, fifo)
	policy := retryPolicy{maxAttempts: r.cfg.MaxAttempts, base: r.cfg.BackoffBase, max: r.cfg.BackoffMax, rand: r.rand}
	for len(runs) > 0 {
		if time.Now().Before(r.paused()) {
			// Another batch was deferred: send nothing more until the pause ends.
			out.released = append(out.released, runIDs(runs)...)
			return out, true
		}
		if ctx.Err() != nil || time.Until(deadline) <= 0 {
			// Out of time: what is left goes back unsent, attempts uncounted.
			out.released = append(out.released, runIDs(runs)...)
			return out, unblocked
		}
		var wave []outbox.Message
		wave, runs = nextWave(runs, fifo)
		w := classify(wave, r.publish(ctx, wave, deadline, st), policy)
		out.add(w.marks)
		st.countDeferred(w.deferred)
		if len(w.deferred) > 0 {
			// One pause per call, however many messages it refused; the queue refused for
			// a reason outside the messages, so nothing more is sent.
			r.deferUntil(w.deferred[0])
			out.released = append(out.released, runIDs(runs)...)
			return out, true
		}
		if len(out.published) > 0 {
			r.published()
		}
		var freed bool
		runs, released, freed = advance(runs, w.held, w.freed)
		out.released = append(out.released, released...)
		unblocked = unblocked || freed
	}
	return out, unblocked
}

// publish calls the publisher once, guarding against a short result slice.
func (r *Relay) publish(ctx context.Context, batch []outbox.Message, deadline time.Time, st *Stats) []publish.Result {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
	if dl, ok := pctx.Deadline(); !ok || deadline.Before(dl) {
		var c2 context.CancelFunc
		pctx, c2 = context.WithDeadline(pctx, deadline)
		defer c2()
	}
	t0 := time.Now()
	var results []publish.Result
	if r.cfg.Tracer != nil {
		results = r.publishTraced(pctx, batch)
	} else {
		results = r.pub.Publish(pctx, batch)
	}
	st.PublishCalls++
	if len(st.PublishLatency) < maxLatencySamples {
		st.PublishLatency = append(st.PublishLatency, time.Since(t0))
	}
	if len(results) != len(batch) {
		r.log.ErrorContext(ctx, "publisher returned the wrong number of results; treating the batch as failed",
			"want", len(batch), "got", len(results))
		err := fmt.Errorf("publisher returned %d results for %d messages", len(results), len(batch))
		results = make([]publish.Result, len(batch))
		for i := range results {
			results[i] = publish.Result{Err: err}
		}
	}
	return results
}

// record runs one statement per outcome kind and counts what the lease still held.
func (r *Relay) record(ctx context.Context, lease outboxstore.Lease, out marks, st *Stats) error {
	now := r.now()
	var errs []error
	step := func(kind string, want int, n int64, err error, counter *int) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		*counter += int(n)
		if lost := want - int(n); lost > 0 {
			st.LeaseLost += lost
			r.log.WarnContext(ctx, "lease lost: another relay took these rows over; their outcome is discarded",
				"outcome", kind, "rows", lost, "lease", lease.String())
		}
	}
	n, err := retryOutcome(ctx, func() (int64, error) { return r.store.MarkDispatched(ctx, lease, out.published, now) })
	step("dispatched", len(out.published), n, err, &st.Dispatched)
	n, err = retryOutcome(ctx, func() (int64, error) { return r.store.Reschedule(ctx, lease, out.retries, now) })
	step("retried", len(out.retries), n, err, &st.Retried)
	n, err = retryOutcome(ctx, func() (int64, error) { return r.store.DeadLetter(ctx, lease, out.dead, now) })
	step("dead_lettered", len(out.dead), n, err, &st.DeadLettered)
	n, err = retryOutcome(ctx, func() (int64, error) { return r.store.Release(ctx, lease, out.released, now) })
	step("released", len(out.released), n, err, &st.Released)
	for _, f := range out.dead {
		r.log.ErrorContext(ctx, "outbox event dead-lettered", "outbox_id", int64(f.ID), "status_code", f.StatusCode, "error", f.Error)
	}
	if len(errs) > 0 {
		return fmt.Errorf("record batch outcome: %w", errors.Join(errs...))
	}
	return nil
}

// retryOutcome runs an outcome statement again, on another connection, when its session
// was lost (a terminated backend, a failover, a reset connection), until ctx (the mark
// timeout) ends. Each statement is conditioned on the lease, so running it twice changes
// nothing more. Without this, a relay that merely lost a connection left its rows leased
// as a dead process does, and the next claim counted a relay death against them
// (MaxDeaths dead-letters a row after three).
func retryOutcome(ctx context.Context, f func() (int64, error)) (int64, error) {
	wait := 20 * time.Millisecond
	for {
		n, err := f()
		if err == nil || !outboxstore.SessionLost(err) || ctx.Err() != nil {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

func errText(err error) string {
	const maxLen = 2000
	s := err.Error()
	if len(s) > maxLen {
		s = s[:maxLen] + "…"
	}
	return s
}
