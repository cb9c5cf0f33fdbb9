// Package configcheck completes and checks the library's configurations alike. Positive
// gives a field its default where zero and negative mean unset. Problems collects the
// invalid fields as *publish.ConfigError, so that a Validate reports all of them at once,
// each naming its configuration and field for a caller that maps fields to its own
// settings.
package configcheck

import (
	"errors"
	"fmt"

	"github.com/outbox-relay/outbox-relay/pkg/publish"
)

// Positive returns v, or def when v is zero or negative: the default of a size, a count or
// a duration for which neither means anything but "unset".
func Positive[T ~int | ~int32 | ~int64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Problems are the invalid fields found so far in one configuration.
type Problems struct {
	config string
	errs   []error
}

// For starts the problems of the configuration named config ("relay", "retention").
func For(config string) *Problems {
	return &Problems{config: config}
}

// Bad records that field is invalid; format and args say what is wrong and what it must be.
func (p *Problems) Bad(field, format string, args ...any) {
	p.errs = append(p.errs, &publish.ConfigError{Config: p.config, Field: field, Reason: fmt.Sprintf(format, args...)})
}

// Err joins the recorded problems, or is nil when there are none.
func (p *Problems) Err() error {
	return errors.Join(p.errs...)
}
