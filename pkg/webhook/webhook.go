package webhook

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
	"github.com/outbox-relay/outbox-relay/v3/internal/tracing"
	"github.com/outbox-relay/outbox-relay/v3/pkg/inbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// Defaults for Config.
const (
	DefaultConsumer     = "webhook"
	DefaultMaxBodyBytes = 1 << 20
)

// MaxReasonBytes bounds the reason a 489 for a Permanent handler error carries: the
// error's text, cut at a rune boundary with "…" appended. Long enough for a sentence that
// names the field and the rule, short enough that a thousand dead letters stay readable.
const MaxReasonBytes = 300

// QStash's non-retryable answer: status 489 together with this header set to "true".
// Defined in internal/receive, with the rest of the QStash status table.
const (
	StatusNonRetryable = receive.StatusNonRetryable
	HeaderNonRetryable = receive.HeaderNonRetryable
)

// Outcomes passed to Config.Observe.
const (
	OutcomeProcessed = "processed"
	OutcomeDuplicate = receive.OutcomeDuplicate
	OutcomePermanent = "permanent"
	OutcomeTransient = receive.OutcomeTransient
	// OutcomeUnauthorized: a bad signature, or forwarded X-Outbox-* headers that contradict
	// the signed identity. Nothing was written.
	OutcomeUnauthorized = receive.OutcomeUnauthorized
	// OutcomeTooLarge: the body is over MaxBodyBytes (489, non-retryable).
	OutcomeTooLarge = receive.OutcomeTooLarge
)

// unknownTopic is the topic passed to Config.Observe for a topic with no handler, so an
// unauthenticated client cannot create metric series by inventing paths.
const unknownTopic = "unknown"

// Delivery is one verified QStash delivery, as a HandlerFunc sees it.
type Delivery struct {
	// Topic is the {topic} path segment.
	Topic string
	// MessageID is the dedupe key: the outbox id (decimal) from the signed URL's outbox_id.
	MessageID string
	// Generation is the signed URL's generation: how often the event was redriven.
	Generation int
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
	// MaxBodyBytes caps the request body; larger bodies get 489 (non-retryable) and are
	// not read whole.
	// Default DefaultMaxBodyBytes (1 MiB, QStash's smallest message limit).
	MaxBodyBytes int64
	// PublicBaseURL is the scheme and host the relay publishes to (PUBLIC_BASE_URL, e.g.
	// https://hooks.example.com). The signed URL is PublicBaseURL + the request's escaped
	// path and query. Required unless OriginFromFunctionURL is set: served over net/http,
	// the handler has no trusted source for it (the client's Host header is never used).
	PublicBaseURL string
	// OriginFromFunctionURL, with PublicBaseURL empty, takes the signed URL's origin from
	// the Lambda Function URL event (https://<requestContext.domainName>, which pkg/funcurl
	// puts in the request context): a Function URL cannot be passed to its own function's
	// environment, so a webhook Lambda served by funcurl.New sets it. A request that did
	// not come through funcurl then gets 500 and a configuration error is logged.
	// PublicBaseURL, when set, wins.
	OriginFromFunctionURL bool
	// Logger receives one line per delivery. Default slog.Default().
	Logger *slog.Logger
	// Observe, when set, is called once per delivery on /events/{topic} with the topic (or
	// "unknown") and one of the Outcome* values, e.g. to count deliveries in metrics.
	Observe func(topic, outcome string)
	// Legacy, when set, is the fallback for deliveries published before the message id
	// moved into the signed URL (see LegacyOutbox). Nil refuses them: 489 missing_message_id.
	Legacy LegacyCheck
	// SharesOutbox says that the outbox this webhook receives from is the outbox table of
	// Pool's database (the relay and the consumer share it). Then a delivery of an event
	// generation the outbox row has left behind (the event was put back in the outbox by
	// a consumer outage, or redriven, and will come again under its new generation, in its
	// key's order) is acknowledged with 200 superseded and not applied. Leave it false
	// when Pool's database has an outbox table of its own: ids would not match.
	SharesOutbox bool
	// HandlerTimeout bounds one delivery's handler and inbox transaction; past it the
	// transaction rolls back and the webhook answers 503 with Retry-After. Default
	// DefaultHandlerTimeout; the budget always ends AnswerMargin before the request's own
	// deadline (a Lambda invocation's), so QStash gets an answer, never a timeout.
	HandlerTimeout time.Duration
	// Tracer, when set, runs every verified delivery inside a consumer span
	// (tracing.StartDelivery: the producer span's child on the first delivery, a new trace
	// linked to it on a redelivery) with a child span around the inbox transaction. Nil
	// turns tracing off at no cost.
	Tracer trace.Tracer
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Consumer = cmp.Or(c.Consumer, DefaultConsumer)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, DefaultMaxBodyBytes)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.HandlerTimeout = cmp.Or(c.HandlerTimeout, DefaultHandlerTimeout)
	return c
}

