package webhook_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// Signing modes of FuzzWebhookRequest.
const (
	fuzzUnsigned byte = iota
	fuzzSigned
	fuzzSignedOtherBody
	fuzzSignedOtherURL
	fuzzModes
)

var fuzzBodyRE = regexp.MustCompile(`^\{"(outcome|error)":"[a-z_]+"(,"message":"([^"\\]|\\.)*")?\}\n$`)

// FuzzWebhookRequest drives the whole request path (routing, size limit, signature,
// routing, JSON, validation, inbox) with arbitrary topics and bodies, and checks the
// invariants: only the documented statuses; never a 500 while the database is up; no
// internal text in the body; nothing written unless the signature is valid; a signed
// order.created is applied exactly when ParseOrderCreated accepts it.
func FuzzWebhookRequest(f *testing.F) {
	f.Add("order.created", []byte(`{"order_id":"o-1","amount_cents":1250,"currency":"EUR"}`), fuzzSigned)
	f.Add("order.created", []byte(`{"order_id":"o-1","amount_cents":1250,"currency":"EUR"}`), fuzzUnsigned)
	f.Add("order.created", []byte(`{"order_id":"o-1","amount_cents":1250,"currency":"EUR"}`), fuzzSignedOtherBody)
	f.Add("order.created", []byte(`{"order_id":"o-1","amount_cents":1250,"currency":"EUR"}`), fuzzSignedOtherURL)
	f.Add("order.created", []byte(`{"order_id":"","amount_cents":-1,"currency":"eur"}`), fuzzSigned)
	f.Add("order.created", []byte(`{"order_id":`), fuzzSigned)
	f.Add("order.deleted", []byte(`{}`), fuzzSigned)
	f.Add("a/b", []byte(`{}`), fuzzSigned)
	f.Add("", []byte(``), fuzzUnsigned)

	fx := newFixture(f, func(c *webhook.Config) { c.MaxBodyBytes = 4096 })
	var seq atomic.Int64
	allowed := map[int]bool{200: true, 401: true, 404: true, 405: true, webhook.StatusNonRetryable: true}

	f.Fuzz(func(t *testing.T, topic string, body []byte, mode byte) {
		mode %= fuzzModes
		id := strconv.FormatInt(seq.Add(1), 10) // fresh id: no duplicates or conflicts
		path := "/events/" + url.PathEscape(topic) + "?outbox_id=" + id + "&generation=0"
		signedURL, signedBody := baseURL+path, body
		switch mode {
		case fuzzSignedOtherBody:
			signedBody = append(append([]byte(nil), body...), ' ')
		case fuzzSignedOtherURL:
			signedURL = "https://evil.example" + path
		}
		r := httptest.NewRequest(http.MethodPost, "http://hooks.example.com"+path, bytes.NewReader(body))
		if mode != fuzzUnsigned {
			r.Header.Set("Upstash-Signature", sign(t, qstash.DevCurrentSigningKey, signedURL, signedBody, time.Now()))
		}
		r.Header.Set("X-Outbox-Id", id)

		before := fx.count(t, "processed_messages")
		w := fx.serve(r)
		after := fx.count(t, "processed_messages")

		if !allowed[w.Code] {
			t.Fatalf("status %d (body %q)", w.Code, w.Body)
		}
		if w.Code != 404 && w.Code != 405 && !fuzzBodyRE.Match(w.Body.Bytes()) {
			t.Fatalf("unexpected response body %q", w.Body)
		}
		if mode != fuzzSigned && (w.Code == 200 || after != before) {
			t.Fatalf("mode %d: status %d, processed_messages %d -> %d", mode, w.Code, before, after)
		}
		if mode == fuzzSigned && topic == "order.created" && len(body) <= 4096 {
			_, perr := orders.Parse(body)
			if ok := perr == nil; ok != (w.Code == 200) || ok != (after == before+1) {
				t.Fatalf("payload %q: parse error %v, status %d, processed_messages %d -> %d", body, perr, w.Code, before, after)
			}
		}
	})
}
