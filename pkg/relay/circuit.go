package relay

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// A circuit per destination (topic) holds a down consumer's events in the outbox instead
// of feeding them to QStash's retry ladder (docs/reliability.md, "Consumer outage"). The
// failure callback opens it, when QStash gives up on a delivery for a transient reason,
// and reopens that event; the relay then holds the topic's claimed events, publishes one
// probe when the circuit's schedule says, and closes the circuit when the probe was
// delivered, waking every held event at once.
//
//	mechanism                    saves                        puts at risk        restored by                                     pinned by
//	hold after the claim         the claim stays one plain    per-key order       later same-key events of the batch are held     TestCircuitOpenProbeClose
//	(not a claim filter)         statement (qClaim unchanged)                     too, and a held head holds its key in the
//	                                                                              claim; a probe in flight holds its key
//	held rows sleep              a claim and a hold per held  recovery latency    closing wakes every held row in the same        TestCircuitOpenProbeClose,
//	circuitHoldMax               row per drain during an                          statement; a hold after the last circuit        TestConsumerOutageCostsAWait
//	                             outage                                           closed wakes its rows itself
//	                                                          a probe waiting     a due probe wakes its candidate (qWakeProbe)
//	                                                          for a held head
//	one probe per circuit        billed attempts during       a probe slot held   one QStash attempt; its callback frees the      TestCircuitOpenProbeClose
//	(qTakeProbe, one slot)       the outage                   forever             slot; an unpublished probe's slot is dropped;
//	                                                                              a stale one is freed by qCloseCircuits
//	close on "delivered"         knowing without a success    closing into an     the outage's failures reopen the circuit and    TestConsumerOutageCostsAWait
//	(processed_messages, 489,    callback                     outage              their events; nothing is dead-lettered
//	or no failure in horizon)

// Circuit timing. defaultCircuitRefresh bounds how often a relay reads the circuits (one small
// statement; its DELETE finds nothing while none is open); circuitHoldMax how long a held
// event sleeps before it is claimed (and held) again: the closing wakes it, so this only
// bounds a missed wake, and sets how often a long outage's backlog is walked; DefaultProbeHorizon
// how long after its publish a probe with no failure callback counts as delivered, when
// the consumer's commit is not visible in this database: a probe has one attempt, so its
// callback comes after QStash's delivery timeout and the callback's own delivery.
const (
	defaultCircuitRefresh = time.Second
	circuitHoldMax        = 5 * time.Minute
	DefaultProbeHorizon   = 3 * time.Minute
)

// breaker is a relay's view of the open circuits, read at most every refresh.
type breaker struct {
	store   *outboxstore.Store
	log     *slog.Logger
	horizon time.Duration
	refresh time.Duration

	mu     sync.Mutex
	readAt time.Time
	open   map[string]outboxstore.Circuit
	// reading: a caller is reading the table; the others use the view as it is.
	// forgotten: forget was called during that read.
	reading, forgotten bool
}

// noCircuitsRecheck is how long a relay on a schema without the circuit table (before
// migration 0018) waits before it looks again: nothing opens a circuit there, and a
// long-lived relay sees the table a minute after `migrate up` at the latest.
const noCircuitsRecheck = time.Minute

// current returns the open circuits by topic, refreshed when older than its refresh. A
// failed read keeps the last view: the claim that follows fails too if the database is
// down, and a stale view only holds or releases for one more second. One caller reads at a
// time, outside the lock: the others take the view as it is rather than queue behind the
// read (under a pinned horizon a read waited on took claims of every batch in flight from
// a few milliseconds to a second).
func (b *breaker) current(ctx context.Context) map[string]outboxstore.Circuit {
	b.mu.Lock()
	if b.reading || time.Since(b.readAt) < b.refresh {
		open := b.open
		b.mu.Unlock()
		return open
	}
	b.reading = true
	b.mu.Unlock()
	open, readAt := b.read(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.open, b.readAt = open, readAt
	if b.forgotten {
		// forget was called during the read, which may have begun before what it was
		// told to forget: the next caller reads again.
		b.readAt = time.Time{}
	}
	b.reading, b.forgotten = false, false
	return open
}

// read reads the open circuits (closing those whose probe was delivered) and says when to
// count the view from; on a failed read it returns the last view.
func (b *breaker) read(ctx context.Context) (map[string]outboxstore.Circuit, time.Time) {
	b.mu.Lock()
	last := b.open
	b.mu.Unlock()
	// Half of what the caller allows at most: behind a lock on the outbox table (a
	// migration) this read waits as the claim does, and must not leave the claim after it
	// no time at all.
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Until(dl)/2)
		defer cancel()
	}
	open, closed, err := b.store.Circuits(ctx, b.horizon)
	for _, cl := range closed {
		c := last[cl.Topic]
		b.log.InfoContext(ctx, "consumer circuit closed: a probe was delivered; held events resume",
			"topic", cl.Topic, "why", cl.Why, "open_for_ms", time.Since(c.OpenedAt).Milliseconds())
	}
	switch {
	case errors.Is(err, outboxstore.ErrNoCircuits):
		return nil, time.Now().Add(noCircuitsRecheck - b.refresh)
	case err != nil:
		// Not again before the refresh: each retry would take its share of a claim.
		b.log.WarnContext(ctx, "consumer circuits not read; keeping the last view", "error", err)
		return last, time.Now()
	}
	readAt := time.Now()
	m := make(map[string]outboxstore.Circuit, len(open))
	for _, c := range open {
		if _, was := last[c.Topic]; !was {
			b.log.WarnContext(ctx, "consumer circuit open: holding the topic's events in the outbox and probing",
				"topic", c.Topic, "opened_at", c.OpenedAt)
		}
		m[c.Topic] = c
		if !c.ProbeInFlight && c.ProbeIn <= 0 {
			// The probe is due: its candidate may be asleep behind a hold.
			if err := b.store.WakeProbe(ctx, c.Topic); err != nil {
				b.log.WarnContext(ctx, "consumer circuit probe candidate not woken", "topic", c.Topic, "error", err)
			}
		}
	}
	return m, readAt
}

