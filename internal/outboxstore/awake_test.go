package outboxstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// A promise's end is the database's clock: EndPromise says how long it still runs, so the
// relay's last claim starts after it; KeepPromise never moves it earlier; without
// migration 0022 every call says so with ErrNoPromises.
func TestPromiseEndsWhenItSaid(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := outboxstore.NewStore(db.Pool)
	token, err := s.Promise(t.Context(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.KeepPromise(t.Context(), token, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	left, err := s.EndPromise(t.Context(), token)
	if err != nil || left < 1500*time.Millisecond || left > 2*time.Second {
		t.Fatalf("EndPromise: %v %v, want most of the 2 s still to run", left, err)
	}
	if left, err := s.EndPromise(t.Context(), token); err != nil || left != 0 {
		t.Fatalf("EndPromise again: %v %v, want 0 (gone)", left, err)
	}

	if _, err := db.Pool.Exec(t.Context(), `DROP TABLE outbox_relay_awake`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Promise(t.Context(), time.Second); !errors.Is(err, outboxstore.ErrNoPromises) {
		t.Fatalf("Promise without 0022: %v, want ErrNoPromises", err)
	}
}
