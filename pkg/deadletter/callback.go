package deadletter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
	"github.com/outbox-relay/outbox-relay/v3/internal/tracing"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// DefaultCallbackMaxBodyBytes bounds a failure-callback body: it carries the original body
// and the destination's response, both base64 (4/3 larger), each up to QStash's 1 MB.
const DefaultCallbackMaxBodyBytes = 4 << 20

// Outcomes passed to CallbackConfig.Observe.
const (
	OutcomeRecorded  = "recorded"
	OutcomeDuplicate = receive.OutcomeDuplicate
	// OutcomeSuperseded: a late callback about a generation its event has left behind
	// (redriven since), recorded resolved as superseded: history, not a new dead letter.
	OutcomeSuperseded = "superseded"
	// OutcomeRescheduled: a transient final failure (an outage of the destination, not the
	// event's fault: DeliveryFailure.Permanent is false) put its outbox row back to pending
	// for the relay to publish again. Nothing was dead-lettered.
	OutcomeRescheduled  = "rescheduled"
	OutcomeMalformed    = "malformed"
	OutcomeUnauthorized = receive.OutcomeUnauthorized
	OutcomeTooLarge     = receive.OutcomeTooLarge
	OutcomeTransient    = receive.OutcomeTransient
)

// CallbackConfig configures NewCallbackHandler. Zero fields take the defaults.
type CallbackConfig struct {
	// Pool records the letters (a *pgxpool.Pool). Required.
	Pool Querier
	// Verifier checks Upstash-Signature. Required.
	Verifier *qstash.Verifier
	// FailureURL is the exact failure-callback URL the relay publishes
	// (Upstash-Failure-Callback, FAILURE_CALLBACK_URL): QStash signs callbacks with it as the
	// subject. When empty, the trusted origin from the request context (internal/origin, set by
	// pkg/funcurl) plus the request's path and query is used; with neither, requests get
	// 500 and a configuration error is logged. The client's Host is never used.
	FailureURL string
	// MaxBodyBytes caps the callback body. Default DefaultCallbackMaxBodyBytes.
	MaxBodyBytes int64
	// Logger receives one line per callback. Default slog.Default().
	Logger *slog.Logger
	// Observe, when set, is called once per POST with one of the Outcome* values.
	Observe func(outcome string)
	// LegacyWindow reports whether callbacks of deliveries published before the identity
	// moved into the URL may still be linked to their outbox row through the source headers
	// they report. Default: the legacy_identity window in Pool's database (legacyOpen).
	LegacyWindow func(ctx context.Context) (bool, error)
	// Probes is the probe schedule of the circuits this handler opens when it reschedules
	// a transiently failed delivery. Zero: CircuitProbeWait doubling to CircuitProbeMaxWait.
	Probes ProbeSchedule
	// Tracer, when set, records each verified callback in a span of its own trace, linked
	// to the event's producer span (the traceparent among the source headers the callback
	// reports), so the trace of an event that was dead-lettered leads to its letter. Nil
	// turns tracing off.
	Tracer trace.Tracer
}

// CallbackHandler records QStash failure callbacks as dead letters. Any path, POST only:
//
//	recorded, superseded,   200
//	duplicate or rescheduled
//	malformed body          400, nothing written
//	body over the limit     489 + Upstash-NonRetryable-Error: true, nothing written
//	bad or missing sig      401, nothing written
//	database failure        500 (QStash retries the callback)
//
// A transient failure (DeliveryFailure.Permanent false: a 5xx, a timeout, any answer but
// 489 or Upstash-NonRetryable-Error) is the destination's outage, not the event's fault:
// its outbox row goes back to pending under a new generation (Reopen) and the relay
// publishes it again; nothing is dead-lettered. A permanent failure, or one whose row is
// gone, is recorded as a dead letter.
//
// The letter's outbox id and generation come from the signed body: the query of the
// destination url it reports (outbox_id, generation). A callback about a delivery
// published before the identity moved into the URL falls back to the X-Outbox-Id and
// X-Outbox-Generation source headers it reports, while the legacy window is open; after
// that its letter is recorded unlinked (no outbox id).
type CallbackHandler struct {
	cfg  CallbackConfig
	recv receive.Receiver
}

// NewCallbackHandler returns a CallbackHandler, or an error naming every invalid field.
func NewCallbackHandler(cfg CallbackConfig) (*CallbackHandler, error) {
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultCallbackMaxBodyBytes
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.LegacyWindow == nil {
		cfg.LegacyWindow = legacyOpen(cfg.Pool)
	}
	return &CallbackHandler{cfg: cfg, recv: receive.Receiver{
		Verifier:     cfg.Verifier,
		MaxBodyBytes: cfg.MaxBodyBytes,
		URL:          cfg.FailureURL,
		Name:         "failure callback",
		ConfigHint:   "set FAILURE_CALLBACK_URL",
	}}, nil
}

