package qstash_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// A Publisher sends outbox messages to QStash, one Result per message; a Verifier on the
// consumer's side accepts only what QStash signed. Here QStash is the project's local
// server (production: BaseURL and Token from the Upstash console, the keys from
// QSTASH_CURRENT_SIGNING_KEY and QSTASH_NEXT_SIGNING_KEY).
func ExampleNewPublisher() {
	ctx := context.Background()
	srv := qstashtest.NewServer(qstashtest.Options{})
	defer srv.Close()

	current, next := srv.Keys()
	verifier, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: current, NextSigningKey: next})
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	var received []string
	var consumer *httptest.Server
	consumer = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		// The signature covers the URL QStash was asked to call and the body's bytes.
		if err := verifier.Verify(r.Header.Get("Upstash-Signature"), consumer.URL+r.URL.RequestURI(), body); err != nil {
			http.Error(w, "invalid signature", http.StatusUnauthorized)
			return
		}
		mu.Lock()
		received = append(received, r.URL.Path+" "+string(body))
		mu.Unlock()
	}))
	defer consumer.Close()

	pub, err := qstash.NewPublisher(qstash.PublisherConfig{
		BaseURL:            srv.URL,
		Token:              srv.Token,
		DestinationBaseURL: consumer.URL, // the webhook's public URL
		Ordering:           publish.OrderingFIFO,
	})
	if err != nil {
		log.Fatal(err)
	}
	// The relay passes claimed rows; the id becomes the deduplication id and the message
	// id the consumer dedupes on.
	results := pub.Publish(ctx, []outbox.Message{
		{ID: 1, Topic: "order.created", PartitionKey: "order:o-1", Payload: []byte(`{"order_id":"o-1"}`)},
		{ID: 2, Topic: "order.shipped", PartitionKey: "order:o-1", Payload: []byte(`{"order_id":"o-1"}`)},
	})
	for _, res := range results {
		fmt.Println("accepted:", res.Err == nil && res.MessageID != "")
	}

	if err := srv.WaitIdle(ctx); err != nil {
		log.Fatal(err)
	}
	// In FIFO mode a key's messages are delivered one after the other, in id order.
	for _, r := range received {
		fmt.Println(r)
	}
	// Output:
	// accepted: true
	// accepted: true
	// /events/order.created {"order_id":"o-1"}
	// /events/order.shipped {"order_id":"o-1"}
}

// Verify accepts a signature made with either signing key for exactly this URL and body;
// anything else is ErrBadSignature, and a *VerifyError says why (for logs, never for the
// response: a 401 tells a forger nothing).
func ExampleVerifier_Verify() {
	verifier, err := qstash.NewVerifier(qstash.VerifierConfig{
		CurrentSigningKey: qstash.DevCurrentSigningKey,
		NextSigningKey:    qstash.DevNextSigningKey,
	})
	if err != nil {
		log.Fatal(err)
	}
	const url = "https://hooks.example.com/events/order.created?outbox_id=7&generation=0"
	body := []byte(`{"order_id":"o-7"}`)
	// QStash signs every delivery; during a key rotation it may use the next key.
	sig, err := qstash.Sign(qstash.DevNextSigningKey, url, body, time.Now())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("genuine:", verifier.Verify(sig, url, body))

	err = verifier.Verify(sig, url, []byte(`{"order_id":"o-8"}`))
	var verr *qstash.VerifyError
	if errors.As(err, &verr) {
		fmt.Println("tampered:", errors.Is(err, qstash.ErrBadSignature), verr.Reason)
	}
	// Output:
	// genuine: <nil>
	// tampered: true body_mismatch
}
