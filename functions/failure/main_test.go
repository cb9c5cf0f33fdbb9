package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/internal/receiverfunc/receivertest"
	"github.com/outbox-relay/outbox-relay/pkg/deadletter"
)

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	receivertest.RequireConfig(t, readConfig, receivertest.Vars{
		PublicURL: "FAILURE_CALLBACK_URL", Good: "https://abc.lambda-url.eu-west-1.on.aws/", Bad: "/failure", DefaultMaxBodyBytes: 4 << 20,
	})
}

func TestBuildServesRecorder(t *testing.T) {
	t.Parallel()
	const callbackURL = "https://hooks.example.com/failure"
	h, _, rec := receivertest.Start(t, readConfig, build, map[string]string{"FAILURE_CALLBACK_URL": callbackURL}, "/failure")
	// The tracer telemetry.Setup returned reaches the handler: a signed request is traced.
	body, _ := json.Marshal(map[string]any{"status": 500, "sourceMessageId": "msg-1", "retried": 3, "maxRetries": 3,
		"url": "https://hooks.example.com/events/order.created?outbox_id=1&generation=0"})
	receivertest.ServeSigned(t, h, callbackURL, "/failure", body)
	if spans := rec.Ended(); len(spans) != 1 || spans[0].Name() != "dead_letter order.created" {
		t.Fatalf("%d spans; want the callback's", len(spans))
	}
}

func TestObserverCountsNewDeadLettersAndRejections(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	em := receiverfunc.Observer(metrics.NewEMF(&buf, metrics.EMFConfig{}), slog.New(slog.NewTextHandler(io.Discard, nil)), metrics.FunctionFailure, outcomeMetric)
	obs := func(outcome string) { em("", outcome) }
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
