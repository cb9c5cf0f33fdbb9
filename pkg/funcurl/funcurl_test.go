package funcurl_test

import (
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/internal/origin"
	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/funcurl"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

const domain = "abc123.lambda-url.eu-west-1.on.aws"

func event(method, rawPath, query, body string, b64 bool, headers map[string]string) events.LambdaFunctionURLRequest {
	return events.LambdaFunctionURLRequest{
		Version:         "2.0",
		RawPath:         rawPath,
		RawQueryString:  query,
		Headers:         headers,
		Body:            body,
		IsBase64Encoded: b64,
		RequestContext: events.LambdaFunctionURLRequestContext{
			DomainName: domain,
			RequestID:  "req-1",
			HTTP:       events.LambdaFunctionURLRequestContextHTTPDescription{Method: method, Path: rawPath, SourceIP: "203.0.113.9"},
		},
	}
}

// headerValue reads a response header whatever the case of its name (HTTP names are
// case-insensitive; the adapter writes them canonical, Upstash-Nonretryable-Error).
func headerValue(resp events.LambdaFunctionURLResponse, name string) string {
	for k, v := range resp.Headers {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestNewRequest(t *testing.T) {
	t.Parallel()
	ev := event("POST", "/events/a%2Fb", "x=1&y=2", base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 'h', 'i'}), true,
		map[string]string{"upstash-signature": "sig", "content-type": "application/json", "host": "evil.example", "x-forwarded-host": "evil.example"})
	ev.Cookies = []string{"a=1", "b=2"}
	r, err := funcurl.NewRequest(t.Context(), ev, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.URL.String(); got != "https://"+domain+"/events/a%2Fb?x=1&y=2" {
		t.Fatalf("URL %q", got)
	}
	if r.URL.EscapedPath() != "/events/a%2Fb" || r.URL.RawQuery != "x=1&y=2" {
		t.Fatalf("escaped path %q, query %q", r.URL.EscapedPath(), r.URL.RawQuery)
	}
	if r.Method != "POST" || r.Host != domain || r.RemoteAddr != "203.0.113.9" || r.RequestURI != "/events/a%2Fb?x=1&y=2" {
		t.Fatalf("method %q host %q remote %q uri %q", r.Method, r.Host, r.RemoteAddr, r.RequestURI)
	}
	if r.Header.Get("Upstash-Signature") != "sig" || r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Host") != "" {
		t.Fatalf("headers %v", r.Header)
	}
	if r.Header.Get("Cookie") != "a=1; b=2" {
		t.Fatalf("cookie %q", r.Header.Get("Cookie"))
	}
	b, _ := io.ReadAll(r.Body)
	if string(b) != "\x00\x01\x02hi" || r.ContentLength != 5 {
		t.Fatalf("body %q, length %d", b, r.ContentLength)
	}
	if o, ok := origin.FromContext(r.Context()); !ok || o != "https://"+domain {
		t.Fatalf("origin (%q, %v)", o, ok)
	}

	// Plain body, empty path.
	r, err = funcurl.NewRequest(t.Context(), event("GET", "", "", "hello", false, nil), 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.URL.String() != "https://"+domain+"/" || r.ContentLength != 5 {
		t.Fatalf("URL %q, length %d", r.URL, r.ContentLength)
	}
}

func TestNewRequestBodyLimit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		body string
		b64  bool
		ok   bool
	}{
		{"plain at limit", "12345", false, true},
		{"plain over", "123456", false, false},
		{"base64 at limit, one pad", base64.StdEncoding.EncodeToString([]byte("12345")), true, true},
		{"base64 at limit, two pads", base64.StdEncoding.EncodeToString([]byte("1234")), true, true},
		{"base64 over", base64.StdEncoding.EncodeToString([]byte("123456")), true, false},
		{"base64 way over", strings.Repeat("A", 1<<20), true, false},
	} {
		_, err := funcurl.NewRequest(t.Context(), event("POST", "/", "", c.body, c.b64, nil), 5)
		if c.ok && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if !c.ok && !errors.Is(err, funcurl.ErrBodyTooLarge) {
			t.Errorf("%s: err %v, want ErrBodyTooLarge", c.name, err)
		}
	}
}

