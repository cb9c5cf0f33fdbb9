package qstashtest_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	upstash "github.com/upstash/qstash-go"

	"github.com/outbox-relay/outbox-relay/v3/internal/localqstash"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// TestSDKContract: qstash-go v1.0.0 publishes, batches and enqueues to the server and gets
// the message ids the destination then sees; its Receiver (with a non-empty next key) and
// the project's Verifier both accept every signed delivery.
func TestSDKContract(t *testing.T) {
	t.Parallel()
	dst := newSink(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	c := sdkClient(srv)

	pub, err := c.Publish(upstash.PublishOptions{
		Url: dst.URL + "/events/a", Body: `{"n":1}`, ContentType: "application/json",
		Headers: map[string]string{"X-Correlation-Id": "c-1"}, Retries: upstash.RetryCount(1),
	})
	if err != nil {
		t.Fatalf("sdk Publish: %v", err)
	}
	batch, err := c.Batch([]upstash.BatchOptions{
		{Url: dst.URL + "/events/b", Body: `{"n":2}`, ContentType: "application/json"},
		{Url: dst.URL + "/events/c", Body: `{"n":3}`, DeduplicationId: "d-3"},
	})
	if err != nil {
		t.Fatalf("sdk Batch: %v", err)
	}
	enq, err := c.Enqueue(upstash.EnqueueOptions{Queue: "q1", PublishOptions: upstash.PublishOptions{Url: dst.URL + "/events/d", Body: `{"n":4}`}})
	if err != nil {
		t.Fatalf("sdk Enqueue: %v", err)
	}
	ids := []string{pub.MessageId, batch[0][0].MessageId, batch[1][0].MessageId, enq.MessageId}
	for _, id := range ids {
		if !strings.HasPrefix(id, "msg_") {
			t.Fatalf("message ids %q: want msg_ prefixes", ids)
		}
	}
	if pub.Url != dst.URL+"/events/a" {
		t.Fatalf("publish url = %q", pub.Url)
	}
	got := dst.settled(t, srv, 4, "")
	seen := map[string]delivery{}
	for _, d := range got {
		if d.VerifyErr != nil || d.SDKErr != nil {
			t.Fatalf("delivery to %s: Verifier %v, SDK Receiver %v", d.Path, d.VerifyErr, d.SDKErr)
		}
		if d.Header.Get("User-Agent") != "Upstash-QStash" || d.Header.Get("Upstash-Retried") != "0" || d.Header.Get("Upstash-Caller-Ip") == "" {
			t.Fatalf("delivery headers %v", d.Header)
		}
		seen[d.Header.Get("Upstash-Message-Id")] = d
	}
	for _, id := range ids {
		if _, ok := seen[id]; !ok {
			t.Fatalf("no delivery with Upstash-Message-Id %s", id)
		}
	}
	a := seen[pub.MessageId]
	if string(a.Body) != `{"n":1}` || a.Header.Get("X-Correlation-Id") != "c-1" || a.Header.Get("Content-Type") != "application/json" || a.Path != "/events/a" {
		t.Fatalf("published delivery: path %s body %s headers %v", a.Path, a.Body, a.Header)
	}
}

// TestTamperedDeliveriesRejected re-signs a real delivery's claims with each kind of
// forgery and checks the Verifier refuses every one.
func TestTamperedDeliveriesRejected(t *testing.T) {
	t.Parallel()
	dst := newSink(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	if _, err := sdkClient(srv).Publish(upstash.PublishOptions{Url: dst.URL + "/x", Body: `{"a":1}`}); err != nil {
		t.Fatal(err)
	}
	localqstash.WaitIdle(t, srv)
	d := dst.deliveries()[0]
	sig, url := d.Header.Get("Upstash-Signature"), dst.URL+"/x"
	v, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: srv.CurrentSigningKey, NextSigningKey: srv.NextSigningKey})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(sig, url, d.Body); err != nil {
		t.Fatalf("genuine delivery rejected: %v", err)
	}
	tok, _, err := jwt.NewParser().ParseUnverified(sig, jwt.MapClaims{})
	if err != nil {
		t.Fatal(err)
	}
	orig := tok.Claims.(jwt.MapClaims)
	resign := func(method jwt.SigningMethod, key []byte, edit func(jwt.MapClaims)) string {
		c := jwt.MapClaims{}
		for k, val := range orig {
			c[k] = val
		}
		if edit != nil {
			edit(c)
		}
		s, err := jwt.NewWithClaims(method, c).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	key := []byte(srv.CurrentSigningKey)
	for name, tc := range map[string]struct {
		sig, url string
		body     []byte
		reason   qstash.VerifyReason
	}{
		"tampered body": {sig, url, []byte(`{"a":2}`), qstash.ReasonBodyMismatch},
		"wrong subject": {resign(jwt.SigningMethodHS256, key, func(c jwt.MapClaims) { c["sub"] = url + "/" }), url, d.Body, qstash.ReasonSubject},
		"expired": {resign(jwt.SigningMethodHS256, key, func(c jwt.MapClaims) {
			c["exp"] = time.Now().Add(-time.Hour).Unix()
		}), url, d.Body, qstash.ReasonExpired},
		"HS512":     {resign(jwt.SigningMethodHS512, key, nil), url, d.Body, qstash.ReasonAlgorithm},
		"empty key": {resign(jwt.SigningMethodHS256, []byte(""), nil), url, d.Body, qstash.ReasonBadSignature},
	} {
		var ve *qstash.VerifyError
		if err := v.Verify(tc.sig, tc.url, tc.body); !errors.As(err, &ve) || ve.Reason != tc.reason {
			t.Errorf("%s: Verify = %v, want reason %s", name, err, tc.reason)
		}
	}
}

func TestSignWithNextKeyAndClockSkew(t *testing.T) {
	t.Parallel()
	dst := newSink(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{SignWithNextKey: true, ClockSkew: -10 * time.Minute})
	if _, err := sdkClient(srv).Publish(upstash.PublishOptions{Url: dst.URL + "/x", Body: "b"}); err != nil {
		t.Fatal(err)
	}
	localqstash.WaitIdle(t, srv)
	d := dst.deliveries()[0]
	var ve *qstash.VerifyError
	if !errors.As(d.VerifyErr, &ve) || ve.Reason != qstash.ReasonExpired {
		t.Fatalf("skewed delivery: Verify = %v, want expired", d.VerifyErr)
	}
	// Only the next key verifies the MAC.
	if err := upstash.NewReceiver(srv.NextSigningKey, "x").Verify(upstash.VerifyOptions{Signature: d.Header.Get("Upstash-Signature"), Body: "b", Tolerance: time.Hour}); err != nil {
		t.Fatalf("not signed with the next key: %v", err)
	}
}

func TestAuthAndRawPathRouting(t *testing.T) {
	t.Parallel()
	dst := newSink(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	dest := dst.URL + "/a/b//c"
	for name, tc := range map[string]struct {
		path   string
		auth   string
		status int
	}{
		"no token":        {"/v2/publish/" + dest, "none", http.StatusUnauthorized},
		"wrong token":     {"/v2/publish/" + dest, "Bearer nope", http.StatusUnauthorized},
		"query token":     {"/v2/publish/" + dest + "?x=1&qstash_token=" + srv.Token + "&upstash-retries=0", "none", http.StatusCreated},
		"no scheme":       {"/v2/publish/" + strings.TrimPrefix(dest, "http://"), "", http.StatusBadRequest},
		"non loopback":    {"/v2/publish/https://example.com/x", "", http.StatusBadRequest},
		"unknown route":   {"/v2/nope", "", http.StatusNotFound},
		"bearer publish":  {"/v2/publish/" + dest, "", http.StatusCreated},
		"enqueue no dest": {"/v2/enqueue/q", "", http.StatusBadRequest},
	} {
		h := http.Header{}
		switch tc.auth {
		case "none":
			h.Set("Authorization", "")
		case "":
		default:
			h.Set("Authorization", tc.auth)
		}
		resp, text := localqstash.Call(t, srv, http.MethodPost, tc.path, h, "{}")
		var body map[string]any
		_ = json.Unmarshal([]byte(text), &body)
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d %v, want %d", name, resp.StatusCode, body, tc.status)
		}
		if resp.StatusCode >= 400 && body["error"] == nil {
			t.Errorf("%s: error body %v has no \"error\"", name, body)
		}
	}
	localqstash.WaitIdle(t, srv)
	var paths []string
	for _, d := range dst.deliveries() {
		paths = append(paths, d.Path+"|"+d.Header.Get("Upstash-Retried"))
		if d.VerifyErr != nil {
			t.Errorf("delivery %s: %v", d.Path, d.VerifyErr)
		}
	}
	// Both publishes arrive at the uncleaned path; the query one keeps x=1 (checked by the
	// signature's subject, which includes the query).
	if len(paths) != 2 || paths[0] != "/a/b//c|0" || paths[1] != "/a/b//c|0" {
		t.Fatalf("deliveries %v", paths)
	}
}

func TestDeduplication(t *testing.T) {
	t.Parallel()
	dst := newSink(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{DedupWindow: 200 * time.Millisecond})
	h := http.Header{"Upstash-Deduplication-Id": {"outbox-1"}}
	publish := func(h http.Header, body string) (int, map[string]any) {
		resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/publish/"+dst.URL+"/x", h, body)
		var v map[string]any
		if err := json.Unmarshal([]byte(b), &v); err != nil {
			t.Fatalf("response %q: %v", b, err)
		}
		return resp.StatusCode, v
	}
	s1, r1 := publish(h, "a")
	s2, r2 := publish(h, "different body, same id")
	if s1 != 201 || s2 != 202 || r2["messageId"] != r1["messageId"] || r2["deduplicated"] != true || r1["deduplicated"] != nil {
		t.Fatalf("publish twice: %d %v, %d %v", s1, r1, s2, r2)
	}
	cb := http.Header{"Upstash-Content-Based-Deduplication": {"true"}, "Upstash-Forward-X-A": {"1"}}
	s3, r3 := publish(cb, "same")
	s4, r4 := publish(cb, "same")
	s5, _ := publish(http.Header{"Upstash-Content-Based-Deduplication": {"true"}, "Upstash-Forward-X-A": {"2"}}, "same")
	if s3 != 201 || s4 != 202 || r4["messageId"] != r3["messageId"] || s5 != 201 {
		t.Fatalf("content dedup: %d %d %d", s3, s4, s5)
	}
	if s, _ := publish(http.Header{"Upstash-Deduplication-Id": {"a:b"}}, "x"); s != 400 {
		t.Fatalf("dedup id with ':' = %d, want 400", s)
	}
	// After the window the id is new again.
	testwait.Eventually(t, 5*time.Second, func() bool { s, _ := publish(h, "a"); return s == 201 }, "the dedup id to expire")
	// Forgetting the expired entry kept the new one: within its window it deduplicates.
	if s, r := publish(h, "a"); s != 202 || r["deduplicated"] != true {
		t.Fatalf("publish again within the new window: %d %v", s, r)
	}
	dst.settled(t, srv, 4, "(id, content x2, id after window)")
}

// TestRetriesBackoffAndRetryAfter: failures are retried with Upstash-Retried counting up; a
// Retry-After answer replaces QStash's backoff (at TimeScale 1 that backoff is 12 s, so the
// test only finishes in time if Retry-After is honoured).
func TestRetriesBackoffAndRetryAfter(t *testing.T) {
	t.Parallel()
	dst := newSink(t, func(d delivery, n int) (int, http.Header, string) {
		switch n {
		case 1:
			return 503, http.Header{"Retry-After": {"0"}}, "busy"
		case 2:
			return 429, http.Header{"Retry-After": {"5ms"}}, "slow down"
		}
		return 200, nil, "ok"
	})
	srv := qstashtest.NewTestServer(t, qstashtest.Options{TimeScale: 1})
	if _, err := sdkClient(srv).Publish(upstash.PublishOptions{Url: dst.URL + "/x", Body: "b"}); err != nil {
		t.Fatal(err)
	}
	localqstash.WaitIdle(t, srv)
	var got []string
	for _, a := range srv.Attempts() {
		got = append(got, fmt.Sprintf("%d:%d", a.Retried, a.Status))
	}
	if !slices.Equal(got, []string{"0:503", "1:429", "2:200"}) {
		t.Fatalf("attempts %v", got)
	}
	if len(srv.DLQ()) != 0 {
		t.Fatal("delivered message in the DLQ")
	}
}

func TestBackoffTable(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]time.Duration{
		1: 12 * time.Second, 2: 2*time.Minute + 28*time.Second, 3: 30*time.Minute + 8*time.Second,
		4: 6*time.Hour + 7*time.Minute + 6*time.Second, 5: 24 * time.Hour, 9: 24 * time.Hour,
	} {
		if got := qstashtest.Backoff(n).Truncate(time.Second); got != want {
			t.Errorf("Backoff(%d) = %v, want %v (QStash's documented table)", n, got, want)
		}
	}
}

