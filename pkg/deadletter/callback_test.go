package deadletter_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck/configchecktest"
	"github.com/outbox-relay/outbox-relay/v3/internal/origin"
	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

const failureURL = "https://hooks.example.com/failure"

// verifier checks signatures made with the dev keys (the local QStash server's default).
func verifier(t testing.TB) *qstash.Verifier {
	t.Helper()
	v, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: qstash.DevCurrentSigningKey, NextSigningKey: qstash.DevNextSigningKey})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func newCallbackHandler(t testing.TB, db *pgtest.DB, edit func(*deadletter.CallbackConfig)) *deadletter.CallbackHandler {
	t.Helper()
	cfg := deadletter.CallbackConfig{Pool: db.Pool, Verifier: verifier(t), FailureURL: failureURL, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if edit != nil {
		edit(&cfg)
	}
	h, err := deadletter.NewCallbackHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// callbackBody is a failure callback as QStash documents it: base64 bodies, sourceHeader
// values as lists, createdAt in unix ms.
func callbackBody(outboxID int64, msgID string) []byte {
	b, _ := json.Marshal(map[string]any{
		"status":          489,
		"header":          map[string][]string{"Upstash-Nonretryable-Error": {"true"}},
		"body":            base64.StdEncoding.EncodeToString([]byte(`{"error":"rejected"}`)),
		"retried":         0,
		"maxRetries":      3,
		"dlqId":           "1725323658779-0",
		"sourceMessageId": msgID,
		"url":             destination(outboxID, 0),
		"method":          "POST",
		"sourceHeader":    map[string][]string{"Upstash-Forward-X-Outbox-Id": {itoa(outboxID)}, "Content-Type": {"application/json"}},
		"sourceBody":      base64.StdEncoding.EncodeToString([]byte(`{"order_id":"o-1","amount_cents":0,"currency":"EUR"}`)),
		"createdAt":       time.Now().UnixMilli(),
	})
	return b
}

func signedCallback(t testing.TB, url string, body []byte) *http.Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/failure", bytes.NewReader(body))
	sig, err := qstash.Sign(qstash.DevCurrentSigningKey, url, body, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Upstash-Signature", sig)
	return r
}

func serveCallback(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestCallbackRecordsOnceAndRejectsForgeries(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var outcomes []string
	h := newCallbackHandler(t, db, func(c *deadletter.CallbackConfig) { c.Observe = func(o string) { outcomes = append(outcomes, o) } })
	id := enqueue(t, db, "order.created", "order:1", `{"order_id":"o-1","amount_cents":0,"currency":"EUR"}`)
	dispatch(t, db, id)
	body := callbackBody(id, "msg-1")

	// Forged: signed with an unknown key, signed for another URL, unsigned, tampered.
	forged := []*http.Request{}
	r := signedCallback(t, failureURL, body)
	sig, _ := qstash.Sign("sig_attacker", failureURL, body, time.Now())
	r.Header.Set("Upstash-Signature", sig)
	forged = append(forged, r, signedCallback(t, "https://evil.example/failure", body))
	r = signedCallback(t, failureURL, body)
	r.Header.Del("Upstash-Signature")
	forged = append(forged, r)
	r = signedCallback(t, failureURL, body)
	r.Body = io.NopCloser(bytes.NewReader(callbackBody(id, "msg-forged")))
	forged = append(forged, r)
	for i, r := range forged {
		if w := serveCallback(h, r); w.Code != http.StatusUnauthorized {
			t.Fatalf("forgery %d: status %d", i, w.Code)
		}
	}
	if n := db.Count(t, `SELECT count(*) FROM dead_letters`); n != 0 {
		t.Fatalf("forgeries wrote %d letters", n)
	}
	if readOutbox(t, db, id).dead {
		t.Fatal("forgery marked the outbox row")
	}

	for i := range 2 {
		w := serveCallback(h, signedCallback(t, failureURL, body))
		if w.Code != http.StatusOK {
			t.Fatalf("callback %d: status %d %s", i, w.Code, w.Body)
		}
	}
	if n := db.Count(t, `SELECT count(*) FROM dead_letters`); n != 1 {
		t.Fatalf("%d letters, want 1", n)
	}
	letters, err := deadletter.List(context.Background(), db.Pool, deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	l := letters[0]
	var p map[string]any
	if json.Unmarshal(l.Payload, &p) != nil || p["order_id"] != "o-1" || l.OutboxID != outbox.ID(id) || l.QStashDLQID != "1725323658779-0" || l.StatusCode != 489 {
		t.Fatalf("letter %+v", l)
	}
	if !readOutbox(t, db, id).dead {
		t.Fatal("outbox row not marked dead-lettered")
	}
	want := "unauthorized,unauthorized,unauthorized,unauthorized,recorded,duplicate"
	if got := strings.Join(outcomes, ","); got != want {
		t.Fatalf("outcomes %s, want %s", got, want)
	}
}

func TestCallbackRejectsBadInputWithoutWriting(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := newCallbackHandler(t, db, func(c *deadletter.CallbackConfig) { c.MaxBodyBytes = 2048 })
	cases := []struct {
		name   string
		req    *http.Request
		status int
	}{
		{"not JSON", signedCallback(t, failureURL, []byte(`{"status":`)), http.StatusBadRequest},
		{"no source message id", signedCallback(t, failureURL, []byte(`{"status":500,"sourceBody":""}`)), http.StatusBadRequest},
		{"bad base64", signedCallback(t, failureURL, []byte(`{"sourceMessageId":"m","sourceBody":"%%%"}`)), http.StatusBadRequest},
		{"too large", signedCallback(t, failureURL, bytes.Repeat([]byte(" "), 4096)), receive.StatusNonRetryable},
		{"wrong method", httptest.NewRequest(http.MethodGet, "/failure", nil), http.StatusMethodNotAllowed},
	}
	for _, c := range cases {
		w := serveCallback(h, c.req)
		if w.Code != c.status {
			t.Errorf("%s: status %d, want %d", c.name, w.Code, c.status)
		}
		// Only an oversized body is permanent for QStash (489 + the header: no retries).
		if nonRetryable := w.Header().Get(receive.HeaderNonRetryable) == "true"; nonRetryable != (c.name == "too large") {
			t.Errorf("%s: %s = %q", c.name, receive.HeaderNonRetryable, w.Header().Get(receive.HeaderNonRetryable))
		}
	}
	if n := db.Count(t, `SELECT count(*) FROM dead_letters`); n != 0 {
		t.Fatalf("bad input wrote %d letters", n)
	}
}

func TestCallbackURLFromTrustedOrigin(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := newCallbackHandler(t, db, func(c *deadletter.CallbackConfig) { c.FailureURL = "" })
	body := callbackBody(0, "msg-o")

	r := signedCallback(t, "https://hooks.example.com/failure", body)
	r.Host = "hooks.example.com"
	if w := serveCallback(h, r); w.Code != http.StatusInternalServerError {
		t.Fatalf("no origin: status %d, want 500", w.Code)
	}
	const fn = "https://xyz.lambda-url.eu-west-1.on.aws"
	r = signedCallback(t, fn+"/failure", body)
	r = r.WithContext(origin.NewContext(r.Context(), fn))
	if w := serveCallback(h, r); w.Code != http.StatusOK {
		t.Fatalf("trusted origin: status %d", w.Code)
	}
}

func TestCallbackDatabaseDown(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := newCallbackHandler(t, db, nil)
	db.Pool.Close()
	if w := serveCallback(h, signedCallback(t, failureURL, callbackBody(1, "m"))); w.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", w.Code)
	}
}

func TestNewCallbackHandlerValidates(t *testing.T) {
	t.Parallel()
	_, err := deadletter.NewCallbackHandler(deadletter.CallbackConfig{FailureURL: "nope", MaxBodyBytes: -1})
	configchecktest.RequireFields(t, err, "failure callback", "Pool", "Verifier", "FailureURL", "MaxBodyBytes")
}

// The docs' variant: sourceHeader values as strings, timestamps as quoted strings.
func TestCallbackDocumentedStringForm(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := newCallbackHandler(t, db, nil)
	id := enqueue(t, db, "order.created", "order:9", `{"n":9}`)
	body := []byte(`{"status":489,"body":"e30=","retried":"0","maxRetries":"3","dlqId":"1-0","sourceMessageId":"msg-doc",` +
		`"url":"` + destination(id, 0) + `","sourceHeader":{"x-outbox-id":"` + itoa(id) + `"},` +
		`"sourceBody":"eyJuIjo5fQ==","createdAt":"1725323658779","notBefore":"0"}`)
	if w := serveCallback(h, signedCallback(t, failureURL, body)); w.Code != http.StatusOK {
		t.Fatalf("status %d %s", w.Code, w.Body)
	}
	ls, err := deadletter.List(context.Background(), db.Pool, deadletter.Filter{})
	if err != nil || len(ls) != 1 || ls[0].OutboxID != outbox.ID(id) || ls[0].PartitionKey != "order:9" || string(ls[0].Payload) != `{"n": 9}` {
		t.Fatalf("letters %+v %v", ls, err)
	}
}
