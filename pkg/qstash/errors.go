package qstash

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
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
	// Method and URL are the request answered (no token: it travels in a header).
	Method, URL string
	// at is when the answer arrived, the origin of RetryAfter and of a delta Reset.
	at time.Time
	// retryAfterRead tells a Retry-After of 0 (resend at once) from none.
	retryAfterRead bool
}

// RateLimit is one family of rate-limit headers. Reset is kept as sent; resetTime reads it.
type RateLimit struct {
	Limit     int64
	Remaining int64
	Reset     string
}

// resetTime reads Reset: QStash sends unix seconds (docs api-ratelimiting); unix
// milliseconds and a delta in seconds (the IETF RateLimit draft) are accepted too, told
// apart by size. False when absent or unreadable.
func (r RateLimit) resetTime(now time.Time) (time.Time, bool) {
	v, err := strconv.ParseInt(strings.TrimSpace(r.Reset), 10, 64)
	if err != nil || v < 0 {
		return time.Time{}, false
	}
	switch {
	case v >= 1e12:
		return time.UnixMilli(v), true
	case v >= 1e9:
		return time.Unix(v, 0), true
	default:
		return now.Add(time.Duration(v) * time.Second), true
	}
}

const maxErrorBody = 4 << 10

// Error names the status code and QStash's message (or the status text when it sent none).
func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	if e.URL != "" {
		return fmt.Sprintf("qstash api: %s %s: %d %s", e.Method, e.URL, e.StatusCode, msg)
	}
	return fmt.Sprintf("qstash api: %d %s", e.StatusCode, msg)
}

// Permanent reports whether the answer rejects the message itself, so resending it cannot
// succeed: 400, 412, 413 and 422, the statuses QStash (and HTTP) use for a request whose
// content is refused. The Publisher only lets it reach a message when the request held
// that message alone (a request of several is split first), and never for a 412 about
// queues or a text naming the deployment (see Publisher). Every other status is not
// permanent: 401/403/404/405 are deployment faults, 408/429/5xx transient, and an unknown
// 4xx is retried rather than dead-lettered on a guess.
func (e *APIError) Permanent() bool {
	return messageStatus(e.StatusCode) && !queueCapText(e.StatusCode, e.Message)
}

func messageStatus(code int) bool {
	switch code {
	case http.StatusBadRequest, http.StatusPreconditionFailed, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		return true
	}
	return false
}

// queueCapText: QStash answers 412 both for a message over the plan's size and for a queue
// over the plan's queue count (pricing page); the text tells them apart.
func queueCapText(code int, msg string) bool {
	return code == http.StatusPreconditionFailed && strings.Contains(strings.ToLower(msg), "queue")
}

// HTTPStatus returns StatusCode (publish.StatusCode reads it).
func (e *APIError) HTTPStatus() int { return e.StatusCode }

// newAPIError builds the APIError of the answer to method url, whose body has been read.
func newAPIError(resp *http.Response, body []byte, now time.Time, method, url string) *APIError {
	e := &APIError{StatusCode: resp.StatusCode, at: now, Method: method, URL: url}
	// A copy: the caller may reuse body's buffer.
	e.Body = bytes.Clone(body[:min(len(body), maxErrorBody)])
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
	e.RetryAfter, e.retryAfterRead = parseRetryAfter(resp.Header.Get("Retry-After"), now)
	return e
}

func rateLimit(h http.Header, prefix string) RateLimit {
	n := func(name string) int64 {
		v, _ := strconv.ParseInt(strings.TrimSpace(h.Get(prefix+name)), 10, 64)
		return v
	}
	return RateLimit{Limit: n("Limit"), Remaining: n("Remaining"), Reset: h.Get(prefix + "Reset")}
}