// callbackSink records failure callbacks and fails the first one.
func TestFailureCallbackBody(t *testing.T) {
	t.Parallel()
	dst := newSink(t, func(d delivery, n int) (int, http.Header, string) {
		return 500, http.Header{"X-Reason": {"boom"}}, "nope"
	})
	cbs := newSink(t, func(d delivery, n int) (int, http.Header, string) {
		if n == 1 {
			return 502, nil, "callback endpoint flaked"
		}
		return 200, nil, "ok"
	})
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	h := http.Header{
		"Content-Type":                {"application/json"},
		"Upstash-Forward-X-Outbox-Id": {"42"},
		"Upstash-Retries":             {"2"},
		"Upstash-Failure-Callback":    {cbs.URL + "/failure"},
	}
	resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/publish/"+dst.URL+"/events/order.created", h, `{"order_id":"o-1"}`)
	if resp.StatusCode != 201 {
		t.Fatalf("publish: %d %s", resp.StatusCode, b)
	}
	var pub struct {
		MessageID string `json:"messageId"`
	}
	_ = json.Unmarshal([]byte(b), &pub)
	dst.settled(t, srv, 3, "(1 + 2 retries)")
	calls := cbs.deliveries()
	if len(calls) != 2 {
		t.Fatalf("%d failure-callback attempts, want 2 (first one failed)", len(calls))
	}
	c := calls[1]
	if c.VerifyErr != nil || c.SDKErr != nil || c.Path != "/failure" {
		t.Fatalf("callback not signed for its own URL: %v / %v", c.VerifyErr, c.SDKErr)
	}
	if c.Header.Get("Upstash-Retried") != "1" {
		t.Fatalf("second callback attempt has Upstash-Retried %q", c.Header.Get("Upstash-Retried"))
	}
	fc, err := qstash.DecodeFailureCallback(c.Body)
	if err != nil {
		t.Fatalf("decode %s: %v", c.Body, err)
	}
	dlq := srv.DLQ()
	if len(dlq) != 1 {
		t.Fatalf("DLQ %v", dlq)
	}
	if fc.Status != 500 || fc.Header.Get("X-Reason") != "boom" || string(fc.Body) != "nope" ||
		fc.Retried != 2 || fc.MaxRetries != 2 || fc.DLQID != dlq[0].DLQID || fc.SourceMessageID != pub.MessageID ||
		fc.URL != dst.URL+"/events/order.created" || fc.Method != "POST" ||
		fc.SourceHeader.Get("X-Outbox-Id") != "42" || fc.SourceHeader.Get("Content-Type") != "application/json" ||
		string(fc.SourceBody) != `{"order_id":"o-1"}` || fc.CallerIP != "127.0.0.1" ||
		time.Since(fc.CreatedAt) > time.Minute || fc.NotBefore.IsZero() {
		t.Fatalf("failure callback %+v", fc)
	}
}

