package origin_test

import (
	"context"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/origin"
)

func TestOrigin(t *testing.T) {
	t.Parallel()
	if o, ok := origin.FromContext(context.Background()); ok || o != "" {
		t.Fatalf("empty context: got (%q, %v)", o, ok)
	}
	if _, ok := origin.FromContext(origin.NewContext(context.Background(), "")); ok {
		t.Fatal("empty origin reported as present")
	}
	ctx := origin.NewContext(context.Background(), "https://x.example")
	if o, ok := origin.FromContext(ctx); !ok || o != "https://x.example" {
		t.Fatalf("got (%q, %v)", o, ok)
	}
}
