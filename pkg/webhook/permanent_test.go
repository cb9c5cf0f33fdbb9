package webhook_test

import (
	"errors"
	"testing"

	"github.com/outbox-relay/outbox-relay/v2/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v2/pkg/webhook"
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