// TestNonRetryable489 fails at once, dead-letters and fires the failure callback; a 489
// without the header is an ordinary failure.
func TestNonRetryable489(t *testing.T) {
	t.Parallel()
	dst := newSink(t, func(d delivery, n int) (int, http.Header, string) {
		if d.Path == "/hard" {
			return 489, http.Header{"Upstash-Nonretryable-Error": {"true"}}, "bad event"
		}
		return 489, nil, "no header"
	})
	cbs := newSink(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	for _, p := range []string{"/hard", "/soft"} {
		h := http.Header{"Upstash-Retries": {"3"}, "Upstash-Failure-Callback": {cbs.URL + "/f"}}
		if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/publish/"+dst.URL+p, h, "x"); resp.StatusCode != 201 {
			t.Fatal(b)
		}
	}
	localqstash.WaitIdle(t, srv)
	count := map[string]int{}
	for _, d := range dst.deliveries() {
		count[d.Path]++
	}
	if count["/hard"] != 1 || count["/soft"] != 4 {
		t.Fatalf("attempts per path %v, want /hard 1, /soft 4", count)
	}
	if len(srv.DLQ()) != 2 || len(cbs.deliveries()) != 2 {
		t.Fatalf("DLQ %d entries, %d callbacks; want 2 and 2", len(srv.DLQ()), len(cbs.deliveries()))
	}
}

