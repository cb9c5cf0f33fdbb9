// Package configcheck completes and checks the library's configurations alike. Positive
// gives a field its default where zero and negative mean unset. Problems collects the
// invalid fields as *publish.ConfigError, so that a Validate reports all of them at once,
// each naming its configuration and field for a caller that maps fields to its own
// settings. HTTPURL and BaseURL are the one check of the URLs the configurations hold.
package configcheck

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
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

// HTTPURL reports why s is not an absolute http(s) URL, or nil.
func HTTPURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %w", s, err)
	}
	if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("%q is not an absolute http(s) URL", s)
	}
	return nil
}

// BaseURL is HTTPURL for a base that paths are appended to (where the relay publishes,
// what QStash signs): a query or fragment would end up in the middle of every URL made
// from it, so neither is allowed, not even an empty "?".
func BaseURL(s string) error {
	if err := HTTPURL(s); err != nil {
		return err
	}
	// Parsed, s has "?" only before a query and "#" only before a fragment, empty or not.
	if strings.ContainsAny(s, "?#") {
		return fmt.Errorf("%q must not have a query or fragment", s)
	}
	return nil
}