// parseRetryAfter reads delta-seconds or an HTTP date (one already past reads as 0); ok
// is false when v is absent or neither.
func parseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
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
// answered {"error": "..."} for this message, and published the others (docs
// features/batch). QStash documents neither the texts nor which are final, so an item error
// is permanent only when its text is known to be about the message itself and final
// (permanentItemTexts, each with its source); any other is retried, and an item error
// naming the deployment (a bad destination URL) defers publishing instead.
type ItemError struct {
	// Index is the message's position in the Publish call.
	Index int
	// Message is QStash's error text.
	Message string
}

// Error names the item's index and QStash's text.
func (e *ItemError) Error() string {
	return fmt.Sprintf("qstash batch item %d: %s", e.Index, e.Message)
}

// Permanent reports whether the text is a known, final rejection of the message itself.
func (e *ItemError) Permanent() bool {
	msg := strings.ToLower(e.Message)
	for _, t := range permanentItemTexts {
		if strings.Contains(msg, t) {
			return true
		}
	}
	return false
}

// permanentItemTexts are item errors known to reject the message itself for good.
var permanentItemTexts = []string{
	// github.com/superset-sh/superset/pull/3591 (us-east-1, 2026-04): a deduplication id
	// with ':' is refused. The relay's ids never contain ':'; kept for ids from elsewhere.
	"deduplicationid cannot contain",
}

// deploymentText recognises an error text that blames the deployment rather than the
// message, and returns the variable to fix with a hint.
func deploymentText(msg string) (variable, hint string, ok bool) {
	m := strings.ToLower(msg)
	switch {
	case retriesText(m):
		// Upstash-Retries over the plan's cap: the wording is undocumented (contract §4),
		// so any text about the retry count counts. Checked before the failure callback:
		// its retries default to the message's, so a text about them is the same fault.
		return "QSTASH_RETRIES/QSTASH_PLAN", "QStash refused the retry count (Upstash-Retries, from QSTASH_RETRIES) the relay sets on every message: more than the account's plan allows? (QSTASH_PLAN must name the plan QStash bills)", true
	case strings.Contains(m, "invalid destination url"):
		// upstash/docs#50, upstash/workflow-js#149: the destination is not a URL QStash
		// accepts. The relay builds it from PUBLIC_BASE_URL and a validated topic.
		return "PUBLIC_BASE_URL", "QStash refused the destination URL built from it", true
	case strings.Contains(m, "failure-callback") || strings.Contains(m, "failure callback"):
		return "FAILURE_CALLBACK_URL", "QStash refused the failure-callback URL", true
	case strings.Contains(m, "flow-control-value"):
		// upstash/qstash-js#245: the exact 400 text for a bad Upstash-Flow-Control-Value.
		return "FLOW_CONTROL_PARALLELISM/FLOW_CONTROL_RATE/FLOW_CONTROL_PERIOD", "QStash refused the flow-control settings", true
	case strings.Contains(m, "queue limit") || strings.Contains(m, "queue count"):
		// The plan's queue count (pricing page); the local server's text for it.
		return "FIFO_QUEUES/QSTASH_PLAN", "QStash refused a queue: more queues than the plan allows", true
	case strings.Contains(m, "invalid token") || strings.Contains(m, "unauthorized"):
		return "QSTASH_TOKEN", "QStash refused the token", true
	}
	return "", "", false
}

// retriesText recognises a lower-cased refusal of the retry count.
func retriesText(m string) bool {
	for _, t := range []string{"upstash-retries", "maxretries", "max retries", "retry count", "retries count", "number of retries"} {
		if strings.Contains(m, t) {
			return true
		}
	}
	return strings.Contains(m, "retries") && !strings.Contains(m, "retried")
}

// sharedHeaders are the variables behind the headers every message of the relay carries,
// named when QStash refuses all of a call's messages the same way in words the relay
// does not know (deploymentText knows some).
const sharedHeaders = "QSTASH_RETRIES/QSTASH_PLAN (Upstash-Retries), FAILURE_CALLBACK_URL (Upstash-Failure-Callback) or FLOW_CONTROL_PARALLELISM/FLOW_CONTROL_RATE/FLOW_CONTROL_PERIOD (Upstash-Flow-Control-Value)"

