package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/pkg/inbox"
	"github.com/outbox-relay/outbox-relay/pkg/origin"
	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/qstash"
)

// Defaults for Config.
const (
	DefaultConsumer     = "webhook"
	DefaultMaxBodyBytes = 1 << 20
)

// QStash's non-retryable answer: status 489 together with this header set to "true".
const (
	StatusNonRetryable = 489
	HeaderNonRetryable = "Upstash-NonRetryable-Error"
)

// Outcomes passed to Config.Observe.
const (
	OutcomeProcessed    = "processed"
	OutcomeDuplicate    = "duplicate"
	OutcomePermanent    = "permanent"
	OutcomeTransient    = "transient"
	OutcomeUnauthorized = "unauthorized"
)

// UnknownTopic is the topic passed to Config.Observe for a topic with no handler, so an
// unauthenticated client cannot create metric series by inventing paths.
const UnknownTopic = "unknown"

// Delivery is one verified QStash delivery, as a HandlerFunc sees it.
type Delivery struct {
	// Topic is the {topic} path segment.
	Topic string
	// MessageID is the dedupe key: the forwarded X-Outbox-Id, else Upstash-Message-Id.
	MessageID string
	// Payload is the raw body, byte for byte as signed. It is valid JSON.
	Payload []byte
	// Headers are the request headers (correlation id, traceparent, Upstash-*), without
	// Upstash-Signature.
	Headers http.Header
	// Attempt is Upstash-Retried: 0 on QStash's first attempt.
	Attempt int
}

// HandlerFunc applies one delivery. It must write only through tx: its writes commit with
// the dedupe record, or roll back with it when it returns an error. Return Permanent(err)
// for input a retry cannot fix; any other error is retried by QStash.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, d Delivery) error

// Handlers maps topics to their handlers.
type Handlers map[string]HandlerFunc

// Config configures New. Zero fields take the Default* values.
type Config struct {
	// Pool runs the inbox transactions (a *pgxpool.Pool). Required.
	Pool inbox.TxBeginner
	// Verifier checks Upstash-Signature. Required.
	Verifier *qstash.Verifier
	// Consumer names this consumer in processed_messages. Default DefaultConsumer. Two
	// deployments that must each apply every event need different names.
	Consumer string
	// Handlers routes topics. At least one; each topic must be a valid outbox topic.
	Handlers Handlers
	// MaxBodyBytes caps the request body; larger bodies get 413 and are not read whole.
	// Default DefaultMaxBodyBytes (1 MiB, QStash's smallest message limit).
	MaxBodyBytes int64
	// PublicBaseURL is the scheme and host the relay publishes to (PUBLIC_BASE_URL, e.g.
	// https://hooks.example.com). The signed URL is PublicBaseURL + the request's escaped
	// path and query. When empty, the trusted origin a transport adapter put in the request
	// context (pkg/origin, set by pkg/funcurl) is used; with neither, every request gets 500
	// and a configuration error is logged. The client's Host header is never used.
	PublicBaseURL string
	// Logger receives one line per delivery. Default slog.Default().
	Logger *slog.Logger
	// Observe, when set, is called once per delivery on /events/{topic} with the topic (or
	// UnknownTopic) and one of the Outcome* values, e.g. to count deliveries in metrics.
	Observe func(topic, outcome string)
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Consumer == "" {
		c.Consumer = DefaultConsumer
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports every invalid field.
func (c Config) Validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("Pool is nil"))
	}
	if c.Verifier == nil {
		errs = append(errs, errors.New("Verifier is nil"))
	}
	if len(c.Handlers) == 0 {
		errs = append(errs, errors.New("Handlers is empty; register at least one topic"))
	}
	for topic, fn := range c.Handlers {
		if err := outbox.ValidTopic(topic); err != nil {
			errs = append(errs, fmt.Errorf("Handlers: topic %q: %v", topic, err))
		}
		if fn == nil {
			errs = append(errs, fmt.Errorf("Handlers: topic %q has a nil handler", topic))
		}
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, errors.New("MaxBodyBytes is negative"))
	}
	if c.PublicBaseURL != "" {
		if err := validBaseURL(c.PublicBaseURL); err != nil {
			errs = append(errs, fmt.Errorf("PublicBaseURL: %w", err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid webhook config: %w", errors.Join(errs...))
	}
	return nil
}

// validBaseURL accepts an absolute http(s) URL without query or fragment.
func validBaseURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("%q is not a URL: %v", s, err)
	case u.Scheme != "https" && u.Scheme != "http":
		return fmt.Errorf("%q must start with https://", s)
	case u.Host == "":
		return fmt.Errorf("%q has no host", s)
	case u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(s, "?"):
		return fmt.Errorf("%q must not have a query or fragment", s)
	}
	return nil
}

