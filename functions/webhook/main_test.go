package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/examples/orders"
	"github.com/outbox-relay/outbox-relay/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/internal/receiverfunc/receivertest"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/pkg/webhook"
)

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	receivertest.RequireConfig(t, readConfig, receivertest.Vars{
		PublicURL: "PUBLIC_BASE_URL", Good: "https://hooks.example.com", Bad: "hooks.example.com", DefaultMaxBodyBytes: 1 << 20,
	})
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

// TestStartNamesRefusedVariable: a PUBLIC_BASE_URL the environment reader lets through
// but the webhook refuses (a fragment) stops the cold start with an error naming the
// variable, not the library field.
func TestStartNamesRefusedVariable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	cfg := receivertest.LoadConfig(t, readConfig, map[string]string{"DATABASE_URL": db.URL, "PUBLIC_BASE_URL": "https://hooks.example.com/#top"})
	h, _, err := receiverfunc.Start(context.Background(), cfg, slog.New(slog.DiscardHandler), build)
	if got := envconfig.Vars(err); h != nil || !slices.Equal(got, []string{"PUBLIC_BASE_URL"}) {
		t.Fatalf("variables %v in: %v", got, err)
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
