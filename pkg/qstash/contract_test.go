package qstash_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/localqstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// batchRequests counts the /v2/batch requests the server answered, by status.
func batchRequests(srv *qstashtest.Server) (all int, byStatus map[int]int) {
	byStatus = map[int]int{}
	for _, r := range srv.Requests() {
		if r.Path == "/v2/batch" {
			all++
			byStatus[r.Status]++
		}
	}
	return all, byStatus
}

// TestBaseURLRefusedAtStartup: a QSTASH_URL with a path, a query or plain http to a remote
// host is refused by the config, with an error naming the variable.
func TestBaseURLRefusedAtStartup(t *testing.T) {
	t.Parallel()
	for _, base := range []string{
		"https://qstash.upstash.io/v2", "https://qstash.upstash.io/v2/", "https://qstash.upstash.io?x=1",
		"http://qstash.upstash.io", "ftp://qstash.upstash.io", "https://user:pw@qstash.upstash.io",
	} {
		_, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: base, Token: "t", DestinationBaseURL: "https://x"})
		var ce *publish.ConfigError
		if !errors.As(err, &ce) || ce.Field != "BaseURL" {
			t.Errorf("%s: %v, want a ConfigError for BaseURL (the env reader names QSTASH_URL)", base, err)
		}
		if err != nil && strings.Contains(err.Error(), "pw") {
			t.Errorf("%s: the error repeats the password: %v", base, err)
		}
	}
	for _, base := range []string{"https://qstash.upstash.io", "https://qstash-eu-central-1.upstash.io/", "http://127.0.0.1:8080", "http://localhost:8080/", "http://[::1]:8080"} {
		if _, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: base, Token: "t", DestinationBaseURL: "https://x"}); err != nil {
			t.Errorf("%s refused: %v", base, err)
		}
	}
}

// TestWrongQStashURLDefersEverything: a gateway in front of the strict server that adds
// /v2 to every path (what a QSTASH_URL ending in /v2 does) gets 404 for /v2/v2/batch.
// Every message is deferred for the deployment with an error naming QSTASH_URL; nothing
// is permanent, so nothing is dead-lettered, and one request is all it costs.
func TestWrongQStashURLDefersEverything(t *testing.T) {
	t.Parallel()
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanPayg})
	gw := qstashtest.V2Gateway(t, srv)
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: gw, Token: srv.Token, DestinationBaseURL: "http://127.0.0.1:1", MaxBatchItems: 10})
	res := p.Publish(context.Background(), messages(1, 100, 10))
	for i, r := range res {
		var de *publish.DeferError
		if r.Outcome() != publish.Deferred || !errors.As(r.Err, &de) || de.Reason != publish.DeferDeployment {
			t.Fatalf("message %d: %v (outcome %v), want deferred for the deployment", i, r.Err, r.Outcome())
		}
		if !strings.Contains(r.Err.Error(), "QSTASH_URL") || publish.StatusCode(r.Err) != http.StatusNotFound {
			t.Fatalf("message %d: %v does not name QSTASH_URL or carry the 404", i, r.Err)
		}
	}
	reqs := srv.Requests()
	if len(reqs) != 1 || reqs[0].Path != "/v2/v2/batch" || reqs[0].Status != http.StatusNotFound {
		t.Fatalf("server saw %+v, want one 404 for /v2/v2/batch (the rest of the call is deferred unsent)", reqs)
	}
}

// badItemProxy forwards to srv and gives the message with outbox id badID a deduplication
// id with ':', which the server (like production) refuses; it does so every time the
// message passes, as a truly bad message would be refused every time.
func badItemProxy(t *testing.T, srv *qstashtest.Server, badIDs ...string) *httptest.Server {
	t.Helper()
	bad := map[any]bool{}
	for _, id := range badIDs {
		bad[id] = true
	}
	target, _ := url.Parse(srv.URL)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v2/batch" {
			var items []map[string]any
			if err := json.Unmarshal(body, &items); err != nil {
				t.Errorf("proxy: %v", err)
			}
			for _, it := range items {
				h := it["headers"].(map[string]any)
				if id := h["Upstash-Forward-X-Outbox-Id"]; bad[id] {
					h["Upstash-Deduplication-Id"] = fmt.Sprint("outbox:", id)
				}
			}
			body, _ = json.Marshal(items)
		}
		u := *target
		u.Path, u.RawPath, u.RawQuery = r.URL.Path, r.URL.RawPath, r.URL.RawQuery
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, u.String(), bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(proxy.Close)
	return proxy
}

