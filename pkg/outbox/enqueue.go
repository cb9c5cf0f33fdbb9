package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/v3/internal/tracing"
)

// Querier is what Enqueue writes through: pgx.Tx in real use (so the event commits or rolls
// back with the business change), and also *pgx.Conn and *pgxpool.Pool.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Producer enqueues events under its Limits. The zero value uses the defaults.
type Producer struct {
	Limits Limits
}

// Enqueue validates ev and inserts it through db with the default Limits. Invalid events
// return a *ValidationError (errors.Is with ErrInvalidTopic, ...) and nothing is sent to db.
func Enqueue(ctx context.Context, db Querier, ev Event) (ID, error) {
	return Producer{}.Enqueue(ctx, db, ev)
}

// EnqueueBatch is Enqueue for many events in one INSERT statement; ids are returned in the
// order of evs. If any event is invalid, none is written.
func EnqueueBatch(ctx context.Context, db Querier, evs []Event) ([]ID, error) {
	return Producer{}.EnqueueBatch(ctx, db, evs)
}

// Enqueue validates ev and inserts it through db. When ctx carries a span, its W3C trace
// context is stored in the event's headers (traceparent, tracestate) unless ev sets its own,
// so the consumer's span joins the producer's trace (package tracing). The insert wakes listening relays once
// per statement (a trigger calls pg_notify), and only when the caller's transaction commits.
func (p Producer) Enqueue(ctx context.Context, db Querier, ev Event) (ID, error) {
	if err := p.Limits.Validate(ev); err != nil {
		return 0, err
	}
	headers, err := encodeHeaders(tracing.Inject(ctx, ev.Headers))
	if err != nil {
		return 0, err
	}
	var id ID
	if err := db.QueryRow(ctx, qInsert, ev.Topic, ev.PartitionKey, string(ev.Payload), headers, availableAt(ev)).Scan(&id); err != nil {
		return 0, fmt.Errorf("insert outbox event: %w", err)
	}
	return id, nil
}

// EnqueueBatch validates every event first, then inserts all of them in one statement.
func (p Producer) EnqueueBatch(ctx context.Context, db Querier, evs []Event) ([]ID, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	topics := make([]string, len(evs))
	keys := make([]string, len(evs))
	payloads := make([]string, len(evs))
	headers := make([]string, len(evs))
	avail := make([]*time.Time, len(evs))
	for i, ev := range evs {
		if err := p.Limits.Validate(ev); err != nil {
			err.(*ValidationError).Index = i
			return nil, err
		}
		h, err := encodeHeaders(tracing.Inject(ctx, ev.Headers))
		if err != nil {
			return nil, err
		}
		topics[i], keys[i], payloads[i], headers[i], avail[i] = ev.Topic, ev.PartitionKey, string(ev.Payload), h, availableAt(ev)
	}
	rows, err := db.Query(ctx, qInsertBatch, topics, keys, payloads, headers, avail)
	if err != nil {
		return nil, fmt.Errorf("insert outbox events: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[ID])
	if err != nil {
		return nil, fmt.Errorf("insert outbox events: %w", err)
	}
	// Identity values are drawn in input order; RETURNING order is not promised, sorting is.
	slices.Sort(ids)
	return ids, nil
}

func encodeHeaders(h map[string]string) (string, error) {
	if len(h) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "", fmt.Errorf("encode outbox headers: %w", err)
	}
	return string(b), nil
}

func availableAt(ev Event) *time.Time {
	if ev.AvailableAt.IsZero() {
		return nil
	}
	t := ev.AvailableAt
	return &t
}
