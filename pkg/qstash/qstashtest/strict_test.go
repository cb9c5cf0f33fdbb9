package qstashtest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/localqstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// wantError checks a production-shaped error answer: the status and a JSON {"error"} body.
func wantError(t *testing.T, what string, resp *http.Response, body string, status int) {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	if resp.StatusCode != status || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
		t.Errorf("%s: %d %s, want %d {\"error\":...}", what, resp.StatusCode, body, status)
	}
}

// TestStrictRejections: what production rejects, with production's status and body:
// flow-control keys and labels outside the resource-name rule (400), a message over the
// plan's size (412), retries over the plan's cap (400), unknown paths (404), on publish and
// in batches.
func TestStrictRejections(t *testing.T) {
	t.Parallel()
	dst := newSink(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanFree})
	pub := "/v2/publish/" + dst.URL + "/x"
	for _, tc := range []struct {
		what   string
		header http.Header
		body   string
		status int
	}{
		{"flow-control key with ':'", http.Header{"Upstash-Flow-Control-Key": {"order:o-42"}, "Upstash-Flow-Control-Value": {"parallelism=1"}}, "{}", 400},
		{"flow-control key with a space", http.Header{"Upstash-Flow-Control-Key": {"eu west"}, "Upstash-Flow-Control-Value": {"parallelism=1"}}, "{}", 400},
		{"label with '/'", http.Header{"Upstash-Label": {"orders/eu"}}, "{}", 400},
		{"one bad label of two", http.Header{"Upstash-Label": {"ok,not ok"}}, "{}", 400},
		{"retries over the free plan's 3", http.Header{"Upstash-Retries": {"4"}}, "{}", 400},
		{"message over the free plan's 1 MB", nil, strings.Repeat("x", 1_000_001), 412},
	} {
		resp, b := localqstash.Call(t, srv, http.MethodPost, pub, tc.header, tc.body)
		wantError(t, tc.what, resp, b, tc.status)
	}
	for _, ok := range []http.Header{
		{"Upstash-Flow-Control-Key": {"shop.customer_7-0a1b"}, "Upstash-Flow-Control-Value": {"parallelism=1"}},
		{"Upstash-Label": {"order.created"}, "Upstash-Retries": {"3"}},
	} {
		if resp, b := localqstash.Call(t, srv, http.MethodPost, pub, ok, strings.Repeat("x", 1_000_000)); resp.StatusCode != http.StatusCreated {
			t.Errorf("%v: %d %s, want 201", ok, resp.StatusCode, b)
		}
	}
	for _, path := range []string{"/v2/v2/batch", "/v3/publish/" + dst.URL, "/batch", "/"} {
		resp, b := localqstash.Call(t, srv, http.MethodPost, path, nil, "[]")
		wantError(t, path, resp, b, http.StatusNotFound)
	}
	// Without a plan (the dev server's default) the plan limits do not apply; the
	// resource-name rule does.
	open := qstashtest.NewTestServer(t, qstashtest.Options{})
	if resp, b := localqstash.Call(t, open, http.MethodPost, "/v2/publish/"+dst.URL+"/x", http.Header{"Upstash-Retries": {"12"}}, strings.Repeat("x", 2_000_000)); resp.StatusCode != http.StatusCreated {
		t.Errorf("no plan: %d %s", resp.StatusCode, b)
	}
	resp, b := localqstash.Call(t, open, http.MethodPost, "/v2/publish/"+dst.URL+"/x", http.Header{"Upstash-Flow-Control-Key": {"a:b"}, "Upstash-Flow-Control-Value": {"rate=1"}}, "{}")
	wantError(t, "no plan, bad key", resp, b, 400)
	localqstash.WaitIdle(t, srv)
	localqstash.WaitIdle(t, open)
}

// zeros is a body of n zero bytes that is never held in memory.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	k := min(int64(len(p)), z.n)
	clear(p[:k])
	z.n -= k
	return int(k), nil
}

// TestRequestOver100MB: a request body over 100 MB is answered 413 before it is read.
func TestRequestOver100MB(t *testing.T) {
	t.Parallel()
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	n := int64(qstash.MaxRequestBytes + 1)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v2/batch", &zeros{n: n})
	req.ContentLength = n
	resp, b := localqstash.Send(t, srv, req)
	wantError(t, "101 MB batch", resp, b, http.StatusRequestEntityTooLarge)
	if reqs := srv.Requests(); len(reqs) != 1 || reqs[0].Bytes != 0 {
		t.Fatalf("requests %+v: the body must not be read", reqs)
	}
}

