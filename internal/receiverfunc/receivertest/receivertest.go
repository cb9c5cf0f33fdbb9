// Package receivertest is what the tests of the two receiver functions (functions/webhook
// and functions/failure) share: a valid environment, a cold start on a test schema that
// is checked the same way for both, and a delivery signed as QStash signs it.
package receivertest

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outbox-relay/outbox-relay/v3/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/v3/internal/tracing/tracingtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// Valid returns the variables every receiver requires, with values that parse, plus
// extra (which may override them).
func Valid(extra map[string]string) map[string]string {
	m := map[string]string{
		"DATABASE_URL":               "postgres://u:p@db.example:5432/app?sslmode=require",
		"QSTASH_CURRENT_SIGNING_KEY": qstash.DevCurrentSigningKey,
		"QSTASH_NEXT_SIGNING_KEY":    qstash.DevNextSigningKey,
	}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// Env is a getenv over m.
func Env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// LoadConfig is receiverfunc.LoadConfig over Valid(vars), failing the test on an error.
func LoadConfig(t *testing.T, read receiverfunc.Read, vars map[string]string) receiverfunc.Config {
	t.Helper()
	c, err := receiverfunc.LoadConfig(read, Env(Valid(vars)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Vars names a receiver's own variables for RequireConfig.
type Vars struct {
	// PublicURL is the variable of the URL QStash signs (PUBLIC_BASE_URL,
	// FAILURE_CALLBACK_URL); Good and Bad are a valid and an invalid value of it.
	PublicURL, Good, Bad string
	// DefaultMaxBodyBytes is MAX_BODY_BYTES's default.
	DefaultMaxBodyBytes int64
}

// RequireConfig checks read as every receiver reads its environment: the defaults (no
// public URL, v.DefaultMaxBodyBytes, info logs), the values it was given, one error that
// names every missing or invalid variable (so an operator fixes them in one deploy), and
// a bad DATABASE_URL reported without its password.
func RequireConfig(t *testing.T, read receiverfunc.Read, v Vars) {
	t.Helper()
	if c := LoadConfig(t, read, nil); c.MaxBodyBytes != v.DefaultMaxBodyBytes || c.LogLevel != slog.LevelInfo || c.PublicURL != "" {
		t.Fatalf("defaults %+v", c)
	}
	c := LoadConfig(t, read, map[string]string{v.PublicURL: v.Good, "MAX_BODY_BYTES": "2048", "LOG_LEVEL": "DEBUG"})
	if c.PublicURL != v.Good || c.MaxBodyBytes != 2048 || c.LogLevel != slog.LevelDebug {
		t.Fatalf("config %+v", c)
	}

	_, err := read(Env(map[string]string{v.PublicURL: v.Bad, "MAX_BODY_BYTES": "lots", "LOG_LEVEL": "loud"}))
	if err == nil {
		t.Fatal("invalid environment accepted")
	}
	for _, want := range []string{"DATABASE_URL", "QSTASH_CURRENT_SIGNING_KEY", "QSTASH_NEXT_SIGNING_KEY", v.PublicURL, "MAX_BODY_BYTES", "LOG_LEVEL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}
	_, err = read(Env(Valid(map[string]string{"DATABASE_URL": "postgres://u:p@db:notaport/app"})))
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("bad DATABASE_URL: %v", err)
	}
	if strings.Contains(err.Error(), ":p@") {
		t.Fatalf("error leaks the password: %v", err)
	}
}

// Start runs the receiver's cold start after its configuration (receiverfunc.Start) on a
// fresh test schema, with vars added to Valid and a recording tracer. It checks what both
// receivers must do: size the pool for one invoke at a time and refuse an unsigned POST to
// path with 401.
func Start(t *testing.T, read receiverfunc.Read, build receiverfunc.Build, vars map[string]string, path string) (http.Handler, *pgtest.DB, *tracetest.SpanRecorder) {
	t.Helper()
	db := pgtest.New(t)
	vars = maps.Clone(vars)
	vars["DATABASE_URL"] = db.URL
	cfg := LoadConfig(t, read, vars)
	rec, tr := tracingtest.New(t)
	cfg.Tracer = tr
	h, pool, err := receiverfunc.Start(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), build)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if pool.Config().MaxConns != receiverfunc.MaxConns {
		t.Fatalf("MaxConns %d", pool.Config().MaxConns)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`)))
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("unsigned POST %s: %d", path, w.Code)
	}
	return h, db, rec
}

// ServeSigned posts body to target through h, signed with the dev current key for
// signedURL (the URL QStash was asked to call), and fails unless h answers 200.
func ServeSigned(t *testing.T, h http.Handler, signedURL, target string, body []byte) {
	t.Helper()
	sig, err := qstash.Sign(qstash.DevCurrentSigningKey, signedURL, body, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, target, bytes.NewReader(body))
	r.Header.Set("Upstash-Signature", sig)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("signed POST %s: %d %s", target, w.Code, w.Body)
	}
}