// Validate reports every invalid field, each a *publish.ConfigError.
func (c Config) Validate() error {
	bad := configcheck.For("webhook")
	if c.Pool == nil {
		bad.Bad("Pool", "is nil; it must be the pool the inbox transactions run on (a *pgxpool.Pool)")
	}
	receive.CheckConfig(bad, c.Verifier, c.MaxBodyBytes, "deliveries", "DefaultMaxBodyBytes")
	if len(c.Handlers) == 0 {
		bad.Bad("Handlers", "is empty; register at least one topic")
	}
	if c.HandlerTimeout < 0 {
		bad.Bad("HandlerTimeout", "%v is negative", c.HandlerTimeout)
	}
	for topic, fn := range c.Handlers {
		if err := outbox.ValidTopic(topic); err != nil {
			bad.Bad("Handlers", "topic %q: %v", topic, err)
		}
		if fn == nil {
			bad.Bad("Handlers", "topic %q has a nil handler", topic)
		}
	}
	switch {
	case c.PublicBaseURL != "":
		if err := configcheck.BaseURL(c.PublicBaseURL); err != nil {
			bad.Bad("PublicBaseURL", "%v", err)
		}
	case !c.OriginFromFunctionURL:
		// Fail here rather than answer every delivery 500: nothing else can say what QStash signed.
		bad.Bad("PublicBaseURL", "is empty; set it to the scheme and host QStash delivers to (PUBLIC_BASE_URL, "+
			"e.g. https://hooks.example.com), or set OriginFromFunctionURL when the handler is served by pkg/funcurl")
	}
	return bad.Err()
}

// Handler is the webhook http.Handler. It is safe for concurrent use.
type Handler struct {
	cfg  Config
	mux  *http.ServeMux
	recv receive.Receiver
	// topics are cfg.Handlers' topics, for the key-order check (keyorder.go).
	topics []string
}

// New returns a Handler, or an error naming every invalid Config field.
func New(cfg Config) (*Handler, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.PublicBaseURL = strings.TrimRight(cfg.PublicBaseURL, "/")
	h := &Handler{cfg: cfg, mux: http.NewServeMux(), recv: receive.Receiver{
		Verifier:     cfg.Verifier,
		MaxBodyBytes: cfg.MaxBodyBytes,
		BaseURL:      cfg.PublicBaseURL,
		Name:         "webhook",
		ConfigHint:   "set PUBLIC_BASE_URL",
	}}
	h.topics = slices.Sorted(maps.Keys(cfg.Handlers))
	// The method in the pattern makes the mux answer 405 to other methods on this path.
	h.mux.HandleFunc("POST /events/{topic}", h.serveEvent)
	return h, nil
}

// ServeHTTP routes POST /events/{topic}; everything else is 404 or 405.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mux.ServeHTTP(w, r)
}

// The webhook's rows of the status table; internal/receive has 401, 489 body_too_large,
// 500 and the duplicate.
var (
	replyProcessed    = receive.Reply{Status: http.StatusOK, Code: "processed", Outcome: OutcomeProcessed}
	replyNoMessageID  = receive.Reply{Status: StatusNonRetryable, Code: "missing_message_id", Outcome: OutcomePermanent}
	replyUnknownTopic = receive.Reply{Status: StatusNonRetryable, Code: "unknown_topic", Outcome: OutcomePermanent}
	replyMalformed    = receive.Reply{Status: StatusNonRetryable, Code: "malformed_json", Outcome: OutcomePermanent}
	replyConflict     = receive.Reply{Status: StatusNonRetryable, Code: "payload_conflict", Outcome: OutcomePermanent}
	replyRejected     = receive.Reply{Status: StatusNonRetryable, Code: "rejected", Outcome: OutcomePermanent}
)

