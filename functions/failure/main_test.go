package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/receiverfunc/receivertest"
	"github.com/outbox-relay/outbox-relay/pkg/deadletter"
)

// vars are the function's own variables, for the checks every receiver passes.
var vars = receivertest.Vars{
	PublicURL: "FAILURE_CALLBACK_URL", Good: "https://hooks.example.com/failure", Bad: "/failure", DefaultMaxBodyBytes: 4 << 20,
}

// TestReceiver: the function reads its environment as every receiver does, and its cold
// start serves the callback recorder, traced.
func TestReceiver(t *testing.T) {
	t.Parallel()
	h, _, rec := receivertest.StartReceiver(t, receiver, vars, "/failure")
	body, _ := json.Marshal(map[string]any{"status": 500, "sourceMessageId": "msg-1", "retried": 3, "maxRetries": 3,
		"url": "https://hooks.example.com/events/order.created?outbox_id=1&generation=0"})
	receivertest.ServeTraced(t, h, rec, vars.Good, "/failure", body, "dead_letter order.created")
}

func TestObserverCountsNewDeadLettersAndRejections(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	em := receiver.Observer(&buf, "", slog.New(slog.DiscardHandler))
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