func TestNewRequestMalformed(t *testing.T) {
	t.Parallel()
	bad := []events.LambdaFunctionURLRequest{
		event("", "/", "", "", false, nil),
		event("POST", "/", "", "not base64!", true, nil),
		event("POST", "no-slash", "", "", false, nil),
	}
	noDomain := event("POST", "/", "", "", false, nil)
	noDomain.RequestContext.DomainName = ""
	evilDomain := event("POST", "/", "", "", false, nil)
	evilDomain.RequestContext.DomainName = "a.example/evil"
	bad = append(bad, noDomain, evilDomain)
	for i, ev := range bad {
		if _, err := funcurl.NewRequest(t.Context(), ev, 0); !errors.Is(err, funcurl.ErrBadRequest) {
			t.Errorf("case %d: err %v, want ErrBadRequest", i, err)
		}
	}
}

func TestHandlerResponse(t *testing.T) {
	t.Parallel()
	calls := 0
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		switch r.URL.Path {
		case "/binary":
			w.Header().Add("X-Multi", "a")
			w.Header().Add("X-Multi", "b")
			http.SetCookie(w, &http.Cookie{Name: "s", Value: "1"})
			w.WriteHeader(http.StatusTeapot)
			w.WriteHeader(http.StatusOK) // ignored
			w.Write([]byte{0xff, 0xfe})
		case "/panic":
			panic("boom")
		default:
			w.Write([]byte("<html>hi</html>"))
		}
	})
	fn := funcurl.New(h, funcurl.Config{MaxBodyBytes: 4, Logger: quiet()})
	ctx := t.Context()

	resp, err := fn(ctx, event("GET", "/binary", "", "", false, nil))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusTeapot || resp.Headers["X-Multi"] != "a, b" || len(resp.Cookies) != 1 || resp.Cookies[0] != "s=1" {
		t.Fatalf("response %+v", resp)
	}
	if _, ok := resp.Headers["Set-Cookie"]; ok {
		t.Fatal("Set-Cookie left in headers")
	}
	if !resp.IsBase64Encoded || resp.Body != base64.StdEncoding.EncodeToString([]byte{0xff, 0xfe}) {
		t.Fatalf("binary body %q (base64 %v)", resp.Body, resp.IsBase64Encoded)
	}

	resp, _ = fn(ctx, event("GET", "/", "", "", false, nil))
	if resp.StatusCode != 200 || resp.Body != "<html>hi</html>" || !strings.HasPrefix(resp.Headers["Content-Type"], "text/html") || resp.IsBase64Encoded {
		t.Fatalf("text response %+v", resp)
	}

	resp, err = fn(ctx, event("GET", "/panic", "", "", false, nil))
	if err != nil || resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("panic: %+v %v", resp, err)
	}

	before := calls
	resp, err = fn(ctx, event("POST", "/", "", "12345", false, nil))
	if err != nil || resp.StatusCode != receive.StatusNonRetryable || headerValue(resp, receive.HeaderNonRetryable) != "true" || resp.Body != `{"error":"body_too_large"}`+"\n" {
		t.Fatalf("too large: %+v %v", resp, err)
	}
	resp, err = fn(ctx, event("POST", "/", "", "%%%", true, nil))
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad base64: %+v %v", resp, err)
	}
	if calls != before {
		t.Fatal("handler called for a rejected event")
	}
}

// receiverSetup gives a receiver its migrated schema (with the example's tables) and a
// verifier of the dev keys.
func receiverSetup(t *testing.T) (*pgtest.DB, *qstash.Verifier) {
	t.Helper()
	db := pgtest.New(t)
	if err := orders.Migrate(t.Context(), db.Pool); err != nil {
		t.Fatal(err)
	}
	v, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: qstash.DevCurrentSigningKey, NextSigningKey: qstash.DevNextSigningKey})
	if err != nil {
		t.Fatal(err)
	}
	return db, v
}

