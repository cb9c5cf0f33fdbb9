// Package publish is the contract between the relay and the queue it publishes to: what
// one message's publish came to (Result, classified by Outcome as Published, Retryable,
// PermanentFailure or Deferred) and the errors that classify it (Permanent, *DeferError),
// plus *ConfigError, which every configuration in the module uses to name an invalid field.
// It imports nothing of the project, so a publisher (package qstash) implements
// relay.Publisher without linking the relay engine into programs that only receive.
package publish

import (
	"errors"
	"time"
)

// Ordering is what order the queue keeps between the messages of one partition key. The
// QStash publisher sends accordingly, and the relay hands it batches accordingly; a relay
// whose Config.Ordering is empty takes its publisher's (an Ordering() Ordering method), so
// the two cannot disagree and only the publisher has a default.
type Ordering string

const (
	// OrderingPublish: the queue keeps no order between messages (QStash /v2/publish, with
	// optional flow control). The relay hands it a batch in one call, a key's events in id
	// order inside it. The QStash publisher's default (DefaultOrdering): highest
	// throughput, and consumers must tolerate reordering.
	OrderingPublish Ordering = "publish"
	// OrderingFIFO: the queue delivers in the order it accepted (QStash FIFO queues), so the
	// relay sends a key's events one after the other: each call carries at most one event
	// per key ("waves"), and a failed event holds its key's later events back.
	OrderingFIFO Ordering = "fifo"
	// DefaultOrdering is the ordering of a QStash publisher whose Ordering is empty (and so
	// of a relay publishing through it).
	DefaultOrdering = OrderingPublish
)

// Result is the outcome of publishing one message.
type Result struct {
	// MessageID is the queue's id for the message, when it was accepted.
	MessageID string
	// Err is nil when published. Errors marked permanent (IsPermanent) dead-letter the
	// event at once; every other error is retried with backoff until MaxAttempts.
	Err error
}

// Outcome classifies a Result.
type Outcome int

const (
	// Published: the queue accepted the message; the relay marks it dispatched.
	Published Outcome = iota
	// Retryable: the message failed for a reason that may pass (a 5xx, a timeout); the
	// relay retries it with backoff and counts the attempt.
	Retryable
	// PermanentFailure: the message can never be accepted (IsPermanent); the relay
	// dead-letters it at once.
	PermanentFailure
	// Deferred: the message was not attempted because the queue refused the whole request
	// for a reason that is not about this message (a used-up quota, a wrong endpoint or
	// token, an outage). The relay puts it back without spending an attempt and stops
	// publishing until the DeferError's Until.
	Deferred
)

// Outcome returns Published, Retryable or PermanentFailure.
func (r Result) Outcome() Outcome {
	switch {
	case r.Err == nil:
		return Published
	case IsDeferred(r.Err):
		return Deferred
	case IsPermanent(r.Err):
		return PermanentFailure
	default:
		return Retryable
	}
}

// IsPermanent reports whether err, or an error it wraps, has a Permanent() bool method
// returning true. Everything else is transient: retrying an unknown error is safe because
// publishes are deduplicated, while dead-lettering it would be a guess.
func IsPermanent(err error) bool {
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}

// StatusCode returns the HTTP status carried by err (a HTTPStatus() int method), or 0.
func StatusCode(err error) int {
	var s interface{ HTTPStatus() int }
	if errors.As(err, &s) {
		return s.HTTPStatus()
	}
	return 0
}

// Permanent marks err as permanent, a failure no retry can fix; Permanent(nil) is nil. It
// is the project's one marker (webhook.Permanent and relay.Permanent call it): returned by
// a Publisher in a Result, the relay dead-letters the event without retrying; returned by
// a webhook handler, the delivery is answered 489 with Upstash-NonRetryable-Error, so
// QStash stops retrying and the failure callback records a dead letter. Any error with a
// Permanent() bool method returning true counts the same (IsPermanent).
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string   { return e.err.Error() }
func (e *permanentError) Unwrap() error   { return e.err }
func (e *permanentError) Permanent() bool { return true }

// Reasons a publish is deferred (DeferError.Reason); they name the metric and log line.
const (
	// DeferQuota: the queue's quota or rate limit is used up until Until.
	DeferQuota = "quota"
	// DeferDeployment: the endpoint or credentials are wrong (404, 405, 401, 403 for the
	// whole request), or the queue refuses a setting every message carries. Nothing is
	// wrong with the messages; an operator must fix the setting.
	DeferDeployment = "deployment"
	// DeferOutage: the queue could not be reached or failed as a whole (a 5xx or 408 for
	// the whole request, a timeout, a connection error). Nothing is wrong with the
	// messages or the settings; it ends by itself, so the relay retries after a short
	// pause instead of charging every pending message an attempt.
	DeferOutage = "outage"
)

// DeferError reports a message the queue did not take for a reason outside the message.
// The relay releases it with its attempt uncounted and publishes nothing more until Until
// (a zero Until lets the relay choose its own pause).
type DeferError struct {
	// Reason is one of DeferQuota, DeferDeployment, DeferOutage.
	Reason string
	// Until is when publishing may resume; zero lets the relay choose.
	Until time.Time
	// Err is the queue's error behind the deferral, if any.
	Err error
}

// Error reads "publish deferred (<reason>): <err>".
func (e *DeferError) Error() string {
	if e.Err == nil {
		return "publish deferred: " + e.Reason
	}
	return "publish deferred (" + e.Reason + "): " + e.Err.Error()
}

// Unwrap returns Err, so the queue's own error stays reachable with errors.As.
func (e *DeferError) Unwrap() error { return e.Err }

// IsDeferred reports whether err is or wraps a *DeferError.
func IsDeferred(err error) bool {
	var d *DeferError
	return errors.As(err, &d)
}
