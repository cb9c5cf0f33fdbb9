package webhook_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// TestSupersededGenerationAcknowledged: with SharesOutbox, a delivery of a generation the
// outbox row has left behind (the event is back in the outbox after a consumer outage and
// comes again) is answered 200 superseded and not applied; the current generation is
// applied. Without SharesOutbox the webhook does not look.
func TestSupersededGenerationAcknowledged(t *testing.T) {
	t.Parallel()
	for _, shares := range []bool{true, false} {
		f := newFixture(t, func(c *webhook.Config) { c.SharesOutbox = shares })
		id, err := outbox.Enqueue(t.Context(), f.db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "k", Payload: json.RawMessage(order("o-1"))})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.db.Pool.Exec(t.Context(), `UPDATE outbox SET generation = 2 WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		deliver := func(gen int) *http.Request {
			r := signedRequest(t, "/events/order.created?outbox_id="+id.String()+"&generation="+strconv.Itoa(gen), "", order("o-1"))
			return r
		}
		w := f.serve(deliver(1))
		if shares {
			if w.Code != http.StatusOK || !contains(w.Body.String(), "superseded") {
				t.Fatalf("old generation: %d %s, want 200 superseded", w.Code, w.Body)
			}
			f.assertNothingWritten(t)
			w = f.serve(deliver(2))
		}
		if w.Code != http.StatusOK || !contains(w.Body.String(), "processed") {
			t.Fatalf("shares %v: %d %s, want processed", shares, w.Code, w.Body)
		}
	}
}
