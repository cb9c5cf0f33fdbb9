package health_test

import (
	"context"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/health"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

func TestCollectAttempts(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// Processed: this hour first try, third try, unknown; 3 hours ago second try; 2 days
	// ago (outside both windows).
	exec(t, db, `INSERT INTO processed_messages (consumer, message_id, retried, processed_at) VALUES
		('webhook', 'a', 0, now() - interval '1 minute'),
		('webhook', 'b', 2, now() - interval '10 minutes'),
		('webhook', 'c', NULL, now() - interval '59 minutes'),
		('webhook', 'd', 1, now() - interval '3 hours'),
		('webhook', 'e', 5, now() - interval '2 days')`)
	// Given up by QStash: this hour after 3 retries; 5 hours ago unknown; a relay letter
	// (never delivered, not a QStash attempt); 2 days ago.
	exec(t, db, `INSERT INTO dead_letters (source, error, attempts, created_at) VALUES
		('delivery', 'x', 3, now() - interval '5 minutes'),
		('delivery', 'x', NULL, now() - interval '5 hours'),
		('relay', 'x', 12, now() - interval '5 minutes'),
		('delivery', 'x', 3, now() - interval '2 days')`)
	r, err := health.CollectAttempts(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	hour := health.Attempts{Delivered: 3, DeliveryAttempts: 5, UnknownAttempts: 1, DeadLettered: 1, DeadLetterAttempts: 4, Total: 9, PerDelivered: 3}
	day := health.Attempts{Delivered: 4, DeliveryAttempts: 7, UnknownAttempts: 1, DeadLettered: 2, DeadLetterAttempts: 5, Total: 12, PerDelivered: 3}
	if r.LastHour != hour || r.LastDay != day {
		t.Fatalf("got %+v\nwant hour %+v day %+v", r, hour, day)
	}

	empty := pgtest.New(t)
	r, err = health.CollectAttempts(context.Background(), empty.Pool)
	if err != nil || r != (health.AttemptsReport{}) {
		t.Fatalf("empty: %+v %v", r, err)
	}
}
