package webhook_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// TestNotNowAnswersRetryAfter: a delivery the webhook cannot apply now, for a reason it
// knows, is answered 503 with Retry-After (QStash's wait instead of its own backoff), and
// nothing is written: a handler that says Later, a handler over its budget (answered
// before the request's own deadline, not cut off by it), the webhook's database
// unreachable. Any other error stays a plain 500 without Retry-After.
func TestNotNowAnswersRetryAfter(t *testing.T) {
	t.Parallel()
	var sawDeadline time.Duration
	handler := func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		switch d.MessageID {
		case "1":
			return webhook.Later(90*time.Second+time.Millisecond, errors.New("payments API in maintenance"))
		case "2", "3":
			dl, _ := ctx.Deadline()
			sawDeadline = time.Until(dl)
			<-ctx.Done() // a handler stuck on a slow dependency, honouring ctx
			return ctx.Err()
		default:
			return errors.New("boom")
		}
	}
	f := newFixture(t, func(c *webhook.Config) {
		c.Handlers = webhook.Handlers{"order.created": handler}
		c.HandlerTimeout = 100 * time.Millisecond
	})
	cases := []struct {
		id         string
		status     int
		retryAfter string
		code       string
	}{
		{"1", http.StatusServiceUnavailable, "91", "later"},
		{"2", http.StatusServiceUnavailable, "30", "handler_timeout"},
		{"4", http.StatusInternalServerError, "", "transient_error"},
	}
	for _, c := range cases {
		w := f.serve(delivery(t, "/events/order.created", c.id, order("o-"+c.id)))
		if w.Code != c.status || w.Header().Get("Retry-After") != c.retryAfter || !contains(w.Body.String(), c.code) {
			t.Fatalf("delivery %s: %d Retry-After %q %s; want %d %q %s", c.id, w.Code, w.Header().Get("Retry-After"), w.Body, c.status, c.retryAfter, c.code)
		}
	}
	f.assertNothingWritten(t)

	// A request deadline closer than HandlerTimeout (a Lambda near its end): the budget
	// ends AnswerMargin before it, and the answer comes before the deadline.
	long := newFixture(t, func(c *webhook.Config) {
		c.Handlers = webhook.Handlers{"order.created": handler}
		c.HandlerTimeout = time.Hour
	})
	const budget = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), webhook.AnswerMargin+budget)
	defer cancel()
	start := time.Now()
	w := long.serve(delivery(t, "/events/order.created", "3", order("o-3")).WithContext(ctx))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "30" || !contains(w.Body.String(), "handler_timeout") {
		t.Fatalf("near the deadline: %d Retry-After %q %s", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	if sawDeadline > budget || ctx.Err() != nil {
		t.Fatalf("the handler's budget was %v (want at most %v) and the answer took %v, past the request's deadline",
			sawDeadline, budget, time.Since(start))
	}
	long.assertNothingWritten(t)
}

// TestDatabaseUnreachableAnswersRetryAfter: the webhook's own database refusing
// connections is an outage of the consumer: 503 with Retry-After.
func TestDatabaseUnreachableAnswersRetryAfter(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	f := newFixture(t, func(c *webhook.Config) { c.Pool = pool })
	w := f.serve(delivery(t, "/events/order.created", "7", order("o-7")))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "30" || !contains(w.Body.String(), "database_unavailable") {
		t.Fatalf("database down: %d Retry-After %q %s", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
}
