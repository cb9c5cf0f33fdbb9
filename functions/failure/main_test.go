package main

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck/configchecktest"
	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/v3/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/v3/internal/receiverfunc/receivertest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
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

// TestListenAddrNeedsFailureCallbackURL: served over net/http (LISTEN_ADDR) the failure
// function has no Function URL event to take the signed URL's origin from, so its cold
// start fails naming the URL instead of answering every callback 500; as a Function URL it
// starts without one.
func TestListenAddrNeedsFailureCallbackURL(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	v, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: qstash.DevCurrentSigningKey, NextSigningKey: qstash.DevNextSigningKey})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	local := receiverfunc.Config{ReceiverConfig: envconfig.ReceiverConfig{ListenAddr: "127.0.0.1:0"}}
	_, err = receiver.Build(local, db.Pool, v, quiet)
	configchecktest.RequireFields(t, err, "failure callback", "FailureURL")
	if !strings.Contains(err.Error(), "FAILURE_CALLBACK_URL") {
		t.Errorf("the error does not name the variable: %v", err)
	}
	local.PublicURL = "http://127.0.0.1:8082/failure"
	if _, err := receiver.Build(local, db.Pool, v, quiet); err != nil {
		t.Fatalf("LISTEN_ADDR with FAILURE_CALLBACK_URL: %v", err)
	}
	if _, err := receiver.Build(receiverfunc.Config{}, db.Pool, v, quiet); err != nil {
		t.Fatalf("as a Function URL without FAILURE_CALLBACK_URL: %v", err)
	}
}
