package relay

import (
	"context"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// Publisher hands a batch of messages to the queue. It is the relay's only dependency on
// QStash, so the engine is tested with any implementation.
type Publisher interface {
	// Publish sends msgs and returns exactly one Result per message, in the same order.
	// Messages sharing a PartitionKey arrive in id order. Publish must not fail a message
	// without reporting it in its Result; a nil Err means the queue accepted the message.
	Publish(ctx context.Context, msgs []outbox.Message) []publish.Result
}

// PublisherFunc adapts a function to a Publisher, as http.HandlerFunc does for a handler:
// PublisherFunc(f).Publish(ctx, msgs) calls f(ctx, msgs). f bears the Publisher contract
// (one Result per message, in order). Tests use it to script the queue's answers.
type PublisherFunc func(ctx context.Context, msgs []outbox.Message) []publish.Result

// Publish calls f(ctx, msgs).
func (f PublisherFunc) Publish(ctx context.Context, msgs []outbox.Message) []publish.Result {
	return f(ctx, msgs)
}
