package qstash

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// apiRequest is one request to QStash's REST API other than /v2/batch: the queue calls
// (EnsureQueues) and the DLQ calls (DLQ). They all go through the Publisher's client, so
// they share its base URL, its token (set by the client's transport and re-read once when
// QStash refuses it, Token.Transport), its handling of a 429 and its error type, *APIError.
type apiRequest struct {
	method string
	// path is the path and query after the base URL, e.g. "/v2/dlq?count=100".
	path string
	// body, when not nil, is sent as JSON.
	body []byte
	// timeout bounds each try, maxAnswer the bytes of an answer read: past it a JSON answer
	// fails to decode rather than exhausting memory.
	timeout   time.Duration
	maxAnswer int64
}

// maxAPIRetries bounds how often one request is sent again after a 429: the management
// endpoints have a per-second burst limit (docs api-ratelimiting).
const maxAPIRetries = 5

// api sends r and returns the answer's body, waiting out a 429 up to maxAPIRetries
// times. A non-2xx answer is an *APIError.
func (p *Publisher) api(ctx context.Context, r apiRequest) ([]byte, error) {
	for try := 0; ; try++ {
		data, err := p.apiOnce(ctx, r)
		var ae *APIError
		if !errors.As(err, &ae) || ae.StatusCode != http.StatusTooManyRequests || try >= maxAPIRetries {
			return data, err
		}
		t := time.NewTimer(apiRetryWait(ae))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (gave up waiting out the rate limit: %w)", err, ctx.Err())
		}
	}
}

// apiRetryWait is how long to wait before sending a request answered 429 again: at once
// for a Retry-After of 0, else until the reset quotaUntil reads from the answer (a
// Retry-After, the burst limit's reset, or DefaultQuotaPause).
func apiRetryWait(e *APIError) time.Duration {
	if e.retryAfterRead && e.RetryAfter == 0 {
		return 0
	}
	return time.Until(quotaUntil(e))
}

func (p *Publisher) apiOnce(ctx context.Context, r apiRequest) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	u := p.baseURL + r.path
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return nil, err
	}
	// The bearer token is set by the client's transport (Token.Transport).
	if r.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, r.maxAnswer))
	if err != nil {
		return nil, fmt.Errorf("read qstash answer to %s %s: %w", r.method, u, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, newAPIError(resp, data, p.now(), r.method, u)
	}
	return data, nil
}
