package deadletter_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"

	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// A dead letter waits in dead_letters until someone fixes its cause and redrives it.
// Here the relay dead-letters an event whose payload is over the configured QStash
// message size (a permanent failure); the operator lists the letters, raises the limit
// and redrives them: their outbox rows are pending again, under a new deduplication id,
// and the next drain publishes them. outboxctl dlq list and outboxctl dlq redrive do the
// same from a shell.
func ExampleRedrive() {
	ctx := context.Background()
	db := pgtest.MustOpen(ctx)
	defer db.Close()
	// Deliveries are held: this example is about the relay's side only.
	qs := qstashtest.NewServer(qstashtest.Options{HoldDeliveries: true})
	defer qs.Close()
	drain := func(maxMessageBytes int64) relay.Stats {
		pub, err := qstash.NewPublisher(qstash.PublisherConfig{
			BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: "http://127.0.0.1:8081",
			MaxMessageBytes: maxMessageBytes,
		})
		if err != nil {
			log.Fatal(err)
		}
		r, err := relay.New(db.Pool, pub, relay.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			log.Fatal(err)
		}
		st, err := r.Drain(ctx)
		if err != nil {
			log.Fatal(err)
		}
		return st
	}

	payload := `{"report":"` + strings.Repeat("x", 200) + `"}`
	if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: "report.ready", PartitionKey: "report:r-1", Payload: []byte(payload)}); err != nil {
		log.Fatal(err)
	}
	fmt.Println("dead-lettered:", drain(100).DeadLettered)

	letters, err := deadletter.List(ctx, db.Pool, deadletter.Filter{Topic: "report.ready"})
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range letters {
		fmt.Println(l.Source, l.Topic, strings.Contains(l.Error, "over the 100-byte QStash message limit"))
	}

	// The cause is fixed (the default limit is the plan's); put the letters back.
	res, err := deadletter.Redrive(ctx, db.Pool, deadletter.Filter{Topic: "report.ready"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("redriven:", len(res.Redriven))
	fmt.Println("dispatched:", drain(0).Dispatched)

	open, err := deadletter.List(ctx, db.Pool, deadletter.Filter{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("open letters:", len(open))
	// Output:
	// dead-lettered: 1
	// relay report.ready true
	// redriven: 1
	// dispatched: 1
	// open letters: 0
}
