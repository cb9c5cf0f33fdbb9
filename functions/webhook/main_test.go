package main

import (
	"log/slog"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck/configchecktest"
	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/v3/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// TestListenAddrNeedsPublicBaseURL: served over net/http (LISTEN_ADDR) the webhook has no
// Function URL event to take the signed URL's origin from, so its cold start fails naming
// PUBLIC_BASE_URL instead of answering every delivery 500; as a Function URL it starts
// without one.
func TestListenAddrNeedsPublicBaseURL(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	v, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: qstash.DevCurrentSigningKey, NextSigningKey: qstash.DevNextSigningKey})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	local := receiverfunc.Config{ReceiverConfig: envconfig.ReceiverConfig{ListenAddr: "127.0.0.1:0"}}
	_, err = receiver.Build(local, db.Pool, v, quiet)
	configchecktest.RequireFields(t, err, "webhook", "PublicBaseURL")
	local.PublicURL = "http://127.0.0.1:8081"
	if _, err := receiver.Build(local, db.Pool, v, quiet); err != nil {
		t.Fatalf("LISTEN_ADDR with PUBLIC_BASE_URL: %v", err)
	}
	if _, err := receiver.Build(receiverfunc.Config{}, db.Pool, v, quiet); err != nil {
		t.Fatalf("as a Function URL without PUBLIC_BASE_URL: %v", err)
	}
}