func (h *Handler) serveEvent(w http.ResponseWriter, r *http.Request) {
	topic := r.PathValue("topic")
	fn, known := h.cfg.Handlers[topic]
	label := topic
	if !known {
		label = unknownTopic
	}
	a := &receive.Answer{W: w, R: r, Log: h.cfg.Logger.With(slog.String("topic", label))}
	if h.cfg.Observe != nil {
		a.Observe = func(outcome string) { h.cfg.Observe(label, outcome) }
	}
	req, ok := h.recv.Receive(a)
	if !ok {
		return
	}
	body := req.Body

	id, legacy, ok := h.identity(a, req, topic, known)
	if !ok {
		return
	}
	attempt, _ := strconv.Atoi(r.Header.Get(receive.HeaderRetried))
	a.Log = a.Log.With(slog.String("message_id", id.MessageID()), slog.Int("generation", id.Generation),
		slog.Int("attempt", attempt), slog.Bool("legacy_identity", legacy))
	// The span starts only once the signature holds, so unsigned requests cannot make
	// spans, and it is named after the label, so they cannot invent span names either.
	// With a nil Tracer, span is the no-op span and ctx is the request's: nothing allocates.
	ctx, span := tracing.StartDelivery(r.Context(), h.cfg.Tracer, r.Header, label, id.MessageID(), attempt)
	defer span.End()
	a.Span = span
	switch {
	case !known:
		a.Reply(replyUnknownTopic, slog.LevelWarn, "webhook topic has no handler", slog.String("requested_topic", truncate(topic, 128)))
		return
	case !utf8.Valid(body) || !json.Valid(body): // json.Valid alone lets invalid UTF-8 through
		a.Reply(replyMalformed, slog.LevelWarn, "webhook payload is not valid JSON")
		return
	}

	headers := r.Header.Clone()
	headers.Del(receive.HeaderSignature)
	d := Delivery{Topic: topic, MessageID: id.MessageID(), Generation: id.Generation, Payload: body, Headers: headers, Attempt: attempt}
	sum := sha256.Sum256(body)
	budget, cancel := h.handlerBudget(ctx)
	defer cancel()
	// The handler's own error, before the inbox wraps it: its text is the reason a 489 gives.
	var handlerErr error
	outcome, err := h.handleOnce(budget, func(ctx context.Context, tx pgx.Tx, d Delivery) error {
		handlerErr = fn(ctx, tx, d)
		return handlerErr
	}, d, sum[:])
	if outcome != 0 && span.IsRecording() {
		span.SetAttributes(inboxOutcomeKey.String(outcome.String()))
	}
	switch {
	case err == nil && outcome == inbox.Duplicate:
		a.Reply(receive.ReplyDuplicate, slog.LevelInfo, "webhook delivery already processed")
	case err == nil:
		a.Reply(replyProcessed, slog.LevelInfo, "webhook delivery processed")
	case errors.Is(err, errSuperseded):
		a.Reply(replySuperseded, slog.LevelInfo, "webhook delivery superseded: its event is back in the outbox and comes again under a new generation")
	case errors.Is(err, errPutBack) || errors.Is(err, errBehindFailed):
		h.answerKeyOrder(budget, w, a, d, err)
	case errors.Is(err, inbox.ErrPayloadConflict):
		// Two different payloads under one id is a producer or relay bug: loud.
		a.Reply(replyConflict, slog.LevelError, "webhook payload conflicts with the one already processed under this id", slog.Any("error", err))
	case IsPermanent(err):
		a.Message = reason(cmp.Or(handlerErr, err))
		a.Reply(replyRejected, slog.LevelWarn, "webhook delivery rejected permanently", slog.Any("error", err))
	default:
		if rep, after, ok := notNow(err, budget, r.Context()); ok {
			setRetryAfter(w, after)
			a.Reply(rep, slog.LevelError, "webhook delivery not applied now; QStash will retry after Retry-After",
				slog.Any("error", err), slog.Duration("retry_after", after))
			return
		}
		a.Reply(receive.ReplyTransient, slog.LevelError, "webhook delivery failed; QStash will retry", slog.Any("error", err))
	}
}

// reason is the "message" a 489 carries for err, a Permanent handler error (Permanent has
// the rule for its text): err's text with control characters and runs of white space made
// one space, cut to MaxReasonBytes at a rune boundary. Transient errors stay in the log:
// their 500 carries the code only.
func reason(err error) string {
	if err == nil {
		return ""
	}
	return receive.OneLine(err.Error(), MaxReasonBytes)
}

