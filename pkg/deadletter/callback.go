package deadletter

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"

	"github.com/outbox-relay/outbox-relay/pkg/origin"
	"github.com/outbox-relay/outbox-relay/pkg/qstash"
)

// DefaultCallbackMaxBodyBytes bounds a failure-callback body: it carries the original body
// and the destination's response, both base64 (4/3 larger), each up to QStash's 1 MB.
const DefaultCallbackMaxBodyBytes = 4 << 20

// Outcomes passed to CallbackConfig.Observe.
const (
	OutcomeRecorded     = "recorded"
	OutcomeDuplicate    = "duplicate"
	OutcomeMalformed    = "malformed"
	OutcomeUnauthorized = "unauthorized"
	OutcomeTransient    = "transient"
)

// CallbackConfig configures NewCallbackHandler. Zero fields take the defaults.
type CallbackConfig struct {
	// Pool records the letters (a *pgxpool.Pool). Required.
	Pool Querier
	// Verifier checks Upstash-Signature. Required.
	Verifier *qstash.Verifier
	// FailureURL is the exact failure-callback URL the relay publishes
	// (Upstash-Failure-Callback, FAILURE_PUBLIC_URL): QStash signs callbacks with it as the
	// subject. When empty, the trusted origin from the request context (pkg/origin, set by
	// pkg/funcurl) plus the request's path and query is used; with neither, requests get
	// 500 and a configuration error is logged. The client's Host is never used.
	FailureURL string
	// MaxBodyBytes caps the callback body. Default DefaultCallbackMaxBodyBytes.
	MaxBodyBytes int64
	// Logger receives one line per callback. Default slog.Default().
	Logger *slog.Logger
	// Observe, when set, is called once per POST with one of the Outcome* values.
	Observe func(outcome string)
}

// CallbackHandler records QStash failure callbacks as dead letters. Any path, POST only:
//
//	recorded or duplicate   200
//	malformed body          400, nothing written
//	body over the limit     413 + Upstash-NonRetryable-Error: true
//	bad or missing sig      401, nothing written
//	database failure        500 (QStash retries the callback)
type CallbackHandler struct {
	cfg CallbackConfig
}

