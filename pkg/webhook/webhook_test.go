package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck/configchecktest"
	"github.com/outbox-relay/outbox-relay/v3/internal/origin"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

const orderPath = "/events/order.created"

func TestExactlyOnceEffectSequentialAndConcurrent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	body := order("o-1")

	for i := range 5 {
		w := f.serve(delivery(t, orderPath, "101", body))
		if w.Code != http.StatusOK {
			t.Fatalf("sequential delivery %d: status %d %s", i, w.Code, w.Body)
		}
	}

	// Concurrently, over real HTTP, the same signed delivery of another event.
	srv := httptest.NewServer(f.h)
	defer srv.Close()
	body2 := order("o-2")
	sig := sign(t, qstash.DevCurrentSigningKey, baseURL+identified(orderPath, "102"), body2, time.Now())
	var wg sync.WaitGroup
	statuses := make([]int, 5)
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+identified(orderPath, "102"), bytes.NewReader(body2))
			req.Header.Set("Upstash-Signature", sig)
			req.Header.Set("X-Outbox-Id", "102")
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	for i, s := range statuses {
		if s != http.StatusOK {
			t.Fatalf("concurrent delivery %d: status %d", i, s)
		}
	}

	var charges int
	if err := f.db.Pool.QueryRow(t.Context(),
		`SELECT count(*) FROM billing_charges WHERE (order_id, outbox_id) IN (('o-1','101'),('o-2','102'))`).Scan(&charges); err != nil {
		t.Fatal(err)
	}
	if charges != 2 || f.count(t, "billing_charges") != 2 || f.count(t, "processed_messages") != 2 {
		t.Fatalf("charges %d, billing_charges %d, processed_messages %d; want 2, 2, 2",
			charges, f.count(t, "billing_charges"), f.count(t, "processed_messages"))
	}
	got := f.observed()
	processed := 0
	for _, o := range got {
		if o == "order.created/processed" {
			processed++
		} else if o != "order.created/duplicate" {
			t.Fatalf("unexpected observation %q", o)
		}
	}
	if processed != 2 || len(got) != 10 {
		t.Fatalf("observations %v: want 2 processed of 10", got)
	}
}

