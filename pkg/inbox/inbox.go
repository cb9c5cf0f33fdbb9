// Package inbox runs a consumer's side effects at most once per message id: the dedupe
// record in processed_messages and the side effects commit in one transaction, or neither
// does. Together with at-least-once delivery this gives exactly-once effect.
package inbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Outcome is what HandleOnce did with a message.
type Outcome int

const (
	// Processed: the work ran and committed together with the dedupe record.
	Processed Outcome = iota + 1
	// Duplicate: the message id was already committed; nothing ran, nothing was written.
	Duplicate
	// Conflict: the message id was committed earlier with a different payload hash. That
	// is a bug upstream (two different events under one id); nothing ran.
	Conflict
)

// String returns the outcome as a lower-case word for logs and metrics.
func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	default:
		return "unknown"
	}
}

// ErrPayloadConflict is returned with Conflict. It is permanent: retrying the same
// delivery can never succeed.
var ErrPayloadConflict = errors.New("message id already processed with a different payload")

// ErrRecordVanished means the dedupe record that blocked the insert was gone when read
// back (deleted by retention in between). It is transient: a retry resolves it.
var ErrRecordVanished = errors.New("dedupe record vanished while being read; retry")

// TxBeginner starts transactions: *pgxpool.Pool and *pgx.Conn satisfy it.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Work is the consumer's side effect. It must write only through tx; returning an error
// rolls back its writes and the dedupe record, so a retry runs it again.
type Work func(ctx context.Context, tx pgx.Tx) error

// Option adds to what HandleOnce records with a message.
type Option func(*record)

type record struct {
	retried *int
}

// Retried records n (the delivery's Upstash-Retried: 0 on the first attempt) with the
// message, so operators can see how many attempts deliveries took (outboxctl status).
// Without it, or with n outside 0..MaxRetried (the header is not signed), the count is
// recorded as unknown.
func Retried(n int) Option {
	return func(r *record) {
		if n >= 0 && n <= maxRetried {
			r.retried = &n
		}
	}
}

// maxRetried bounds the retry count Retried records; QStash's plans allow at most 20.
const maxRetried = 1000

// HandleOnce runs work for (consumer, messageID) unless that pair has already committed.
//
// In one READ COMMITTED transaction it inserts the dedupe record, runs work and commits.
// payloadHash (e.g. sha256 of the delivered body) is stored with the record; a later
// delivery of the same id with a different non-nil hash yields Conflict and an error
// wrapping ErrPayloadConflict. A nil hash on either side is never a conflict.
//
// Results: (Processed, nil) after a commit; (Duplicate, nil) when already processed;
// (Conflict, err) as above; (0, err) when work or the database failed, with everything
// rolled back. Errors from work are wrapped, so errors.Is/As still see them.
func HandleOnce(ctx context.Context, db TxBeginner, consumer, messageID string, payloadHash []byte, work Work, opts ...Option) (Outcome, error) {
	if consumer == "" || messageID == "" {
		return 0, errors.New("handle message once: consumer and message id must be non-empty")
	}
	var rec record
	for _, o := range opts {
		o(&rec)
	}
	// READ COMMITTED explicitly: under REPEATABLE READ or SERIALIZABLE a concurrent
	// duplicate would fail with a serialization error instead of waiting and seeing it.
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return 0, fmt.Errorf("begin inbox transaction: %w", err)
	}
	// Rollback after Commit is a no-op; this covers every early return and panics in work.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	var inserted bool
	err = tx.QueryRow(ctx, qClaim, consumer, messageID, payloadHash, rec.retried).Scan(&inserted)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return duplicateOrConflict(ctx, tx, consumer, messageID, payloadHash)
	case err != nil:
		return 0, fmt.Errorf("insert dedupe record: %w", err)
	}

	if err := work(ctx, tx); err != nil {
		return 0, fmt.Errorf("run work for message %s: %w", messageID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit inbox transaction: %w", err)
	}
	return Processed, nil
}

func duplicateOrConflict(ctx context.Context, tx pgx.Tx, consumer, messageID string, payloadHash []byte) (Outcome, error) {
	var stored []byte
	err := tx.QueryRow(ctx, qStoredHash, consumer, messageID).Scan(&stored)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, fmt.Errorf("read dedupe record of message %s: %w", messageID, ErrRecordVanished)
	case err != nil:
		return 0, fmt.Errorf("read dedupe record: %w", err)
	}
	if stored != nil && payloadHash != nil && !bytes.Equal(stored, payloadHash) {
		return Conflict, fmt.Errorf("message %s for consumer %s: %w", messageID, consumer, ErrPayloadConflict)
	}
	return Duplicate, nil
}