// inboxOutcomeKey is the span attribute that says what the inbox did with a delivery:
// inbox.Processed, Duplicate or Conflict as a word.
const inboxOutcomeKey = attribute.Key("outbox.inbox_outcome")

// handleOnce runs fn once per message id in the inbox transaction, inside an "inbox
// commit" span (the delivery span's child) when tracing is on, so spans the handler starts
// from ctx nest under the transaction they commit with.
func (h *Handler) handleOnce(ctx context.Context, fn HandlerFunc, d Delivery, sum []byte) (inbox.Outcome, error) {
	work := func(ctx context.Context, tx pgx.Tx) error {
		if h.cfg.SharesOutbox {
			if old, err := superseded(ctx, tx, d); err != nil || old {
				return cmp.Or(err, errSuperseded)
			}
			if err := h.keyOrder(ctx, tx, d); err != nil {
				return err
			}
		}
		return fn(ctx, tx, d)
	}
	if h.cfg.Tracer == nil {
		return inbox.HandleOnce(ctx, h.cfg.Pool, inbox.Message{Consumer: h.cfg.Consumer, ID: d.MessageID, PayloadHash: sum, Retried: &d.Attempt}, work)
	}
	ctx, span := h.cfg.Tracer.Start(ctx, "inbox commit", trace.WithAttributes(
		semconv.DBSystemNamePostgreSQL, attribute.String("outbox.consumer", h.cfg.Consumer)))
	defer span.End()
	outcome, err := inbox.HandleOnce(ctx, h.cfg.Pool, inbox.Message{Consumer: h.cfg.Consumer, ID: d.MessageID, PayloadHash: sum, Retried: &d.Attempt}, work)
	if outcome != 0 {
		span.SetAttributes(inboxOutcomeKey.String(outcome.String()))
	}
	if err != nil && outcome != inbox.Conflict {
		// The handler's error text may quote the payload: spans get the class only.
		class := "transient"
		if IsPermanent(err) {
			class = "permanent"
		}
		span.SetAttributes(semconv.ErrorTypeKey.String(class))
		span.SetStatus(codes.Error, "inbox transaction rolled back")
	}
	return outcome, err
}

// identity returns the message identity from the signed URL. Forwarded X-Outbox-Id or
// X-Outbox-Generation headers that contradict it are a replay with altered headers: 401,
// nothing written. A URL without one is a delivery published before the identity moved
// into the URL: the Legacy check decides. When it returns false it has answered.
func (h *Handler) identity(a *receive.Answer, req receive.Request, topic string, known bool) (qstash.Identity, bool, bool) {
	r := a.R
	id, err := receive.FromURL(req.URL)
	switch {
	case err == nil:
		if receive.Contradicts(id, r.Header.Get) {
			a.Reply(receive.ReplyUnauthorized, slog.LevelWarn, "webhook delivery refused: forwarded X-Outbox-* headers contradict the signed URL",
				slog.Int64("signed_outbox_id", int64(id.OutboxID)), slog.Int("signed_generation", id.Generation))
			return id, false, false
		}
		return id, false, true
	case !errors.Is(err, receive.ErrNoIdentity):
		// Signed, so the publisher wrote it: a relay bug, not an attack.
		a.Reply(replyNoMessageID, slog.LevelError, "webhook delivery has an invalid identity in its signed URL", slog.Any("error", err))
		return id, false, false
	}
	id, err = receive.FromHeaders(r.Header.Get)
	if err != nil || h.cfg.Legacy == nil || !known {
		a.Reply(replyNoMessageID, slog.LevelWarn, "webhook delivery has no outbox_id in its signed URL",
			slog.Bool("legacy_header", err == nil), slog.Bool("legacy_enabled", h.cfg.Legacy != nil))
		return id, true, false
	}
	accepted, err := h.cfg.Legacy(r.Context(), LegacyDelivery{Identity: id, Topic: topic, Payload: req.Body})
	switch {
	case err != nil:
		a.Reply(receive.ReplyTransient, slog.LevelError, "webhook legacy identity check failed; QStash will retry", slog.Any("error", err))
		return id, true, false
	case !accepted:
		a.Reply(receive.ReplyUnauthorized, slog.LevelWarn, "webhook delivery refused: its unsigned X-Outbox-Id is not accepted (legacy window closed, or no outbox row with this topic and payload)",
			slog.Int64("claimed_outbox_id", int64(id.OutboxID)))
		return id, true, false
	}
	return id, true, true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