// NewCallbackHandler returns a CallbackHandler, or an error naming every invalid field.
func NewCallbackHandler(cfg CallbackConfig) (*CallbackHandler, error) {
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultCallbackMaxBodyBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var errs []error
	if cfg.Pool == nil {
		errs = append(errs, errors.New("Pool is nil"))
	}
	if cfg.Verifier == nil {
		errs = append(errs, errors.New("Verifier is nil"))
	}
	if cfg.MaxBodyBytes < 0 {
		errs = append(errs, errors.New("MaxBodyBytes is negative"))
	}
	if cfg.FailureURL != "" {
		if u, err := url.Parse(cfg.FailureURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			errs = append(errs, fmt.Errorf("FailureURL %q must be an absolute URL like https://hooks.example.com/failure", cfg.FailureURL))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid failure callback config: %w", errors.Join(errs...))
	}
	return &CallbackHandler{cfg: cfg}, nil
}

// ServeHTTP verifies, decodes and records one failure callback.
func (h *CallbackHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeCode(w, http.StatusMethodNotAllowed, "error", "method_not_allowed")
		return
	}
	log := h.cfg.Logger
	respond := func(status int, key, code, outcome string, level slog.Level, msg string, attrs ...any) {
		if status == http.StatusRequestEntityTooLarge {
			w.Header().Set("Upstash-NonRetryable-Error", "true")
		}
		writeCode(w, status, key, code)
		log.Log(r.Context(), level, msg, append(attrs, slog.Int("status", status), slog.String("outcome", outcome))...)
		if h.cfg.Observe != nil {
			h.cfg.Observe(outcome)
		}
	}

	if r.ContentLength > h.cfg.MaxBodyBytes {
		respond(http.StatusRequestEntityTooLarge, "error", "body_too_large", OutcomeMalformed, slog.LevelError,
			"failure callback too large to record; the letter stays only in the QStash DLQ", slog.Int64("limit_bytes", h.cfg.MaxBodyBytes))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			respond(http.StatusRequestEntityTooLarge, "error", "body_too_large", OutcomeMalformed, slog.LevelError,
				"failure callback too large to record; the letter stays only in the QStash DLQ", slog.Int64("limit_bytes", h.cfg.MaxBodyBytes))
			return
		}
		respond(http.StatusInternalServerError, "error", "transient_error", OutcomeTransient, slog.LevelWarn, "failure callback body unreadable", slog.Any("error", err))
		return
	}

	signedURL, ok := h.signedURL(r)
	if !ok {
		respond(http.StatusInternalServerError, "error", "configuration_error", OutcomeTransient, slog.LevelError,
			"failure callback configuration error: set FAILURE_PUBLIC_URL, or serve through the Function URL adapter that provides the trusted origin")
		return
	}
	if err := h.cfg.Verifier.Verify(r.Header.Get("Upstash-Signature"), signedURL, body); err != nil {
		reason := "unknown"
		var ve *qstash.VerifyError
		if errors.As(err, &ve) {
			reason = string(ve.Reason)
		}
		respond(http.StatusUnauthorized, "error", "unauthorized", OutcomeUnauthorized, slog.LevelWarn, "failure callback signature rejected", slog.String("reason", reason))
		return
	}

	cb, err := qstash.DecodeFailureCallback(body)
	if err != nil {
		respond(http.StatusBadRequest, "error", "malformed_callback", OutcomeMalformed, slog.LevelWarn, "failure callback malformed", slog.Any("error", err))
		return
	}
	f := FromCallback(cb)
	log = log.With(slog.String("qstash_message_id", f.QStashMessageID), slog.Int64("outbox_id", f.OutboxID()))
	if f.QStashMessageID == "" {
		respond(http.StatusBadRequest, "error", "malformed_callback", OutcomeMalformed, slog.LevelWarn, "failure callback has no sourceMessageId")
		return
	}
	rec, err := Record(r.Context(), h.cfg.Pool, f)
	switch {
	case err != nil:
		respond(http.StatusInternalServerError, "error", "transient_error", OutcomeTransient, slog.LevelError, "failure callback not recorded; QStash will retry", slog.Any("error", err))
	case !rec.Created:
		respond(http.StatusOK, "outcome", "duplicate", OutcomeDuplicate, slog.LevelInfo, "failure callback already recorded", slog.Int64("dead_letter_id", rec.LetterID))
	default:
		// A dead letter is an operator's problem: warn, so it shows in error dashboards.
		respond(http.StatusOK, "outcome", "recorded", OutcomeRecorded, slog.LevelWarn, "delivery dead-lettered",
			slog.Int64("dead_letter_id", rec.LetterID), slog.Int("destination_status", f.Status),
			slog.Int("retried", f.Retried), slog.Bool("outbox_marked", rec.OutboxMarked))
	}
}

// FromCallback extracts what Record needs from a decoded failure callback.
func FromCallback(cb qstash.FailureCallback) DeliveryFailure {
	return DeliveryFailure{
		QStashMessageID: cb.SourceMessageID,
		DLQID:           cb.DLQID,
		Status:          cb.Status,
		ResponseBody:    cb.Body,
		Retried:         cb.Retried,
		MaxRetries:      cb.MaxRetries,
		URL:             cb.URL,
		SourceHeader:    cb.SourceHeader,
		SourceBody:      cb.SourceBody,
	}
}

func (h *CallbackHandler) signedURL(r *http.Request) (string, bool) {
	if h.cfg.FailureURL != "" {
		return h.cfg.FailureURL, true
	}
	o, ok := origin.FromContext(r.Context())
	if !ok {
		return "", false
	}
	u := strings.TrimRight(o, "/") + r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	return u, true
}

func writeCode(w http.ResponseWriter, status int, key, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	fmt.Fprintf(w, "{%q:%q}\n", key, code)
}