// TestBatchPerItemErrors: a bad item gets an {"error"} element; the others publish.
func TestBatchPerItemErrors(t *testing.T) {
	t.Parallel()
	dst := newSink(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	body := fmt.Sprintf(`[
		{"destination":%q,"body":"1","headers":{"Upstash-Forward-X-N":"1"},"queue":""},
		{"destination":"not a url","body":"2"},
		{"destination":%q,"body":"3","headers":{"Upstash-Flow-Control-Key":"k","Upstash-Flow-Control-Value":"speed=9"}},
		{"destination":%q,"body":"4","queue":null}]`, dst.URL+"/1", dst.URL+"/3", dst.URL+"/4")
	resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/batch", nil, body)
	var out []map[string]any
	if err := json.Unmarshal([]byte(b), &out); err != nil || resp.StatusCode != 200 || len(out) != 4 {
		t.Fatalf("batch: %d %s", resp.StatusCode, b)
	}
	if out[0]["messageId"] == nil || out[1]["error"] == nil || out[3]["messageId"] == nil {
		t.Fatalf("batch answer %s", b)
	}
	if out[2]["error"] != "Upstash-Flow-Control-Value should be either rate=X or parallelism=Y, or both as comma-separated values" {
		t.Fatalf("flow control error %v", out[2])
	}
	if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/batch", nil, `{"destination":"x"}`); resp.StatusCode != 400 || !strings.Contains(b, "error") {
		t.Fatalf("non-array batch: %d %s", resp.StatusCode, b)
	}
	dst.settled(t, srv, 2, "")
}

