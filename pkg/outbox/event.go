package outbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
)

// ID identifies an outbox row. It is also the message id every consumer dedupes on.
type ID int64

// String returns the decimal id, as forwarded in X-Outbox-Id.
func (id ID) String() string { return fmt.Sprintf("%d", int64(id)) }

// Event is what a producer enqueues.
type Event struct {
	// Topic routes the event; it becomes the last path segment of the destination URL
	// (<PUBLIC_BASE_URL>/events/<topic>), so it must be URL-path-safe: 1-128 characters
	// from [A-Za-z0-9._~-], not "." or "..".
	Topic string
	// PartitionKey groups events that must be delivered in order (e.g. "order:1234").
	// Non-empty, at most Limits.MaxPartitionKeyBytes, valid UTF-8, no control characters.
	PartitionKey string
	// Payload is the JSON body delivered to the consumer. Postgres stores it as jsonb, so
	// whitespace and key order are normalised once at insert and stable afterwards.
	Payload json.RawMessage
	// Headers are forwarded to the consumer (correlation id, traceparent, schema version).
	// Names are HTTP tokens; Upstash-* and X-Outbox-* names are reserved.
	Headers map[string]string
	// AvailableAt delays the first publish; zero means now.
	AvailableAt time.Time
}

// Validation errors. Enqueue wraps one of these in a *ValidationError; test with errors.Is.
var (
	ErrInvalidTopic        = errors.New("invalid topic")
	ErrInvalidPartitionKey = errors.New("invalid partition key")
	ErrInvalidPayload      = errors.New("invalid payload")
	ErrPayloadTooLarge     = errors.New("payload too large")
	ErrInvalidHeaders      = errors.New("invalid headers")
)

// ValidationError says which field of an Event was rejected and why. Nothing was written.
type ValidationError struct {
	// Index is the event's position in a batch (0 for a single Enqueue).
	Index int
	// Field is the Event field name.
	Field string
	// Reason explains what is wrong and what to do.
	Reason string
	// Err is one of the Err* sentinels.
	Err error
}

// Error names the event's index, the field, the sentinel and the reason, so a log line
// alone says what to fix.
func (e *ValidationError) Error() string {
	return fmt.Sprintf("outbox event %d: %s: %s: %s", e.Index, e.Field, e.Err, e.Reason)
}

// Unwrap returns the Err* sentinel, so callers branch with errors.Is.
func (e *ValidationError) Unwrap() error { return e.Err }

// Limits bound what Enqueue accepts. Zero fields take the Default* values.
type Limits struct {
	// MaxPayloadBytes caps the JSON payload. Default DefaultMaxPayloadBytes, below QStash's
	// smallest plan limit (1 MB) so headers and the envelope still fit.
	MaxPayloadBytes int
	// MaxPartitionKeyBytes caps the partition key. Default DefaultMaxPartitionKeyBytes.
	MaxPartitionKeyBytes int
	// MaxHeaderBytes caps the sum of header names and values. Default DefaultMaxHeaderBytes.
	MaxHeaderBytes int
}

// Defaults for Limits.
const (
	DefaultMaxPayloadBytes      = 512 << 10
	DefaultMaxPartitionKeyBytes = 256
	DefaultMaxHeaderBytes       = 8 << 10
	// maxTopicLen is fixed: the topic is part of a URL and of a CHECK constraint.
	maxTopicLen = 128
	// maxJSONDepth rejects pathological nesting before Postgres has to parse it.
	maxJSONDepth = 64
)

// WithDefaults returns l with zero fields set to their defaults.
func (l Limits) WithDefaults() Limits {
	l.MaxPayloadBytes = configcheck.Positive(l.MaxPayloadBytes, DefaultMaxPayloadBytes)
	l.MaxPartitionKeyBytes = configcheck.Positive(l.MaxPartitionKeyBytes, DefaultMaxPartitionKeyBytes)
	l.MaxHeaderBytes = configcheck.Positive(l.MaxHeaderBytes, DefaultMaxHeaderBytes)
	return l
}

// ValidTopic reports whether topic can be enqueued and routed.
func ValidTopic(topic string) error {
	switch {
	case topic == "":
		return errors.New("empty; use a name like order.created")
	case len(topic) > maxTopicLen:
		return fmt.Errorf("%d characters, the limit is %d", len(topic), maxTopicLen)
	case topic == "." || topic == ".." || strings.Contains(topic, ".."):
		return errors.New(`".." is not allowed; topics are URL path segments`)
	}
	for i := 0; i < len(topic); i++ {
		c := topic[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '~') {
			return fmt.Errorf("character %q at %d is not allowed; use letters, digits and . _ - ~", c, i)
		}
	}
	return nil
}

// Validate checks ev against the limits without touching the database.
func (l Limits) Validate(ev Event) error {
	l = l.WithDefaults()
	fail := func(field string, sentinel error, reason string) error {
		return &ValidationError{Field: field, Reason: reason, Err: sentinel}
	}
	if err := ValidTopic(ev.Topic); err != nil {
		return fail("Topic", ErrInvalidTopic, err.Error())
	}
	switch pk := ev.PartitionKey; {
	case pk == "":
		return fail("PartitionKey", ErrInvalidPartitionKey, "empty; use the aggregate id, e.g. order:1234")
	case len(pk) > l.MaxPartitionKeyBytes:
		return fail("PartitionKey", ErrInvalidPartitionKey, fmt.Sprintf("%d bytes, the limit is %d", len(pk), l.MaxPartitionKeyBytes))
	case !utf8.ValidString(pk):
		return fail("PartitionKey", ErrInvalidPartitionKey, "not valid UTF-8")
	case hasControl(pk):
		return fail("PartitionKey", ErrInvalidPartitionKey, "contains a control character")
	}
	if len(ev.Payload) > l.MaxPayloadBytes {
		return fail("Payload", ErrPayloadTooLarge, fmt.Sprintf("%d bytes, the limit is %d; store large data elsewhere and send a reference", len(ev.Payload), l.MaxPayloadBytes))
	}
	if err := validJSON(ev.Payload); err != nil {
		return fail("Payload", ErrInvalidPayload, err.Error())
	}
	if err := l.validHeaders(ev.Headers); err != nil {
		return fail("Headers", ErrInvalidHeaders, err.Error())
	}
	return nil
}

