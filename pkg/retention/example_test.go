package retention_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/retention"
)

// Retention deletes what the relay has finished with once it is older than the outbox
// retention, and never a pending row. Here three events are published and one more is
// left pending; eight days later (Config.Now, so the example need not wait) Plan says what
// a run would delete and Run deletes it, in batches. The relay Lambda runs it daily (its
// {"task":"retention"} schedule); outboxctl retention runs it from a shell.
func ExampleRun() {
	ctx := context.Background()
	db := pgtest.MustOpen(ctx)
	defer db.Close()
	// Any queue will do for this example: one that accepts every message.
	accept := relay.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []publish.Result {
		return make([]publish.Result, len(msgs))
	})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := relay.New(db.Pool, accept, relay.Config{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	enqueue := func(key string) {
		if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: "order.created", PartitionKey: key, Payload: []byte(`{}`)}); err != nil {
			log.Fatal(err)
		}
	}
	for _, key := range []string{"order:1", "order:2", "order:3"} {
		enqueue(key)
	}
	st, err := r.Drain(ctx)
	if err != nil {
		log.Fatal(err)
	}
	enqueue("order:4") // written after the drain: still pending
	fmt.Println("dispatched:", st.Dispatched)

	weekLater := time.Now().Add(8 * 24 * time.Hour)
	cfg := retention.Config{Now: func() time.Time { return weekLater }, Logger: quiet}
	plan, err := retention.Plan(ctx, db.Pool, cfg)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("would delete:", plan.OutboxDeleted)
	res, err := retention.Run(ctx, db.Pool, cfg)
	if err != nil {
		log.Fatal(err)
	}
	var left int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left); err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted:", res.OutboxDeleted, "complete:", res.Complete, "rows left:", left)
	// Output:
	// dispatched: 3
	// would delete: 3
	// deleted: 3 complete: true rows left: 1
}