// sharedRefusal is the deferral of a request refused whole, both halves of it refused the
// same way, nothing in the call accepted: the refusal is about what every message
// carries, not about n bad messages.
func (p *Publisher) sharedRefusal(e *APIError, n int) *publish.DeferError {
	if v, hint, ok := deploymentText(e.Message); ok {
		return p.deployment(v, hint, e)
	}
	return p.deployment(sharedHeaders, fmt.Sprintf("QStash refused %d messages and both halves of them with the same answer, so it refuses something they all carry, not each message", n), e)
}

// unreachableError is a request that got no whole answer: a connection refused or reset,
// a timeout (the request's own or the caller's deadline), a body cut short. The request may
// have been accepted; a resend is deduplicated.
type unreachableError struct{ err error }

func (e *unreachableError) Error() string { return e.err.Error() }
func (e *unreachableError) Unwrap() error { return e.err }

// outageStatus reports whether a status for the whole request means QStash (or something
// in between) is failing rather than refusing the request: 408 and every 5xx.
func outageStatus(code int) bool {
	return code == http.StatusRequestTimeout || code >= 500 && code <= 599
}

// MessageTooLargeError is a message whose payload is over the plan's message size
// (PublisherConfig.MaxMessageBytes). It is not sent, and permanent: it fails alone.
type MessageTooLargeError struct {
	// Index is the message's position in the Publish call.
	Index int
	// OutboxID is the message's outbox row.
	OutboxID outbox.ID
	// Size is the payload's size in bytes.
	Size int64
	// Limit is the configured maximum in bytes (PublisherConfig.MaxMessageBytes).
	Limit int64
	// Plan is the configured QStash plan, whose own limit the message names.
	Plan Plan
}

// Error names the outbox id, the size, the limit and the setting that sets it.
func (e *MessageTooLargeError) Error() string {
	return fmt.Sprintf("outbox message %d not sent: its payload is %d bytes, over the %d-byte QStash message limit (QSTASH_MAX_MESSAGE_BYTES; the %s plan allows %s)",
		e.OutboxID, e.Size, e.Limit, e.Plan, planSize(e.Plan))
}

func planSize(p Plan) string {
	l, err := p.Limits()
	if err != nil {
		return "?"
	}
	return strconv.FormatInt(l.MaxMessageBytes, 10) + " bytes"
}

// Permanent is always true: the same payload is too large every time.
func (e *MessageTooLargeError) Permanent() bool { return true }

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
	// Index is the message's position in the Publish call.
	Index int
	// Reason says what QStash would reject.
	Reason string
}

// Error names the message's index and the reason.
func (e *InvalidMessageError) Error() string {
	return fmt.Sprintf("qstash message %d not sent: %s", e.Index, e.Reason)
}

// Permanent is always true: the same message would be refused again.
func (e *InvalidMessageError) Permanent() bool { return true }

// DefaultQuotaPause is how long publishing pauses after a 429 that says nothing about
// when the limit resets.
const DefaultQuotaPause = 10 * time.Second

// maxQuotaPause bounds a reset taken from headers: a daily quota resets within a day, so
// anything later is treated as unreadable.
const maxQuotaPause = 25 * time.Hour

// answerKind is what a non-2xx answer means for the messages of the request.
type answerKind int

const (
	answerFail  answerKind = iota // each message fails with err (permanent or not)
	answerDefer                   // err is a *publish.DeferError for every message left
	answerSplit                   // one message may be at fault: split the request
)

type decision struct {
	kind answerKind
	err  error
}