// TestBatchErrorShapes: one invalid message in a batch gets an {"error"} element while the
// others publish (documented), or, in whole-request mode, a 400 for the whole request with
// nothing published (observed in production).
func TestBatchErrorShapes(t *testing.T) {
	t.Parallel()
	dst := newSink(t, nil)
	body := fmt.Sprintf(`[
		{"destination":%q,"body":"1"},
		{"destination":%q,"body":"2","headers":{"Upstash-Deduplication-Id":"a:b"}},
		{"destination":%q,"body":"3"}]`, dst.URL+"/1", dst.URL+"/2", dst.URL+"/3")
	per := qstashtest.NewTestServer(t, qstashtest.Options{})
	resp, b := localqstash.Call(t, per, http.MethodPost, "/v2/batch", nil, body)
	var out []map[string]any
	if err := json.Unmarshal([]byte(b), &out); err != nil || resp.StatusCode != 200 || len(out) != 3 ||
		out[0]["messageId"] == nil || out[1]["error"] != "DeduplicationId cannot contain ':'" || out[2]["messageId"] == nil {
		t.Fatalf("per-item: %d %s", resp.StatusCode, b)
	}
	whole := qstashtest.NewTestServer(t, qstashtest.Options{BatchErrors: qstashtest.BatchErrorsWholeRequest})
	resp, b = localqstash.Call(t, whole, http.MethodPost, "/v2/batch", nil, body)
	wantError(t, "whole-request", resp, b, http.StatusBadRequest)
	if !strings.Contains(b, "cannot contain ':'") {
		t.Fatalf("whole-request error %s does not say why", b)
	}
	dst.settled(t, per, 2, "(the per-item server's good messages; the whole-request server's none)")
}

// TestQuota429: after QuotaMessages messages the server answers 429 with the daily-quota
// headers (Reset in unix seconds), accepts nothing more, and accepts again after a reset.
func TestQuota429(t *testing.T) {
	t.Parallel()
	dst := newSink(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{QuotaMessages: 3, QuotaWindow: time.Hour})
	batch := func(n int) string {
		var items []string
		for i := range n {
			items = append(items, fmt.Sprintf(`{"destination":%q,"body":"%d"}`, dst.URL, i))
		}
		return "[" + strings.Join(items, ",") + "]"
	}
	if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/batch", nil, batch(2)); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	start := time.Now()
	resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/batch", nil, batch(2))
	wantError(t, "over quota", resp, b, http.StatusTooManyRequests)
	reset, err := strconv.ParseInt(resp.Header.Get("RateLimit-Reset"), 10, 64)
	if err != nil || resp.Header.Get("RateLimit-Limit") != "3" || resp.Header.Get("RateLimit-Remaining") != "1" ||
		reset < start.Add(59*time.Minute).Unix() || reset > time.Now().Add(time.Hour+time.Second).Unix() {
		t.Fatalf("headers %v: want Limit 3, Remaining 1, Reset in unix seconds an hour ahead", resp.Header)
	}
	if resp, _ := localqstash.Call(t, srv, http.MethodPost, "/v2/publish/"+dst.URL, nil, "x"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("the last message of the quota: %d", resp.StatusCode)
	}
	if resp, _ := localqstash.Call(t, srv, http.MethodPost, "/v2/publish/"+dst.URL, nil, "x"); resp.StatusCode != http.StatusTooManyRequests || srv.QuotaUsed() != 3 {
		t.Fatalf("quota used up: %d, used %d", resp.StatusCode, srv.QuotaUsed())
	}
	srv.ResetQuota()
	if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/batch", nil, batch(3)); resp.StatusCode != 200 {
		t.Fatalf("after reset: %d %s", resp.StatusCode, b)
	}
	dst.settled(t, srv, 6, "")
}

// TestLatency: every API answer takes at least Latency.
func TestLatency(t *testing.T) {
	t.Parallel()
	const latency = 40 * time.Millisecond
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Latency: latency, LatencyJitter: 5 * time.Millisecond})
	for _, path := range []string{"/v2/keys", "/v2/nowhere"} {
		start := time.Now()
		resp, _ := localqstash.Call(t, srv, http.MethodGet, path, nil, "")
		if took := time.Since(start); took < latency {
			t.Fatalf("GET %s (%d) answered in %v, under the %v latency", path, resp.StatusCode, took, latency)
		}
	}
}

// TestQueuePause: a paused queue accepts messages but delivers none until resumed.
func TestQueuePause(t *testing.T) {
	t.Parallel()
	dst := newSink(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/queues/", nil, `{"queueName":"q","parallelism":1}`); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/queues/q/pause", nil, ""); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/enqueue/q/"+dst.URL, nil, "x"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	_, b := localqstash.Call(t, srv, http.MethodGet, "/v2/queues/q", nil, "")
	if !strings.Contains(b, `"paused":true`) || srv.Pending() != 1 || len(dst.deliveries()) != 0 {
		t.Fatalf("paused queue: %s, pending %d, delivered %d", b, srv.Pending(), len(dst.deliveries()))
	}
	localqstash.Call(t, srv, http.MethodPost, "/v2/queues/q/resume", nil, "")
	localqstash.WaitIdle(t, srv)
	if len(dst.deliveries()) != 1 {
		t.Fatal("resumed queue did not deliver")
	}
}