// Handler is the webhook http.Handler. It is safe for concurrent use.
type Handler struct {
	cfg Config
	mux *http.ServeMux
}

// New returns a Handler, or an error naming every invalid Config field.
func New(cfg Config) (*Handler, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.PublicBaseURL = strings.TrimRight(cfg.PublicBaseURL, "/")
	h := &Handler{cfg: cfg, mux: http.NewServeMux()}
	// The method in the pattern makes the mux answer 405 to other methods on this path.
	h.mux.HandleFunc("POST /events/{topic}", h.serveEvent)
	return h, nil
}

// ServeHTTP routes POST /events/{topic}; everything else is 404 or 405.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mux.ServeHTTP(w, r)
}

// reply is one row of the edge's error-class-to-status table.
type reply struct {
	status  int
	code    string // the response body's code; never internal error text
	outcome string
}

var (
	replyProcessed    = reply{http.StatusOK, "processed", OutcomeProcessed}
	replyDuplicate    = reply{http.StatusOK, "duplicate", OutcomeDuplicate}
	replyUnauthorized = reply{http.StatusUnauthorized, "unauthorized", OutcomeUnauthorized}
	replyTooLarge     = reply{http.StatusRequestEntityTooLarge, "body_too_large", OutcomePermanent}
	replyNoMessageID  = reply{StatusNonRetryable, "missing_message_id", OutcomePermanent}
	replyUnknownTopic = reply{StatusNonRetryable, "unknown_topic", OutcomePermanent}
	replyMalformed    = reply{StatusNonRetryable, "malformed_json", OutcomePermanent}
	replyConflict     = reply{StatusNonRetryable, "payload_conflict", OutcomePermanent}
	replyRejected     = reply{StatusNonRetryable, "rejected", OutcomePermanent}
	replyTransient    = reply{http.StatusInternalServerError, "transient_error", OutcomeTransient}
	replyConfig       = reply{http.StatusInternalServerError, "configuration_error", OutcomeTransient}
)

