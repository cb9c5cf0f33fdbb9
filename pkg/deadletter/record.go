package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
)

// maxResponseBodyBytes caps the destination response body kept in a dead letter.
const maxResponseBodyBytes = 8 << 10

// maxIDBytes bounds the ids and URL copied from a callback.
const maxIDBytes = 1024

// ErrInvalidFailure is wrapped by Record for a failure it cannot record (no QStash
// message id to be idempotent on).
var ErrInvalidFailure = errors.New("invalid delivery failure")

// DeliveryFailure is what Record needs from a QStash failure callback.
type DeliveryFailure struct {
	// QStashMessageID is the failed message (sourceMessageId): the idempotency key.
	QStashMessageID string
	DLQID           string
	// Status is the destination's last HTTP status (0: no response, e.g. a timeout).
	Status int
	// ResponseHeader are the destination's last response headers (names in any case);
	// Permanent reads Upstash-NonRetryable-Error from them.
	ResponseHeader map[string][]string
	ResponseBody   []byte
	Retried        int
	MaxRetries     int
	// URL is the destination the message was sent to.
	URL string
	// OutboxID is the event's outbox row, 0 when unknown. fromCallback reads it from URL's
	// outbox_id query parameter (signed with the callback body).
	OutboxID outbox.ID
	// Generation is the outbox generation the delivery was about (URL's generation); nil
	// when unknown, and the letter is then about the row's current generation.
	Generation *int
	// SourceHeader are the original message's headers (names in any case).
	SourceHeader map[string][]string
	// SourceBody is the original message body.
	SourceBody []byte
}

// maxReasonBytes bounds the destination's reason copied into a letter's error text. The
// webhook cuts its own at webhook.MaxReasonBytes; another consumer's may be longer.
const maxReasonBytes = 1000

// errorText is the dead letter's error column and the outbox row's last_error. When the
// destination's response is a JSON object with a "message" (the webhook's 489 for a
// Permanent handler error: the handler's reason), the reason follows, so the letter, its
// group and the console say why, not only that.
func (f DeliveryFailure) errorText() string {
	status := "no response"
	if f.Status != 0 {
		status = fmt.Sprintf("HTTP %d", f.Status)
	}
	text := fmt.Sprintf("qstash delivery failed: %s after %d of %d retries", status, f.Retried, f.MaxRetries)
	var body struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(f.ResponseBody, &body) != nil {
		return text
	}
	// One line, no NUL (text columns refuse it), bounded: the body is the destination's.
	if reason := receive.OneLine(body.Message, maxReasonBytes); reason != "" {
		return text + ": " + reason
	}
	return text
}

// topicFromURL returns the {topic} of a .../events/{topic} destination, or "".
func topicFromURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	dir, topic, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	if !ok || dir != "events" || topic == "" || strings.Contains(topic, "/") {
		return ""
	}
	return topic
}

// Recorded is Record's result.
type Recorded struct {
	// LetterID is the dead letter, new or recorded before.
	LetterID int64
	// Created is false for a repeated callback: nothing was written.
	Created bool
	// OutboxID is the event's outbox row (0 when the callback names none).
	OutboxID outbox.ID
	// OutboxMarked is true when the outbox row's dead_lettered_at was set now.
	OutboxMarked bool
	// Superseded is true when the new letter is about a generation its outbox row has left
	// behind (the event was redriven since): it was recorded resolved (ResolutionSuperseded)
	// and the row was left alone.
	Superseded bool
}

// Record stores f as one dead letter (source "delivery") and marks its outbox row
// dead-lettered with the error, in one statement. It is idempotent per QStash message id,
// and adds nothing when the event generation already has an open letter (the relay gave up
// on it too): then it changes nothing and returns Created false with that letter's id.
// A failure of a generation the row has left behind (redriven since) is recorded resolved
// as superseded, as Sync records it, and its row is left alone (Superseded true).
func Record(ctx context.Context, db Querier, f DeliveryFailure) (Recorded, error) {
	// Text columns reject NUL and invalid UTF-8; a hostile or odd id must not turn into
	// a database error that QStash would retry forever.
	f.QStashMessageID = textColumn([]byte(f.QStashMessageID), maxIDBytes)
	f.DLQID = textColumn([]byte(f.DLQID), maxIDBytes)
	f.URL = textColumn([]byte(f.URL), maxIDBytes)
	if f.QStashMessageID == "" {
		return Recorded{}, fmt.Errorf("record delivery failure: %w: no source message id", ErrInvalidFailure)
	}
	var payload *string
	if len(f.SourceBody) > 0 && json.Valid(f.SourceBody) {
		s := string(f.SourceBody)
		payload = &s
	}
	var outboxID *outbox.ID
	if f.OutboxID > 0 {
		outboxID = &f.OutboxID
	}
	errText := f.errorText()
	var r Recorded
	var gotOutbox *outbox.ID
	err := db.QueryRow(ctx, qRecordDelivery,
		outboxID, postgres.NullIfZero(topicFromURL(f.URL)), payload, errText, f.Retried, postgres.NullIfZero(f.Status),
		f.QStashMessageID, f.DLQID, textColumn(f.ResponseBody, maxResponseBodyBytes), f.Generation,
	).Scan(&r.LetterID, &gotOutbox, &r.OutboxMarked, &r.Superseded)
	if isDataError(err) && payload != nil {
		// The body was JSON to encoding/json but not to jsonb (e.g. a \u0000 escape): keep
		// the letter with the outbox row's payload rather than losing it.
		f.SourceBody = nil
		return Record(ctx, db, f)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Recorded before (this callback, or the relay's letter for the same event
		// generation): find that letter for the caller's logs.
		if err := db.QueryRow(ctx, qExistingLetter, f.QStashMessageID, outboxID, f.Generation).Scan(&r.LetterID); err != nil {
			return Recorded{}, fmt.Errorf("find recorded delivery failure: %w", err)
		}
		if outboxID != nil {
			r.OutboxID = *outboxID
		}
		return r, nil
	case err != nil:
		return Recorded{}, fmt.Errorf("record delivery failure: %w", err)
	}
	r.Created = true
	if gotOutbox != nil {
		r.OutboxID = *gotOutbox
	}
	return r, nil
}

// textColumn makes b storable in a text column: valid UTF-8, no NUL (Postgres rejects
// both), at most limit bytes, cut on a rune boundary.
func textColumn(b []byte, limit int) string {
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
