package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// FuzzLimitsValidate: an event Validate accepts is one Postgres stores (inside a
// transaction that stays usable); an event it rejects gets a *ValidationError naming a
// field, before any statement runs.
func FuzzLimitsValidate(f *testing.F) {
	f.Add("order.created", "order:1", []byte(`{"order_id":"o-1"}`), "X-Correlation-Id", "c-1")
	f.Add("a/b", "k", []byte(`{}`), "", "")
	f.Add("..", "k", []byte(`[]`), "X-A", "v")
	f.Add("a%2Fb", "k\x00", []byte(`"x"`), "Upstash-Retries", "1")
	f.Add("t", strings.Repeat("k", 300), []byte(`{"a":"\u0000"}`), "X-A", "v\r\n")
	f.Add("t", "k", []byte(strings.Repeat("[", 70)+strings.Repeat("]", 70)), "bad name", "v")
	f.Add("t", "k", []byte("\"\xff\""), "X-A", "\xff")
	f.Add("t", "k", []byte(`{"n":1e308,"s":"\u00e9\ud83d\ude00"}`), "X-A", "v")
	db := pgtest.New(f)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, topic, key string, payload []byte, hname, hvalue string) {
		ev := outbox.Event{Topic: topic, PartitionKey: key, Payload: payload}
		if hname != "" {
			ev.Headers = map[string]string{hname: hvalue}
		}
		verr := outbox.Limits{}.Validate(ev)
		if verr != nil {
			var ve *outbox.ValidationError
			if !errors.As(verr, &ve) || ve.Field == "" || ve.Reason == "" {
				t.Fatalf("Validate error %v is not a *ValidationError with a field and reason", verr)
			}
			return
		}
		tx := outboxtest.Begin(t, db.Pool)
		if _, err := outbox.Enqueue(ctx, tx, ev); err != nil {
			t.Fatalf("Validate accepted %+v but Postgres refused it: %v", ev, err)
		}
	})
}

// TestEnqueueRejectsWhatPostgresRejects: a payload that json.Valid accepts but jsonb does
// not must get a *ValidationError like any other invalid payload, and leave the caller's
// transaction usable: an INSERT that failed inside the business transaction would abort it
// (SQLSTATE 22P02 / 22003).
func TestEnqueueRejectsWhatPostgresRejects(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := t.Context()
	for name, payload := range map[string]string{
		"lone surrogate escape": `{"note":"\ud800"}`,
		"number beyond numeric": `{"amount":1e1000000}`,
	} {
		t.Run(name, func(t *testing.T) {
			tx := outboxtest.Begin(t, db.Pool)
			_, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: "order.created", PartitionKey: "k", Payload: json.RawMessage(payload)})
			var ve *outbox.ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, outbox.ErrInvalidPayload) {
				t.Errorf("Enqueue(%s) = %v, want a *ValidationError wrapping ErrInvalidPayload", payload, err)
			}
			var one int
			if err := tx.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
				t.Errorf("the caller's transaction is unusable after the rejected event: %v", err)
			}
		})
	}
}
