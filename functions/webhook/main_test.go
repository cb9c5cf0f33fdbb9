package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/examples/orders"
	"github.com/outbox-relay/outbox-relay/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/pkg/metrics"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/pkg/tracing/tracingtest"
	"github.com/outbox-relay/outbox-relay/pkg/webhook"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func valid() map[string]string {
	return map[string]string{
		"DATABASE_URL":               "postgres://u:p@db.example:5432/app?sslmode=require",
		"QSTASH_CURRENT_SIGNING_KEY": qstash.DevCurrentSigningKey,
		"QSTASH_NEXT_SIGNING_KEY":    qstash.DevNextSigningKey,
	}
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	c, err := loadConfig(env(valid()))
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxBodyBytes != 1<<20 || c.LogLevel != slog.LevelInfo || c.PublicURL != "" {
		t.Fatalf("defaults %+v", c)
	}

	m := valid()
	m["PUBLIC_BASE_URL"] = "https://hooks.example.com"
	m["MAX_BODY_BYTES"] = "2048"
	m["LOG_LEVEL"] = "DEBUG"
	c, err = loadConfig(env(m))
	if err != nil {
		t.Fatal(err)
	}
	if c.PublicURL != "https://hooks.example.com" || c.MaxBodyBytes != 2048 || c.LogLevel != slog.LevelDebug {
		t.Fatalf("config %+v", c)
	}
}

func TestLoadConfigReportsEveryProblem(t *testing.T) {
	t.Parallel()
	_, err := loadConfig(env(map[string]string{
		"PUBLIC_BASE_URL": "hooks.example.com",
		"MAX_BODY_BYTES":  "-1",
		"LOG_LEVEL":       "loud",
	}))
	if err == nil {
		t.Fatal("invalid environment accepted")
	}
	for _, want := range []string{"DATABASE_URL", "QSTASH_CURRENT_SIGNING_KEY", "QSTASH_NEXT_SIGNING_KEY", "PUBLIC_BASE_URL", "MAX_BODY_BYTES", "LOG_LEVEL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}
	m := valid()
	m["DATABASE_URL"] = "postgres://u:p@db:notaport/app"
	if _, err := loadConfig(env(m)); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("bad DATABASE_URL: %v", err)
	}
	if _, err := loadConfig(env(m)); strings.Contains(err.Error(), ":p@") {
		t.Fatalf("error leaks the password: %v", err)
	}
}

func TestBuildServesWebhook(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	m := valid()
	m["DATABASE_URL"] = db.URL
	m["PUBLIC_BASE_URL"] = "https://hooks.example.com"
	cfg, err := loadConfig(env(m))
	if err != nil {
		t.Fatal(err)
	}
	rec, tr := tracingtest.New(t)
	cfg.Tracer = tr
	h, pool, err := build(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if pool.Config().MaxConns != receiverfunc.MaxConns {
		t.Fatalf("MaxConns %d", pool.Config().MaxConns)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/events/order.created", strings.NewReader(`{}`)))
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("unsigned request: %d", w.Code)
	}
	// The tracer telemetry.Setup returned reaches the handler: a signed request is traced.
	if err := orders.Migrate(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
	target := "/events/order.created?outbox_id=1&generation=0"
	body := []byte(`{"order_id":"o-1","amount_cents":1,"currency":"EUR"}`)
	sig, err := qstash.Sign(qstash.DevCurrentSigningKey, "https://hooks.example.com"+target, body, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, target, bytes.NewReader(body))
	r.Header.Set("Upstash-Signature", sig)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("signed delivery: %d %s", w.Code, w.Body)
	}
	if spans := rec.Ended(); len(spans) != 2 || spans[1].Name() != "process order.created" {
		t.Fatalf("%d spans; want the delivery and its inbox commit", len(spans))
	}
}

func TestObserverEmitsConsumerMetrics(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	obs := observer(metrics.NewEMF(&buf, metrics.EMFConfig{Topics: []string{"order.created"}}), slog.New(slog.NewTextHandler(io.Discard, nil)))
	for outcome, names := range outcomeMetric {
		buf.Reset()
		obs("order.created", outcome)
		var doc map[string]any
		if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
			t.Fatalf("%s: not one EMF line: %v: %q", outcome, err, buf.String())
		}
		for _, name := range names {
			if doc[name] != float64(1) || doc["Function"] != "webhook" || doc["Topic"] != "order.created" {
				t.Fatalf("%s: EMF line %v lacks %s=1 with Function=webhook, Topic=order.created", outcome, doc, name)
			}
		}
	}
	// Every refusal before a handler ran feeds the rejected-deliveries alarm.
	for _, outcome := range []string{webhook.OutcomeUnauthorized, webhook.OutcomeTooLarge} {
		if !slices.Contains(outcomeMetric[outcome], metrics.RejectedDeliveries) {
			t.Errorf("outcome %s is not counted as %s", outcome, metrics.RejectedDeliveries)
		}
	}
	buf.Reset()
	obs("order.created", "no-such-outcome")
	if buf.Len() != 0 {
		t.Fatalf("unknown outcome emitted %q", buf.String())
	}
}