func TestSecurityMatrix(t *testing.T) {
	t.Parallel()
	body := order("o-sec")
	now := time.Now()
	// edited is the valid delivery of body, then edit.
	edited := func(edit func(t *testing.T, r *http.Request)) func(t *testing.T) *http.Request {
		return func(t *testing.T) *http.Request {
			r := delivery(t, orderPath, "1", body)
			edit(t, r)
			return r
		}
	}
	// header is the valid delivery with one header set to value.
	header := func(name, value string) func(t *testing.T) *http.Request {
		return edited(func(_ *testing.T, r *http.Request) { r.Header.Set(name, value) })
	}
	// signedBy replaces the signature with key's over url and signedBody at at.
	signedBy := func(key, url string, signedBody []byte, at time.Time) func(t *testing.T) *http.Request {
		return edited(func(t *testing.T, r *http.Request) {
			r.Header.Set("Upstash-Signature", sign(t, key, url, signedBody, at))
		})
	}
	// to is a delivery of payload to path (signed, with outbox id 1 in the signed URL).
	to := func(path string, payload []byte) func(t *testing.T) *http.Request {
		return func(t *testing.T) *http.Request { return delivery(t, path, "1", payload) }
	}
	// signedFor is body signed for target, forwarding id as X-Outbox-Id unless it is empty.
	signedFor := func(target, id string) func(t *testing.T) *http.Request {
		return func(t *testing.T) *http.Request { return signedRequest(t, target, id, body) }
	}
	big := append([]byte(`{"order_id":"o","amount_cents":1,"currency":"EUR","pad":"`), bytes.Repeat([]byte("x"), 2048)...)
	big = append(big, `"}`...)
	cases := []struct {
		name   string
		req    func(t *testing.T) *http.Request
		status int
	}{
		{"no signature", edited(func(_ *testing.T, r *http.Request) { r.Header.Del("Upstash-Signature") }), http.StatusUnauthorized},
		{"garbage signature", header("Upstash-Signature", "not.a.jwt"), http.StatusUnauthorized},
		{"signature over another body", signedBy(qstash.DevCurrentSigningKey, baseURL+orderPath, order("o-other"), now), http.StatusUnauthorized},
		{"wrong subject: other path", signedBy(qstash.DevCurrentSigningKey, baseURL+"/events/order.updated", body, now), http.StatusUnauthorized},
		{"wrong subject: other host, spoofed Host and X-Forwarded-Host", edited(func(t *testing.T, r *http.Request) {
			r.Host = "evil.example"
			r.Header.Set("X-Forwarded-Host", "evil.example")
			r.Header.Set("Upstash-Signature", sign(t, qstash.DevCurrentSigningKey, "https://evil.example"+orderPath, body, now))
		}), http.StatusUnauthorized},
		{"wrong subject: query string not signed", edited(func(_ *testing.T, r *http.Request) { r.URL.RawQuery = "x=1" }), http.StatusUnauthorized},
		{"expired token", signedBy(qstash.DevCurrentSigningKey, baseURL+orderPath, body, now.Add(-10*time.Minute)), http.StatusUnauthorized},
		{"token signed with an unknown key", signedBy("sig_someone_else", baseURL+orderPath, body, now), http.StatusUnauthorized},
		{"body over the limit, declared", to(orderPath, big), webhook.StatusNonRetryable},
		{"body over the limit, chunked", func(t *testing.T) *http.Request {
			r := delivery(t, orderPath, "1", big)
			r.ContentLength = -1
			r.Body = io.NopCloser(bytes.NewReader(big))
			return r
		}, webhook.StatusNonRetryable},
		{"wrong method", edited(func(_ *testing.T, r *http.Request) { r.Method = http.MethodPut }), http.StatusMethodNotAllowed},
		{"wrong path", to("/hooks/order.created", body), http.StatusNotFound},
		{"nested path", to(orderPath+"/x", body), http.StatusNotFound},
		{"unknown topic", to("/events/order.deleted", body), webhook.StatusNonRetryable},
		{"malformed JSON", to(orderPath, []byte(`{"order_id":`)), webhook.StatusNonRetryable},
		{"failed validation", to(orderPath, []byte(`{"order_id":"o","amount_cents":0,"currency":"EUR"}`)), webhook.StatusNonRetryable},
		{"no message id", signedFor(orderPath, ""), webhook.StatusNonRetryable},
		{"no message id in the URL, unsigned X-Outbox-Id, no legacy check", signedFor(orderPath, "1"), webhook.StatusNonRetryable},
		{"signed outbox_id without generation", signedFor(orderPath+"?outbox_id=1", ""), webhook.StatusNonRetryable},
		{"signed outbox_id twice", signedFor(orderPath+"?outbox_id=1&outbox_id=2&generation=0", ""), webhook.StatusNonRetryable},
		{"signed outbox_id not a number", signedFor(orderPath+"?outbox_id=x&generation=0", ""), webhook.StatusNonRetryable},
		{"X-Outbox-Id contradicts the signed URL", header("X-Outbox-Id", "2"), http.StatusUnauthorized},
		{"X-Outbox-Generation contradicts the signed URL", header("X-Outbox-Generation", "1"), http.StatusUnauthorized},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, func(cfg *webhook.Config) { cfg.MaxBodyBytes = 1024 })
			w := f.serve(c.req(t))
			if w.Code != c.status {
				t.Fatalf("status %d, want %d (body %s)", w.Code, c.status, w.Body)
			}
			nonRetryable := w.Header().Get(webhook.HeaderNonRetryable) == "true"
			if want := c.status == webhook.StatusNonRetryable; nonRetryable != want {
				t.Fatalf("%s header present = %v, want %v", webhook.HeaderNonRetryable, nonRetryable, want)
			}
			// QStash documents only 489 + the header as "do not retry": an oversized body
			// gets that, never a 413 it would retry and bill.
			if strings.HasPrefix(c.name, "body over the limit") && strings.TrimSpace(w.Body.String()) != `{"error":"body_too_large"}` {
				t.Fatalf("oversized body answered %q", w.Body)
			}
			if c.status == http.StatusUnauthorized && strings.TrimSpace(w.Body.String()) != `{"error":"unauthorized"}` {
				t.Fatalf("401 body %q is not the generic one", w.Body)
			}
			f.assertNothingWritten(t)
		})
	}
}

func TestNextSigningKeyAccepted(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	body := order("o-next")
	r := delivery(t, orderPath, "7", body)
	r.Header.Set("Upstash-Signature", sign(t, qstash.DevNextSigningKey, baseURL+identified(orderPath, "7"), body, time.Now()))
	if w := f.serve(r); w.Code != http.StatusOK {
		t.Fatalf("status %d %s", w.Code, w.Body)
	}
	if f.count(t, "billing_charges") != 1 || f.count(t, "processed_messages") != 1 {
		t.Fatal("delivery signed with the next key was not applied")
	}
}

