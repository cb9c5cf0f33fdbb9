package qstash_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// TestPublisherGarbageChangesNothing: QStash (or a proxy) answering 200 with a truncated
// JSON array or an empty body: every message is retried, none is marked dispatched or
// dead-lettered. (HTML, wrong array length, item errors and status classes: pkg/qstash
// TestPublishErrorClasses, at the Publisher level.)
func TestPublisherGarbageChangesNothing(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{
		"truncated JSON": `[{"messageId":"msg_1"},{"messageId":"ms`,
		"empty body":     ``,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, body)
			}))
			t.Cleanup(fake.Close)
			pub, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: fake.URL, Token: "t", DestinationBaseURL: "https://hooks.example.com"})
			if err != nil {
				t.Fatal(err)
			}
			outboxtest.Enqueue(t, db.Pool, outboxtest.Orders(0, 10, outboxtest.Mod(10)))
			r, err := relay.New(db.Pool, pub, relay.Config{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			st, err := r.Drain(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var dispatched, dead, retried int
			if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE dispatched_at IS NOT NULL),
				count(*) FILTER (WHERE dead_lettered_at IS NOT NULL),
				count(*) FILTER (WHERE last_error LIKE '%unexpected qstash batch response%' AND available_at > now())
				FROM outbox`).Scan(&dispatched, &dead, &retried); err != nil {
				t.Fatal(err)
			}
			if dispatched != 0 || dead != 0 || retried != 10 || st.Retried != 10 {
				t.Fatalf("after a %s: %d dispatched, %d dead, %d scheduled for retry (stats %+v), want 0, 0, 10", name, dispatched, dead, retried, st)
			}
		})
	}
}
