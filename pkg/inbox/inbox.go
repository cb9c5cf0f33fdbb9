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

// Message identifies the delivery HandleOnce runs work for.
type Message struct {
	// Consumer names the handler: each consumer has its own record of what it processed.
	// Required.
	Consumer string
	// ID is the delivery's message id (the signed outbox identity, or QStash's message id).
	// Required.
	ID string
	// PayloadHash (e.g. sha256 of the delivered body) is stored with the record: a later
	// delivery of the same ID with a different non-nil hash is a Conflict. nil is never one.
	PayloadHash []byte
	// Retried is the delivery's Upstash-Retried (0 on the first attempt), stored so that
	// operators see how many attempts deliveries took (outboxctl status). nil, or a value
	// outside 0..1000 (the header is not signed), is stored as unknown.
	Retried *int
}

// maxRetried bounds the retry count HandleOnce records; QStash's plans allow at most 20.
const maxRetried = 1000

// HandleOnce runs work for (msg.Consumer, msg.ID) unless that pair has already committed.
//
// In one READ COMMITTED transaction it inserts the dedupe record, runs work and commits.
// A later delivery of the same id with a different non-nil PayloadHash yields Conflict and
// an error wrapping ErrPayloadConflict.
//
// Results: (Processed, nil) after a commit; (Duplicate, nil) when already processed;
// (Conflict, err) as above; (0, err) when work or the database failed, with everything
// rolled back. Errors from work are wrapped, so errors.Is/As still see them.
func HandleOnce(ctx context.Context, db TxBeginner, msg Message, work Work) (Outcome, error) {
	consumer, messageID, payloadHash := msg.Consumer, msg.ID, msg.PayloadHash
	if consumer == "" || messageID == "" {
		return 0, errors.New("handle message once: consumer and message id must be non-empty")
	}
	retried := msg.Retried
	if retried != nil && (*retried < 0 || *retried > maxRetried) {
		retried = nil
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
	err = tx.QueryRow(ctx, qClaim, consumer, messageID, payloadHash, retried).Scan(&inserted)
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
