package main

import (
	"encoding/json"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/receiverfunc/receivertest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
)

// TestReceiver: the function reads its environment as every receiver does, and its cold
// start serves the callback recorder, traced.
func TestReceiver(t *testing.T) {
	t.Parallel()
	// The callback QStash sends after a delivery's last retry.
	body, _ := json.Marshal(map[string]any{"status": 500, "sourceMessageId": "msg-1", "retried": 3, "maxRetries": 3,
		"url": "https://hooks.example.com/events/order.created?outbox_id=1&generation=0"})
	const callbackURL = "https://hooks.example.com/failure"
	h, _, rec := receivertest.StartReceiver(t, receiver, receivertest.Vars{
		PublicURL: "FAILURE_CALLBACK_URL", Good: callbackURL, Bad: "/failure", DefaultMaxBodyBytes: 4 << 20,
	}, "/failure")
	receivertest.ServeTraced(t, h, rec, callbackURL, "/failure", body, "dead_letter order.created")
}

func TestObserverCountsNewDeadLettersAndRejections(t *testing.T) {
	t.Parallel()
	emit := receivertest.Metrics(t, receiver)
	for _, outcome := range []string{deadletter.OutcomeDuplicate, deadletter.OutcomeTransient, deadletter.OutcomeSuperseded} {
		if doc := emit("", outcome); doc != nil {
			t.Fatalf("%s callback counted: %v (duplicates, retried or superseded callbacks are not)", outcome, doc)
		}
	}
	for _, outcome := range []string{deadletter.OutcomeUnauthorized, deadletter.OutcomeMalformed, deadletter.OutcomeTooLarge} {
		if doc := emit("", outcome); doc["RejectedCallbacks"] != float64(1) || doc["Function"] != "failure" {
			t.Fatalf("%s: EMF line %v, want RejectedCallbacks=1", outcome, doc)
		}
	}
	if doc := emit("", deadletter.OutcomeRecorded); doc["DeliveryDeadLetters"] != float64(1) || doc["Function"] != "failure" {
		t.Fatalf("EMF line %v", doc)
	}
	if doc := emit("", deadletter.OutcomeRescheduled); doc["DeliveriesRescheduled"] != float64(1) || doc["DeliveryDeadLetters"] != nil {
		t.Fatalf("rescheduled callback: EMF line %v, want DeliveriesRescheduled=1 and no dead letter", doc)
	}
}
