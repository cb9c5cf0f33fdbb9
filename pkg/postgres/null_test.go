package postgres_test

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
)

func TestNullIfZero(t *testing.T) {
	t.Parallel()
	if postgres.NullIfZero("") != nil || postgres.NullIfZero(0) != nil || postgres.NullIfZero(time.Time{}) != nil {
		t.Fatal("a zero value is not NULL")
	}
	// A zero time read in a location is still unset, though it is not == time.Time{}.
	if postgres.NullIfZero(time.Time{}.In(time.FixedZone("X", 3600))) != nil {
		t.Fatal("a zero time in a location is not NULL")
	}
	if p := postgres.NullIfZero("topic"); p == nil || *p != "topic" {
		t.Fatalf("NullIfZero(topic) = %v", p)
	}
	now := time.Now()
	if p := postgres.NullIfZero(now); p == nil || !p.Equal(now) {
		t.Fatalf("NullIfZero(now) = %v", p)
	}
}