// TestFIFOQueue: a queue delivers one message at a time in enqueue order; a retried message
// holds the queue, and a finally failed one's failure callback runs before the next starts.
func TestFIFOQueue(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var events []string
	record := func(s string) { mu.Lock(); events = append(events, s); mu.Unlock() }
	seen := map[string]int{}
	dst := newSink(t, func(d delivery, n int) (int, http.Header, string) {
		id := d.Header.Get("X-Seq")
		mu.Lock()
		seen[id]++
		first := seen[id] == 1
		mu.Unlock()
		record("start " + id)
		seq, _ := strconv.Atoi(id)
		if seq == 7 || (seq%3 == 0 && first) {
			return 500, nil, "fail"
		}
		record("ok " + id)
		return 200, nil, "ok"
	})
	cbs := newSink(t, func(d delivery, n int) (int, http.Header, string) {
		fc, _ := qstash.DecodeFailureCallback(d.Body)
		record("callback " + fc.SourceHeader.Get("X-Seq"))
		return 200, nil, "ok"
	})
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Faults: qstashtest.Faults{DelayRate: 0.5, MaxDelay: 3 * time.Millisecond}})
	for i := 1; i <= 20; i++ {
		h := http.Header{"Upstash-Forward-X-Seq": {strconv.Itoa(i)}, "Upstash-Retries": {"2"}, "Upstash-Failure-Callback": {cbs.URL + "/f"}}
		if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/enqueue/orders-0/"+dst.URL+"/x", h, "{}"); resp.StatusCode != 201 {
			t.Fatal(b)
		}
	}
	localqstash.WaitIdle(t, srv)
	mu.Lock()
	defer mu.Unlock()
	// Expected: each message's attempts, then (7 only) its callback, before the next starts.
	var want []string
	for i := 1; i <= 20; i++ {
		id := strconv.Itoa(i)
		switch {
		case i == 7:
			want = append(want, "start 7", "start 7", "start 7", "callback 7")
		case i%3 == 0:
			want = append(want, "start "+id, "start "+id, "ok "+id)
		default:
			want = append(want, "start "+id, "ok "+id)
		}
	}
	if !slices.Equal(events, want) {
		t.Fatalf("queue events\n got %v\nwant %v", events, want)
	}
	for _, a := range srv.Attempts() {
		if !a.FailureCallback && a.Queue != "orders-0" {
			t.Fatalf("attempt %+v not attributed to the queue", a)
		}
	}
}

