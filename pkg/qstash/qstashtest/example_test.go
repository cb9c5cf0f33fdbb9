package qstashtest_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	upstash "github.com/upstash/qstash-go"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// The local server stands in for QStash in a test: any client configured with its URL and
// Token publishes to it (here Upstash's own Go client), and it delivers to the destination
// signed with its signing keys, which a receiver checks as it would QStash's.
func ExampleNewServer() {
	qs := qstashtest.NewServer(qstashtest.Options{})
	defer qs.Close()

	verifier, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: qs.CurrentSigningKey, NextSigningKey: qs.NextSigningKey})
	if err != nil {
		log.Fatal(err)
	}
	dst := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		url := "http://" + r.Host + r.URL.RequestURI()
		fmt.Printf("delivered %s, signature ok: %v\n", body, verifier.Verify(r.Header.Get("Upstash-Signature"), url, body) == nil)
	}))
	defer dst.Close()

	client := upstash.NewClientWith(upstash.Options{Url: qs.URL, Token: qs.Token})
	if _, err := client.Publish(upstash.PublishOptions{Url: dst.URL + "/orders", Body: `{"order":"o-1"}`}); err != nil {
		log.Fatal(err)
	}
	if err := qs.WaitIdle(context.Background()); err != nil {
		log.Fatal(err)
	}
	a := qs.Attempts()[0]
	fmt.Println("attempts:", len(qs.Attempts()), "status:", a.Status)
	// Output:
	// delivered {"order":"o-1"}, signature ok: true
	// attempts: 1 status: 200
}
