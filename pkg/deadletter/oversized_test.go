package deadletter_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/localqstash"
	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// TestOversizedDeliveryNotRetried runs an event whose body is over the webhook's limit
// through the local QStash server with a retry budget of 3: the webhook answers 489 +
// Upstash-NonRetryable-Error, so QStash gives up after the one attempt, the failure
// callback records the dead letter and marks the row, and the handler never runs. The
// control destination answers 413 with the same header: QStash documents only 489 as
// "do not retry", and the local server retries it the full budget, as production would.
func TestOversizedDeliveryNotRetried(t *testing.T) {
	t.Parallel()
	db, qs, _ := syncSetup(t)
	ctx := context.Background()

	var handled atomic.Int64
	srv := httptest.NewUnstartedServer(nil)
	base := "http://" + srv.Listener.Addr().String()
	wh, err := webhook.New(webhook.Config{
		Pool: db.Pool, Verifier: verifier(t), PublicBaseURL: base, MaxBodyBytes: 1024, Logger: quiet(),
		Handlers: webhook.Handlers{"order.created": func(context.Context, pgx.Tx, webhook.Delivery) error {
			handled.Add(1)
			return nil
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/events/", wh)
	mux.Handle("/failure", newCallbackHandler(t, db, func(c *deadletter.CallbackConfig) { c.FailureURL = base + "/failure" }))
	srv.Config.Handler = mux
	srv.Start()
	t.Cleanup(srv.Close)
	var tooLarge413 atomic.Int64
	control := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tooLarge413.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set(receive.HeaderNonRetryable, "true")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
	}))
	t.Cleanup(control.Close)

	payload := `{"order_id":"o-big","pad":"` + strings.Repeat("x", 2048) + `"}`
	big := enqueue(t, db, "order.created", "order:big", payload)
	other := enqueue(t, db, "order.created", "order:other", payload)
	cfg := qstash.PublisherConfig{BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: base, FailureCallbackURL: base + "/failure", Retries: 3}
	publishRows(t, db, cfg, []int64{big})
	cfg.DestinationBaseURL, cfg.FailureCallbackURL = control.URL, ""
	publishRows(t, db, cfg, []int64{other})
	localqstash.WaitIdle(t, qs)

	var deliveries, callbacks []int
	for _, a := range qs.Attempts() {
		switch {
		case a.FailureCallback:
			callbacks = append(callbacks, a.Status)
		case strings.HasPrefix(a.URL, base):
			deliveries = append(deliveries, a.Status)
		}
	}
	if len(deliveries) != 1 || deliveries[0] != receive.StatusNonRetryable || handled.Load() != 0 {
		t.Fatalf("deliveries to the webhook answered %v, handler ran %d times; want one 489 and no handler", deliveries, handled.Load())
	}
	if len(callbacks) != 1 || callbacks[0] != http.StatusOK {
		t.Fatalf("failure callbacks answered %v, want one 200", callbacks)
	}
	if n := tooLarge413.Load(); n != 4 {
		t.Fatalf("the 413 destination got %d attempts, want 4 (1 + 3 retries: QStash retries a 413)", n)
	}
	ls, err := deadletter.List(ctx, db.Pool, deadletter.Filter{})
	if err != nil || len(ls) != 1 || ls[0].OutboxID != outbox.ID(big) || ls[0].StatusCode != receive.StatusNonRetryable || ls[0].Attempts != 0 {
		t.Fatalf("letters %+v %v; want one for row %d, status 489, after 0 retries", ls, err, big)
	}
	if !readOutbox(t, db, big).dead {
		t.Fatal("oversized event's row not dead-lettered")
	}
	if n := db.Count(t, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("%d processed messages after an oversized delivery", n)
	}
}
