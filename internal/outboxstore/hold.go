package outboxstore

import (
	"context"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// HeldError is the last_error of a row the relay holds because its destination's circuit
// is open (or an earlier event of its key is held): Hold writes it, and the wakes find the
// rows by it when a circuit closes.
const HeldError = "held: the consumer of this topic (or of an earlier event of this key) is down; the relay probes it and resumes on the first delivery"

// Statements for holding rows behind an open circuit (pkg/relay, circuit.go). Kept apart
// from the claim: they run after it, on rows it leased, and do not change which rows it
// may take (a held row is a row available later, as after a backoff).
const (
	// qHold returns claimed rows unsent without counting an attempt, as qRelease does, but
	// available only at $3 and with last_error HeldError ($4), so the claim leaves them
	// (and, through their key's head, every later event of their key) alone until then.
	qHold = `
UPDATE outbox
SET available_at = $3::timestamptz, attempts = attempts - 1, locked_until = NULL, lease_token = NULL, last_error = $4::text
WHERE id = ANY($1::bigint[]) AND lease_token = $2`

	// qWakeHeldIfClosed makes every held row (last_error $1) available now when no circuit
	// is open: a relay that held rows while another closed the last circuit (and woke what
	// was held then) runs it after its hold, so its rows do not sleep on. The update's own
	// time, as a redrive's (walk.go), and only rows not leased. With a circuit open the
	// NOT EXISTS is false and nothing is read.
	qWakeHeldIfClosed = `
UPDATE outbox
SET available_at = clock_timestamp()
WHERE NOT EXISTS (SELECT 1 FROM outbox_circuits)
  AND dispatched_at IS NULL AND dead_lettered_at IS NULL AND last_error = $1::text
  AND available_at > clock_timestamp() AND lease_token IS NULL`
)

// Hold returns claimed rows ids unsent, their attempt uncounted, available again at until
// and marked HeldError. It returns how many rows the lease still held.
func (s *Store) Hold(ctx context.Context, lease Lease, ids []outbox.ID, until time.Time) (int64, error) {
	return s.settle(ctx, len(ids), "hold outbox rows", qHold, ids, lease.Token, until, HeldError)
}

// WakeHeldIfClosed makes every row Hold held available now if no circuit is open, and
// returns how many it woke.
func (s *Store) WakeHeldIfClosed(ctx context.Context) (int64, error) {
	tag, err := s.exec(ctx, qWakeHeldIfClosed, HeldError)
	if err != nil {
		return 0, circuitErr("wake held outbox rows", err)
	}
	return tag.RowsAffected(), nil
}
