package relay_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http/httptest"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// Outside Lambda, a long-lived process runs the relay with Run until it is told to stop:
// it drains what is pending, then sleeps until a producer's commit wakes it (LISTEN), and
// on stop finishes the batch in flight. Here the database is a fresh schema of
// DATABASE_URL's server, QStash the project's local server and the consumer a
// webhook.Handler on the same database.
func ExampleRelay_Run() {
	ctx := context.Background()
	db := pgtest.MustOpen(ctx)
	defer db.Close()
	qs := qstashtest.NewServer(qstashtest.Options{})
	defer qs.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// The consumer: it records each order id and says when all three have arrived.
	var mu sync.Mutex
	var got []string
	done := make(chan struct{})
	current, next := qs.Keys()
	verifier, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: current, NextSigningKey: next})
	if err != nil {
		log.Fatal(err)
	}
	consumer := httptest.NewUnstartedServer(nil)
	h, err := webhook.New(webhook.Config{
		Pool:     db.Pool,
		Verifier: verifier,
		Handlers: webhook.Handlers{"order.created": func(_ context.Context, _ pgx.Tx, d webhook.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			if got = append(got, string(d.Payload)); len(got) == 3 {
				close(done)
			}
			return nil
		}},
		PublicBaseURL: "http://" + consumer.Listener.Addr().String(),
		Logger:        quiet,
	})
	if err != nil {
		log.Fatal(err)
	}
	consumer.Config.Handler = h
	consumer.Start()
	defer consumer.Close()

	// The producer's events, one partition key: delivered in this order.
	for _, id := range []string{"o-1", "o-2", "o-3"} {
		ev := outbox.Event{Topic: "order.created", PartitionKey: "customer:c-9", Payload: []byte(`{"order_id":"` + id + `"}`)}
		if _, err := outbox.Enqueue(ctx, db.Pool, ev); err != nil {
			log.Fatal(err)
		}
	}

	pub, err := qstash.NewPublisher(qstash.PublisherConfig{
		BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: consumer.URL, Ordering: publish.OrderingFIFO,
	})
	if err != nil {
		log.Fatal(err)
	}
	r, err := relay.New(db.Pool, pub, relay.Config{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	stop, shutdown := context.WithCancel(ctx) // e.g. signal.NotifyContext(ctx, os.Interrupt)
	go func() {
		<-done
		shutdown()
	}()
	stats, err := r.Run(stop)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("dispatched:", stats.Dispatched)
	for _, p := range got {
		fmt.Println(p)
	}
	// Output:
	// dispatched: 3
	// {"order_id": "o-1"}
	// {"order_id": "o-2"}
	// {"order_id": "o-3"}
}
