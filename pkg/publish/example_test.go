package publish_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// A publisher of your own (any queue behind relay.Publisher) reports each message's fate
// as a Result; the relay acts on its Outcome. Wrap an error with Permanent when the queue
// can never accept the message (it is dead-lettered at once), return a *DeferError when
// the refusal is not about the message (nothing is charged to it), and anything else is
// retried with backoff.
func ExampleResult_Outcome() {
	results := []publish.Result{
		{MessageID: "msg-1"},
		{Err: errors.New("503 from the queue")},
		{Err: publish.Permanent(errors.New("body over the queue's message size"))},
		{Err: &publish.DeferError{Reason: publish.DeferQuota, Until: time.Now().Add(time.Hour), Err: errors.New("daily quota used up")}},
	}
	names := map[publish.Outcome]string{
		publish.Published:        "published: mark dispatched",
		publish.Retryable:        "retryable: back off, count an attempt",
		publish.PermanentFailure: "permanent: dead-letter now",
		publish.Deferred:         "deferred: put back, no attempt spent",
	}
	for _, r := range results {
		fmt.Println(names[r.Outcome()])
	}
	// Output:
	// published: mark dispatched
	// retryable: back off, count an attempt
	// permanent: dead-letter now
	// deferred: put back, no attempt spent
}
