package deadletter

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/pkg/qstash"
)

// DLQEntry is one message of QStash's dead-letter queue (GET /v2/dlq), with what Sync
// needs of it.
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

// DLQ is QStash's dead-letter queue as Sync uses it. DLQClient implements it.
type DLQ interface {
	// List returns one page of entries, oldest first, and the cursor of the next page
	// ("" after the last page).
	List(ctx context.Context, cursor string) (entries []DLQEntry, next string, err error)
	// Delete removes entries by DLQ id and returns how many existed.
	Delete(ctx context.Context, dlqIDs []string) (int, error)
}

const (
	// maxDLQPage is QStash's largest DLQ page (count).
	maxDLQPage = 100
	// maxDLQAnswerBytes bounds one DLQ API answer.
	maxDLQAnswerBytes = 128 << 20
)

// DLQClient reads and deletes QStash DLQ entries over QStash's REST API
// (qstash-contract.md §9).
type DLQClient struct {
	// BaseURL is QStash's origin (QSTASH_URL). Default qstash.DefaultBaseURL.
	BaseURL string
	// Token is the QStash token (QSTASH_TOKEN). Required.
	Token string
	// HTTPClient defaults to a client with a 30 s timeout.
	HTTPClient *http.Client
}

var _ DLQ = (*DLQClient)(nil)

// DLQAPIError is an answer of the DLQ API other than success.
type DLQAPIError struct {
	StatusCode int
	// Message is QStash's {"error"} text, or the body's first bytes.
	Message string
}

// Error says what the DLQ API answered, with its status code, for logs and the CLI.
func (e *DLQAPIError) Error() string {
	return fmt.Sprintf("qstash dlq api answered %d: %s", e.StatusCode, e.Message)
}

// List implements DLQ: GET /v2/dlq?count=100[&cursor=...].
func (c *DLQClient) List(ctx context.Context, cursor string) ([]DLQEntry, string, error) {
	q := url.Values{"count": {strconv.Itoa(maxDLQPage)}}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	body, err := c.do(ctx, http.MethodGet, "/v2/dlq?"+q.Encode())
	if err != nil {
		return nil, "", fmt.Errorf("list qstash dlq: %w", err)
	}
	var page struct {
		Cursor   string           `json:"cursor"`
		Messages []dlqMessageWire `json:"messages"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, "", fmt.Errorf("list qstash dlq: decode page: %w", err)
	}
	entries := make([]DLQEntry, 0, len(page.Messages))
	for _, m := range page.Messages {
		entries = append(entries, m.entry())
	}
	return entries, page.Cursor, nil
}

// Delete implements DLQ: DELETE /v2/dlq?dlqIds=a&dlqIds=b..., at most 100 ids a request.
func (c *DLQClient) Delete(ctx context.Context, ids []string) (int, error) {
	deleted := 0
	for len(ids) > 0 {
		n := min(len(ids), maxDLQPage)
		body, err := c.do(ctx, http.MethodDelete, "/v2/dlq?"+url.Values{"dlqIds": ids[:n]}.Encode())
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
		ids = ids[n:]
	}
	return deleted, nil
}

// maxRateLimitRetries bounds how often one DLQ request is retried after a 429: QStash's
// management API has a per-second burst limit.
const maxRateLimitRetries = 3

func (c *DLQClient) do(ctx context.Context, method, pathQuery string) ([]byte, error) {
	for try := 0; ; try++ {
		body, retryAfter, err := c.once(ctx, method, pathQuery)
		var apiErr *DLQAPIError
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || try == maxRateLimitRetries {
			return body, err
		}
		select {
		case <-time.After(retryAfter):
		case <-ctx.Done():
			return nil, fmt.Errorf("wait out qstash rate limit: %w", ctx.Err())
		}
	}
}

// once sends one request; on a 429 it also returns how long to wait (Retry-After in
// seconds, at most 5 s; 1 s without one).
func (c *DLQClient) once(ctx context.Context, method, pathQuery string) ([]byte, time.Duration, error) {
	if c.Token == "" {
		return nil, 0, errors.New("no QStash token (QSTASH_TOKEN)")
	}
	base := strings.TrimRight(c.BaseURL, "/")
	if base == "" {
		base = qstash.DefaultBaseURL
	}
	req, err := http.NewRequestWithContext(ctx, method, base+pathQuery, nil)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	hc := c.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	// A page is at most 100 messages; their bodies are usually small, but the plans allow
	// up to 50 MB each. Past this bound the decode fails rather than exhausting memory.
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDLQAnswerBytes))
	if err != nil {
		return nil, 0, fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return body, 0, nil
	}
	var e struct {
		Error string `json:"error"`
	}
	msg := strings.Join(strings.Fields(string(body[:min(len(body), 200)])), " ")
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		msg = e.Error
	}
	wait := time.Second
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
		wait = min(time.Duration(s)*time.Second, 5*time.Second)
	}
	return nil, wait, &DLQAPIError{StatusCode: resp.StatusCode, Message: msg}
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
// whose identity is unreadable, is then not recorded (Sync counts it as foreign).
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