func (h *Handler) serveEvent(w http.ResponseWriter, r *http.Request) {
	topic := r.PathValue("topic")
	fn, known := h.cfg.Handlers[topic]
	label := topic
	if !known {
		label = UnknownTopic
	}
	log := h.cfg.Logger.With(slog.String("topic", label))
	respond := func(rep reply, level slog.Level, msg string, attrs ...any) {
		h.write(w, rep)
		log.Log(r.Context(), level, msg, append(attrs, slog.Int("status", rep.status), slog.String("outcome", rep.outcome))...)
		if h.cfg.Observe != nil {
			h.cfg.Observe(label, rep.outcome)
		}
	}

	body, err := readBody(w, r, h.cfg.MaxBodyBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			respond(replyTooLarge, slog.LevelWarn, "webhook body too large", slog.Int64("limit_bytes", h.cfg.MaxBodyBytes))
			return
		}
		respond(replyTransient, slog.LevelWarn, "webhook body unreadable", slog.Any("error", err))
		return
	}

	signedURL, ok := h.signedURL(r)
	if !ok {
		respond(replyConfig, slog.LevelError,
			"webhook configuration error: set PUBLIC_BASE_URL, or serve through the Function URL adapter that provides the trusted origin")
		return
	}
	if err := h.cfg.Verifier.Verify(r.Header.Get("Upstash-Signature"), signedURL, body); err != nil {
		reason := "unknown"
		var ve *qstash.VerifyError
		if errors.As(err, &ve) {
			reason = string(ve.Reason)
		}
		respond(replyUnauthorized, slog.LevelWarn, "webhook signature rejected", slog.String("reason", reason))
		return
	}

	msgID := r.Header.Get("X-Outbox-Id")
	if msgID == "" {
		msgID = r.Header.Get("Upstash-Message-Id")
	}
	attempt, _ := strconv.Atoi(r.Header.Get("Upstash-Retried"))
	log = log.With(slog.String("message_id", msgID), slog.Int("attempt", attempt))
	switch {
	case msgID == "":
		respond(replyNoMessageID, slog.LevelWarn, "webhook delivery has no X-Outbox-Id or Upstash-Message-Id")
		return
	case !known:
		respond(replyUnknownTopic, slog.LevelWarn, "webhook topic has no handler", slog.String("requested_topic", truncate(topic, 128)))
		return
	case !utf8.Valid(body) || !json.Valid(body): // json.Valid alone lets invalid UTF-8 through
		respond(replyMalformed, slog.LevelWarn, "webhook payload is not valid JSON")
		return
	}

	headers := r.Header.Clone()
	headers.Del("Upstash-Signature")
	d := Delivery{Topic: topic, MessageID: msgID, Payload: body, Headers: headers, Attempt: attempt}
	sum := sha256.Sum256(body)
	outcome, err := inbox.HandleOnce(r.Context(), h.cfg.Pool, h.cfg.Consumer, msgID, sum[:], func(ctx context.Context, tx pgx.Tx) error {
		return fn(ctx, tx, d)
	}, inbox.Retried(attempt))
	switch {
	case err == nil && outcome == inbox.Duplicate:
		respond(replyDuplicate, slog.LevelInfo, "webhook delivery already processed")
	case err == nil:
		respond(replyProcessed, slog.LevelInfo, "webhook delivery processed")
	case errors.Is(err, inbox.ErrPayloadConflict):
		// Two different payloads under one id is a producer or relay bug: loud.
		respond(replyConflict, slog.LevelError, "webhook payload conflicts with the one already processed under this id", slog.Any("error", err))
	case IsPermanent(err):
		respond(replyRejected, slog.LevelWarn, "webhook delivery rejected permanently", slog.Any("error", err))
	default:
		respond(replyTransient, slog.LevelError, "webhook delivery failed; QStash will retry", slog.Any("error", err))
	}
}

// signedURL rebuilds the URL QStash signed (the sub claim) from trusted configuration: the
// public base URL or the adapter's origin, plus the path and query as received.
func (h *Handler) signedURL(r *http.Request) (string, bool) {
	base := h.cfg.PublicBaseURL
	if base == "" {
		o, ok := origin.FromContext(r.Context())
		if !ok {
			return "", false
		}
		base = strings.TrimRight(o, "/")
	}
	u := base + r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	return u, true
}

func (h *Handler) write(w http.ResponseWriter, rep reply) {
	if rep.status == StatusNonRetryable || rep.status == http.StatusRequestEntityTooLarge {
		w.Header().Set(HeaderNonRetryable, "true")
	}
	writeCode(w, rep.status, rep.code)
}

func writeCode(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	key := "error"
	if status < 300 {
		key = "outcome"
	}
	fmt.Fprintf(w, "{%q:%q}\n", key, code)
}

// readBody reads at most limit bytes. A declared Content-Length over the limit is refused
// without reading; otherwise reading stops at limit+1 bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("read webhook body: %w", err)
	}
	return b, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
