package qstash

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// DLQEntry is one message of QStash's dead-letter queue (GET /v2/dlq), with what
// deadletter.Sync needs of it.
type DLQEntry struct {
	DLQID     string
	MessageID string
	// URL is the destination the message was published to.
	URL string
	// Header is the message's headers as delivered (forwarded headers under their
	// destination names).
	Header http.Header
	Body   []byte
	// MaxRetries is the message's retry budget.
	MaxRetries int
	// QueueName and FlowControlKey are set for messages published to a queue or with flow
	// control; DeduplicationID when QStash reports one (its API documents none today).
	QueueName       string
	FlowControlKey  string
	DeduplicationID string
	// ResponseStatus, ResponseHeader and ResponseBody are the destination's last answer
	// (status 0: none, e.g. a timeout).
	ResponseStatus int
	ResponseHeader http.Header
	ResponseBody   []byte
}

// DLQ reads and deletes the entries of QStash's dead-letter queue over its REST API
// (qstash-contract.md §13) with its Publisher's client: the same base URL, the same token
// (re-read once when QStash refuses it), 429s waited out as for the queue calls, and a
// non-2xx answer an *APIError. It implements deadletter.DLQ.
type DLQ struct{ p *Publisher }

// DLQ returns the dead-letter queue of p's QStash account.
func (p *Publisher) DLQ() *DLQ { return &DLQ{p: p} }

const (
	// maxDLQPage is QStash's largest DLQ page (count), and the most ids one delete takes.
	maxDLQPage = 100
	// maxDLQAnswerBytes bounds one DLQ answer. A page is at most 100 messages; their bodies
	// are usually small, but the plans allow up to 50 MB each.
	maxDLQAnswerBytes = 128 << 20
	// minDLQRequestTimeout bounds one DLQ request when RequestTimeout (a batch's bound) is
	// shorter: a page carries up to 100 bodies.
	minDLQRequestTimeout = 30 * time.Second
)

func (d *DLQ) request(ctx context.Context, method, pathQuery string) ([]byte, error) {
	return d.p.api(ctx, apiRequest{method: method, path: pathQuery,
		timeout: max(d.p.cfg.RequestTimeout, minDLQRequestTimeout), maxAnswer: maxDLQAnswerBytes})
}

// List returns one page of entries, oldest first, and the cursor of the next page ("" after
// the last page): GET /v2/dlq?count=100[&cursor=...].
func (d *DLQ) List(ctx context.Context, cursor string) ([]DLQEntry, string, error) {
	q := url.Values{"count": {strconv.Itoa(maxDLQPage)}}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	body, err := d.request(ctx, http.MethodGet, "/v2/dlq?"+q.Encode())
	if err != nil {
		return nil, "", fmt.Errorf("list qstash dlq: %w", err)
	}
	entries, next, err := decodeDLQPage(body)
	if err != nil {
		return nil, "", fmt.Errorf("list qstash dlq: %w", err)
	}
	return entries, next, nil
}

// Delete removes entries by DLQ id and returns how many existed: DELETE
// /v2/dlq?dlqIds=a&dlqIds=b..., at most 100 ids a request.
func (d *DLQ) Delete(ctx context.Context, dlqIDs []string) (int, error) {
	deleted := 0
	for len(dlqIDs) > 0 {
		n := min(len(dlqIDs), maxDLQPage)
		body, err := d.request(ctx, http.MethodDelete, "/v2/dlq?"+url.Values{"dlqIds": dlqIDs[:n]}.Encode())
		if err != nil {
			return deleted, fmt.Errorf("delete qstash dlq entries: %w", err)
		}
		var res struct {
			Deleted int `json:"deleted"`
		}
		if err := json.Unmarshal(body, &res); err != nil {
			return deleted, fmt.Errorf("delete qstash dlq entries: decode answer: %w", err)
		}
		deleted += res.Deleted
		dlqIDs = dlqIDs[n:]
	}
	return deleted, nil
}

// decodeDLQPage reads one answer of GET /v2/dlq: its entries and the next page's cursor.
func decodeDLQPage(body []byte) ([]DLQEntry, string, error) {
	var page struct {
		Cursor   string           `json:"cursor"`
		Messages []dlqMessageWire `json:"messages"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, "", fmt.Errorf("decode page: %w", err)
	}
	entries := make([]DLQEntry, 0, len(page.Messages))
	for _, m := range page.Messages {
		entries = append(entries, m.entry())
	}
	return entries, page.Cursor, nil
}

// dlqMessageWire is a DLQ message as QStash sends it: header values as lists (or strings),
// bodies as UTF-8 text or base64, numbers possibly as strings.
type dlqMessageWire struct {
	DLQID              string          `json:"dlqId"`
	MessageID          string          `json:"messageId"`
	URL                string          `json:"url"`
	Header             json.RawMessage `json:"header"`
	Body               *string         `json:"body"`
	BodyBase64         *string         `json:"bodyBase64"`
	MaxRetries         json.RawMessage `json:"maxRetries"`
	QueueName          string          `json:"queueName"`
	FlowControlKey     string          `json:"flowControlKey"`
	DeduplicationID    string          `json:"deduplicationId"`
	ResponseStatus     json.RawMessage `json:"responseStatus"`
	ResponseHeader     json.RawMessage `json:"responseHeader"`
	ResponseBody       *string         `json:"responseBody"`
	ResponseBodyBase64 *string         `json:"responseBodyBase64"`
}

// entry converts m leniently: a field in an unexpected form is left empty rather than
// failing the page, so one odd entry cannot stop every later sync. An entry without ids, or
// whose identity is unreadable, is then not recorded (deadletter.Sync counts it as foreign).
func (m dlqMessageWire) entry() DLQEntry {
	e := DLQEntry{DLQID: m.DLQID, MessageID: m.MessageID, URL: m.URL, QueueName: m.QueueName,
		FlowControlKey: m.FlowControlKey, DeduplicationID: m.DeduplicationID}
	e.Header = wireHeader(m.Header)
	e.ResponseHeader = wireHeader(m.ResponseHeader)
	e.Body = wireBody(m.Body, m.BodyBase64)
	e.ResponseBody = wireBody(m.ResponseBody, m.ResponseBodyBase64)
	e.MaxRetries = wireInt(m.MaxRetries)
	e.ResponseStatus = wireInt(m.ResponseStatus)
	return e
}

// wireHeader accepts {"k": ["v"]} and {"k": "v"}; other values are dropped.
func wireHeader(raw json.RawMessage) http.Header {
	h := http.Header{}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return h
	}
	for k, v := range m {
		var list []string
		if json.Unmarshal(v, &list) != nil {
			var one string
			if json.Unmarshal(v, &one) != nil {
				continue
			}
			list = []string{one}
		}
		h[http.CanonicalHeaderKey(k)] = list
	}
	return h
}

// wireBody returns the UTF-8 text form, else the decoded base64 form, else nil.
func wireBody(text, b64 *string) []byte {
	if text != nil && *text != "" {
		return []byte(*text)
	}
	if b64 != nil {
		if b, err := base64.StdEncoding.DecodeString(*b64); err == nil {
			return b
		}
	}
	return nil
}

// wireInt accepts a number or a numeric string; anything else is 0.
func wireInt(raw json.RawMessage) int {
	n, _ := strconv.Atoi(string(bytes.Trim(raw, `"`)))
	return n
}
