package chaos_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/outbox-relay/outbox-relay/cmd/outboxctl/internal/chaos"
	"github.com/outbox-relay/outbox-relay/internal/localstack"
	"github.com/outbox-relay/outbox-relay/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/pkg/webhook"
)

// The bad-input suite. Most entry points already have their hostile-input tests in their
// own packages (listed in docs/reliability.md); this file adds the cases that had none,
// each with the answer it must get and the check that nothing was written or lost.

const hookBase = "https://hooks.example.com"

// consumer is the webhook and the failure recorder on a fresh schema, with the demo
// handler (every application leaves a demo_effects row).
type consumer struct {
	db   *pgtest.DB
	hook *webhook.Handler
	cb   *deadletter.CallbackHandler
}

func newConsumer(t *testing.T) *consumer {
	t.Helper()
	db := pgtest.New(t)
	if err := localstack.CreateDemoTables(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
	v, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: qstash.DevCurrentSigningKey, NextSigningKey: qstash.DevNextSigningKey})
	if err != nil {
		t.Fatal(err)
	}
	hook, err := webhook.New(webhook.Config{Pool: db.Pool, Verifier: v, PublicBaseURL: hookBase, Logger: quiet(), MaxBodyBytes: 64 << 10,
		Handlers: webhook.Handlers{"order.created": localstack.DemoHandler}})
	if err != nil {
		t.Fatal(err)
	}
	cb, err := deadletter.NewCallbackHandler(deadletter.CallbackConfig{Pool: db.Pool, Verifier: v, FailureURL: hookBase + "/failure", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return &consumer{db: db, hook: hook, cb: cb}
}

// written counts every row a consumer can write.
func (c *consumer) written(t *testing.T) int64 {
	t.Helper()
	var n int64
	err := c.db.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM demo_effects) + (SELECT count(*) FROM billing_charges)
		+ (SELECT count(*) FROM processed_messages) + (SELECT count(*) FROM dead_letters)`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (c *consumer) post(path, sig string, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	if sig != "" {
		r.Header.Set("Upstash-Signature", sig)
	}
	r.Header.Set("X-Outbox-Id", "77")
	r.Header.Set("Upstash-Message-Id", "msg_77")
	w := httptest.NewRecorder()
	if strings.HasPrefix(path, "/failure") {
		c.cb.ServeHTTP(w, r)
	} else {
		c.hook.ServeHTTP(w, r)
	}
	return w
}

func sign(t *testing.T, key, url string, body []byte, at time.Time) string {
	t.Helper()
	s, err := qstash.Sign(key, url, body, at)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func forge(t *testing.T, method jwt.SigningMethod, key any, url string, body []byte, at time.Time) string {
	t.Helper()
	claims := jwt.MapClaims{"iss": "Upstash", "sub": url, "iat": at.Unix(), "nbf": at.Unix(), "exp": at.Add(5 * time.Minute).Unix(),
		"jti": "jwt_forged", "body": qstash.BodyHash(body)}
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var goodOrder = []byte(`{"order_id":"o-77","amount_cents":1200,"currency":"EUR"}`)

// TestWebhookHostileDeliveries: tokens and bodies the webhook must refuse without
// writing anything. (Forged, expired, unknown-key, wrong-subject, oversized, malformed and
// unsigned deliveries are in pkg/webhook TestSecurityMatrix; the verifier's own reasons in
// pkg/qstash TestVerifierRejects.)
func TestWebhookHostileDeliveries(t *testing.T) {
	t.Parallel()
	c := newConsumer(t)
	url := hookBase + "/events/order.created"
	now := time.Now()
	deep := []byte(`{"order_id":"o-deep","amount_cents":1,"currency":"EUR","x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`)
	cases := []struct {
		name   string
		path   string
		sig    string
		body   []byte
		status int
	}{
		{"replayed after expiry", "/events/order.created", sign(t, qstash.DevCurrentSigningKey, url, goodOrder, now.Add(-6*time.Minute)), goodOrder, http.StatusUnauthorized},
		{"alg confusion HS512 with the real key", "/events/order.created", forge(t, jwt.SigningMethodHS512, []byte(qstash.DevCurrentSigningKey), url, goodOrder, now), goodOrder, http.StatusUnauthorized},
		{"alg none", "/events/order.created", forge(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, url, goodOrder, now), goodOrder, http.StatusUnauthorized},
		{"empty signing key", "/events/order.created", forge(t, jwt.SigningMethodHS256, []byte(""), url, goodOrder, now), goodOrder, http.StatusUnauthorized},
		{"signed for the failure URL (wrong subject)", "/events/order.created", sign(t, qstash.DevCurrentSigningKey, hookBase+"/failure", goodOrder, now), goodOrder, http.StatusUnauthorized},
		{"topic with %2F, signed", "/events/order%2Fcreated", sign(t, qstash.DevCurrentSigningKey, hookBase+"/events/order%2Fcreated", goodOrder, now), goodOrder, webhook.StatusNonRetryable},
		{"topic with %00, signed", "/events/order%00created", sign(t, qstash.DevCurrentSigningKey, hookBase+"/events/order%00created", goodOrder, now), goodOrder, webhook.StatusNonRetryable},
		{"topic with %0A, unsigned", "/events/order%0Acreated", "", goodOrder, http.StatusUnauthorized},
		{"20000-deep JSON, signed", "/events/order.created", sign(t, qstash.DevCurrentSigningKey, url, deep, now), deep, webhook.StatusNonRetryable},
	}
	for _, tc := range cases {
		w := c.post(tc.path, tc.sig, tc.body)
		if w.Code != tc.status {
			t.Errorf("%s: status %d %s, want %d", tc.name, w.Code, strings.TrimSpace(w.Body.String()), tc.status)
		}
	}
	if n := c.written(t); n != 0 {
		t.Fatalf("hostile deliveries wrote %d rows", n)
	}

	// A replay inside the validity window is a duplicate: applied once.
	sig := sign(t, qstash.DevCurrentSigningKey, url, goodOrder, now)
	for i := range 3 {
		if w := c.post("/events/order.created", sig, goodOrder); w.Code != http.StatusOK {
			t.Fatalf("delivery %d: %d %s", i, w.Code, w.Body.String())
		}
	}
	var effects int
	if err := c.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM demo_effects`).Scan(&effects); err != nil || effects != 1 {
		t.Fatalf("a delivery replayed three times left %d effects (%v), want 1", effects, err)
	}
}

// TestWebhookRejectsInvalidUTF8: a signed body that is not UTF-8 is not JSON (RFC 8259
// §8.1) and must get 489 like any malformed payload, writing nothing. Today json.Valid,
// which does not check UTF-8, lets it through and the handler applies it with the bad
// bytes replaced by U+FFFD (order "o-\ufffd" charged). See the report.
func TestWebhookRejectsInvalidUTF8(t *testing.T) {
	t.Parallel()
	c := newConsumer(t)
	body := []byte("{\"order_id\":\"o-\xff\",\"amount_cents\":1,\"currency\":\"EUR\"}")
	w := c.post("/events/order.created", sign(t, qstash.DevCurrentSigningKey, hookBase+"/events/order.created", body, time.Now()), body)
	if w.Code != webhook.StatusNonRetryable {
		t.Errorf("invalid UTF-8 body: status %d %s, want 489", w.Code, strings.TrimSpace(w.Body.String()))
	}
	if n := c.written(t); n != 0 {
		t.Errorf("invalid UTF-8 body wrote %d rows", n)
	}
}

// TestFailureCallbackHostile: a delivery's signature replayed to the failure endpoint is
// refused (the subject differs), as is an expired callback. (Malformed bodies, bad base64,
// oversize, forgeries: pkg/deadletter TestCallbackRejectsBadInputWithoutWriting and
// TestCallbackRecordsOnceAndRejectsForgeries; the decoder: FuzzDecodeFailureCallback.)
func TestFailureCallbackHostile(t *testing.T) {
	t.Parallel()
	c := newConsumer(t)
	body := []byte(`{"status":500,"sourceMessageId":"msg_1","url":"https://hooks.example.com/events/order.created","sourceHeader":{"X-Outbox-Id":["1"]},"sourceBody":"e30="}`)
	now := time.Now()
	for name, sig := range map[string]string{
		"signed for the webhook URL": sign(t, qstash.DevCurrentSigningKey, hookBase+"/events/order.created", body, now),
		"expired":                    sign(t, qstash.DevCurrentSigningKey, hookBase+"/failure", body, now.Add(-10*time.Minute)),
		"alg none":                   forge(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, hookBase+"/failure", body, now),
	} {
		if w := c.post("/failure", sig, body); w.Code != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, w.Code)
		}
	}
	if n := c.written(t); n != 0 {
		t.Fatalf("hostile callbacks wrote %d rows", n)
	}
}

// TestSlowLorisBody: a client that sends its headers and then trickles the body is cut off
// by the server's ReadTimeout; the webhook answers without writing anything. This is the
// setting the harness's servers use (chaos.newServer); see docs/reliability.md for the
// local servers that lack it.
func TestSlowLorisBody(t *testing.T) {
	t.Parallel()
	c := newConsumer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: c.hook, ReadHeaderTimeout: time.Second, ReadTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sig := sign(t, qstash.DevCurrentSigningKey, hookBase+"/events/order.created", goodOrder, time.Now())
	fmt.Fprintf(conn, "POST /events/order.created HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nUpstash-Signature: %s\r\nX-Outbox-Id: 9\r\n\r\n", len(goodOrder), sig)
	start := time.Now()
	cut := make(chan time.Duration, 1)
	go func() {
		_, _ = io.Copy(io.Discard, conn) // returns when the server closes the connection
		cut <- time.Since(start)
	}()
	for i := 0; i < len(goodOrder)-1; i++ {
		if _, err := conn.Write(goodOrder[i : i+1]); err != nil {
			break
		}
		select {
		case d := <-cut:
			if d > 3*time.Second {
				t.Fatalf("slow body held the connection for %v", d)
			}
			if n := c.written(t); n != 0 {
				t.Fatalf("a cut-off body wrote %d rows", n)
			}
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Fatal("the server read a body trickled over several seconds to the end")
}

// TestChaosFlags: bad flags for outboxctl chaos are refused with the field named.
func TestChaosFlags(t *testing.T) {
	t.Parallel()
	cases := map[string][]string{
		"relays 0":           {"--relays", "0"},
		"rate above 1":       {"--publish-500", "1.5"},
		"rates over 1":       {"--publish-500", "0.6", "--publish-429", "0.6"},
		"unknown ordering":   {"--ordering", "lifo"},
		"negative kills":     {"--db-kills-per-second", "-1"},
		"rate not a number":  {"--consumer-ack-lost", "often"},
		"seed not a number":  {"--seed", "abc"},
		"no delivery delay?": {"--max-delivery-delay", "0"},
	}
	for name, args := range cases {
		fs := flagSet()
		o := chaos.Options{DatabaseURL: "postgres://x", Faults: chaos.DefaultFaults()}.WithDefaults()
		fl := chaos.BindFlags(fs, &o)
		err := fs.Parse(args)
		if err == nil {
			fl.Apply()
			err = o.Validate()
		}
		if err == nil {
			t.Errorf("%s: %v accepted", name, args)
		}
	}
}
