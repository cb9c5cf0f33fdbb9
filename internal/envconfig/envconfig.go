// Package envconfig is the one place environment variables are read: the webhook Lambda
// (ReadWebhook), the failure-callback Lambda (ReadFailure) and, through package relayenv
// built on this package's Reader, the relay Lambda and `outboxctl relay`. (The relay's
// reader sits apart so the receivers do not link the relay engine.) Each reader reports every missing, invalid or inconsistent
// variable at once, each error a *VarError naming the variable; the libraries' own
// validation (relay.Config, the QStash publisher's, retention's; the receivers' handlers
// and verifier, through ReceiverConfig.ByVariable) is mapped to variables through the
// fields their *publish.ConfigError names, never by reading messages. Defaults
// are applied once, here; no message repeats a value that may hold a secret.
//
// Durations are Go durations (30s, 15m, 1h) or a whole number of days (7d). Every variable
// read here is described in package envdoc (`outboxctl env`, docs/configuration.md), whose
// tests fail when a reader and the description part.
package envconfig

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// VarError is one environment variable's problem.
type VarError struct {
	Var    string
	Reason string
	// Err is the library's error behind Reason, when there is one.
	Err error
}

func (e *VarError) Error() string { return e.Var + ": " + e.Reason }
func (e *VarError) Unwrap() error { return e.Err }

// Reader reads variables through getenv and collects every problem. fields maps the
// library config fields a variable sets to that variable, as the reads register them, so a
// library's *publish.ConfigError can be reported under the variable a user sets.
type Reader struct {
	getenv func(string) string
	fields map[string]string
	errs   []error
}

func NewReader(getenv func(string) string) *Reader {
	return &Reader{getenv: getenv, fields: map[string]string{}}
}

func (r *Reader) Get(name string) string {
	return strings.TrimSpace(r.getenv(name))
}

func (r *Reader) Fail(name, format string, args ...any) {
	r.errs = append(r.errs, &VarError{Var: name, Reason: fmt.Sprintf(format, args...)})
}

// sets records that variable name sets the library field (e.g. "Lease").
func (r *Reader) Sets(name string, fields ...string) {
	for _, f := range fields {
		r.fields[f] = name
	}
}

// str reads name, which sets fields.
func (r *Reader) Str(name string, fields ...string) string {
	r.Sets(name, fields...)
	return r.Get(name)
}

// required reads name and reports it when unset; hint says where the value comes from.
func (r *Reader) Required(name, hint string, fields ...string) string {
	v := r.Str(name, fields...)
	if v == "" {
		r.Fail(name, "is not set (%s)", hint)
	}
	return v
}

// int parses name as a whole number in [lo, hi]; unset gives 0 and false.
func (r *Reader) Int(name string, lo, hi int, fields ...string) (int, bool) {
	v := r.Str(name, fields...)
	if v == "" {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		r.Fail(name, "%q must be a whole number from %d to %d", v, lo, hi)
		return 0, false
	}
	return n, true
}

// duration parses name as a non-negative duration; unset gives 0 and false.
func (r *Reader) Duration(name string, fields ...string) (time.Duration, bool) {
	v := r.Str(name, fields...)
	if v == "" {
		return 0, false
	}
	d, err := ParseDuration(v)
	if err != nil {
		r.Fail(name, "%q is not a duration (e.g. 30s, 15m, 1h, 7d)", v)
		return 0, false
	}
	if d < 0 {
		r.Fail(name, "%q must not be negative", v)
		return 0, false
	}
	return d, true
}

// databaseURL reads DATABASE_URL (required) without ever repeating it: a parse error may
// quote the URL, password included.
func (r *Reader) DatabaseURL() string {
	v := r.Required("DATABASE_URL", "postgres://user:pass@host:5432/db?sslmode=require; or DB_SECRET_ARN")
	if v != "" {
		if _, err := pgxpool.ParseConfig(v); err != nil {
			r.Fail("DATABASE_URL", "is not a valid Postgres connection string")
		}
	}
	return v
}

// logLevel reads LOG_LEVEL (debug, info, warn, error; default info).
func (r *Reader) LogLevel() slog.Level {
	var l slog.Level
	if v := r.Get("LOG_LEVEL"); v != "" {
		if err := l.UnmarshalText([]byte(strings.ToLower(v))); err != nil {
			r.Fail("LOG_LEVEL", "%q must be debug, info, warn or error", v)
		}
	}
	return l
}

// AbsoluteURL reads an optional http(s) base URL: no query or fragment (configcheck.BaseURL).
func (r *Reader) AbsoluteURL(name, example string, fields ...string) string {
	v := r.Str(name, fields...)
	if v == "" {
		return ""
	}
	if configcheck.BaseURL(v) != nil {
		r.Fail(name, "%q must be an absolute URL like %s", v, example)
	}
	return v
}

// check adds err's problems: each *publish.ConfigError whose field a variable sets is
// reported under that variable; anything else as it is.
func (r *Reader) Check(err error) {
	errs, _ := byVariable(err, r.fields)
	r.errs = append(r.errs, errs...)
}

// byVariable splits err into its problems, each *publish.ConfigError whose field a
// variable sets (fields) as a *VarError naming that variable; mapped says whether any was.
func byVariable(err error, fields map[string]string) (errs []error, mapped bool) {
	if err == nil {
		return nil, false
	}
	errs = []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = slices.Clone(j.Unwrap())
	}
	for i, e := range errs {
		var ce *publish.ConfigError
		if errors.As(e, &ce) {
			if v, ok := fields[ce.Field]; ok {
				errs[i], mapped = &VarError{Var: v, Reason: ce.Error(), Err: e}, true
			}
		}
	}
	return errs, mapped
}

func (r *Reader) Err() error { return errors.Join(r.errs...) }

// Vars lists the variables err's *VarErrors name, in order.
func Vars(err error) []string {
	var out []string
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		var ve *VarError
		if errors.As(e, &ve) {
			out = append(out, ve.Var)
		}
	}
	return out
}

// ParseDuration accepts time.ParseDuration's syntax and, in addition, "<n>d" for n days.
func ParseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 || n > 36500 {
			return 0, fmt.Errorf("parse duration %q: days must be a whole number", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("parse duration %q: %w", s, err)
	}
	return d, nil
}
