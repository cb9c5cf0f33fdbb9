package webhook

import "errors"

// Permanent marks err as permanent: the delivery is answered 489 with
// Upstash-NonRetryable-Error, so QStash stops retrying and the failure callback records a
// dead letter. Use it for errors a retry cannot fix (invalid payload, a rejected business
// rule). Unmarked errors are transient and retried. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err, or an error it wraps, has a Permanent() bool method
// returning true (so errors marked by publish.Permanent count too).
func IsPermanent(err error) bool {
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}

type permanentError struct{ err error }

func (e *permanentError) Error() string   { return e.err.Error() }
func (e *permanentError) Unwrap() error   { return e.err }
func (e *permanentError) Permanent() bool { return true }
