package relay

import (
	"context"

	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/publish"
)

// Publisher hands a batch of messages to the queue. It is the relay's only dependency on
// QStash, so the engine is tested with any implementation.
type Publisher interface {
	// Publish sends msgs and returns exactly one Result per message, in the same order.
	// Messages sharing a PartitionKey arrive in id order. Publish must not fail a message
	// without reporting it in its Result; a nil Err means the queue accepted the message.
	Publish(ctx context.Context, msgs []outbox.Message) []Result
}

// PublisherFunc adapts a function to a Publisher, as http.HandlerFunc does for a handler:
// PublisherFunc(f).Publish(ctx, msgs) calls f(ctx, msgs). f bears the Publisher contract
// (one Result per message, in order). Tests use it to script the queue's answers.
type PublisherFunc func(ctx context.Context, msgs []outbox.Message) []Result

// Publish calls f(ctx, msgs).
func (f PublisherFunc) Publish(ctx context.Context, msgs []outbox.Message) []Result {
	return f(ctx, msgs)
}

// The publish contract, under the names the relay's users know (package publish holds it,
// so that a publisher need not import the engine).
type (
	// Result is one message's outcome of Publisher.Publish (publish.Result).
	Result = publish.Result
	// Outcome classifies a Result (publish.Outcome).
	Outcome = publish.Outcome
	// DeferError is a message the queue did not take for a reason outside the message
	// (publish.DeferError).
	DeferError = publish.DeferError
	// ConfigError is one invalid field of Config (publish.ConfigError).
	ConfigError = publish.ConfigError
)

// The outcomes of a Result and the reasons of a DeferError; see package publish.
const (
	Published        = publish.Published        // accepted: marked dispatched
	Retryable        = publish.Retryable        // retried with backoff
	PermanentFailure = publish.PermanentFailure // dead-lettered at once
	Deferred         = publish.Deferred         // put back without an attempt
	DeferQuota       = publish.DeferQuota       // the quota is used up
	DeferDeployment  = publish.DeferDeployment  // a setting is wrong
	DeferOutage      = publish.DeferOutage      // the queue is down
)

// IsPermanent is publish.IsPermanent.
func IsPermanent(err error) bool { return publish.IsPermanent(err) }

// IsDeferred is publish.IsDeferred.
func IsDeferred(err error) bool { return publish.IsDeferred(err) }

// StatusCode is publish.StatusCode.
func StatusCode(err error) int { return publish.StatusCode(err) }

// Permanent is publish.Permanent, the one marker of a failure no retry can fix.
func Permanent(err error) error { return publish.Permanent(err) }
