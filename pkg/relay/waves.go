package relay

import (
	"errors"
	"fmt"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// The steps of publishBatch that decide, apart from the clock, the pause and the publisher:
// each takes and returns plain values, so a table test covers the batch logic without a
// database.

// marks collects a batch's results for the statements that mark its rows: what the
// relay did with each message (published, retried, dead-lettered, released).
type marks struct {
	published []outbox.ID
	retries   []outboxstore.Retry
	dead      []outboxstore.Failure
	released  []outbox.ID
}

func (o *marks) add(p marks) {
	o.published = append(o.published, p.published...)
	o.retries = append(o.retries, p.retries...)
	o.dead = append(o.dead, p.dead...)
	o.released = append(o.released, p.released...)
}

// holdUndecodable returns the messages that may be sent, and the ids of those released
// unsent because an undecodable row of their key, with a smaller id, is dead-lettered in
// this batch: a key's later event never overtakes its failure. undecodable is in id order.
func holdUndecodable(undecodable []outboxstore.Failure, msgs []outbox.Message) (pending []outbox.Message, released []outbox.ID) {
	if len(undecodable) == 0 {
		return msgs, nil
	}
	held := make(map[string]outbox.ID, len(undecodable)) // key -> smallest id whose failure holds it
	for _, f := range undecodable {
		if _, ok := held[f.PartitionKey]; !ok {
			held[f.PartitionKey] = f.ID
		}
	}
	pending = make([]outbox.Message, 0, len(msgs))
	for _, m := range msgs {
		if h, ok := held[m.PartitionKey]; ok && m.ID > h {
			released = append(released, m.ID)
			continue
		}
		pending = append(pending, m)
	}
	return pending, released
}

// keyRuns groups pending (in id order) for sending. In fifo mode each run is one key's
// events in id order, runs in order of their key's first event; in publish mode, which
// sends everything at once, one run holds it all.
func keyRuns(pending []outbox.Message, fifo bool) [][]outbox.Message {
	if len(pending) == 0 {
		return nil
	}
	if !fifo {
		return [][]outbox.Message{pending}
	}
	var runs [][]outbox.Message
	byKey := make(map[string]int) // key -> index in runs
	for _, m := range pending {
		i, ok := byKey[m.PartitionKey]
		if !ok {
			i = len(runs)
			byKey[m.PartitionKey] = i
			runs = append(runs, nil)
		}
		runs[i] = append(runs[i], m)
	}
	return runs
}

// nextWave returns the messages of the next publish call and the runs left after it: in
// fifo mode the first event of every run, in publish mode the one run whole (in id order,
// so each key's events too). runs is not modified.
func nextWave(runs [][]outbox.Message, fifo bool) (wave []outbox.Message, rest [][]outbox.Message) {
	if !fifo {
		return runs[0], nil
	}
	wave = make([]outbox.Message, len(runs))
	rest = make([][]outbox.Message, len(runs))
	for i, run := range runs {
		wave[i], rest[i] = run[0], run[1:]
	}
	return wave, rest
}

// retryPolicy is what classify needs of the configuration to reschedule a failure.
type retryPolicy struct {
	maxAttempts int
	base, max   time.Duration
	// rand returns a number in [0, 1) for the backoff's jitter; called once per retry.
	rand func() float64
}

// waveDecision is what one publish call's results decide.
type waveDecision struct {
	marks
	// deferred holds each deferral in wave order: those messages were released with no
	// attempt spent, and nothing more of the batch may be sent.
	deferred []*publish.DeferError
	// held are the keys with an event that failed: their later events wait until that
	// outcome is recorded. freed are those of them dead-lettered, whose later events are
	// claimable again once the batch is marked.
	held, freed map[string]bool
}

// classify turns a wave's results (one per message, in order) into outcomes. A retryable
// failure at policy.maxAttempts is dead-lettered instead of rescheduled.
func classify(wave []outbox.Message, results []publish.Result, policy retryPolicy) waveDecision {
	w := waveDecision{held: map[string]bool{}, freed: map[string]bool{}}
	for i, m := range wave {
		res := results[i]
		switch res.Outcome() {
		case publish.Published:
			w.published = append(w.published, m.ID)
		case publish.Deferred:
			// Not attempted: back to pending with the attempt uncounted.
			w.released = append(w.released, m.ID)
			var d *publish.DeferError
			errors.As(res.Err, &d)
			w.deferred = append(w.deferred, d)
		case publish.PermanentFailure:
			w.dead = append(w.dead, outboxstore.Failure{ID: m.ID, PartitionKey: m.PartitionKey, Error: errText(res.Err), StatusCode: publish.StatusCode(res.Err)})
			w.held[m.PartitionKey], w.freed[m.PartitionKey] = true, true
		case publish.Retryable:
			w.held[m.PartitionKey] = true
			if m.Attempt >= policy.maxAttempts {
				w.dead = append(w.dead, outboxstore.Failure{
					ID:           m.ID,
					PartitionKey: m.PartitionKey,
					Error:        fmt.Sprintf("retry budget exhausted after %d attempts: %s", m.Attempt, errText(res.Err)),
					StatusCode:   publish.StatusCode(res.Err),
				})
				w.freed[m.PartitionKey] = true
				continue
			}
			w.retries = append(w.retries, outboxstore.Retry{
				ID:    m.ID,
				Delay: backoff(m.Attempt, policy.base, policy.max, policy.rand()),
				Error: errText(res.Err),
			})
		}
	}
	return w
}

// advance drops the runs that are fully sent and releases those whose key is held (their
// next event waits for the failure's outcome to be recorded). freed reports a released
// run whose key was dead-lettered, so it is claimable again once the batch is marked.
func advance(runs [][]outbox.Message, held, dead map[string]bool) (next [][]outbox.Message, released []outbox.ID, freed bool) {
	for _, run := range runs {
		if len(run) == 0 {
			continue
		}
		if k := run[0].PartitionKey; held[k] {
			for _, m := range run {
				released = append(released, m.ID)
			}
			freed = freed || dead[k]
			continue
		}
		next = append(next, run)
	}
	return next, released, freed
}

// runIDs returns the ids of every message in runs, for a release of what was not sent.
func runIDs(runs [][]outbox.Message) []outbox.ID {
	var ids []outbox.ID
	for _, run := range runs {
		for _, m := range run {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// countDeferred counts deferrals by reason and keeps the first for the drain's log line.
func (s *Stats) countDeferred(ds []*publish.DeferError) {
	for _, d := range ds {
		switch d.Reason {
		case publish.DeferQuota:
			s.DeferredQuota++
		case publish.DeferDeployment:
			s.DeferredDeployment++
		case publish.DeferOutage:
			s.DeferredOutage++
		}
		if s.deferred == nil {
			s.deferred = d
		}
	}
}
