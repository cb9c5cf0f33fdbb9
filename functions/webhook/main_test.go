package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/examples/orders"
	"github.com/outbox-relay/outbox-relay/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/internal/receiverfunc/receivertest"
	"github.com/outbox-relay/outbox-relay/pkg/metrics"
	"github.com/outbox-relay/outbox-relay/pkg/webhook"
)

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	if c := receivertest.LoadConfig(t, readConfig, nil); c.MaxBodyBytes != 1<<20 || c.LogLevel != slog.LevelInfo || c.PublicURL != "" {
		t.Fatalf("defaults %+v", c)
	}
	c := receivertest.LoadConfig(t, readConfig, map[string]string{
		"PUBLIC_BASE_URL": "https://hooks.example.com", "MAX_BODY_BYTES": "2048", "LOG_LEVEL": "DEBUG"})
	if c.PublicURL != "https://hooks.example.com" || c.MaxBodyBytes != 2048 || c.LogLevel != slog.LevelDebug {
		t.Fatalf("config %+v", c)
	}
}

func TestLoadConfigReportsEveryProblem(t *testing.T) {
	t.Parallel()
	receivertest.RequireEveryProblem(t, readConfig,
		map[string]string{"PUBLIC_BASE_URL": "hooks.example.com", "MAX_BODY_BYTES": "-1", "LOG_LEVEL": "loud"},
		"DATABASE_URL", "QSTASH_CURRENT_SIGNING_KEY", "QSTASH_NEXT_SIGNING_KEY", "PUBLIC_BASE_URL", "MAX_BODY_BYTES", "LOG_LEVEL")
	_, err := readConfig(receivertest.Env(receivertest.Valid(map[string]string{"DATABASE_URL": "postgres://u:p@db:notaport/app"})))
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("bad DATABASE_URL: %v", err)
	}
	if strings.Contains(err.Error(), ":p@") {
		t.Fatalf("error leaks the password: %v", err)
	}
}

func TestBuildServesWebhook(t *testing.T) {
	t.Parallel()
	const public = "https://hooks.example.com"
	h, db, rec := receivertest.Start(t, readConfig, build, map[string]string{"PUBLIC_BASE_URL": public}, "/events/order.created")
	// The tracer telemetry.Setup returned reaches the handler: a signed request is traced.
	if err := orders.Migrate(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
	target := "/events/order.created?outbox_id=1&generation=0"
	receivertest.ServeSigned(t, h, public+target, target, []byte(`{"order_id":"o-1","amount_cents":1,"currency":"EUR"}`))
	if spans := rec.Ended(); len(spans) != 2 || spans[1].Name() != "process order.created" {
		t.Fatalf("%d spans; want the delivery and its inbox commit", len(spans))
	}
}

func TestObserverEmitsConsumerMetrics(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	obs := receiverfunc.Observer(metrics.NewEMF(&buf, metrics.EMFConfig{Topics: []string{"order.created"}}), slog.New(slog.NewTextHandler(io.Discard, nil)),
		metrics.FunctionWebhook, outcomeMetric)
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
