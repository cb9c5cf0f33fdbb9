package receive

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
	"github.com/outbox-relay/outbox-relay/v3/internal/origin"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// Headers QStash sends with a delivery, and the ones a receiver answers with.
const (
	HeaderSignature    = "Upstash-Signature"
	HeaderMessageID    = "Upstash-Message-Id"
	HeaderRetried      = "Upstash-Retried"
	HeaderNonRetryable = "Upstash-NonRetryable-Error"
	// HeaderForwardPrefix marks a header the publisher asked QStash to forward
	// (Upstash-Forward-X-Outbox-Id arrives as X-Outbox-Id).
	HeaderForwardPrefix = "Upstash-Forward-"
)

// Headers the relay forwards for information. They are not signed: the identity a
// receiver acts on comes from the signed URL (Identity); when one of these is present it
// must agree with it.
const (
	HeaderOutboxID         = "X-Outbox-Id"
	HeaderOutboxGeneration = "X-Outbox-Generation"
)

// StatusNonRetryable is QStash's "do not retry" status, and the only one: QStash documents
// 489 together with HeaderNonRetryable: "true" as "mark the message failed now, skip the
// remaining retries" (docs features/retry.mdx "Non-Retryable Error"; docs/qstash-contract.md
// point 12). Any other error status, 413 included, is retried, and every retry is billed.
// Reply.Write sets the header with it.
const StatusNonRetryable = 489

// Outcomes of the receive step, and the duplicate every receiver answers alike. Receivers
// add their own.
const (
	// OutcomeUnauthorized: the signature is missing or wrong, or a header contradicts
	// the signed identity. Nothing was written.
	OutcomeUnauthorized = "unauthorized"
	// OutcomeTooLarge: the body is over the limit (answered 489, non-retryable: a body
	// that does not fit now never will).
	OutcomeTooLarge = "too_large"
	// OutcomeTransient: QStash should retry (unreadable body, configuration, database).
	OutcomeTransient = "transient"
	// OutcomeDuplicate: the message was applied or recorded before; answered 200, so
	// QStash stops redelivering it.
	OutcomeDuplicate = "duplicate"
)

// Reply is one row of a receiver's status table: the status QStash acts on, the short code
// the JSON body carries (never internal error text), and the outcome logged and counted.
type Reply struct {
	Status  int
	Code    string
	Outcome string
}

// Replies of the receive step itself; receivers answer ReplyTransient and ReplyDuplicate
// as well, so QStash sees one code for them whichever receiver it calls.
var (
	ReplyUnauthorized = Reply{http.StatusUnauthorized, "unauthorized", OutcomeUnauthorized}
	ReplyTooLarge     = Reply{StatusNonRetryable, "body_too_large", OutcomeTooLarge}
	ReplyTransient    = Reply{http.StatusInternalServerError, "transient_error", OutcomeTransient}
	ReplyConfig       = Reply{http.StatusInternalServerError, "configuration_error", OutcomeTransient}
	ReplyDuplicate    = Reply{http.StatusOK, "duplicate", OutcomeDuplicate}
)

// Write answers rep as JSON: {"outcome": code} for 2xx, {"error": code} otherwise. A 489
// carries Upstash-NonRetryable-Error: true, so QStash gives up at once instead of retrying
// what cannot change.
func (rep Reply) Write(w http.ResponseWriter) { rep.write(w, "") }

