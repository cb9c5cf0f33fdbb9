// Package relay drains the outbox: claim a batch under a lease, publish it outside any
// transaction, then record every outcome with one statement per kind, fenced by the lease.
//
// Per-key FIFO: an event is never handed to the Publisher while an earlier event with the
// same partition key is pending (leased or backing off); it waits until that event is
// dispatched or dead-lettered. The claim statement enforces this across relays (see
// outbox.Store.Claim). Within a batch, a key's events go out in id order in successive
// Publish calls ("waves": the first event of every key, then the second, ...); when one
// fails retryably, its key's later events are released unsent and wait behind it, while
// other keys keep flowing. A batch whose keys are all distinct is one Publish call.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outbox-relay/outbox-relay/pkg/outbox"
)

// Relay drains one outbox table through one Publisher. It is safe to run many relays, in
// one process or many, against the same table.
type Relay struct {
	store *outbox.Store
	pub   Publisher
	db    outbox.Querier
	cfg   Config
	log   *slog.Logger
}

// New returns a Relay over db (a *pgxpool.Pool) and pub, or the config's errors.
func New(db outbox.Querier, pub Publisher, cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if db == nil || pub == nil {
		return nil, errors.New("relay: database and publisher are required")
	}
	return &Relay{store: outbox.NewStore(db), pub: pub, db: db, cfg: cfg, log: cfg.Logger}, nil
}

// Config returns the effective configuration (defaults applied).
func (r *Relay) Config() Config { return r.cfg }

// Stats counts what a drain did.
type Stats struct {
	Batches      int
	Claimed      int
	Dispatched   int
	Retried      int
	DeadLettered int
	// Released were claimed but not sent (held behind a failed same-key event, or out of
	// time); they are pending again with their attempt uncounted.
	Released int
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
	Duration          time.Duration

	// more: the last claim may have left ready rows behind (see outbox.Store.Claim).
	more bool
}

const maxLatencySamples = 100

func (s *Stats) add(o Stats) {
	s.Batches += o.Batches
	s.Claimed += o.Claimed
	s.Dispatched += o.Dispatched
	s.Retried += o.Retried
	s.DeadLettered += o.DeadLettered
	s.Released += o.Released
	s.LeaseLost += o.LeaseLost
	s.PublishCalls += o.PublishCalls
	for _, l := range o.PublishLatency {
		if len(s.PublishLatency) < maxLatencySamples {
			s.PublishLatency = append(s.PublishLatency, l)
		}
	}
}

// LogValue renders the counts for slog.
func (s Stats) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Int("batches", s.Batches), slog.Int("claimed", s.Claimed),
		slog.Int("dispatched", s.Dispatched), slog.Int("retried", s.Retried),
		slog.Int("dead_lettered", s.DeadLettered), slog.Int("released", s.Released),
		slog.Int("lease_lost", s.LeaseLost), slog.Int("publish_calls", s.PublishCalls),
		slog.Bool("stopped_at_deadline", s.StoppedAtDeadline),
		slog.Int64("duration_ms", s.Duration.Milliseconds()))
}

// Drain runs batches until one comes back short (fewer rows than BatchSize and every ready
// row seen, or nothing claimable at all), ctx is done,
// or less than DeadlineMargin is left before ctx's deadline. A batch that was claimed is
// always published and marked before Drain returns: its outcome statements run even if
// ctx is cancelled meanwhile. An error (database down) leaves unmarked rows leased; they
// become ready again when the lease ends.
func (r *Relay) Drain(ctx context.Context) (Stats, error) {
	start := time.Now()
	var total Stats
	err := r.drain(ctx, ctx, &total)
	total.Duration = time.Since(start)
	return total, err
}

