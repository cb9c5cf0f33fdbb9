package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
)

// Permanent reports whether the delivery failed for the event's own fault: the destination
// answered 489, or set Upstash-NonRetryable-Error: true (QStash's non-retryable answer, and
// the webhook's for an event a retry cannot fix). Every other final failure (a 5xx, a
// timeout or connection error: status 0, a 429, or any other status) says the destination
// was not ready, not that the event is bad: an outage, which the failure callback
// reschedules instead of dead-lettering (docs/reliability.md, "Consumer outage").
func (f DeliveryFailure) Permanent() bool {
	if f.Status == receive.StatusNonRetryable {
		return true
	}
	for name, values := range f.ResponseHeader {
		if !strings.EqualFold(name, receive.HeaderNonRetryable) {
			continue
		}
		for _, v := range values {
			if strings.EqualFold(strings.TrimSpace(v), "true") {
				return true
			}
		}
	}
	return false
}

// keyOrderCode is the webhook's error code for a delivery it held behind its key's failed
// previous event (pkg/webhook, keyorder.go).
const keyOrderCode = "key_order"

// heldForKeyOrder reports whether the destination answered last that it holds the event
// behind its key's previous one (503, {"error":"key_order"}): not an outage, so Reopen
// opens no circuit for it.
func (f DeliveryFailure) heldForKeyOrder() bool {
	if f.Status != http.StatusServiceUnavailable {
		return false
	}
	var body struct {
		Error string `json:"error"`
	}
	return json.Unmarshal(f.ResponseBody, &body) == nil && body.Error == keyOrderCode
}

// Reopen states, Rescheduled.State.
const (
	// ReopenDone: the row went back to pending under a new generation.
	ReopenDone = "reopened"
	// ReopenNoRow: no outbox row to reopen (unknown id, or deleted by retention); only a
	// dead letter keeps the event.
	ReopenNoRow = "no_row"
	// ReopenElsewhere: the row has left the failed generation (redriven or rescheduled
	// since: a repeated or late callback) or is dead-lettered: Record decides (superseded
	// history, or the existing letter).
	ReopenElsewhere = "elsewhere"
)

// Rescheduled is Reopen's result.
type Rescheduled struct {
	// State is one of the Reopen* values.
	State string
	// Generation is the row's generation after the statement (the new one when reopened).
	Generation int
	// Topic is the row's topic (empty without a row).
	Topic string
}

// The default probe schedule of a destination's circuit (docs/reliability.md, "Consumer
// outage"): the relay publishes the first probe CircuitProbeWait after the circuit opens,
// and each failed probe doubles the wait before the next, up to CircuitProbeMaxWait. The
// maximum bounds how late a recovered consumer is noticed: at most this plus one probe's
// delivery.
const (
	CircuitProbeWait    = 5 * time.Second
	CircuitProbeMaxWait = time.Minute
)

// ProbeSchedule is when a circuit's probes go: Wait after it opens, doubling after each
// failed probe up to MaxWait. Zero fields take CircuitProbeWait and CircuitProbeMaxWait.
type ProbeSchedule struct {
	Wait, MaxWait time.Duration
}

func (s ProbeSchedule) withDefaults() ProbeSchedule {
	if s.Wait <= 0 {
		s.Wait = CircuitProbeWait
	}
	if s.MaxWait <= 0 {
		s.MaxWait = CircuitProbeMaxWait
	}
	s.MaxWait = max(s.MaxWait, s.Wait)
	return s
}

// reopenTries bounds how often a Reopen statement that lost a deadlock runs again.
const reopenTries = 3

// Reopen puts the outbox row of a transiently failed delivery back to pending, in one
// statement: attempts 0, available now, generation+1 so the relay's re-publish carries a
// deduplication id QStash has not seen (as Redrive does), last_error the failure. Only a row
// at the failed generation (f.Generation; nil: the row's current one) and not dead-lettered
// is reopened, so a repeated callback finds the row at a newer generation and changes
// nothing. A row its relay has not marked yet (the callback came first) loses its lease:
// the relay's mark then changes nothing, and the row goes out again under the new
// generation. The relay then re-publishes it like any pending event: its key's later
// events wait behind it again, so per-key order holds for everything not yet published.
// In the same statement it opens the circuit of the row's topic (migration 0018; on an
// older schema the row is only reopened), so the relay holds the topic and probes it; a
// failed probe frees the probe slot and doubles the wait before the next (probes; the
// zero value is the default schedule).
func Reopen(ctx context.Context, db Querier, f DeliveryFailure, probes ProbeSchedule) (Rescheduled, error) {
	probes = probes.withDefaults()
	if f.OutboxID <= 0 {
		return Rescheduled{State: ReopenNoRow}, nil
	}
	var r Rescheduled
	var dispatched, dead, reopened bool // the row's state as locked, for the statement's shape
	scan := func(sql string, args ...any) error {
		// The statement locks the failed row, then its topic's circuit and its key's later
		// rows; a concurrent reopen of another event of the topic, or a relay marking
		// the key's rows, can take two of those in the other order. Postgres then aborts
		// one statement (40P01), which changed nothing: it runs again.
		for try := 1; ; try++ {
			err := db.QueryRow(ctx, sql, append([]any{f.OutboxID, f.Generation, f.errorText()}, args...)...).
				Scan(&r.Generation, &r.Topic, &dispatched, &dead, &reopened)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001") && try < reopenTries {
				continue
			}
			return err
		}
	}
	var err error
	if f.heldForKeyOrder() {
		// The consumer answered: it is up, and held the event behind its key's failed
		// previous one. Back to the outbox, no circuit.
		err = scan(qReopenDelivery)
	} else {
		err = scan(qReopenDeliveryCircuit, probes.Wait, probes.MaxWait)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: before migration 0018
			err = scan(qReopenDelivery)
		}
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Rescheduled{State: ReopenNoRow}, nil
	case err != nil:
		return Rescheduled{}, fmt.Errorf("reopen failed delivery: %w", err)
	case reopened:
		r.State = ReopenDone
	default:
		r.State = ReopenElsewhere
	}
	return r, nil
}
