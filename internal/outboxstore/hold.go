package outboxstore

import (
	"context"
	"time"

	"github.com/outbox-relay/outbox-relay/v2/pkg/outbox"
)

// HeldError is the last_error of a row the relay holds because its destination's circuit
// is open (or an earlier event of its key is held): Hold writes it, and WakeHeld finds the
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

	// qWakeHeld makes every held row (last_error $1) available now: a circuit closed. The
	// update's own time, as a redrive's (internal/outboxstore, walk.go), and only rows not
	// leased; rows of circuits still open are claimed and held again.
	qWakeHeld = `
UPDATE outbox
SET available_at = clock_timestamp()
WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL AND last_error = $1::text
  AND available_at > clock_timestamp() AND lease_token IS NULL`
)

// Hold returns claimed rows ids unsent, their attempt uncounted, available again at until
// and marked HeldError. It returns how many rows the lease still held.
func (s *Store) Hold(ctx context.Context, lease Lease, ids []outbox.ID, until time.Time) (int64, error) {
	return s.settle(ctx, len(ids), "hold outbox rows", qHold, ids, lease.Token, until, HeldError)
}

// WakeHeld makes every row Hold held available now, and returns how many it woke.
func (s *Store) WakeHeld(ctx context.Context) (int64, error) {
	return s.settle(ctx, 1, "wake held outbox rows", qWakeHeld, HeldError)
}
