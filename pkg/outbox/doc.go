// Package outbox is the producer's side of the transactional outbox: write an event in the
// same transaction as the business change, and it is delivered at least once, or recorded
// as a dead letter, even if the process dies right after the commit.
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		// ... the business change, in tx ...
//		_, err := outbox.Enqueue(ctx, tx, outbox.Event{
//			Topic:        "order.created",
//			PartitionKey: "order:o-42",
//			Payload:      json.RawMessage(`{"order_id":"o-42"}`),
//		})
//		return err
//	})
//
// Enqueue and EnqueueBatch take anything with Exec, Query and QueryRow (pgx.Tx, *pgx.Conn,
// *pgxpool.Pool). An invalid event is refused with a *ValidationError (errors.Is with
// ErrInvalidTopic, ErrInvalidPartitionKey, ErrInvalidPayload, ErrPayloadTooLarge or
// ErrInvalidHeaders) before any statement runs, so the caller's transaction stays usable;
// Producer applies non-default Limits.
//
// Events of one PartitionKey are delivered in id order (in the relay's fifo mode); an event
// with a future AvailableAt holds the later events of its key until it is due, as FIFO
// requires. The relay (package relay) drains the table; Message is what it hands to its
// publisher.
package outbox
