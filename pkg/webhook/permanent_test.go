package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

func TestPermanentMarker(t *testing.T) {
	t.Parallel()
	base := errors.New("x")
	if webhook.Permanent(nil) != nil {
		t.Fatal("Permanent(nil) != nil")
	}
	p := webhook.Permanent(base)
	if !webhook.IsPermanent(p) || !errors.Is(p, base) || webhook.IsPermanent(base) {
		t.Fatal("Permanent marker broken")
	}
	if !webhook.IsPermanent(errors.Join(errors.New("y"), p)) {
		t.Fatal("wrapped permanent error not detected")
	}
	// One marker: what a handler marks, the relay reads as permanent, and the reverse.
	if !publish.IsPermanent(p) || !webhook.IsPermanent(publish.Permanent(base)) {
		t.Fatal("webhook and publish disagree on what is permanent")
	}
}

// TestPermanentReasonInBody: a Permanent handler error's text is the 489's "message", on one
// line and bounded; a transient error's text never leaves the service.
func TestPermanentReasonInBody(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", webhook.MaxReasonBytes)
	f := newFixture(t, func(c *webhook.Config) {
		c.Handlers = webhook.Handlers{"order.created": func(_ context.Context, _ pgx.Tx, d webhook.Delivery) error {
			switch d.MessageID {
			case "1":
				return fmt.Errorf("charge order: %w", webhook.Permanent(errors.New("amount_cents 0\nis not positive")))
			case "2":
				return webhook.Permanent(errors.New(long))
			default:
				return errors.New("password=hunter2 refused by the database")
			}
		}}
	})
	reply := func(id string) (int, map[string]string) {
		w := f.serve(delivery(t, orderPath, id, order("o-"+id)))
		var body map[string]string
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("delivery %s: body %q: %v", id, w.Body, err)
		}
		return w.Code, body
	}
	// The handler's own error, wrapping included, not the inbox's wrapping of it.
	if code, body := reply("1"); code != webhook.StatusNonRetryable || body["error"] != "rejected" || body["message"] != "charge order: amount_cents 0 is not positive" {
		t.Fatalf("permanent: %d %v", code, body)
	}
	if code, body := reply("2"); code != webhook.StatusNonRetryable || len(body["message"]) > webhook.MaxReasonBytes ||
		!strings.HasPrefix(long, strings.TrimSuffix(body["message"], "…")) || !utf8.ValidString(body["message"]) {
		t.Fatalf("long permanent: %d %d bytes %q", code, len(body["message"]), body["message"])
	}
	if code, body := reply("3"); code != http.StatusInternalServerError || len(body) != 1 || body["error"] != "transient_error" {
		t.Fatalf("transient: %d %v", code, body)
	}
}
