package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/pkg/metrics"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/pkg/tracing/tracingtest"
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
	if c.MaxBodyBytes != 4<<20 || c.LogLevel != slog.LevelInfo || c.PublicURL != "" {
		t.Fatalf("defaults %+v", c)
	}
	m := valid()
	m["FAILURE_CALLBACK_URL"] = "https://abc.lambda-url.eu-west-1.on.aws/"
	m["MAX_BODY_BYTES"] = "1000"
	m["LOG_LEVEL"] = "warn"
	if c, err = loadConfig(env(m)); err != nil {
		t.Fatal(err)
	}
	if c.PublicURL != "https://abc.lambda-url.eu-west-1.on.aws/" || c.MaxBodyBytes != 1000 || c.LogLevel != slog.LevelWarn {
		t.Fatalf("config %+v", c)
	}
}

func TestLoadConfigReportsEveryProblem(t *testing.T) {
	t.Parallel()
	_, err := loadConfig(env(map[string]string{"FAILURE_CALLBACK_URL": "/failure", "MAX_BODY_BYTES": "lots", "LOG_LEVEL": "chatty"}))
	if err == nil {
		t.Fatal("invalid environment accepted")
	}
	for _, want := range []string{"DATABASE_URL", "QSTASH_CURRENT_SIGNING_KEY", "QSTASH_NEXT_SIGNING_KEY", "FAILURE_CALLBACK_URL", "MAX_BODY_BYTES", "LOG_LEVEL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}
}

func TestBuildServesRecorder(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	m := valid()
	m["DATABASE_URL"] = db.URL
	m["FAILURE_CALLBACK_URL"] = "https://hooks.example.com/failure"
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
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/failure", strings.NewReader(`{}`)))
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("unsigned callback: %d", w.Code)
	}
	// The tracer telemetry.Setup returned reaches the handler: a signed request is traced.
	body, _ := json.Marshal(map[string]any{"status": 500, "sourceMessageId": "msg-1", "retried": 3, "maxRetries": 3,
		"url": "https://hooks.example.com/events/order.created?outbox_id=1&generation=0"})
	sig, err := qstash.Sign(qstash.DevCurrentSigningKey, m["FAILURE_CALLBACK_URL"], body, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/failure", bytes.NewReader(body))
	r.Header.Set("Upstash-Signature", sig)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("signed callback: %d %s", w.Code, w.Body)
	}
	if spans := rec.Ended(); len(spans) != 1 || spans[0].Name() != "dead_letter order.created" {
		t.Fatalf("%d spans; want the callback's", len(spans))
	}
}

func TestObserverCountsNewDeadLettersAndRejections(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	obs := observer(metrics.NewEMF(&buf, metrics.EMFConfig{}), slog.New(slog.NewTextHandler(io.Discard, nil)))
	obs(deadletter.OutcomeDuplicate)
	obs(deadletter.OutcomeTransient)
	obs(deadletter.OutcomeSuperseded)
	if buf.Len() != 0 {
		t.Fatalf("duplicates, retried or superseded callbacks counted: %q", buf.String())
	}
	for _, outcome := range []string{deadletter.OutcomeUnauthorized, deadletter.OutcomeMalformed, deadletter.OutcomeTooLarge} {
		buf.Reset()
		obs(outcome)
		var doc map[string]any
		if err := json.Unmarshal(buf.Bytes(), &doc); err != nil || doc["RejectedCallbacks"] != float64(1) || doc["Function"] != "failure" {
			t.Fatalf("%s: EMF line %q (%v), want RejectedCallbacks=1", outcome, buf.String(), err)
		}
	}
	buf.Reset()
	obs(deadletter.OutcomeRecorded)
	var doc map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil || doc["DeliveryDeadLetters"] != float64(1) || doc["Function"] != "failure" {
		t.Fatalf("EMF line %q (%v)", buf.String(), err)
	}
}