// TestOneBadItemInHundred: one message QStash refuses, in a batch of 100, under both
// batch-error shapes: exactly one permanent result (the bad message), 99 published and
// delivered. Under the whole-request 400 (seen in production) the publisher finds it by
// splitting the request; under per-item errors (documented) in one request.
func TestOneBadItemInHundred(t *testing.T) {
	t.Parallel()
	for _, mode := range []qstashtest.BatchErrorMode{qstashtest.BatchErrorsWholeRequest, qstashtest.BatchErrorsPerItem} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			cons := newConsumer(t, nil)
			srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanPayg, BatchErrors: mode})
			proxy := badItemProxy(t, srv, "42")
			p := newPublisher(t, qstash.PublisherConfig{BaseURL: proxy.URL, Token: srv.Token, DestinationBaseURL: cons.URL})
			msgs := messages(1, 100, 10)
			res := p.Publish(context.Background(), msgs)
			for i, r := range res {
				if msgs[i].ID == 42 {
					if r.Outcome() != publish.PermanentFailure || !strings.Contains(r.Err.Error(), "cannot contain ':'") {
						t.Fatalf("bad message: %v (outcome %v), want permanent with QStash's reason", r.Err, r.Outcome())
					}
					continue
				}
				if r.Err != nil || !strings.HasPrefix(r.MessageID, "msg_") {
					t.Fatalf("message %d: %+v, want published", msgs[i].ID, r)
				}
			}
			wantDelivered(t, srv, cons, 99)
			n, byStatus := batchRequests(srv)
			switch mode {
			case qstashtest.BatchErrorsWholeRequest:
				// 1 + about 2*log2(100) requests: halves that hold the bad message fail
				// whole, the others publish.
				if byStatus[http.StatusBadRequest] < 2 || n > 1+2*7 {
					t.Fatalf("%d requests %v: want a bisection", n, byStatus)
				}
			default:
				if n != 1 {
					t.Fatalf("%d requests, want 1 (per-item errors need no split)", n)
				}
			}
		})
	}
}

// TestRequestByteBudget: 100 messages of about 3 kB with a 64 KiB budget go out in
// several requests, none over the budget, and all are delivered.
func TestRequestByteBudget(t *testing.T) {
	t.Parallel()
	cons := newConsumer(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanFree})
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: cons.URL, MaxRequestBytes: qstash.MinRequestBytes})
	msgs := messages(1, 100, 10)
	for i := range msgs {
		msgs[i].Payload = []byte(fmt.Sprintf(`{"id":%d,"pad":%q}`, msgs[i].ID, strings.Repeat("x", 3000)))
	}
	publishAll(t, p, msgs)
	var sizes []int64
	for _, r := range srv.Requests() {
		if r.Path == "/v2/batch" {
			sizes = append(sizes, r.Bytes)
			if r.Bytes > qstash.MinRequestBytes {
				t.Fatalf("a request of %d bytes, over the %d budget", r.Bytes, qstash.MinRequestBytes)
			}
		}
	}
	// 100 * ~3.5 kB = ~350 kB: at least 6 requests of at most 64 KiB.
	if len(sizes) < 6 {
		t.Fatalf("%d requests %v, want the batch split by size", len(sizes), sizes)
	}
	wantDelivered(t, srv, cons, 100)
}

// TestOversizedMessageFailsAlone: a payload over the plan's message size is not sent; it
// fails permanently with an error that says why, and its neighbours publish. The strict
// server would have answered 412 for it.
func TestOversizedMessageFailsAlone(t *testing.T) {
	t.Parallel()
	cons := newConsumer(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanFree})
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: cons.URL, Plan: qstash.PlanFree, Ordering: publish.OrderingFIFO, FIFOQueues: 2})
	msgs := messages(1, 5, 5)
	msgs[2].Payload = []byte(`"` + strings.Repeat("y", 1_000_000) + `"`)
	res := p.Publish(context.Background(), msgs)
	var tl *qstash.MessageTooLargeError
	if res[2].Outcome() != publish.PermanentFailure || !errors.As(res[2].Err, &tl) || tl.Limit != 1_000_000 ||
		!strings.Contains(res[2].Err.Error(), "QSTASH_MAX_MESSAGE_BYTES") {
		t.Fatalf("oversized: %v", res[2].Err)
	}
	for i, r := range res {
		if i != 2 && r.Err != nil {
			t.Fatalf("message %d: %v", i, r.Err)
		}
	}
	for _, r := range srv.Requests() {
		if r.Bytes > 1_000_000 {
			t.Fatalf("the oversized message was sent: %+v", r)
		}
	}
	wantDelivered(t, srv, cons, 4)
}