func TestFlowControlParallelismAndRate(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	inFlight, maxInFlight := 0, 0
	dst := newSink(t, func(d delivery, n int) (int, http.Header, string) {
		mu.Lock()
		inFlight++
		maxInFlight = max(maxInFlight, inFlight)
		mu.Unlock()
		time.Sleep(10 * time.Millisecond) // a slow endpoint, so calls overlap
		mu.Lock()
		inFlight--
		mu.Unlock()
		return 200, nil, "ok"
	})
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	for i := 0; i < 12; i++ {
		h := http.Header{"Upstash-Flow-Control-Key": {"customer-1"}, "Upstash-Flow-Control-Value": {"parallelism=2"}}
		if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/publish/"+dst.URL+"/p", h, "{}"); resp.StatusCode != 201 {
			t.Fatal(b)
		}
	}
	resp, b := localqstash.Call(t, srv, http.MethodGet, "/v2/flowControl/customer-1", nil, "")
	if resp.StatusCode != 200 || !strings.Contains(b, `"parallelismMax":2`) {
		t.Fatalf("flowControl info: %d %s", resp.StatusCode, b)
	}
	localqstash.WaitIdle(t, srv)
	if maxInFlight > 2 || len(dst.deliveries()) != 12 {
		t.Fatalf("max in flight %d (limit 2), %d deliveries of 12", maxInFlight, len(dst.deliveries()))
	}

	// rate=3 per 1s: the fourth call cannot start within the first window.
	for i := 0; i < 4; i++ {
		h := http.Header{"Upstash-Flow-Control-Key": {"customer-2"}, "Upstash-Flow-Control-Value": {"rate=3, period=1s"}}
		if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/publish/"+dst.URL+"/r", h, "{}"); resp.StatusCode != 201 {
			t.Fatal(b)
		}
	}
	localqstash.WaitIdle(t, srv)
	var starts []time.Time
	for _, a := range srv.Attempts() {
		if strings.HasSuffix(a.URL, "/r") {
			starts = append(starts, a.Start)
		}
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	if len(starts) != 4 || starts[3].Sub(starts[0]) < 900*time.Millisecond {
		t.Fatalf("rate-limited starts %v: the 4th must wait for the next 1s window", starts)
	}
}

