package webhook_test

import (
	"errors"
	"testing"

	"github.com/outbox-relay/outbox-relay/pkg/webhook"
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
}
