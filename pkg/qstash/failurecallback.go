package qstash

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrBadFailureCallback is wrapped by every DecodeFailureCallback error.
var ErrBadFailureCallback = errors.New("invalid qstash failure callback")

// FailureCallback is the JSON body QStash POSTs to a message's Upstash-Failure-Callback URL
// once the message has finally failed (retries exhausted, or a 489 non-retryable answer).
// Field meanings follow qstash-contract.md §8.
type FailureCallback struct {
	// Status is the HTTP status of the destination's last response (0 if none was received).
	Status int
	// Header is the destination's last response headers.
	Header http.Header
	// Body is the destination's last response body, base64-decoded. QStash may truncate it.
	Body []byte
	// Retried is how many retries were made; MaxRetries the configured budget.
	Retried    int
	MaxRetries int
	// DLQID identifies the DLQ entry QStash created (e.g. "1725323658779-0").
	DLQID string
	// SourceMessageID is the QStash message id of the failed message. Always set.
	SourceMessageID string
	// URL and Method are the original destination and HTTP method.
	URL    string
	Method string
	// SourceHeader is the original message's headers; forwarded headers appear under
	// their destination names (X-Outbox-Id, not Upstash-Forward-X-Outbox-Id).
	SourceHeader http.Header
	// SourceBody is the original message body, base64-decoded.
	SourceBody []byte
	// NotBefore and CreatedAt are the message's schedule and creation times (zero if absent).
	NotBefore time.Time
	CreatedAt time.Time
	// TopicName and EndpointName are set for URL-group messages, ScheduleID for scheduled
	// ones; CallerIP is the publisher's address.
	TopicName    string
	EndpointName string
	ScheduleID   string
	CallerIP     string
}

// failureCallbackWire is the tolerant wire form: QStash's own documents disagree on whether
// timestamps are numbers or strings and header values strings or lists (contract §8,
// uncertainty 4), so each such field accepts both.
type failureCallbackWire struct {
	Status          flexInt    `json:"status"`
	Header          flexHeader `json:"header"`
	Body            *string    `json:"body"`
	Retried         flexInt    `json:"retried"`
	MaxRetries      flexInt    `json:"maxRetries"`
	DLQID           string     `json:"dlqId"`
	SourceMessageID string     `json:"sourceMessageId"`
	URL             string     `json:"url"`
	Method          string     `json:"method"`
	SourceHeader    flexHeader `json:"sourceHeader"`
	SourceBody      *string    `json:"sourceBody"`
	NotBefore       flexInt    `json:"notBefore"`
	CreatedAt       flexInt    `json:"createdAt"`
	TopicName       string     `json:"topicName"`
	EndpointName    string     `json:"endpointName"`
	ScheduleID      string     `json:"scheduleId"`
	CallerIP        string     `json:"callerIP"`
}

// DecodeFailureCallback parses a failure-callback body. It is tolerant where QStash's
// documentation is ambiguous: timestamps (unix ms) may be numbers or numeric strings, header
// values strings or lists of strings, and unknown fields are ignored. It is strict where a
// wrong value would lose data: a missing sourceMessageId, invalid base64 in body or
// sourceBody, or a non-numeric number is an error wrapping ErrBadFailureCallback.
func DecodeFailureCallback(data []byte) (FailureCallback, error) {
	var w failureCallbackWire
	if err := json.Unmarshal(data, &w); err != nil {
		return FailureCallback{}, fmt.Errorf("decode failure callback: %w: %w", ErrBadFailureCallback, err)
	}
	if w.SourceMessageID == "" {
		return FailureCallback{}, fmt.Errorf("decode failure callback: %w: sourceMessageId missing", ErrBadFailureCallback)
	}
	body, err := decodeB64("body", w.Body)
	if err != nil {
		return FailureCallback{}, err
	}
	sourceBody, err := decodeB64("sourceBody", w.SourceBody)
	if err != nil {
		return FailureCallback{}, err
	}
	return FailureCallback{
		Status:          int(w.Status),
		Header:          http.Header(w.Header),
		Body:            body,
		Retried:         int(w.Retried),
		MaxRetries:      int(w.MaxRetries),
		DLQID:           w.DLQID,
		SourceMessageID: w.SourceMessageID,
		URL:             w.URL,
		Method:          w.Method,
		SourceHeader:    http.Header(w.SourceHeader),
		SourceBody:      sourceBody,
		NotBefore:       unixMilli(int64(w.NotBefore)),
		CreatedAt:       unixMilli(int64(w.CreatedAt)),
		TopicName:       w.TopicName,
		EndpointName:    w.EndpointName,
		ScheduleID:      w.ScheduleID,
		CallerIP:        w.CallerIP,
	}, nil
}