// TestFaultsSeededAndAdjustable: the same seed injects the same publish faults; SetFaults
// switches them at runtime; a dropped response still publishes; duplicates reuse the id.
func TestFaultsSeededAndAdjustable(t *testing.T) {
	t.Parallel()
	dst := newSink(t, nil)
	run := func(seed uint64) []int {
		srv := qstashtest.NewTestServer(t, qstashtest.Options{Seed: seed, Faults: qstashtest.Faults{Publish5xxRate: 0.3, Publish429Rate: 0.2}})
		var codes []int
		for i := 0; i < 40; i++ {
			resp, _ := localqstash.Call(t, srv, http.MethodPost, "/v2/publish/"+dst.URL+"/s", nil, "{}")
			codes = append(codes, resp.StatusCode)
			if resp.StatusCode == 429 && (resp.Header.Get("RateLimit-Limit") == "" || resp.Header.Get("Retry-After") == "") {
				t.Fatalf("429 without rate-limit headers: %v", resp.Header)
			}
		}
		return codes
	}
	a, b, c := run(7), run(7), run(8)
	if !slices.Equal(a, b) || slices.Equal(a, c) || !slices.Contains(a, 500) || !slices.Contains(a, 429) || !slices.Contains(a, 201) {
		t.Fatalf("seed 7: %v\nseed 7: %v\nseed 8: %v", a, b, c)
	}

	dup := newSink(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{Faults: qstashtest.Faults{DropResponseRate: 1}})
	if _, err := http.Post(srv.URL+"/v2/publish/"+dup.URL+"/d?qstash_token="+srv.Token, "application/json", strings.NewReader("{}")); err == nil {
		t.Fatal("dropped response: want a transport error")
	}
	localqstash.WaitIdle(t, srv)
	srv.SetFaults(qstashtest.Faults{DuplicateRate: 1})
	if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/publish/"+dup.URL+"/e", nil, "{}"); resp.StatusCode != 201 {
		t.Fatalf("after SetFaults: %d %s", resp.StatusCode, b)
	}
	localqstash.WaitIdle(t, srv)
	ids := map[string]int{}
	for _, d := range dup.deliveries() {
		ids[d.Path+" "+d.Header.Get("Upstash-Message-Id")]++
	}
	if len(ids) != 2 {
		t.Fatalf("deliveries %v: want the dropped-response message once and the duplicated one twice", ids)
	}
	for k, n := range ids {
		if strings.HasPrefix(k, "/d ") && n != 1 || strings.HasPrefix(k, "/e ") && n != 2 {
			t.Fatalf("deliveries %v", ids)
		}
	}
	var dups int
	for _, at := range srv.Attempts() {
		if at.Duplicate {
			dups++
		}
	}
	if dups != 1 {
		t.Fatalf("%d duplicate attempts logged, want 1", dups)
	}
}