// drain runs batches under work until one comes back short, stop is done, or work's
// deadline is within DeadlineMargin.
func (r *Relay) drain(stop, work context.Context, total *Stats) error {
	for stop.Err() == nil {
		if r.nearDeadline(work) {
			total.StoppedAtDeadline = true
			return nil
		}
		st, err := r.Batch(work)
		total.add(st)
		if err != nil {
			return err
		}
		if !st.more {
			return nil
		}
	}
	return nil
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

// outcome collects a batch's results for the outcome statements.
type outcome struct {
	published []outbox.ID
	retries   []outbox.Retry
	dead      []outbox.Failure
	released  []outbox.ID
}

// Batch claims, publishes and marks one batch.
func (r *Relay) Batch(ctx context.Context) (Stats, error) {
	st := Stats{Batches: 1}
	lease, err := outbox.NewLease()
	if err != nil {
		return st, err
	}
	claimedAt := time.Now()
	msgs, more, err := r.store.Claim(ctx, lease, r.cfg.BatchSize, r.cfg.Lease, r.now())
	if err != nil {
		return st, err
	}
	st.more = more
	st.Claimed = len(msgs)
	if len(msgs) == 0 {
		return st, nil
	}

	// Publishing stops early enough that the outcome statements finish before the lease
	// ends (so no other relay takes the rows over meanwhile) and before ctx's deadline.
	pubDeadline := claimedAt.Add(r.cfg.Lease - r.cfg.MarkTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Add(-r.cfg.MarkTimeout).Before(pubDeadline) {
		pubDeadline = dl.Add(-r.cfg.MarkTimeout)
	}
	out := r.publishWaves(ctx, msgs, pubDeadline, &st)

	// The batch's outcome is recorded even if ctx was cancelled after the claim: marking
	// what was published avoids a duplicate publish; only a crash skips this.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.MarkTimeout)
	defer cancel()
	err = r.record(mctx, lease, out, &st)
	return st, err
}

// publishWaves hands msgs (sorted by id) to the publisher in waves that keep per-key order.
func (r *Relay) publishWaves(ctx context.Context, msgs []outbox.Message, deadline time.Time, st *Stats) outcome {
	var out outcome
	// Group by key, keeping id order inside each key and first-appearance order of keys.
	order := make([]string, 0, len(msgs))
	byKey := make(map[string][]outbox.Message, len(msgs))
	for _, m := range msgs {
		if _, ok := byKey[m.PartitionKey]; !ok {
			order = append(order, m.PartitionKey)
		}
		byKey[m.PartitionKey] = append(byKey[m.PartitionKey], m)
	}
	blocked := make(map[string]bool)
	for wave := 0; ; wave++ {
		var batch []outbox.Message
		for _, k := range order {
			if ms := byKey[k]; wave < len(ms) && !blocked[k] {
				batch = append(batch, ms[wave])
			}
		}
		if len(batch) == 0 {
			break
		}
		if ctx.Err() != nil || time.Until(deadline) <= 0 {
			// Out of time: what is left goes back unsent, attempts uncounted.
			for _, k := range order {
				if ms := byKey[k]; wave < len(ms) && !blocked[k] {
					for _, m := range ms[wave:] {
						out.released = append(out.released, m.ID)
					}
				}
			}
			break
		}
		results := r.publish(ctx, batch, deadline, st)
		for i, m := range batch {
			res := results[i]
			switch res.Outcome() {
			case Published:
				out.published = append(out.published, m.ID)
			case Deferred:
				// Not attempted: back to pending with the attempt uncounted, and the key's
				// later events wait behind it.
				blocked[m.PartitionKey] = true
				for _, later := range byKey[m.PartitionKey][wave:] {
					out.released = append(out.released, later.ID)
				}
			case PermanentFailure:
				out.dead = append(out.dead, outbox.Failure{ID: m.ID, Error: errText(res.Err), StatusCode: StatusCode(res.Err)})
			case Retryable:
				if m.Attempt >= r.cfg.MaxAttempts {
					out.dead = append(out.dead, outbox.Failure{
						ID:         m.ID,
						Error:      fmt.Sprintf("retry budget exhausted after %d attempts: %s", m.Attempt, errText(res.Err)),
						StatusCode: StatusCode(res.Err),
					})
					continue
				}
				out.retries = append(out.retries, outbox.Retry{
					ID:    m.ID,
					Delay: Backoff(m.Attempt, r.cfg.BackoffBase, r.cfg.BackoffMax, r.cfg.Rand()),
					Error: errText(res.Err),
				})
				// Later events of this key must wait behind the failed one.
				blocked[m.PartitionKey] = true
				for _, later := range byKey[m.PartitionKey][wave+1:] {
					out.released = append(out.released, later.ID)
				}
			}
		}
	}
	return out
}

// publish calls the publisher once, guarding against a short result slice.
func (r *Relay) publish(ctx context.Context, batch []outbox.Message, deadline time.Time, st *Stats) []Result {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
	if dl, ok := pctx.Deadline(); !ok || deadline.Before(dl) {
		var c2 context.CancelFunc
		pctx, c2 = context.WithDeadline(pctx, deadline)
		defer c2()
	}
	t0 := time.Now()
	results := r.pub.Publish(pctx, batch)
	st.PublishCalls++
	if len(st.PublishLatency) < maxLatencySamples {
		st.PublishLatency = append(st.PublishLatency, time.Since(t0))
	}
	if len(results) != len(batch) {
		r.log.Error("publisher returned the wrong number of results; treating the batch as failed",
			"want", len(batch), "got", len(results))
		err := fmt.Errorf("publisher returned %d results for %d messages", len(results), len(batch))
		results = make([]Result, len(batch))
		for i := range results {
			results[i] = Result{Err: err}
		}
	}
	return results
}

// record runs one statement per outcome kind and counts what the lease still held.
func (r *Relay) record(ctx context.Context, lease outbox.Lease, out outcome, st *Stats) error {
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
			r.log.Warn("lease lost: another relay took these rows over; their outcome is discarded",
				"outcome", kind, "rows", lost, "lease", lease.String())
		}
	}
	n, err := r.store.MarkDispatched(ctx, lease, out.published, now)
	step("dispatched", len(out.published), n, err, &st.Dispatched)
	n, err = r.store.Reschedule(ctx, lease, out.retries, now)
	step("retried", len(out.retries), n, err, &st.Retried)
	n, err = r.store.DeadLetter(ctx, lease, out.dead, now)
	step("dead_lettered", len(out.dead), n, err, &st.DeadLettered)
	n, err = r.store.Release(ctx, lease, out.released, now)
	step("released", len(out.released), n, err, &st.Released)
	for _, f := range out.dead {
		r.log.Error("outbox event dead-lettered", "outbox_id", int64(f.ID), "status_code", f.StatusCode, "error", f.Error)
	}
	if len(errs) > 0 {
		return fmt.Errorf("record batch outcome: %w", errors.Join(errs...))
	}
	return nil
}

func errText(err error) string {
	const maxLen = 2000
	s := err.Error()
	if len(s) > maxLen {
		s = s[:maxLen] + "…"
	}
	return s
}