// TestWebhookThroughAdapter runs a signed Function URL event through the adapter and the
// real webhook handler: the signed URL comes from requestContext.domainName, and a
// signature made for a client-supplied Host is refused.
func TestWebhookThroughAdapter(t *testing.T) {
	t.Parallel()
	db, v := receiverSetup(t)
	h, err := webhook.New(webhook.Config{Pool: db.Pool, Verifier: v, Handlers: webhook.Handlers{"order.created": orders.OrderCreated}, OriginFromFunctionURL: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	fn := funcurl.New(h, funcurl.Config{MaxBodyBytes: webhook.DefaultMaxBodyBytes, Logger: quiet()})
	body := []byte(`{"order_id":"o-fn","amount_cents":500,"currency":"USD"}`)
	send := func(signedFor string, b64 bool) events.LambdaFunctionURLResponse {
		sig, err := qstash.Sign(qstash.DevCurrentSigningKey, signedFor, body, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		enc := string(body)
		if b64 {
			enc = base64.StdEncoding.EncodeToString(body)
		}
		// The identity is in the query, as the relay publishes it (the signed URL includes it).
		resp, err := fn(t.Context(), event("POST", "/events/order.created", "outbox_id=77&generation=0", enc, b64, map[string]string{
			"upstash-signature": sig, "x-outbox-id": "77", "host": "evil.example", "x-forwarded-host": "evil.example",
		}))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := send("https://evil.example/events/order.created?outbox_id=77&generation=0", false); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("signature for the spoofed host: status %d", resp.StatusCode)
	}
	if resp := send("https://"+domain+"/events/order.created?outbox_id=77&generation=0", true); resp.StatusCode != http.StatusOK {
		t.Fatalf("signature for the function url: status %d %s", resp.StatusCode, resp.Body)
	}
	var n int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM billing_charges WHERE order_id = 'o-fn' AND outbox_id = '77'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("billing_charges %d, %v", n, err)
	}
}

func TestNewLocalServerSetsEveryTimeout(t *testing.T) {
	t.Parallel()
	s := funcurl.NewLocalServer("127.0.0.1:0", http.NotFoundHandler())
	if s.ReadHeaderTimeout == 0 || s.ReadTimeout == 0 || s.WriteTimeout == 0 || s.IdleTimeout == 0 {
		t.Fatalf("a timeout is unset: %+v", s)
	}
}

// TestOversizedBodyThroughAdapter: a signed body over the limit, sent to either QStash
// receiver (webhook, failure callback) through the Function URL adapter, is answered 489 +
// Upstash-NonRetryable-Error: true (QStash's only "do not retry"; it retries and bills a
// 413) with the code body_too_large, and nothing is written. Both when the adapter's limit
// is the handler's (as receiverfunc wires it: the adapter answers) and when it is larger
// (the handler answers).
func TestOversizedBodyThroughAdapter(t *testing.T) {
	t.Parallel()
	db, v := receiverSetup(t)
	const limit = 1024
	wh, err := webhook.New(webhook.Config{Pool: db.Pool, Verifier: v, MaxBodyBytes: limit, Logger: quiet(),
		Handlers: webhook.Handlers{"order.created": orders.OrderCreated}, OriginFromFunctionURL: true})
	if err != nil {
		t.Fatal(err)
	}
	cb, err := deadletter.NewCallbackHandler(deadletter.CallbackConfig{Pool: db.Pool, Verifier: v, MaxBodyBytes: limit, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("x", 2*limit)
	for _, c := range []struct {
		name, path, query, body string
		h                       http.Handler
	}{
		{"webhook", "/events/order.created", "outbox_id=5&generation=0", `{"order_id":"o-big","amount_cents":1,"currency":"EUR","pad":"` + pad + `"}`, wh},
		{"failure callback", "/failure", "", `{"status":500,"sourceMessageId":"msg-big","url":"https://` + domain +
			`/events/order.created?outbox_id=5&generation=0","body":"` + base64.StdEncoding.EncodeToString([]byte(pad)) + `"}`, cb},
	} {
		for _, adapterLimit := range []int64{limit, 4 * limit} {
			target := "https://" + domain + c.path
			if c.query != "" {
				target += "?" + c.query
			}
			sig, err := qstash.Sign(qstash.DevCurrentSigningKey, target, []byte(c.body), time.Now())
			if err != nil {
				t.Fatal(err)
			}
			fn := funcurl.New(c.h, funcurl.Config{MaxBodyBytes: adapterLimit, Logger: quiet()})
			resp, err := fn(t.Context(), event("POST", c.path, c.query, c.body, false, map[string]string{"upstash-signature": sig}))
			if err != nil || resp.StatusCode != receive.StatusNonRetryable || headerValue(resp, receive.HeaderNonRetryable) != "true" ||
				strings.TrimSpace(resp.Body) != `{"error":"body_too_large"}` {
				t.Fatalf("%s, adapter limit %d: %+v %v; want 489, %s: true, body_too_large", c.name, adapterLimit, resp, err, receive.HeaderNonRetryable)
			}
		}
	}
	var n int
	if err := db.Pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM dead_letters) + (SELECT count(*) FROM processed_messages) +
		(SELECT count(*) FROM billing_charges)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("oversized bodies wrote %d rows (%v)", n, err)
	}
}