func TestPayloadConflictForKnownID(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	if w := f.serve(delivery(t, orderPath, "9", order("o-a"))); w.Code != http.StatusOK {
		t.Fatalf("first delivery: %d", w.Code)
	}
	w := f.serve(delivery(t, orderPath, "9", order("o-b")))
	if w.Code != webhook.StatusNonRetryable || w.Header().Get(webhook.HeaderNonRetryable) != "true" {
		t.Fatalf("conflict: status %d header %q", w.Code, w.Header().Get(webhook.HeaderNonRetryable))
	}
	var orderID string
	if err := f.db.Pool.QueryRow(t.Context(), `SELECT order_id FROM billing_charges`).Scan(&orderID); err != nil {
		t.Fatal(err) // also fails if a second row appeared
	}
	if orderID != "o-a" || f.count(t, "processed_messages") != 1 {
		t.Fatalf("conflicting payload changed state: order %q, processed_messages %d", orderID, f.count(t, "processed_messages"))
	}
	if !contains(f.logs.String(), `"level":"ERROR"`) {
		t.Fatal("payload conflict was not logged at ERROR")
	}
}

func TestHandlerThatWritesThenFailsLeavesNothingAndRetrySucceeds(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	secret := "db password is hunter2"
	flaky := func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		if err := orders.OrderCreated(ctx, tx, d); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			return errors.New(secret) // after the charge was written
		}
		return nil
	}
	f := newFixture(t, func(c *webhook.Config) { c.Handlers = webhook.Handlers{"order.created": flaky} })

	w := f.serve(delivery(t, orderPath, "5", order("o-5")))
	if w.Code != http.StatusInternalServerError || w.Header().Get(webhook.HeaderNonRetryable) != "" {
		t.Fatalf("failing handler: status %d, non-retryable %q; want 500 without it", w.Code, w.Header().Get(webhook.HeaderNonRetryable))
	}
	if contains(w.Body.String(), "hunter2") {
		t.Fatalf("response echoes the internal error: %s", w.Body)
	}
	f.assertNothingWritten(t)

	r := delivery(t, orderPath, "5", order("o-5"))
	r.Header.Set("Upstash-Retried", "1")
	if w := f.serve(r); w.Code != http.StatusOK {
		t.Fatalf("retry: status %d", w.Code)
	}
	if f.count(t, "billing_charges") != 1 || f.count(t, "processed_messages") != 1 {
		t.Fatal("retry did not apply the event exactly once")
	}
	if got := f.observed(); len(got) != 2 || got[0] != "order.created/transient" || got[1] != "order.created/processed" {
		t.Fatalf("observations %v", got)
	}
}

func TestPermanentHandlerErrorRollsBack(t *testing.T) {
	t.Parallel()
	reject := func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		if err := orders.OrderCreated(ctx, tx, d); err != nil {
			return err
		}
		return webhook.Permanent(errors.New("customer is blocked"))
	}
	f := newFixture(t, func(c *webhook.Config) { c.Handlers = webhook.Handlers{"order.created": reject} })
	w := f.serve(delivery(t, orderPath, "6", order("o-6")))
	if w.Code != webhook.StatusNonRetryable || w.Header().Get(webhook.HeaderNonRetryable) != "true" {
		t.Fatalf("status %d", w.Code)
	}
	// The reason is the body's message (TestPermanentReasonInBody has the rule).
	if w.Body.String() != `{"error":"rejected","message":"customer is blocked"}`+"\n" {
		t.Fatalf("body %s", w.Body)
	}
	f.assertNothingWritten(t)
}

func TestDeliveryFields(t *testing.T) {
	t.Parallel()
	var got webhook.Delivery
	capture := func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error { got = d; return nil }
	f := newFixture(t, func(c *webhook.Config) { c.Handlers = webhook.Handlers{"order.created": capture} })
	body := order("o-f")
	r := delivery(t, orderPath, "42", body)
	r.Header.Set("Upstash-Retried", "3")
	r.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	if w := f.serve(r); w.Code != http.StatusOK {
		t.Fatalf("status %d", w.Code)
	}
	if got.Topic != "order.created" || got.MessageID != "42" || got.Attempt != 3 || !bytes.Equal(got.Payload, body) {
		t.Fatalf("delivery %+v", got)
	}
	if got.Headers.Get("Traceparent") == "" || got.Headers.Get("Upstash-Signature") != "" {
		t.Fatalf("headers %v: want traceparent kept, signature removed", got.Headers)
	}

	// The forwarded headers are information only: without them the signed URL is the key,
	// and an unsigned Upstash-Message-Id never is.
	r = signedRequest(t, orderPath+"?outbox_id=0043&generation=2", "", order("o-g"))
	if w := f.serve(r); w.Code != http.StatusOK || got.MessageID != "43" || got.Generation != 2 {
		t.Fatalf("status %d, message id %q generation %d; want 43 (canonical decimal), 2", w.Code, got.MessageID, got.Generation)
	}
}