// write is Write with "message" beside the code when message is not empty.
func (rep Reply) write(w http.ResponseWriter, message string) {
	if rep.Status == StatusNonRetryable {
		w.Header().Set(HeaderNonRetryable, "true")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(rep.Status)
	key := "error"
	if rep.Status < 300 {
		key = "outcome"
	}
	if message == "" {
		fmt.Fprintf(w, "{%q:%q}\n", key, rep.Code)
		return
	}
	// JSON, not %q: Go's quoting escapes differ from JSON's for some runes.
	b, _ := json.Marshal(map[string]string{key: rep.Code, "message": message}) // strings cannot fail
	fmt.Fprintf(w, "%s\n", b)
}

// Answer answers one request: it writes the reply, logs one line with the status and
// outcome, and reports the outcome to Observe. It is built per request.
type Answer struct {
	W http.ResponseWriter
	R *http.Request
	// Log already carries the request's attributes.
	Log *slog.Logger
	// Observe, when set, is called once with the outcome.
	Observe func(outcome string)
	// Span, when set and recording, is the request's span: Reply puts the status code on
	// it, and an error status with the reply's code for a 5xx (QStash retries those). The
	// log line's error text never goes on the span: it may quote the payload.
	Span trace.Span
	// Message, when set, goes in the reply's body beside the code: text the receiver chose
	// to publish (the webhook's Permanent handler errors), never an internal error's.
	Message string
}

// Reply writes rep and logs msg at level with attrs.
func (a *Answer) Reply(rep Reply, level slog.Level, msg string, attrs ...any) {
	if a.Span != nil && a.Span.IsRecording() {
		a.Span.SetAttributes(semconv.HTTPResponseStatusCode(rep.Status))
		if rep.Status >= http.StatusInternalServerError {
			a.Span.SetAttributes(semconv.ErrorTypeKey.String(rep.Code))
			a.Span.SetStatus(codes.Error, rep.Code)
		}
	}
	rep.write(a.W, a.Message)
	ctx := a.R.Context()
	if a.Span != nil {
		// The span starts after the request's context was made: put it there, so the line
		// carries the delivery's trace id.
		ctx = trace.ContextWithSpan(ctx, a.Span)
	}
	a.Log.Log(ctx, level, msg, append(attrs, slog.Int("status", rep.Status), slog.String("outcome", rep.Outcome))...)
	if a.Observe != nil {
		a.Observe(rep.Outcome)
	}
}

// Receiver is the shared receive step. The zero value is not usable: set Verifier and
// MaxBodyBytes.
type Receiver struct {
	// Verifier checks Upstash-Signature.
	Verifier *qstash.Verifier
	// MaxBodyBytes caps the body; a larger one gets 489 (non-retryable) and is not read
	// whole.
	MaxBodyBytes int64
	// BaseURL is the scheme and host QStash delivers to (e.g. https://hooks.example.com):
	// the signed URL is BaseURL + the request's escaped path and query.
	BaseURL string
	// URL, when set, is the exact URL QStash signs (a failure-callback URL) and wins over
	// BaseURL.
	URL string
	// Name says which receiver this is in log lines ("webhook", "failure callback").
	Name string
	// ConfigHint says how to fix a missing URL, e.g. "set PUBLIC_BASE_URL".
	ConfigHint string
}

// CheckConfig records in bad what a receiver's configuration must give its Receiver: a
// verifier, without which QStash's requests could not be told from forged ones, and a body
// limit that is not negative. signed names what QStash signs for this receiver
// ("deliveries", "callbacks"); defaultMax is the default a zero limit takes.
func CheckConfig(bad *configcheck.Problems, v *qstash.Verifier, maxBodyBytes int64, signed, defaultMax string) {
	if v == nil {
		bad.Bad("Verifier", "is nil; it must check the %s' signatures (qstash.NewVerifier)", signed)
	}
	if maxBodyBytes < 0 {
		bad.Bad("MaxBodyBytes", "%d is negative (0 means %s)", maxBodyBytes, defaultMax)
	}
}

// Request is a delivery whose body and URL the signature covers.
type Request struct {
	// Body is the raw body, byte for byte as signed.
	Body []byte
	// URL is the signed URL, parsed; its query is signed too.
	URL *url.URL
}

// Receive reads and verifies r. When it returns false it has answered already (489, 401
// or 500) and the caller must return. With neither URL nor BaseURL set, the trusted origin
// a transport adapter put in the context (internal/origin, set by pkg/funcurl) is the base; the
// client's Host header is never used.
func (rc *Receiver) Receive(a *Answer) (Request, bool) {
	body, err := readBody(a.W, a.R, rc.MaxBodyBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			a.Reply(ReplyTooLarge, slog.LevelWarn, rc.Name+" body too large", slog.Int64("limit_bytes", rc.MaxBodyBytes))
			return Request{}, false
		}
		a.Reply(ReplyTransient, slog.LevelWarn, rc.Name+" body unreadable", slog.Any("error", err))
		return Request{}, false
	}
	signed, ok := rc.signedURL(a.R)
	if !ok {
		a.Reply(ReplyConfig, slog.LevelError, rc.Name+" configuration error: "+rc.ConfigHint+
			", or serve through the Function URL adapter that provides the trusted origin")
		return Request{}, false
	}
	if err := rc.Verifier.Verify(a.R.Header.Get(HeaderSignature), signed, body); err != nil {
		a.Reply(ReplyUnauthorized, slog.LevelWarn, rc.Name+" signature rejected", slog.String("reason", Reason(err)))
		return Request{}, false
	}
	u, err := url.Parse(signed)
	if err != nil {
		// Verified, so QStash signed it: a URL it delivered to parses, this cannot happen.
		a.Reply(ReplyUnauthorized, slog.LevelWarn, rc.Name+" signed URL does not parse", slog.Any("error", err))
		return Request{}, false
	}
	return Request{Body: body, URL: u}, true
}

// OneLine returns s as one line of valid UTF-8 at most limit bytes long (limit >= 3):
// control characters and runs of white space become one space, and a longer text is cut at
// a rune boundary with "…" appended. It makes text from a handler or a destination fit a
// response body, a log line and a text column (which refuses NUL).
func OneLine(s string, limit int) string {
	s = strings.Join(strings.FieldsFunc(strings.ToValidUTF8(s, "\uFFFD"), func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r)
	}), " ")
	if len(s) <= limit {
		return s
	}
	const ellipsis = "…"
	cut := max(limit-len(ellipsis), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// Reason is the log reason of a verification error: a qstash.VerifyReason, or "unknown".
func Reason(err error) string {
	var ve *qstash.VerifyError
	if errors.As(err, &ve) {
		return string(ve.Reason)
	}
	return "unknown"
}

// signedURL rebuilds the URL QStash signed (the sub claim) from trusted configuration.
func (rc *Receiver) signedURL(r *http.Request) (string, bool) {
	if rc.URL != "" {
		return rc.URL, true
	}
	base := rc.BaseURL
	if base == "" {
		o, ok := origin.FromContext(r.Context())
		if !ok {
			return "", false
		}
		base = o
	}
	u := strings.TrimRight(base, "/") + r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	return u, true
}

// readBody reads at most limit bytes. A declared Content-Length over the limit is refused
// without reading; otherwise reading stops at limit+1 bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	return b, nil
}
