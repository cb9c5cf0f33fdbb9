package webhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// A FIFO queue delivers a key's next event once the previous one was delivered or failed:
// a delivery that failed for good (the consumer was down for QStash's whole ladder) lets
// the queue move on, and the failed event comes back only when its failure callback (or
// dlq sync) has put it back in the outbox. Production does not say whether that callback
// lands before the queue's next delivery. If the consumer is up again in between, the
// key's next event would be applied before the one that failed: per-key order broken for
// two healthy events. So, when the webhook shares the outbox's database, a delivery from
// a FIFO queue (qstash.HeaderOrdering) whose key's previous dispatched event (not
// dead-lettered, of a topic this webhook handles) is not applied here is held: 503 with
// Retry-After, nothing written. The reopen that puts the failed event back also puts this
// one back (pkg/deadletter, Reopen), after which this delivery is superseded and both go
// out again in order. Only the previous event is looked at: it was itself applied after
// its own previous one, and so on back.
//
// keyOrderWindow bounds how recent that previous event's dispatch must be: one whose
// failure is still unreported after two hours (its callback lost, dlq sync not run) no
// longer holds its key, which then flows with the order broken rather than stop; and it
// stays well inside the dedupe TTL (at least 6 h with the relay's defaults: pkg/retention),
// so an event applied long ago is never taken for one not applied.
const keyOrderWindow = 2 * time.Hour

// KeyOrderRetryAfter is the Retry-After of a delivery held behind its key's failed
// previous event: about how long a failure callback takes to put that event back.
const KeyOrderRetryAfter = 5 * time.Second

// errBehindFailed is the inbox work's answer to a delivery held behind its key's previous
// event: rolled back, answered 503 (replyKeyOrder).
var errBehindFailed = errors.New("the previous event of this delivery's key was not applied: its delivery failed and it is on its way back through the outbox")

var replyKeyOrder = receive.Reply{Status: http.StatusServiceUnavailable, Code: "key_order", Outcome: OutcomeTransient}

// qKeyOrder reads what stands before outbox row $1 in its key, for consumer $2: whether
// an earlier event is pending again after it had been dispatched (generation above 0: put
// back by a failure callback, dlq sync or a redrive) and not leased with the delivery's
// own row (published in the same batch, ahead of it in the queue: its delivery can come
// before the relay's mark, and putting it back then cost the consumer outage scenario a
// thousand republishes), and the previous dispatched event
// when it is not applied by $2, dispatched within $3 and of one of the topics $4. Two
// index probes: outbox_pending_key_idx, and outbox_dispatched_key_idx (migration 0021),
// before which the second part reads nothing (without the index the walk would be the
// whole table for a quiet key).
const qKeyOrder = `
SELECT EXISTS (SELECT 1 FROM outbox e
               WHERE e.partition_key = l.partition_key AND e.id < l.id
                 AND e.dispatched_at IS NULL AND e.dead_lettered_at IS NULL AND e.generation > 0
                 AND e.lease_token IS DISTINCT FROM coalesce(l.lease_token, '00000000-0000-0000-0000-000000000000'::uuid)),
       p.id, p.topic
FROM outbox l
LEFT JOIN LATERAL (
    SELECT p.id, p.topic, p.dispatched_at FROM outbox p
    WHERE to_regclass('outbox_dispatched_key_idx') IS NOT NULL
      AND p.partition_key = l.partition_key AND p.id < l.id
      AND p.dispatched_at IS NOT NULL AND p.dead_lettered_at IS NULL
    ORDER BY p.id DESC
    LIMIT 1) p ON p.dispatched_at > now() - $3::interval AND p.topic = ANY($4::text[])
      AND NOT EXISTS (SELECT 1 FROM processed_messages m WHERE m.consumer = $2 AND m.message_id = p.id::text)
WHERE l.id = $1::bigint`

// qPutBack puts outbox row $1 back to pending under a new generation, as a failure
// callback's reopen does (pkg/deadletter), when it is still at generation $2 and not
// dead-lettered: the relay publishes it again after its key's earlier events, and its
// queued delivery is superseded. last_error $3 says why.
const qPutBack = `
UPDATE outbox
SET dispatched_at = NULL, attempts = 0, available_at = clock_timestamp(), lease_token = NULL,
    locked_until = NULL, last_error = $3::text, generation = generation + 1
WHERE id = $1::bigint AND generation = $2::int AND dead_lettered_at IS NULL`