// TestQuotaDefers: once the daily quota is used up, the server answers 429 with
// RateLimit-*; every message is deferred (not retried, not permanent) until the reset the
// header gives, and publishing works again after the reset.
func TestQuotaDefers(t *testing.T) {
	t.Parallel()
	cons := newConsumer(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{QuotaMessages: 10, QuotaWindow: time.Hour})
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: cons.URL, MaxBatchItems: 5})
	before := time.Now()
	for i, r := range p.Publish(context.Background(), messages(1, 10, 10)) {
		if r.Err != nil {
			t.Fatalf("within quota, message %d: %v", i, r.Err)
		}
	}
	res := p.Publish(context.Background(), messages(11, 12, 12))
	for i, r := range res {
		var de *publish.DeferError
		if r.Outcome() != publish.Deferred || !errors.As(r.Err, &de) || de.Reason != publish.DeferQuota {
			t.Fatalf("over quota, message %d: %v (outcome %v)", i, r.Err, r.Outcome())
		}
		// The window started when the server did, before `before`; Reset is that plus an
		// hour, rounded up to a whole second.
		if de.Until.Before(before.Add(time.Hour-time.Minute)) || de.Until.After(time.Now().Add(time.Hour+time.Second)) {
			t.Fatalf("Until %v, want the quota reset about an hour after %v", de.Until, before)
		}
	}
	if n, byStatus := batchRequests(srv); n != 3 || byStatus[http.StatusTooManyRequests] != 1 {
		t.Fatalf("%d requests %v: after the 429 the rest of the call must be deferred unsent", n, byStatus)
	}
	srv.ResetQuota()
	for i, r := range p.Publish(context.Background(), messages(11, 5, 5)) {
		if r.Err != nil {
			t.Fatalf("after the reset, message %d: %v", i, r.Err)
		}
	}
	wantDelivered(t, srv, cons, 15)
}

// TestFlowControlKeyAccepted: a partition key with ':', '/' and a space, with flow control
// on, is accepted by the strict server under a key that is the same every time; the
// server's flow-control state has it under that key.
func TestFlowControlKeyAccepted(t *testing.T) {
	t.Parallel()
	cons := newConsumer(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanPayg})
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: cons.URL, Name: "shop", FlowControlParallelism: 1})
	msgs := messages(1, 3, 1)
	for i := range msgs {
		msgs[i].PartitionKey = "customer:7/eu west"
	}
	publishAll(t, p, msgs)
	localqstash.WaitIdle(t, srv)
	key := qstash.FlowControlKey("shop", "customer:7/eu west")
	if key != qstash.FlowControlKey("shop", "customer:7/eu west") || !qstash.ValidResourceName(key) || !strings.HasPrefix(key, "shop.customer_7_eu_west-") {
		t.Fatalf("key %q", key)
	}
	if resp, _ := localqstash.Call(t, srv, http.MethodGet, "/v2/flowControl/"+key, nil, ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("flow-control key %q unknown to the server: %d", key, resp.StatusCode)
	}
	if got, _ := cons.snapshot(); len(got) != 3 {
		t.Fatalf("%d delivered, want 3", len(got))
	}
}

// TestDerivedNamesCollisionFree: 200,000 partition keys, many of them sanitising to the
// same readable text, give 200,000 distinct valid flow-control keys; labels likewise.
func TestDerivedNamesCollisionFree(t *testing.T) {
	t.Parallel()
	seen := make(map[string]string, 200_000)
	seps := []string{":", "/", " ", "_", "@", "é"}
	for i := range 200_000 {
		raw := "customer" + seps[i%len(seps)] + strconv.Itoa(i/len(seps))
		if i%7 == 0 {
			raw = strings.Repeat("k", 60) + strconv.Itoa(i) // past the readable prefix
		}
		k := qstash.FlowControlKey("outbox", raw)
		if !qstash.ValidResourceName(k) || len(k) > len("outbox")+1+40+1+20 {
			t.Fatalf("%q -> %q: not a valid bounded key", raw, k)
		}
		if prev, dup := seen[k]; dup {
			t.Fatalf("%q and %q both map to %q", prev, raw, k)
		}
		seen[k] = raw
	}
	if qstash.Label("order.created") != "order.created" || qstash.Label("a~b") == qstash.Label("a_b") || !qstash.ValidResourceName(qstash.Label("a~b")) {
		t.Fatal("labels: valid topics stay as they are, others are made valid and distinct")
	}
}

