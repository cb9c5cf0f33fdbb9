package qstash

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// APIError is a non-2xx answer from the QStash API. qstash-go v1.0.0 discards the status
// code and turns a non-JSON body into a *json.SyntaxError; this type keeps both, so the
// relay can tell a rejected message from a flaky proxy.
type APIError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Message is QStash's {"error": "..."} text, or, for a body that is not such JSON (a
	// proxy's HTML 502), its first bytes with the whitespace collapsed.
	Message string
	// Body is the raw response body, truncated to maxErrorBody bytes.
	Body []byte
	// RateLimit is the daily-quota limit (RateLimit-*), Burst the one-second management
	// limit (Burst-RateLimit-*); zero when the headers are absent.
	RateLimit RateLimit
	Burst     RateLimit
	// RetryAfter is the Retry-After header as a duration, 0 when absent or unparsable.
	RetryAfter time.Duration
}

// RateLimit is one family of rate-limit headers. Reset is kept as sent: QStash does not
// document its unit.
type RateLimit struct {
	Limit     int64
	Remaining int64
	Reset     string
}

const maxErrorBody = 4 << 10

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	return fmt.Sprintf("qstash api: %d %s", e.StatusCode, msg)
}

// Permanent reports whether resending the same request cannot succeed: every 4xx except
// 408 (timeout), 429 (rate limit), and 401/403. A rejected token is the deployment's fault,
// not the message's: dead-lettering would sweep the whole backlog into dead_letters on one
// rotated token, while retrying holds it (the oldest-pending-age alarm fires) and drains by
// itself once the token is fixed. 5xx, 3xx and everything else are transient.
func (e *APIError) Permanent() bool {
	switch e.StatusCode {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusUnauthorized, http.StatusForbidden:
		return false
	}
	return e.StatusCode >= 400 && e.StatusCode < 500
}

// HTTPStatus returns StatusCode (relay.StatusCode reads it).
func (e *APIError) HTTPStatus() int { return e.StatusCode }

// newAPIError builds an APIError from a response whose body has been read.
func newAPIError(resp *http.Response, body []byte) *APIError {
	e := &APIError{StatusCode: resp.StatusCode}
	if len(body) > maxErrorBody {
		e.Body = append([]byte(nil), body[:maxErrorBody]...)
	} else {
		e.Body = body
	}
	var j struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &j) == nil && j.Error != "" {
		e.Message = j.Error
	} else {
		e.Message = snippet(body)
	}
	e.RateLimit = rateLimit(resp.Header, "RateLimit-")
	e.Burst = rateLimit(resp.Header, "Burst-RateLimit-")
	e.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	return e
}

func rateLimit(h http.Header, prefix string) RateLimit {
	n := func(name string) int64 {
		v, _ := strconv.ParseInt(strings.TrimSpace(h.Get(prefix+name)), 10, 64)
		return v
	}
	return RateLimit{Limit: n("Limit"), Remaining: n("Remaining"), Reset: h.Get(prefix + "Reset")}
}

// parseRetryAfter reads delta-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// snippet is the start of a non-JSON body, printable and on one line, for error text.
func snippet(b []byte) string {
	const max = 200
	if len(b) > max {
		b = b[:max]
	}
	s := strings.ToValidUTF8(string(b), "?")
	s = strings.Join(strings.Fields(s), " ")
	if !utf8.ValidString(s) {
		return ""
	}
	return s
}

// ItemError is a failed item of a /v2/batch request: QStash accepted the request but
// answered {"error": "..."} for this message, and published the others. QStash does not
// document these texts, so the classification is a choice: an item error is a validation
// failure of the message itself (bad destination, header or dedup id) and permanent, unless
// its text names a transient cause (rate limit, quota, timeout, unavailable, internal
// error, try again), in which case it is retried.
type ItemError struct {
	// Index is the message's position in the Publish call.
	Index int
	// Message is QStash's error text.
	Message string
}

func (e *ItemError) Error() string {
	return fmt.Sprintf("qstash batch item %d: %s", e.Index, e.Message)
}

// Permanent reports whether the item's error text names no transient cause.
func (e *ItemError) Permanent() bool { return !transientText(e.Message) }

var transientWords = []string{
	"rate limit", "ratelimit", "too many", "quota", "timeout", "timed out", "unavailable",
	"internal", "temporar", "try again", "retry", "overload", "busy",
}

func transientText(s string) bool {
	s = strings.ToLower(s)
	for _, w := range transientWords {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// Errors for batch responses QStash should not send. All are transient: the batch may or
// may not have been accepted, and a resend is deduplicated.
var (
	// ErrNoMessageID: a batch item came back with neither a message id nor an error.
	ErrNoMessageID = errors.New("qstash batch item has no message id")
	// ErrBadResponse: a 2xx response that is not the expected JSON array of one result per
	// message.
	ErrBadResponse = errors.New("unexpected qstash batch response")
	// ErrHeldBack: a message was not sent because an earlier message of its partition key
	// failed in the same Publish call; sending it would overtake that message.
	ErrHeldBack = errors.New("held back behind a failed message of the same partition key")
)

// InvalidMessageError is a message the Publisher refused to send because QStash could only
// reject it (for example a header name that is not an HTTP token). It is permanent.
type InvalidMessageError struct {
	Index  int
	Reason string
}

func (e *InvalidMessageError) Error() string {
	return fmt.Sprintf("qstash message %d not sent: %s", e.Index, e.Reason)
}

// Permanent is always true: the same message would be refused again.
func (e *InvalidMessageError) Permanent() bool { return true }