// classify decides what a failed request of n messages means: a non-2xx answer (an
// *APIError) or no answer at all (an *unreachableError, or an error building the request).
func (p *Publisher) classify(err error, n int) decision {
	var e *APIError
	if !errors.As(err, &e) {
		var u *unreachableError
		if errors.As(err, &u) {
			return decision{answerDefer, p.outage(time.Time{}, u)}
		}
		return decision{answerFail, err}
	}
	switch {
	case outageStatus(e.StatusCode):
		var until time.Time
		if e.RetryAfter > 0 && e.RetryAfter <= maxQuotaPause {
			until = e.at.Add(e.RetryAfter)
		}
		return decision{answerDefer, p.outage(until, e)}
	case e.StatusCode == http.StatusTooManyRequests:
		until := quotaUntil(e)
		return decision{answerDefer, &publish.DeferError{Reason: publish.DeferQuota, Until: until,
			Err: fmt.Errorf("qstash quota or rate limit reached, publishing paused until %s: %w", until.UTC().Format(time.RFC3339), e)}}
	case e.StatusCode == http.StatusUnauthorized || e.StatusCode == http.StatusForbidden:
		return decision{answerDefer, p.deployment("QSTASH_TOKEN", "QStash refused the token (rotated or for another account?); "+p.cfg.Tokens.status(), e)}
	case e.StatusCode == http.StatusNotFound || e.StatusCode == http.StatusMethodNotAllowed:
		return decision{answerDefer, p.deployment("QSTASH_URL", fmt.Sprintf("%q is not the QStash API, or something in between rewrites the path: it answered %d to %s (QSTASH_URL must be the bare origin, e.g. %s)",
			p.cfg.BaseURL, e.StatusCode, e.Method+" "+strings.TrimPrefix(e.URL, p.baseURL), DefaultBaseURL), e)}
	case queueCapText(e.StatusCode, e.Message):
		return decision{answerDefer, p.deployment("FIFO_QUEUES/QSTASH_PLAN", "QStash refused a queue: more queues than the plan allows", e)}
	}
	// Only a refusal (4xx) can blame the settings; a 5xx's text is about QStash itself.
	if v, hint, ok := deploymentText(e.Message); ok && e.StatusCode >= 400 && e.StatusCode < 500 {
		return decision{answerDefer, p.deployment(v, hint, e)}
	}
	if messageStatus(e.StatusCode) && n > 1 {
		return decision{kind: answerSplit}
	}
	// Alone, a message status is the message's fault (APIError.Permanent); anything else
	// is transient.
	return decision{answerFail, fmt.Errorf("publish qstash batch: %w", e)}
}

// outage is the DeferError of a request that failed as a whole: until is when QStash said
// to come back (Retry-After), zero to let the relay choose its pause.
func (p *Publisher) outage(until time.Time, err error) *publish.DeferError {
	return &publish.DeferError{Reason: publish.DeferOutage, Until: until,
		Err: fmt.Errorf("qstash unreachable or failing (%s): not the messages' fault, no attempt spent: %w", p.baseURL, err)}
}

// deployment is the DeferError of a fault an operator must fix in variable.
func (p *Publisher) deployment(variable, hint string, err error) *publish.DeferError {
	return &publish.DeferError{Reason: publish.DeferDeployment, Err: fmt.Errorf("check %s: %s: %w", variable, hint, err)}
}

// quotaUntil is when a 429 says the limit resets: Retry-After, else the reset of the
// exhausted family (RateLimit-Reset for the daily quota, Burst-RateLimit-Reset for the
// one-second management limit), else any reset given, else DefaultQuotaPause. A time in
// the past or more than a day ahead counts as unreadable.
func quotaUntil(e *APIError) time.Time {
	now := e.at
	if now.IsZero() {
		now = time.Now()
	}
	ok := func(t time.Time) bool { return t.After(now) && t.Sub(now) <= maxQuotaPause }
	if e.RetryAfter > 0 && e.RetryAfter <= maxQuotaPause {
		return now.Add(e.RetryAfter)
	}
	var candidates []RateLimit
	for _, r := range []RateLimit{e.RateLimit, e.Burst} {
		if r.Reset != "" && r.Remaining == 0 {
			candidates = append(candidates, r)
		}
	}
	candidates = append(candidates, e.RateLimit, e.Burst)
	for _, r := range candidates {
		if t, found := r.resetTime(now); found && ok(t) {
			return t
		}
	}
	return now.Add(DefaultQuotaPause)
}