func validJSON(p []byte) error {
	if len(bytes.TrimSpace(p)) == 0 {
		return errors.New("empty; send a JSON value such as {}")
	}
	if !utf8.Valid(p) {
		return errors.New("not valid UTF-8")
	}
	if !json.Valid(p) {
		return errors.New("not valid JSON")
	}
	return checkJSONForPostgres(p)
}

// Postgres numeric limits: at most 131072 digits before the decimal point and 16383 after.
const (
	maxNumericIntDigits  = 131072
	maxNumericFracDigits = 16383
)

// checkJSONForPostgres rejects valid JSON that jsonb would still refuse, so Enqueue returns
// a typed error instead of aborting the caller's transaction: \u0000 (jsonb cannot store
// NUL), unpaired UTF-16 surrogate escapes, numbers beyond numeric's range, and nesting deeper
// than maxJSONDepth (a denial-of-service shape). p is already known to be valid JSON.
func checkJSONForPostgres(p []byte) error {
	depth, maxDepth := 0, 0
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '"':
			for i++; i < len(p) && p[i] != '"'; i++ {
				if p[i] != '\\' {
					continue
				}
				i++
				if p[i] != 'u' {
					continue
				}
				r := hex4(p[i+1 : i+5])
				i += 4
				switch {
				case r == 0:
					return errors.New(`contains \u0000, which Postgres jsonb cannot store`)
				case r >= 0xD800 && r <= 0xDBFF:
					if i+6 >= len(p) || p[i+1] != '\\' || p[i+2] != 'u' {
						return errors.New("contains an unpaired UTF-16 surrogate escape")
					}
					if lo := hex4(p[i+3 : i+7]); lo < 0xDC00 || lo > 0xDFFF {
						return errors.New("contains an unpaired UTF-16 surrogate escape")
					}
					i += 6
				case r >= 0xDC00 && r <= 0xDFFF:
					return errors.New("contains an unpaired UTF-16 surrogate escape")
				}
			}
		case c == '{' || c == '[':
			depth++
			maxDepth = max(maxDepth, depth)
		case c == '}' || c == ']':
			depth--
		case c == '-' || c >= '0' && c <= '9':
			end, err := checkNumber(p, i)
			if err != nil {
				return err
			}
			i = end - 1
		}
	}
	if maxDepth > maxJSONDepth {
		return fmt.Errorf("nested %d levels deep, the limit is %d", maxDepth, maxJSONDepth)
	}
	return nil
}

// checkNumber scans the number starting at p[i] and returns the index after it.
func checkNumber(p []byte, i int) (int, error) {
	digits := func() int {
		n := 0
		for i < len(p) && p[i] >= '0' && p[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if p[i] == '-' {
		i++
	}
	intDigits, fracDigits, exp := digits(), 0, 0
	if i < len(p) && p[i] == '.' {
		i++
		fracDigits = digits()
	}
	if i < len(p) && (p[i] == 'e' || p[i] == 'E') {
		i++
		neg := false
		if p[i] == '+' || p[i] == '-' {
			neg = p[i] == '-'
			i++
		}
		for ; i < len(p) && p[i] >= '0' && p[i] <= '9'; i++ {
			if exp < 1<<30 {
				exp = exp*10 + int(p[i]-'0')
			}
		}
		if neg {
			exp = -exp
		}
	}
	if intDigits+exp > maxNumericIntDigits || fracDigits-exp > maxNumericFracDigits {
		return i, errors.New("contains a number beyond the range Postgres numeric can store")
	}
	return i, nil
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		}
	}
	return r
}

func reservedHeader(name string) bool {
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "upstash-") || strings.HasPrefix(n, "x-outbox-") ||
		n == "content-type" || n == "content-length" || n == "host" || n == "authorization"
}

// validHeaders checks the headers a producer sets. As a map of strings they always encode
// to what the outbox_headers_strings constraint requires (a JSON object of string values;
// nil and empty maps are stored as {}), so a rejected header is a *ValidationError here and
// never a check violation that would abort the caller's transaction.
func (l Limits) validHeaders(h map[string]string) error {
	total := 0
	for k, v := range h {
		if k == "" || !isToken(k) {
			return fmt.Errorf("header name %q is not an HTTP token", k)
		}
		if reservedHeader(k) {
			return fmt.Errorf("header %q is reserved for the relay and QStash", k)
		}
		if !utf8.ValidString(v) || hasControl(v) {
			return fmt.Errorf("header %q has a control character or invalid UTF-8 in its value", k)
		}
		total += len(k) + len(v)
	}
	if total > l.MaxHeaderBytes {
		return fmt.Errorf("headers total %d bytes, the limit is %d", total, l.MaxHeaderBytes)
	}
	return nil
}

func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return true
		}
	}
	return false
}