// TestDeliveryURLCarriesIdentity: the destination is <base>/events/<topic>?outbox_id=&
// generation=, the signature's subject covers it, and ParseIdentity reads it back.
func TestDeliveryURLCarriesIdentity(t *testing.T) {
	t.Parallel()
	cons := newConsumer(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanPayg})
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: cons.URL + "/"})
	m := messages(9007199254740993, 1, 1)[0] // above 2^53: no float on the way
	m.Generation = 2
	if r := p.Publish(context.Background(), []outbox.Message{m})[0]; r.Err != nil {
		t.Fatal(r.Err)
	}
	localqstash.WaitIdle(t, srv)
	att := srv.Attempts()
	if len(att) != 1 || att[0].URL != cons.URL+"/events/order.created?outbox_id=9007199254740993&generation=2" {
		t.Fatalf("attempts %+v", att)
	}
	if got, bad := cons.snapshot(); len(got) != 1 || len(bad) != 0 {
		t.Fatalf("signature over the URL with its query did not verify: %v", bad)
	}
	id, err := qstash.ParseIdentity(att[0].URL)
	if err != nil || id.OutboxID != 9007199254740993 || id.Generation != 2 {
		t.Fatalf("ParseIdentity = %+v, %v", id, err)
	}
	if _, err := qstash.ParseIdentity(cons.URL + "/events/order.created"); !errors.Is(err, qstash.ErrNoIdentity) {
		t.Fatalf("no identity: %v", err)
	}
	for _, bad := range []string{"?outbox_id=1", "?outbox_id=1&generation=0&outbox_id=2", "?outbox_id=x&generation=0", "?outbox_id=1&generation=-1"} {
		if _, err := qstash.ParseIdentity("https://x/events/t" + bad); err == nil || errors.Is(err, qstash.ErrNoIdentity) {
			t.Errorf("%s: %v, want a malformed-identity error", bad, err)
		}
	}
}

// TestEnsureQueues: FIFO queues are created with parallelism 1 and read back; a queue
// found with parallelism 2, or paused, is reported by name and left as it is.
func TestEnsureQueues(t *testing.T) {
	t.Parallel()
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanPayg})
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: "http://127.0.0.1:1", Name: "shop", Ordering: publish.OrderingFIFO, FIFOQueues: 6})
	ctx := context.Background()
	if err := p.EnsureQueues(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		q := getQueue(t, srv, fmt.Sprintf("shop-%d", i))
		if q.Parallelism != 1 || q.Paused {
			t.Fatalf("queue %d: %+v", i, q)
		}
	}
	if err := p.EnsureQueues(ctx); err != nil {
		t.Fatalf("second run: %v", err)
	}
	queueAPI(t, srv, http.MethodPost, "/v2/queues/", `{"queueName":"shop-2","parallelism":2}`)
	queueAPI(t, srv, http.MethodPost, "/v2/queues/shop-4/pause", "")
	err := p.EnsureQueues(ctx)
	var qm *qstash.QueueMismatchError
	if !errors.As(err, &qm) || !strings.Contains(err.Error(), "shop-2 has parallelism 2") || !strings.Contains(err.Error(), "shop-4 is paused") {
		t.Fatalf("EnsureQueues = %v, want both queues named", err)
	}
	if q := getQueue(t, srv, "shop-2"); q.Parallelism != 2 {
		t.Fatalf("the changed queue was reset silently: %+v", q)
	}
}

