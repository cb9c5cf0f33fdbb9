package webhook

import "github.com/outbox-relay/outbox-relay/v3/pkg/publish"

// Permanent is publish.Permanent, under the name a handler's author looks for: a handler
// error it marks is answered 489 with Upstash-NonRetryable-Error, so QStash stops retrying
// and the failure callback records a dead letter. Use it for errors a retry cannot fix (an
// invalid payload, a rejected business rule). Unmarked errors are transient and retried.
//
// The text of the error the handler returns is the dead letter's reason: the 489's body is
// {"error":"rejected","message":<text>}, with control characters and runs of white space
// made one space and cut to MaxReasonBytes, and QStash hands that body to the failure
// callback, which stores it (dead_letters.error and response_body). The text leaves your
// service, so it must say why without secrets, credentials or personal data.
func Permanent(err error) error { return publish.Permanent(err) }

// IsPermanent is publish.IsPermanent: whether err, or an error it wraps, has a Permanent()
// bool method returning true.
func IsPermanent(err error) bool { return publish.IsPermanent(err) }