// putBackReason is the last_error of a row the webhook put back behind its key.
const putBackReason = "put back by the webhook: an earlier event of its key was back in the outbox when it was delivered"

// fromFIFOQueue reports whether d came through a FIFO queue.
func fromFIFOQueue(d Delivery) bool {
	return strings.EqualFold(strings.TrimSpace(d.Headers.Get(qstash.HeaderOrdering)), qstash.OrderingFIFO)
}

// keyOrder checks d, from a FIFO queue, against its key's earlier events. It returns a
// *behindError (errBehindFailed) when d must wait for its key's previous event (see
// keyOrderWindow), or errPutBack when an earlier event of its key is pending again: d is
// then put back in the outbox (after the inbox transaction, putBack) and acknowledged, so
// the queue delivers that earlier event first. Holding d would keep the earlier one
// behind it in the queue until d's retries ran out.
func (h *Handler) keyOrder(ctx context.Context, tx pgx.Tx, d Delivery) error {
	if !fromFIFOQueue(d) {
		return nil
	}
	id, err := strconv.ParseInt(d.MessageID, 10, 64)
	if err != nil {
		return nil
	}
	var reopened bool
	var prev *int64
	var topic *string
	switch err := tx.QueryRow(ctx, qKeyOrder, id, h.cfg.Consumer, keyOrderWindow, h.topics).Scan(&reopened, &prev, &topic); {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("read the earlier events of the key: %w", err)
	case reopened:
		return errPutBack
	case prev != nil:
		return &behindError{prev: *prev, topic: *topic}
	}
	return nil
}

// errPutBack is keyOrder's answer for a delivery to put back behind its key.
var errPutBack = errors.New("an earlier event of this delivery's key is back in the outbox")

// putBack puts d's row back in the outbox (qPutBack) and reports whether it did.
func (h *Handler) putBack(ctx context.Context, d Delivery) (bool, error) {
	id, err := strconv.ParseInt(d.MessageID, 10, 64)
	if err != nil {
		return false, nil
	}
	tx, err := h.cfg.Pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return false, fmt.Errorf("put the delivery back in the outbox: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, qPutBack, id, d.Generation, putBackReason)
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		return false, fmt.Errorf("put the delivery back in the outbox: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// behindError names the event a held delivery waits for; it is errBehindFailed.
type behindError struct {
	prev  int64
	topic string
}

func (e *behindError) Error() string {
	return fmt.Sprintf("%v (outbox id %d, topic %s)", errBehindFailed, e.prev, e.topic)
}
func (e *behindError) Is(target error) bool { return target == errBehindFailed }

// answerKeyOrder answers a delivery keyOrder stopped: put back in the outbox behind its
// key's earlier event and acknowledged (errPutBack), or held, 503 with Retry-After
// (errBehindFailed, or a put-back that did not happen).
func (h *Handler) answerKeyOrder(ctx context.Context, w http.ResponseWriter, a *receive.Answer, d Delivery, err error) {
	if errors.Is(err, errPutBack) {
		// Rolled back; now outside the inbox transaction, so no dedupe record keeps the
		// event's next delivery from being applied.
		ok, perr := h.putBack(ctx, d)
		if perr == nil && ok {
			a.Reply(replySuperseded, slog.LevelInfo, "webhook delivery put back in the outbox behind an earlier event of its key, which is back there too; it comes again under a new generation")
			return
		}
		// Not put back (the database, or the row moved on meanwhile): QStash retries, and
		// the next attempt looks again.
		if perr != nil {
			err = perr
		}
	}
	setRetryAfter(w, KeyOrderRetryAfter)
	a.Reply(replyKeyOrder, slog.LevelWarn, "webhook delivery held behind an earlier event of its key that failed or is back in the outbox; QStash will retry after Retry-After",
		slog.Any("error", err), slog.Duration("retry_after", KeyOrderRetryAfter))
}