// TestMaxInFlight: with MaxInFlight 3 (or the free plan's 10), never more deliveries are in
// flight at the destination than the cap, although 30 messages are ready at once. The
// destination holds each request until the cap is reached and then until all 30 have
// started (which only an uncapped server allows) or 100 ms have passed: without the cap the
// peak is 30, with it the cap itself.
func TestMaxInFlight(t *testing.T) {
	t.Parallel()
	const total = 30
	for _, tc := range []struct {
		opts qstashtest.Options
		cap  int64
	}{{qstashtest.Options{MaxInFlight: 3}, 3}, {qstashtest.Options{Plan: qstash.PlanFree}, 10}} {
		t.Run(strconv.Itoa(int(tc.cap)), func(t *testing.T) {
			t.Parallel()
			var (
				now, peak, started atomic.Int64
				once               sync.Once
				full               = make(chan struct{})
				all                = make(chan struct{})
			)
			dst := newSink(t, func(d delivery, n int) (int, http.Header, string) {
				if started.Add(1) == total {
					close(all)
				}
				cur := now.Add(1)
				defer now.Add(-1)
				for p := peak.Load(); cur > p && !peak.CompareAndSwap(p, cur); p = peak.Load() {
				}
				if cur >= tc.cap {
					once.Do(func() { close(full) })
				}
				hold := time.NewTimer(5 * time.Second)
				defer hold.Stop()
				select {
				case <-full:
				case <-hold.C:
				}
				hold.Reset(100 * time.Millisecond)
				select {
				case <-all:
				case <-hold.C:
				}
				return 200, nil, "ok"
			})
			srv := qstashtest.NewTestServer(t, tc.opts)
			var items []string
			for i := range total {
				items = append(items, fmt.Sprintf(`{"destination":%q,"body":"%d"}`, dst.URL, i))
			}
			if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/batch", nil, "["+strings.Join(items, ",")+"]"); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			localqstash.WaitIdle(t, srv)
			if peak.Load() != tc.cap || len(dst.deliveries()) != total {
				t.Fatalf("peak %d in flight, %d delivered; want exactly %d and %d", peak.Load(), len(dst.deliveries()), tc.cap, total)
			}
		})
	}
}

// TestHoldDeliveries: a held server accepts and keeps messages (published, enqueued,
// batched) but attempts none, not even from a queue paused and resumed; an enqueued message
// creates its queue and counts in its lag; a held message can still be cancelled.
func TestHoldDeliveries(t *testing.T) {
	t.Parallel()
	dst := newSink(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{HoldDeliveries: true})
	resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/publish/"+dst.URL, nil, "one")
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("publish: %d %s", resp.StatusCode, b)
	}
	var first struct{ MessageID string }
	if err := json.Unmarshal([]byte(b), &first); err != nil || first.MessageID == "" {
		t.Fatalf("publish answer %s: %v", b, err)
	}
	if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/enqueue/q/"+dst.URL, nil, "two"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("enqueue: %d %s", resp.StatusCode, b)
	}
	batch := fmt.Sprintf(`[{"destination":%q,"body":"3"},{"destination":%q,"body":"4"}]`, dst.URL, dst.URL)
	if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/batch", nil, batch); resp.StatusCode != http.StatusOK {
		t.Fatalf("batch: %d %s", resp.StatusCode, b)
	}
	for _, action := range []string{"pause", "resume"} {
		if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/queues/q/"+action, nil, ""); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s queue: %d %s", action, resp.StatusCode, b)
		}
	}
	if resp, b := localqstash.Call(t, srv, http.MethodGet, "/v2/queues/q", nil, ""); resp.StatusCode != http.StatusOK || !strings.Contains(b, `"lag":1`) {
		t.Fatalf("queue of the held message: %d %s, want it listed with lag 1", resp.StatusCode, b)
	}
	// An unheld server delivers to this sink within milliseconds (every other test here).
	time.Sleep(100 * time.Millisecond)
	if n, p := len(dst.deliveries()), srv.Pending(); n != 0 || p != 4 {
		t.Fatalf("held server: %d deliveries, %d pending; want 0 and 4", n, p)
	}
	if resp, b := localqstash.Call(t, srv, http.MethodDelete, "/v2/messages/"+first.MessageID, nil, ""); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("cancel held message: %d %s", resp.StatusCode, b)
	}
	if p := srv.Pending(); p != 3 {
		t.Fatalf("%d pending after cancelling one of 4", p)
	}
}