// TestQueueCountCap: more queues than the plan allows is a config error before anything
// runs, and the strict server answers the queue beyond the cap with 412, which
// EnsureQueues reports naming FIFO_QUEUES.
func TestQueueCountCap(t *testing.T) {
	t.Parallel()
	_, err := qstash.NewPublisher(qstash.PublisherConfig{Token: "t", DestinationBaseURL: "https://x", Plan: qstash.PlanFree, Ordering: publish.OrderingFIFO, FIFOQueues: 11})
	if err == nil || !strings.Contains(err.Error(), "FIFOQueues") || !strings.Contains(err.Error(), "10 queues") {
		t.Fatalf("config: %v", err)
	}
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanFree})
	for i := range 10 {
		queueAPI(t, srv, http.MethodPost, "/v2/queues/", fmt.Sprintf(`{"queueName":"q-%d","parallelism":1}`, i))
	}
	if resp, body := localqstash.Call(t, srv, http.MethodPost, "/v2/queues/", nil, `{"queueName":"q-10","parallelism":1}`); resp.StatusCode != http.StatusPreconditionFailed || !strings.Contains(body, `"error"`) {
		t.Fatalf("11th queue: %d %s, want 412 {\"error\"}", resp.StatusCode, body)
	}
	// A publisher configured for a bigger plan than the account has.
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: "http://127.0.0.1:1", Name: "shop", Ordering: publish.OrderingFIFO, FIFOQueues: 2})
	if err := p.EnsureQueues(context.Background()); err == nil || !strings.Contains(err.Error(), "FIFO_QUEUES") {
		t.Fatalf("EnsureQueues over the account's cap: %v", err)
	}
}

// TestTwoDeploymentsShareAnAccount: two deployments publish the same outbox ids within
// the dedup window; with different names both sets are delivered, with the same name the
// second is deduplicated (the collision the name prevents).
func TestTwoDeploymentsShareAnAccount(t *testing.T) {
	t.Parallel()
	cons := newConsumer(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanPayg})
	publish := func(name string) []publish.Result {
		p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: cons.URL, Name: name})
		return p.Publish(context.Background(), messages(1, 20, 5))
	}
	a, b := publish("staging"), publish("production")
	for i := range a {
		if a[i].Err != nil || b[i].Err != nil || a[i].MessageID == b[i].MessageID {
			t.Fatalf("message %d: %+v %+v", i, a[i], b[i])
		}
	}
	wantDelivered(t, srv, cons, 40)
	c := publish("staging")
	for i := range c {
		if c[i].MessageID != a[i].MessageID {
			t.Fatalf("same deployment, message %d: %s, want the deduplicated %s", i, c[i].MessageID, a[i].MessageID)
		}
	}
	if p := newPublisher(t, qstash.PublisherConfig{Token: "t", DestinationBaseURL: "https://x"}); p.DeduplicationID(outbox.Message{ID: 7}) != "outbox-7" ||
		p.DeduplicationID(outbox.Message{ID: 7, Generation: 2}) != "outbox-7-r2" || p.QueueName("k")[:7] != "outbox-" {
		t.Fatal("the default name must keep the ids and queue names used before names existed")
	}
	for _, name := range []string{"a:b", "a.b", "", strings.Repeat("n", qstash.MaxNameLen+1)} {
		if _, err := qstash.NewPublisher(qstash.PublisherConfig{Token: "t", DestinationBaseURL: "https://x", Name: name}); err == nil && name != "" {
			t.Errorf("name %q accepted", name)
		}
	}
}

func queueAPI(t *testing.T, srv *qstashtest.Server, method, path, body string) string {
	t.Helper()
	resp, data := localqstash.Call(t, srv, method, path, nil, body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, data)
	}
	return data
}

func getQueue(t *testing.T, srv *qstashtest.Server, name string) qstash.Queue {
	t.Helper()
	var q qstash.Queue
	if err := json.Unmarshal([]byte(queueAPI(t, srv, http.MethodGet, "/v2/queues/"+name, "")), &q); err != nil {
		t.Fatal(err)
	}
	return q
}

// recordingTransport keeps the body of every /v2/batch request.
type recordingTransport struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (rt *recordingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/v2/batch" && r.Body != nil {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		rt.mu.Lock()
		rt.bodies = append(rt.bodies, b)
		rt.mu.Unlock()
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestPublishModeOneRequestPerCall: in publish ordering 20 keys x 50 events go out in one
// request (no per-key waves: QStash keeps no order there), every message labelled with its
// topic and carrying a valid flow-control key.
func TestPublishModeOneRequestPerCall(t *testing.T) {
	t.Parallel()
	cons := newConsumer(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanPayg})
	rt := &recordingTransport{}
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: cons.URL,
		FlowControlRate: 1000, HTTPClient: &http.Client{Transport: rt}})
	msgs := messages(1, 1000, 20)
	for i := range msgs {
		msgs[i].PartitionKey = fmt.Sprintf("order:%d", i%20)
	}
	publishAll(t, p, msgs)
	if len(rt.bodies) != 1 {
		t.Fatalf("%d requests for 1000 messages over 20 keys, want 1", len(rt.bodies))
	}
	var items []struct {
		Headers map[string]string `json:"headers"`
	}
	if err := json.Unmarshal(rt.bodies[0], &items); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, it := range items {
		if it.Headers["Upstash-Label"] != "order.created" || !qstash.ValidResourceName(it.Headers["Upstash-Flow-Control-Key"]) {
			t.Fatalf("item headers %v", it.Headers)
		}
		keys[it.Headers["Upstash-Flow-Control-Key"]] = true
	}
	if len(keys) != 20 {
		t.Fatalf("%d flow-control keys for 20 partition keys", len(keys))
	}
	wantDelivered(t, srv, cons, 1000)
}

