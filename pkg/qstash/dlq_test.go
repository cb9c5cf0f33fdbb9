package qstash_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/localqstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// limitingTransport answers 429 (Retry-After: 0, QStash's burst limit) in place of the
// requests limit selects, and sends the others to the server.
type limitingTransport struct {
	limit   func(*http.Request) bool
	limited atomic.Int64
}

func (lt *limitingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if !lt.limit(r) {
		return http.DefaultTransport.RoundTrip(r)
	}
	lt.limited.Add(1)
	return &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"0"}},
		Body: io.NopCloser(strings.NewReader(`{"error":"too many requests"}`)), Request: r}, nil
}

// deadLettered publishes n messages with no retries to a destination that answers 500, so
// each ends in srv's DLQ, and returns the publisher (through tr when not nil).
func deadLettered(t *testing.T, srv *qstashtest.Server, n int, tr http.RoundTripper) *qstash.Publisher {
	t.Helper()
	cons := newConsumer(t, func(string, int) bool { return true })
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: cons.URL,
		Retries: qstash.NoRetries, HTTPClient: &http.Client{Transport: tr}})
	publishAll(t, p, messages(1, n, n))
	localqstash.WaitIdle(t, srv)
	return p
}

// TestDLQListAndDelete: the DLQ of the local server as the publisher's client reads it
// (qstash-contract.md §13): each dead-lettered message with its destination, headers, body
// and last answer; a delete by ids waits out a 429 and sends the ids once; a 429 that does
// not end is an *APIError after maxAPIRetries.
func TestDLQListAndDelete(t *testing.T) {
	t.Parallel()
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	var deletes atomic.Int64
	tr := &limitingTransport{limit: func(r *http.Request) bool {
		return r.Method == http.MethodDelete && deletes.Add(1) == 1
	}}
	p := deadLettered(t, srv, 3, tr)
	ctx := context.Background()
	entries, next, err := p.DLQ().List(ctx, "")
	if err != nil || next != "" || len(entries) != 3 {
		t.Fatalf("list: %d entries, next %q, %v", len(entries), next, err)
	}
	// Entries are in the order the deliveries failed, which is any order.
	sent := map[string]outbox.Message{}
	for _, m := range messages(1, 3, 3) {
		sent[p.MessageDestination(m)] = m
	}
	for _, e := range entries {
		m, ok := sent[e.URL]
		delete(sent, e.URL)
		if !ok || e.DLQID == "" || e.MessageID == "" || string(e.Body) != string(m.Payload) ||
			e.Header.Get("X-Partition-Key") != m.PartitionKey || e.MaxRetries != 0 || e.ResponseStatus != http.StatusInternalServerError {
			t.Fatalf("entry %+v", e)
		}
	}
	n, err := p.DLQ().Delete(ctx, []string{entries[0].DLQID, entries[2].DLQID, "no-such-id"})
	if err != nil || n != 2 || tr.limited.Load() != 1 {
		t.Fatalf("delete: %d %v (%d answered 429 first)", n, err, tr.limited.Load())
	}
	if left := srv.DLQ(); len(left) != 1 || left[0].DLQID != entries[1].DLQID {
		t.Fatalf("left %+v, want the middle entry", left)
	}

	tr.limit = func(*http.Request) bool { return true }
	_, _, err = p.DLQ().List(ctx, "")
	var ae *qstash.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusTooManyRequests || tr.limited.Load() != 1+6 {
		t.Fatalf("lasting 429: %v after %d tries, want an *APIError after 6", err, tr.limited.Load()-1)
	}
}

// TestDLQWaitsOutTheBurstLimit: the local server's one-second burst limit on management
// calls answers as production does (429, Burst-RateLimit-* and no Retry-After), and the
// DLQ calls wait for its reset instead of failing: a sync lists and deletes back to back.
func TestDLQWaitsOutTheBurstLimit(t *testing.T) {
	t.Parallel()
	srv := qstashtest.NewTestServer(t, qstashtest.Options{ManagementBurst: 1})
	p := deadLettered(t, srv, 2, nil)
	ctx := context.Background()
	// The burst counts requests per second of the wall clock: start at the top of one so
	// that the list and the delete share it (straddling two, neither is over the limit).
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
	entries, _, err := p.DLQ().List(ctx, "")
	if err != nil || len(entries) != 2 {
		t.Fatalf("list: %d entries, %v", len(entries), err)
	}
	ids := []string{entries[0].DLQID, entries[1].DLQID}
	if n, err := p.DLQ().Delete(ctx, ids); err != nil || n != 2 {
		t.Fatalf("delete within the list's second: %d, %v", n, err)
	}
	limited := 0
	for _, r := range srv.Requests() {
		if r.Status == http.StatusTooManyRequests {
			limited++
		}
	}
	if limited == 0 {
		t.Fatal("no request was over the burst limit: the test proves nothing")
	}
}

// TestDLQRereadsRotatedToken: the DLQ calls go through the publisher's client, so a token
// rotated at its source is re-read on the 401 as for a publish, once for both.
func TestDLQRereadsRotatedToken(t *testing.T) {
	t.Parallel()
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	deadLettered(t, srv, 2, nil)
	var reads atomic.Int32
	tok := qstash.NewToken(srv.Token, func(context.Context) (string, error) {
		reads.Add(1)
		return "rotated", nil
	})
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Tokens: tok, DestinationBaseURL: "http://127.0.0.1:1"})
	srv.SetToken("rotated")
	ctx := context.Background()
	entries, _, err := p.DLQ().List(ctx, "")
	if err != nil || len(entries) != 2 {
		t.Fatalf("list after the rotation: %d entries, %v", len(entries), err)
	}
	if n, err := p.DLQ().Delete(ctx, []string{entries[0].DLQID, entries[1].DLQID}); err != nil || n != 2 {
		t.Fatalf("delete after the rotation: %d %v", n, err)
	}
	if n := reads.Load(); n != 1 || tok.Value() != "rotated" {
		t.Fatalf("%d re-reads, token %q: want one read, the rotated token", n, tok.Value())
	}
	if byStatus := dlqRequests(srv); byStatus[http.StatusUnauthorized] != 1 || byStatus[http.StatusOK] != 2 {
		t.Fatalf("DLQ requests by status %v: want one 401, then both calls answered", byStatus)
	}
}

// dlqRequests counts the DLQ requests the server answered, by status.
func dlqRequests(srv *qstashtest.Server) map[int]int {
	byStatus := map[int]int{}
	for _, r := range srv.Requests() {
		if r.Path == "/v2/dlq" {
			byStatus[r.Status]++
		}
	}
	return byStatus
}
