package webhook_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

const baseURL = "https://hooks.example.com"

type fixture struct {
	db      *pgtest.DB
	h       *webhook.Handler
	logs    *logtest.Buffer
	mu      sync.Mutex
	observe []string
}

func verifier(t testing.TB) *qstash.Verifier {
	t.Helper()
	v, err := qstash.NewVerifier(qstash.VerifierConfig{
		CurrentSigningKey: qstash.DevCurrentSigningKey,
		NextSigningKey:    qstash.DevNextSigningKey,
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// newFixture builds a Handler on a fresh schema; edit tweaks the config before New.
func newFixture(t testing.TB, edit func(*webhook.Config)) *fixture {
	t.Helper()
	f := &fixture{db: pgtest.New(t), logs: &logtest.Buffer{}}
	if err := orders.Migrate(t.Context(), f.db.Pool); err != nil {
		t.Fatal(err)
	}
	cfg := webhook.Config{
		Pool:          f.db.Pool,
		Verifier:      verifier(t),
		Handlers:      webhook.Handlers{"order.created": orders.OrderCreated},
		PublicBaseURL: baseURL,
		Logger:        slog.New(slog.NewJSONHandler(f.logs, nil)),
		Observe: func(topic, outcome string) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.observe = append(f.observe, topic+"/"+outcome)
		},
	}
	if edit != nil {
		edit(&cfg)
	}
	h, err := webhook.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.h = h
	return f
}

func sign(t testing.TB, key, url string, body []byte, now time.Time) string {
	t.Helper()
	s, err := qstash.Sign(key, url, body, now)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// identified is path with the identity query the relay puts in the destination URL.
func identified(path, id string) string { return path + "?outbox_id=" + id + "&generation=0" }

// delivery is a request as QStash sends it to path with the outbox id in its query (as the
// relay publishes), signed for baseURL+path+query. The identity is also forwarded as
// X-Outbox-Id, for information, as the relay does.
func delivery(t testing.TB, path, id string, body []byte) *http.Request {
	t.Helper()
	return signedRequest(t, identified(path, id), id, body)
}

// signedRequest is a request to target (path and query) signed for baseURL+target, with
// X-Outbox-Id set to id unless id is empty.
func signedRequest(t testing.TB, target, id string, body []byte) *http.Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, target, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Upstash-Signature", sign(t, qstash.DevCurrentSigningKey, baseURL+target, body, time.Now()))
	r.Header.Set("Upstash-Message-Id", "msg_"+id)
	if id != "" {
		r.Header.Set("X-Outbox-Id", id)
		r.Header.Set("X-Outbox-Generation", "0")
	}
	r.Header.Set("Upstash-Retried", "0")
	return r
}

func (f *fixture) serve(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

func (f *fixture) count(t testing.TB, table string) int {
	t.Helper()
	return f.db.Count(t, "SELECT count(*) FROM "+table)
}

// assertNothingWritten fails unless both the dedupe table and the side-effect table are empty.
func (f *fixture) assertNothingWritten(t testing.TB) {
	t.Helper()
	if n := f.count(t, "processed_messages"); n != 0 {
		t.Fatalf("processed_messages has %d rows, want 0", n)
	}
	if n := f.count(t, "billing_charges"); n != 0 {
		t.Fatalf("billing_charges has %d rows, want 0", n)
	}
}

func (f *fixture) observed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.observe...)
}

func order(id string) []byte {
	return []byte(`{"order_id":"` + id + `","amount_cents":1250,"currency":"EUR"}`)
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
