package deadletter_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/outbox-relay/outbox-relay/pkg/deadletter"
)

// TestDLQClientDecodesDocumentedShapes: header values as lists or strings, bodies as text or
// base64, numbers as numbers or strings (qstash-contract.md §9), the cursor passed on, and
// the bulk delete's query form.
func TestDLQClientDecodesDocumentedShapes(t *testing.T) {
	t.Parallel()
	var (
		queries []string
		limited bool
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !limited && r.Method == http.MethodDelete {
			// QStash's burst limit: the client waits Retry-After and sends it again.
			limited = true
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"error":"too many requests"}`))
			return
		}
		if r.Header.Get("Authorization") != "Bearer tok" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"invalid token"}`))
			return
		}
		queries = append(queries, r.Method+" "+r.URL.RawQuery)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodDelete:
			_, _ = w.Write([]byte(`{"deleted":2}`))
		case r.URL.Query().Get("cursor") == "":
			_, _ = w.Write([]byte(`{"cursor":"c2","messages":[{"dlqId":"1725323658779-0","messageId":"msg_1",
				"url":"https://hooks.example.com/events/order.created?outbox_id=7&generation=1",
				"header":{"X-Outbox-Id":["7"],"Content-Type":"application/json"},"body":"{\"a\":1}","maxRetries":"3",
				"queueName":"outbox-2","responseStatus":500,"responseHeader":{"Retry-After":"10"},
				"responseBodyBase64":"/w=="}]}`))
		default:
			// The second entry has every field in a form QStash does not document.
			_, _ = w.Write([]byte(`{"messages":[{"dlqId":"d2","messageId":"msg_2","url":"https://x/","bodyBase64":"AAE=","responseBody":"oops"},
				{"dlqId":"d3","header":{"X-Outbox-Id":7,"A":["b"]},"bodyBase64":"%%%","maxRetries":"many","responseStatus":{}}]}`))
		}
	}))
	t.Cleanup(srv.Close)
	c := &deadletter.DLQClient{BaseURL: srv.URL + "/", Token: "tok"}
	ctx := context.Background()
	page, next, err := c.List(ctx, "")
	if err != nil || next != "c2" || len(page) != 1 {
		t.Fatalf("first page: %+v %q %v", page, next, err)
	}
	e := page[0]
	if e.DLQID != "1725323658779-0" || e.MessageID != "msg_1" || e.Header.Get("X-Outbox-Id") != "7" || e.Header.Get("Content-Type") != "application/json" ||
		string(e.Body) != `{"a":1}` || e.MaxRetries != 3 || e.QueueName != "outbox-2" || e.ResponseStatus != 500 ||
		e.ResponseHeader.Get("Retry-After") != "10" || string(e.ResponseBody) != "\xff" {
		t.Fatalf("entry %+v", e)
	}
	page, next, err = c.List(ctx, next)
	if err != nil || next != "" || len(page) != 2 || string(page[0].Body) != "\x00\x01" || string(page[0].ResponseBody) != "oops" {
		t.Fatalf("last page: %+v %q %v", page, next, err)
	}
	// An odd entry does not fail the page: what cannot be read is left empty.
	if odd := page[1]; odd.DLQID != "d3" || odd.MessageID != "" || odd.Header.Get("X-Outbox-Id") != "" || odd.Header.Get("A") != "b" ||
		odd.Body != nil || odd.MaxRetries != 0 || odd.ResponseStatus != 0 {
		t.Fatalf("odd entry %+v", odd)
	}
	if n, err := c.Delete(ctx, []string{"a", "b"}); err != nil || n != 2 || !limited {
		t.Fatalf("delete: %d %v (rate limited first: %v)", n, err, limited)
	}
	want := []string{"GET count=100", "GET count=100&cursor=c2", "DELETE dlqIds=a&dlqIds=b"}
	if !slices.Equal(queries, want) {
		t.Fatalf("requests %q, want %q", queries, want)
	}
	if _, _, err := (&deadletter.DLQClient{BaseURL: srv.URL, Token: "bad"}).List(ctx, ""); err == nil || !strings.Contains(err.Error(), "401: invalid token") {
		t.Fatalf("bad token: %v", err)
	}
}

// loopingDLQ injects a DLQ API that hands out the same cursor forever.
type loopingDLQ struct{ calls int }

func (l *loopingDLQ) List(context.Context, string) ([]deadletter.DLQEntry, string, error) {
	l.calls++
	return []deadletter.DLQEntry{{DLQID: "d", MessageID: "m", URL: "https://elsewhere.example.com/x"}}, "same", nil
}

func (l *loopingDLQ) Delete(context.Context, []string) (int, error) { return 0, nil }

func TestSyncStopsOnRepeatedCursor(t *testing.T) {
	t.Parallel()
	dlq := &loopingDLQ{}
	res, err := deadletter.Sync(context.Background(), nil, deadletter.SyncConfig{DLQ: dlq, DestinationBaseURL: "https://hooks.example.com", Logger: quiet()})
	if err == nil || !strings.Contains(err.Error(), `cursor "same" again`) || dlq.calls != 2 || res.Foreign != 2 {
		t.Fatalf("res %+v calls %d err %v", res, dlq.calls, err)
	}
}

// TestDLQClientGivesUpOnLastingRateLimit: a 429 that does not end is an error after a
// bounded number of tries.
func TestDLQClientGivesUpOnLastingRateLimit(t *testing.T) {
	t.Parallel()
	var tries atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tries.Add(1)
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(srv.Close)
	_, _, err := (&deadletter.DLQClient{BaseURL: srv.URL, Token: "tok"}).List(context.Background(), "")
	var apiErr *deadletter.DLQAPIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || tries.Load() != 4 {
		t.Fatalf("err %v after %d tries", err, tries.Load())
	}
}