func unixMilli(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// decodeB64 decodes standard base64 (QStash's encoding), padded or not. nil stays nil.
func decodeB64(field string, s *string) ([]byte, error) {
	if s == nil {
		return nil, nil
	}
	b, err := base64.StdEncoding.DecodeString(*s)
	if err != nil {
		b, err = base64.RawStdEncoding.DecodeString(strings.TrimRight(*s, "="))
	}
	if err != nil {
		return nil, fmt.Errorf("decode failure callback: %w: %s is not base64: %w", ErrBadFailureCallback, field, err)
	}
	return b, nil
}

// flexInt is an integer written as a JSON number or a numeric string; null and "" are 0.
type flexInt int64

func (n *flexInt) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	s := string(b)
	if len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if s = strings.TrimSpace(s); s == "" {
			return nil
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// Some encoders write integral floats ("1.7e12"); accept them only if exact.
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f < -(1<<63) || f >= 1<<63 || f != math.Trunc(f) {
			return fmt.Errorf("%q is not an integer", s)
		}
		v = int64(f)
	}
	*n = flexInt(v)
	return nil
}

// flexHeader is {name: value} or {name: [values]}, canonicalised like http.Header.
type flexHeader http.Header

func (h *flexHeader) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	if raw == nil {
		return nil
	}
	out := make(http.Header, len(raw))
	for k, v := range raw {
		v = bytes.TrimSpace(v)
		switch {
		case bytes.Equal(v, []byte("null")):
			continue
		case len(v) > 0 && v[0] == '[':
			var vals []string
			if err := json.Unmarshal(v, &vals); err != nil {
				return fmt.Errorf("header %q: %w", k, err)
			}
			for _, s := range vals {
				out.Add(k, s)
			}
		default:
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return fmt.Errorf("header %q: %w", k, err)
			}
			out.Add(k, s)
		}
	}
	*h = flexHeader(out)
	return nil
}

// MarshalJSON writes f in QStash's own form: numbers for status, counts and unix-ms
// timestamps, header values as lists, bodies as standard base64. Zero optional fields are
// omitted. DecodeFailureCallback reads the result back unchanged.
func (f FailureCallback) MarshalJSON() ([]byte, error) {
	type wire struct {
		Status          int                 `json:"status"`
		Header          map[string][]string `json:"header,omitempty"`
		Body            string              `json:"body,omitempty"`
		Retried         int                 `json:"retried"`
		MaxRetries      int                 `json:"maxRetries"`
		DLQID           string              `json:"dlqId,omitempty"`
		SourceMessageID string              `json:"sourceMessageId"`
		URL             string              `json:"url,omitempty"`
		Method          string              `json:"method,omitempty"`
		SourceHeader    map[string][]string `json:"sourceHeader,omitempty"`
		SourceBody      string              `json:"sourceBody,omitempty"`
		NotBefore       int64               `json:"notBefore,omitempty"`
		CreatedAt       int64               `json:"createdAt,omitempty"`
		TopicName       string              `json:"topicName,omitempty"`
		EndpointName    string              `json:"endpointName,omitempty"`
		ScheduleID      string              `json:"scheduleId,omitempty"`
		CallerIP        string              `json:"callerIP,omitempty"`
	}
	ms := func(t time.Time) int64 {
		if t.IsZero() {
			return 0
		}
		return t.UnixMilli()
	}
	return json.Marshal(wire{
		Status:          f.Status,
		Header:          f.Header,
		Body:            base64.StdEncoding.EncodeToString(f.Body),
		Retried:         f.Retried,
		MaxRetries:      f.MaxRetries,
		DLQID:           f.DLQID,
		SourceMessageID: f.SourceMessageID,
		URL:             f.URL,
		Method:          f.Method,
		SourceHeader:    f.SourceHeader,
		SourceBody:      base64.StdEncoding.EncodeToString(f.SourceBody),
		NotBefore:       ms(f.NotBefore),
		CreatedAt:       ms(f.CreatedAt),
		TopicName:       f.TopicName,
		EndpointName:    f.EndpointName,
		ScheduleID:      f.ScheduleID,
		CallerIP:        f.CallerIP,
	})
}