// validate reports every invalid field, each a *publish.ConfigError.
func (c CallbackConfig) validate() error {
	bad := configcheck.For("failure callback")
	if c.Pool == nil {
		bad.Bad("Pool", "is nil; it must be the pool the letters are recorded in (a *pgxpool.Pool)")
	}
	receive.CheckConfig(bad, c.Verifier, c.MaxBodyBytes, "callbacks", "DefaultCallbackMaxBodyBytes")
	if c.FailureURL != "" && configcheck.HTTPURL(c.FailureURL) != nil {
		bad.Bad("FailureURL", "%q must be an absolute URL like https://hooks.example.com/failure", c.FailureURL)
	}
	return bad.Err()
}

// The callback's rows of the status table; internal/receive has 401, 489 body_too_large,
// 500 and the duplicate.
var (
	replyRecorded   = receive.Reply{Status: http.StatusOK, Code: "recorded", Outcome: OutcomeRecorded}
	replySuperseded = receive.Reply{Status: http.StatusOK, Code: "superseded", Outcome: OutcomeSuperseded}
	replyMalformed  = receive.Reply{Status: http.StatusBadRequest, Code: "malformed_callback", Outcome: OutcomeMalformed}
	replyReopened   = receive.Reply{Status: http.StatusOK, Code: "rescheduled", Outcome: OutcomeRescheduled}
)

// ServeHTTP verifies, decodes and records one failure callback.
func (h *CallbackHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		receive.Reply{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed"}.Write(w)
		return
	}
	a := &receive.Answer{W: w, R: r, Log: h.cfg.Logger, Observe: h.cfg.Observe}
	req, ok := h.recv.Receive(a)
	if !ok {
		return
	}
	cb, err := qstash.DecodeFailureCallback(req.Body)
	if err != nil {
		a.Reply(replyMalformed, slog.LevelWarn, "failure callback malformed", slog.Any("error", err))
		return
	}
	f := fromCallback(cb)
	if f.QStashMessageID == "" {
		a.Reply(replyMalformed, slog.LevelWarn, "failure callback has no sourceMessageId")
		return
	}
	legacy := false
	if f.OutboxID == 0 {
		var err error
		if legacy, err = h.legacyIdentity(r.Context(), cb, &f); err != nil {
			a.Reply(receive.ReplyTransient, slog.LevelError, "failure callback legacy window unreadable; QStash will retry", slog.Any("error", err))
			return
		}
	}
	a.Log = a.Log.With(slog.String("qstash_message_id", f.QStashMessageID), slog.Int64("outbox_id", int64(f.OutboxID)), slog.Bool("legacy_identity", legacy))
	ctx := r.Context()
	if h.cfg.Tracer != nil {
		var span trace.Span
		ctx, span = h.startSpan(ctx, f)
		defer span.End()
		a.Span = span
	}
	if !f.Permanent() {
		re, err := Reopen(ctx, h.cfg.Pool, f, h.cfg.Probes)
		if a.Span != nil {
			a.Span.SetAttributes(attribute.String("outbox.reopen", re.State))
		}
		switch {
		case err != nil:
			a.Reply(receive.ReplyTransient, slog.LevelError, "failure callback not rescheduled; QStash will retry", slog.Any("error", err))
			return
		case re.State == ReopenDone:
			// An outage of the destination, not a fault of the event: no operator work.
			a.Reply(replyReopened, slog.LevelInfo, "delivery failed transiently: rescheduled in the outbox, not dead-lettered",
				slog.Int("destination_status", f.Status), slog.Int("retried", f.Retried), slog.Int("generation", re.Generation))
			return
		}
		// No row to reopen, or a generation the row has left: Record keeps the failure.
	}
	rec, err := Record(ctx, h.cfg.Pool, f)
	if err == nil && a.Span != nil {
		a.Span.SetAttributes(deadLetterIDKey.Int64(rec.LetterID), attribute.Bool("outbox.dead_letter.created", rec.Created),
			attribute.Bool("outbox.dead_letter.superseded", rec.Superseded))
	}
	switch {
	case err != nil:
		a.Reply(receive.ReplyTransient, slog.LevelError, "failure callback not recorded; QStash will retry", slog.Any("error", err))
	case !rec.Created:
		a.Reply(receive.ReplyDuplicate, slog.LevelInfo, "failure callback already recorded", slog.Int64("dead_letter_id", rec.LetterID))
	case rec.Superseded:
		// The event was redriven since: this failure is history, nothing for an operator.
		a.Reply(replySuperseded, slog.LevelInfo, "failure callback superseded: its event was redriven since",
			slog.Int64("dead_letter_id", rec.LetterID), slog.Int("destination_status", f.Status), slog.Int("retried", f.Retried))
	default:
		// A dead letter is an operator's problem: warn, so it shows in error dashboards.
		a.Reply(replyRecorded, slog.LevelWarn, "delivery dead-lettered",
			slog.Int64("dead_letter_id", rec.LetterID), slog.Int("destination_status", f.Status),
			slog.Int("retried", f.Retried), slog.Bool("outbox_marked", rec.OutboxMarked))
	}
}