// forget drops the cached view, so the next current reads the table.
func (b *breaker) forget() {
	b.mu.Lock()
	b.readAt, b.forgotten = time.Time{}, b.reading
	b.mu.Unlock()
}

// probe is a probe event this batch publishes for its topic's circuit.
type probe struct {
	topic string
	id    outbox.ID
}

// circuitHold is what the open circuits do to one claimed batch.
type circuitHold struct {
	held   []outbox.ID
	until  time.Time
	probes []probe
}

// holdOpenCircuits takes out of c the events of topics whose circuit is open, and every
// later event of their keys in the batch, so no key moves past a held event. Per open
// topic whose probe is due, the first event that is not behind a held one of its key
// becomes the probe, if this relay wins the probe slot: it is published (Probe set) and
// its key's later events, of any topic, are held until it is delivered. Held events wait until the
// next probe is due, at most circuitHoldMax, or until the circuit closes.
// Its statements are bounded by timeout (a relay statement is never unbounded).
func (r *Relay) holdOpenCircuits(ctx context.Context, timeout time.Duration, c *outboxstore.Claimed) circuitHold {
	var h circuitHold
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	open := r.circuits.current(ctx)
	if len(open) == 0 {
		return h
	}
	heldKeys := make(map[string]bool)
	probing := make(map[string]bool)
	for _, circuit := range open {
		if circuit.ProbeInFlight {
			// Published, not yet delivered: should it fail, it is reopened, and its key's
			// later events (of any topic) must not have gone before it.
			heldKeys[circuit.ProbeKey] = true
		}
	}
	kept := c.Messages[:0:0]
	for _, m := range c.Messages {
		circuit, isOpen := open[m.Topic]
		switch {
		case heldKeys[m.PartitionKey]:
		case !isOpen:
			kept = append(kept, m)
			continue
		case !probing[m.Topic] && !circuit.ProbeInFlight && circuit.ProbeIn <= 0 && r.takeProbe(ctx, m):
			probing[m.Topic] = true
			m.Probe = true
			kept = append(kept, m)
			h.probes = append(h.probes, probe{topic: m.Topic, id: m.ID})
			heldKeys[m.PartitionKey] = true
			continue
		}
		heldKeys[m.PartitionKey] = true
		h.held = append(h.held, m.ID)
	}
	if len(h.probes) > 0 {
		r.circuits.forget()
	}
	c.Messages = kept
	base := time.Now()
	if now := r.now(); now != nil {
		base = *now
	}
	h.until = base.Add(circuitHoldMax)
	return h
}

// takeProbe claims the probe slot of m's topic for m.
func (r *Relay) takeProbe(ctx context.Context, m outbox.Message) bool {
	ok, err := r.store.TakeProbe(ctx, m.Topic, int64(m.ID), m.Generation)
	if err != nil {
		r.log.WarnContext(ctx, "consumer circuit probe not taken", "topic", m.Topic, "outbox_id", int64(m.ID), "error", err)
		return false
	}
	if ok {
		r.log.InfoContext(ctx, "consumer circuit probe: publishing one event", "topic", m.Topic, "outbox_id", int64(m.ID))
	}
	return ok
}

// settleCircuits holds the batch's held events and frees the slot of every probe that
// was not published (QStash refused it, or time ran out), so the next can go.
func (r *Relay) settleCircuits(ctx context.Context, lease outboxstore.Lease, h circuitHold, published []outbox.ID, st *Stats) error {
	var errs []error
	if len(h.held) > 0 {
		n, err := r.store.Hold(ctx, lease, h.held, h.until)
		if err != nil {
			errs = append(errs, err)
		}
		st.Released += int(n)
		// The last circuit may have closed (and woken what was held) since this batch
		// read it open.
		if _, err := r.store.WakeHeldIfClosed(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range h.probes {
		if slices.Contains(published, p.id) {
			continue
		}
		if err := r.store.DropProbe(ctx, p.topic, int64(p.id)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