// TestFailureCallbackIdentity: a message that finally fails comes back in a failure
// callback whose signed url field carries the outbox id and generation.
func TestFailureCallbackIdentity(t *testing.T) {
	t.Parallel()
	cons := newConsumer(t, func(string, int) bool { return true })
	got := make(chan qstash.Identity, 1)
	fail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fc, err := qstash.DecodeFailureCallback(body)
		if err != nil {
			t.Errorf("decode: %v", err)
			return
		}
		id, err := fc.Identity()
		if err != nil {
			t.Errorf("identity: %v", err)
		}
		got <- id
	}))
	t.Cleanup(fail.Close)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Plan: qstash.PlanPayg})
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: cons.URL, FailureCallbackURL: fail.URL, Retries: qstash.NoRetries})
	m := messages(314, 1, 1)[0]
	m.Generation = 3
	if r := p.Publish(context.Background(), []outbox.Message{m})[0]; r.Err != nil {
		t.Fatal(r.Err)
	}
	localqstash.WaitIdle(t, srv)
	select {
	case id := <-got:
		if id != (qstash.Identity{OutboxID: 314, Generation: 3}) {
			t.Fatalf("identity %+v", id)
		}
	default:
		t.Fatal("no failure callback")
	}
}

// TestFIFOInvalidMessageHoldsOnlyLaterOnes: in FIFO ordering a message the publisher cannot
// send holds back the later messages of its key, never the earlier ones.
func TestFIFOInvalidMessageHoldsOnlyLaterOnes(t *testing.T) {
	t.Parallel()
	cons := newConsumer(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: srv.URL, Token: srv.Token, DestinationBaseURL: cons.URL, Ordering: publish.OrderingFIFO, FIFOQueues: 2})
	msgs := messages(1, 6, 1) // one key
	msgs[3].Headers = map[string]string{"Bad Header": "x"}
	res := p.Publish(context.Background(), msgs)
	for i, r := range res {
		switch {
		case i < 3 && r.Err != nil:
			t.Fatalf("message %d, before the invalid one: %v", i, r.Err)
		case i == 3 && r.Outcome() != publish.PermanentFailure:
			t.Fatalf("invalid message: %v", r.Err)
		case i > 3 && !errors.Is(r.Err, qstash.ErrHeldBack):
			t.Fatalf("message %d, after the invalid one: %v", i, r.Err)
		}
	}
	wantDelivered(t, srv, cons, 3)
}

// TestDeferralWinsOverHoldBack: in FIFO ordering, once a 429 has deferred the call, a
// later message of a key that failed earlier is deferred too (no attempt spent), not held
// back, and nothing more is sent.
func TestDeferralWinsOverHoldBack(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if n.Add(1) == 1 {
			io.WriteString(w, `[{"error":"something nobody documented"}]`)
			return
		}
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":"daily quota exceeded"}`)
	}))
	t.Cleanup(fake.Close)
	p := newPublisher(t, qstash.PublisherConfig{BaseURL: fake.URL, Token: "t", DestinationBaseURL: "http://127.0.0.1:1", Ordering: publish.OrderingFIFO, MaxBatchItems: 1})
	msgs := messages(1, 3, 2) // keys 0, 1, 0
	res := p.Publish(context.Background(), msgs)
	if res[0].Outcome() != publish.Retryable || res[1].Outcome() != publish.Deferred || res[2].Outcome() != publish.Deferred {
		t.Fatalf("outcomes %v %v %v (%v), want retryable, deferred, deferred", res[0].Outcome(), res[1].Outcome(), res[2].Outcome(), res[2].Err)
	}
	if n.Load() != 2 {
		t.Fatalf("%d requests, want 2", n.Load())
	}
}