func TestDLQAPI(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	healthy := false
	dst := newSink(t, func(d delivery, n int) (int, http.Header, string) {
		mu.Lock()
		defer mu.Unlock()
		if healthy {
			return 200, nil, "ok"
		}
		return 500, nil, "down"
	})
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	c := sdkClient(srv)
	for i := 0; i < 5; i++ {
		if _, err := c.Publish(upstash.PublishOptions{Url: fmt.Sprintf("%s/q%d", dst.URL, i%2), Body: strconv.Itoa(i), Retries: upstash.RetryCount(0)}); err != nil {
			t.Fatal(err)
		}
	}
	localqstash.WaitIdle(t, srv)
	all, cursor, err := c.Dlq().List(upstash.ListDlqOptions{Count: 2})
	if err != nil || len(all) != 2 || cursor == "" {
		t.Fatalf("list page 1: %d entries, cursor %q, %v", len(all), cursor, err)
	}
	q1, _, err := c.Dlq().List(upstash.ListDlqOptions{Filter: upstash.DlqFilter{Url: dst.URL + "/q1"}})
	if err != nil || len(q1) != 2 || q1[0].ResponseStatus != 500 || q1[0].ResponseBody != "down" {
		t.Fatalf("filter by url: %+v %v", q1, err)
	}
	one, err := c.Dlq().Get(q1[0].DlqId)
	if err != nil || one.MessageId != q1[0].MessageId || one.Body == "" {
		t.Fatalf("get: %+v %v", one, err)
	}
	if err := c.Dlq().Delete(q1[0].DlqId); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Dlq().Get(q1[0].DlqId); err == nil {
		t.Fatal("deleted entry still there")
	}
	if n, err := c.Dlq().DeleteMany([]string{q1[1].DlqId, "nope"}); err != nil || n != 1 {
		t.Fatalf("DeleteMany (JSON body): %d %v", n, err)
	}
	mu.Lock()
	healthy = true
	mu.Unlock()
	left := srv.DLQ()
	if len(left) != 3 {
		t.Fatalf("%d left, want 3", len(left))
	}
	resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/dlq/retry/"+left[0].DLQID, nil, "")
	if resp.StatusCode != 201 || !strings.Contains(b, "msg_") {
		t.Fatalf("retry one: %d %s", resp.StatusCode, b)
	}
	resp, b = localqstash.Call(t, srv, http.MethodDelete, "/v2/dlq?dlqIds="+left[1].DLQID, nil, "")
	if resp.StatusCode != 200 || b != `{"deleted":1}` {
		t.Fatalf("delete by query: %d %s", resp.StatusCode, b)
	}
	resp, b = localqstash.Call(t, srv, http.MethodPost, "/v2/dlq/retry", nil, "")
	if resp.StatusCode != 201 || strings.Count(b, "msg_") != 1 {
		t.Fatalf("bulk retry: %d %s", resp.StatusCode, b)
	}
	localqstash.WaitIdle(t, srv)
	if len(srv.DLQ()) != 0 {
		t.Fatalf("DLQ after retries: %v", srv.DLQ())
	}
	if resp, _ := localqstash.Call(t, srv, http.MethodGet, "/v2/dlq/nope", nil, ""); resp.StatusCode != 404 {
		t.Fatalf("missing entry: %d", resp.StatusCode)
	}
}

func TestKeysRotateAndMessages(t *testing.T) {
	t.Parallel()
	dst := newSink(t, nil)
	srv := qstashtest.NewTestServer(t, qstashtest.Options{})
	c := sdkClient(srv)
	keys, err := c.Keys().Get()
	if err != nil || keys.Current != qstash.DevCurrentSigningKey || keys.Next != qstash.DevNextSigningKey {
		t.Fatalf("keys %+v %v", keys, err)
	}
	rot, err := c.Keys().Rotate()
	if err != nil || rot.Current != qstash.DevNextSigningKey || rot.Next == qstash.DevNextSigningKey {
		t.Fatalf("rotate %+v %v", rot, err)
	}
	res, err := c.Publish(upstash.PublishOptions{Url: dst.URL + "/k", Body: "x"})
	if err != nil {
		t.Fatal(err)
	}
	delayed, err := c.Publish(upstash.PublishOptions{Url: dst.URL + "/later", Body: "x", Delay: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := c.Messages().Get(delayed.MessageId); err != nil || m.Url != dst.URL+"/later" {
		t.Fatalf("pending message: %+v %v", m, err)
	}
	if err := c.Messages().Cancel(delayed.MessageId); err != nil {
		t.Fatal(err)
	}
	localqstash.WaitIdle(t, srv)
	got := dst.deliveries()
	if len(got) != 1 || got[0].Header.Get("Upstash-Message-Id") != res.MessageId || got[0].VerifyErr != nil {
		t.Fatalf("after rotation the old next key signs: %+v", got)
	}
	if _, err := c.Messages().Get(delayed.MessageId); err == nil {
		t.Fatal("cancelled message still pending")
	}
}

// TestCloseStopsHangingDelivery: Close cancels an in-flight delivery and waits for it.
func TestCloseStopsHangingDelivery(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	dst := newSink(t, func(d delivery, n int) (int, http.Header, string) {
		<-release
		return 200, nil, "ok"
	})
	defer close(release)
	srv := qstashtest.NewServer(qstashtest.Options{})
	if resp, b := localqstash.Call(t, srv, http.MethodPost, "/v2/publish/"+dst.URL+"/hang", nil, "{}"); resp.StatusCode != 201 {
		t.Fatal(b)
	}
	done := make(chan struct{})
	go func() { srv.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return while a delivery hung")
	}
}
