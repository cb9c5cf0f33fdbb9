package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// visibleWaker records, at each Kick, how many events another session sees: a kick
// before the commit would see none.
type visibleWaker struct {
	t    *testing.T
	db   *pgtest.DB
	seen []int
}

func (w *visibleWaker) Kick() {
	w.seen = append(w.seen, w.db.Count(w.t, `SELECT count(*) FROM outbox`))
}

func enqueueIn(tx pgx.Tx) error {
	_, err := outbox.Enqueue(context.Background(), tx, outbox.Event{Topic: "order.created", PartitionKey: "k", Payload: []byte(`{}`)})
	return err
}

func TestBeginFuncKicksAfterTheCommit(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := &visibleWaker{t: t, db: db}
	if err := outbox.BeginFunc(t.Context(), db.Pool, w, enqueueIn); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("business rule")
	err := outbox.BeginFunc(t.Context(), db.Pool, w, func(tx pgx.Tx) error {
		if err := enqueueIn(tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if len(w.seen) != 1 || w.seen[0] != 1 {
		t.Fatalf("kicks saw %v events, want one kick seeing the committed event", w.seen)
	}
	if err := outbox.BeginFunc(t.Context(), db.Pool, nil, enqueueIn); err != nil {
		t.Fatalf("nil waker: %v", err)
	}
}
