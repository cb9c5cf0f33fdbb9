package webhook_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// Hostile input beyond TestSecurityMatrix: tokens an attacker can build, paths that decode
// to something else, bodies that are JSON to some parsers only, and a body sent slowly.
// Each gets its answer and writes nothing.

// post sends body to target (path and query) with sig, as QStash would.
func (f *fixture) post(t *testing.T, target, sig string, body []byte) int {
	t.Helper()
	r := signedRequest(t, target, "77", body)
	r.Header.Del("Upstash-Signature")
	if sig != "" {
		r.Header.Set("Upstash-Signature", sig)
	}
	return f.serve(r).Code
}

func TestWebhookHostileDeliveries(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *webhook.Config) { c.MaxBodyBytes = 64 << 10 })
	good := order("o-77")
	target := identified(orderPath, "77")
	url := baseURL + target
	now := time.Now()
	deep := []byte(`{"order_id":"o-deep","amount_cents":1,"currency":"EUR","x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`)
	key := qstash.DevCurrentSigningKey
	cases := []struct {
		name   string
		target string
		sig    string
		body   []byte
		status int
	}{
		{"replayed after expiry", target, sign(t, key, url, good, now.Add(-6*time.Minute)), good, http.StatusUnauthorized},
		{"alg confusion HS512 with the real key", target, qstashtest.Forge(jwt.SigningMethodHS512, []byte(key), url, good, now), good, http.StatusUnauthorized},
		{"alg none", target, qstashtest.Forge(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, url, good, now), good, http.StatusUnauthorized},
		{"empty signing key", target, qstashtest.Forge(jwt.SigningMethodHS256, []byte(""), url, good, now), good, http.StatusUnauthorized},
		{"signed for the failure URL (wrong subject)", target, sign(t, key, baseURL+"/failure", good, now), good, http.StatusUnauthorized},
		{"signed without the identity query", target, sign(t, key, baseURL+orderPath, good, now), good, http.StatusUnauthorized},
		{"signed for another outbox id", target, sign(t, key, baseURL+identified(orderPath, "78"), good, now), good, http.StatusUnauthorized},
		{"topic with %2F, signed", identified("/events/order%2Fcreated", "77"), sign(t, key, baseURL+identified("/events/order%2Fcreated", "77"), good, now), good, webhook.StatusNonRetryable},
		{"topic with %00, signed", identified("/events/order%00created", "77"), sign(t, key, baseURL+identified("/events/order%00created", "77"), good, now), good, webhook.StatusNonRetryable},
		{"topic with %0A, unsigned", identified("/events/order%0Acreated", "77"), "", good, http.StatusUnauthorized},
		{"20000-deep JSON, signed", target, sign(t, key, url, deep, now), deep, webhook.StatusNonRetryable},
		// RFC 8259 §8.1: not UTF-8 is not JSON, although encoding/json's Valid accepts it.
		{"invalid UTF-8, signed", target, sign(t, key, url, []byte("{\"order_id\":\"o-\xff\"}"), now), []byte("{\"order_id\":\"o-\xff\"}"), webhook.StatusNonRetryable},
	}
	for _, c := range cases {
		if got := f.post(t, c.target, c.sig, c.body); got != c.status {
			t.Errorf("%s: status %d, want %d", c.name, got, c.status)
		}
	}
	f.assertNothingWritten(t)

	// A replay inside the validity window is a duplicate: applied once.
	sig := sign(t, key, url, good, now)
	for i := range 3 {
		if got := f.post(t, target, sig, good); got != http.StatusOK {
			t.Fatalf("delivery %d: %d", i, got)
		}
	}
	if n := f.count(t, "billing_charges"); n != 1 {
		t.Fatalf("a delivery replayed three times charged %d times, want 1", n)
	}
}

// TestSlowLorisBody: a client that sends its headers and then trickles the body is cut off
// by the server's ReadTimeout (funcurl.NewLocalServer sets one, at 30 s; 1 s here); the
// webhook answers without writing anything.
func TestSlowLorisBody(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: f.h, ReadHeaderTimeout: time.Second, ReadTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	good := order("o-slow")
	target := identified(orderPath, "9")
	sig := sign(t, qstash.DevCurrentSigningKey, baseURL+target, good, time.Now())
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nUpstash-Signature: %s\r\n\r\n", target, len(good), sig)
	start := time.Now()
	cut := make(chan time.Duration, 1)
	go func() {
		_, _ = io.Copy(io.Discard, conn) // returns when the server closes the connection
		cut <- time.Since(start)
	}()
	for i := 0; i < len(good)-1; i++ {
		if _, err := conn.Write(good[i : i+1]); err != nil {
			break
		}
		select {
		case d := <-cut:
			if d > 3*time.Second {
				t.Fatalf("slow body held the connection for %v", d)
			}
			f.assertNothingWritten(t)
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Fatal("the server read a body trickled over several seconds to the end")
}