func TestDatabaseDownIsTransient(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.db.Pool.Close()
	w := f.serve(delivery(t, orderPath, "8", order("o-8")))
	if w.Code != http.StatusInternalServerError || w.Header().Get(webhook.HeaderNonRetryable) != "" {
		t.Fatalf("status %d; want 500, retryable", w.Code)
	}
}

func TestTrustedOriginFromContext(t *testing.T) {
	t.Parallel()
	const fnURL = "https://abc123.lambda-url.eu-west-1.on.aws"
	f := newFixture(t, func(c *webhook.Config) { c.PublicBaseURL, c.OriginFromFunctionURL = "", true })
	body := order("o-origin")

	// Without configuration or origin the handler refuses to guess from Host.
	r := delivery(t, orderPath, "11", body)
	r.Host = "hooks.example.com"
	if w := f.serve(r); w.Code != http.StatusInternalServerError {
		t.Fatalf("no base URL and no origin: status %d, want 500", w.Code)
	}
	if !contains(f.logs.String(), "configuration error") {
		t.Fatal("missing configuration error in the log")
	}

	signed := func(path string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		r.Header.Set("Upstash-Signature", sign(t, qstash.DevCurrentSigningKey, fnURL+path, body, time.Now()))
		r.Host = "evil.example"
		return r.WithContext(origin.NewContext(r.Context(), fnURL))
	}
	if w := f.serve(signed(identified(orderPath, "12") + "&src=relay")); w.Code != http.StatusOK {
		t.Fatalf("signed for the trusted origin with a query: status %d %s", w.Code, w.Body)
	}
	if f.count(t, "billing_charges") != 1 {
		t.Fatal("event not applied")
	}
}

func TestPublicBaseURLTrailingSlash(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *webhook.Config) { c.PublicBaseURL = baseURL + "/" })
	if w := f.serve(delivery(t, orderPath, "13", order("o-13"))); w.Code != http.StatusOK {
		t.Fatalf("status %d", w.Code)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	v := verifier(t)
	ok := webhook.Handlers{"order.created": orders.OrderCreated}
	f := newFixture(t, nil)
	cases := []struct {
		name    string
		cfg     webhook.Config
		fields  []string
		mention []string
	}{
		{"empty", webhook.Config{}, []string{"Pool", "Verifier", "Handlers", "PublicBaseURL"}, nil},
		// Served over net/http with no base URL, every delivery would get 500: New refuses.
		{"no base url", webhook.Config{Pool: f.db.Pool, Verifier: v, Handlers: ok}, []string{"PublicBaseURL"}, []string{"PUBLIC_BASE_URL", "OriginFromFunctionURL"}},
		{"bad topic and nil handler", webhook.Config{Pool: f.db.Pool, Verifier: v, PublicBaseURL: baseURL, Handlers: webhook.Handlers{"a/b": orders.OrderCreated, "x": nil}},
			[]string{"Handlers"}, []string{`"a/b"`, `"x" has a nil handler`}},
		{"bad base url", webhook.Config{Pool: f.db.Pool, Verifier: v, Handlers: ok, PublicBaseURL: "hooks.example.com"}, []string{"PublicBaseURL"}, nil},
		{"base url with query", webhook.Config{Pool: f.db.Pool, Verifier: v, Handlers: ok, PublicBaseURL: "https://h.example?x=1"}, []string{"PublicBaseURL"}, nil},
		{"negative limit", webhook.Config{Pool: f.db.Pool, Verifier: v, Handlers: ok, PublicBaseURL: baseURL, MaxBodyBytes: -1}, []string{"MaxBodyBytes"}, nil},
	}
	for _, c := range cases {
		_, err := webhook.New(c.cfg)
		configchecktest.RequireFields(t, err, "webhook", c.fields...)
		for _, w := range c.mention {
			if err != nil && !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %s", c.name, err, w)
			}
		}
	}
}