// deadLetterIDKey is the span attribute naming the dead letter a callback recorded (or
// found recorded) and the letters a redrive resolved.
const deadLetterIDKey = attribute.Key("outbox.dead_letter.id")

// startSpan starts the callback's span: a new trace (QStash calls back after its last
// retry, long after the producer's trace ended) linked to the producer span the source
// headers carry. Only ids and counts go on it, never the bodies.
func (h *CallbackHandler) startSpan(ctx context.Context, f DeliveryFailure) (context.Context, trace.Span) {
	topic := topicFromURL(f.URL)
	if topic == "" {
		topic = "unknown"
	}
	opts := []trace.SpanStartOption{
		trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String(tracing.MessagingSystem),
			semconv.MessagingOperationName("dead_letter"),
			semconv.MessagingDestinationName(topic),
			attribute.Int64("outbox.id", int64(f.OutboxID)),
			attribute.String("messaging.qstash.source_message_id", f.QStashMessageID),
			attribute.Int("messaging.qstash.retried", f.Retried),
			attribute.Int("outbox.destination_status", f.Status),
		),
	}
	if l, ok := tracing.Link(producerHeaders(f.SourceHeader)); ok {
		opts = append(opts, trace.WithLinks(l))
	}
	return h.cfg.Tracer.Start(ctx, "dead_letter "+topic, opts...)
}

// producerHeaders picks the W3C trace context out of a callback's source headers, whose
// names come in any case, as delivered (Traceparent) or as published
// (Upstash-Forward-Traceparent).
func producerHeaders(m map[string][]string) map[string]string {
	get := receive.HeaderMap(m)
	value := func(name string) string {
		if v := get(name); v != "" {
			return v
		}
		return get(receive.HeaderForwardPrefix + name)
	}
	tp := value(tracing.TraceparentHeader)
	if tp == "" {
		return nil
	}
	h := map[string]string{tracing.TraceparentHeader: tp}
	if ts := value(tracing.TracestateHeader); ts != "" {
		h[tracing.TracestateHeader] = ts
	}
	return h
}

// legacyIdentity links a callback whose url carries no identity through the source
// headers it reports, while the legacy window is open. It reports whether it did.
func (h *CallbackHandler) legacyIdentity(ctx context.Context, cb qstash.FailureCallback, f *DeliveryFailure) (bool, error) {
	id, err := receive.FromHeaders(receive.HeaderMap(cb.SourceHeader))
	if err != nil {
		return false, nil
	}
	open, err := h.cfg.LegacyWindow(ctx)
	if err != nil || !open {
		if err == nil {
			h.cfg.Logger.WarnContext(ctx, "failure callback without outbox_id in its url after the legacy window: recorded unlinked",
				slog.Int64("claimed_outbox_id", int64(id.OutboxID)))
		}
		return false, err
	}
	f.OutboxID, f.Generation = id.OutboxID, &id.Generation
	return true, nil
}

// legacyOpen reports whether db's legacy_identity window (migration 0007) is open. A
// database without that table has none.
func legacyOpen(db Querier) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		var open bool
		err := db.QueryRow(ctx, qLegacyWindowOpen).Scan(&open)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
			return false, nil
		case err != nil:
			return false, fmt.Errorf("read legacy identity window: %w", err)
		}
		return open, nil
	}
}

// fromCallback extracts what Record needs from a decoded failure callback. The outbox id
// and generation come from the reported destination url (signed with the callback body);
// without them OutboxID stays 0.
func fromCallback(cb qstash.FailureCallback) DeliveryFailure {
	f := DeliveryFailure{
		QStashMessageID: cb.SourceMessageID,
		DLQID:           cb.DLQID,
		Status:          cb.Status,
		ResponseHeader:  cb.Header,
		ResponseBody:    cb.Body,
		Retried:         cb.Retried,
		MaxRetries:      cb.MaxRetries,
		URL:             cb.URL,
		SourceHeader:    cb.SourceHeader,
		SourceBody:      cb.SourceBody,
	}
	if id, err := receive.FromRawURL(cb.URL); err == nil {
		f.OutboxID, f.Generation = id.OutboxID, &id.Generation
	}
	return f
}
