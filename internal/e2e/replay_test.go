package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/localstack"
	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// capture records the deliveries that reach the receivers, as a wiretap would.
type capture struct {
	mu   sync.Mutex
	reqs []captured
}

type captured struct {
	target string // path and query
	header http.Header
	body   []byte
}

func (c *capture) front(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		c.mu.Lock()
		c.reqs = append(c.reqs, captured{target: r.URL.RequestURI(), header: r.Header.Clone(), body: body})
		c.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

// TestCapturedDeliveryReplayedWithAlteredHeaders: an event goes relay -> local QStash ->
// webhook and is applied; the delivery captured on the wire is then replayed (inside its
// signature's five minutes) with another X-Outbox-Id, and with the id and generation both
// changed: refused with 401. Replayed unchanged it is a duplicate. The handler's effect
// happened once and no dedupe record exists for any other id. Before the identity came
// from the signed URL, the altered replay applied the event a second time under the new id.
func TestCapturedDeliveryReplayedWithAlteredHeaders(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE effects (message_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	tap := &capture{}
	pl, err := localstack.StartPipeline(ctx, localstack.PipelineConfig{
		Pool: db.Pool,
		Handlers: webhook.Handlers{"order.created": func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, d.MessageID)
			return err
		}},
		QStash:        qstashtest.Options{TimeScale: 0.0001},
		ReceiverFront: tap.front,
		Logger:        quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	rl, err := pl.NewRelay(db.Pool, relay.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	id, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "order:1", Payload: json.RawMessage(`{"order_id":"1"}`)})
	if err != nil {
		t.Fatal(err)
	}
	other, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "order:2", Payload: json.RawMessage(`{"order_id":"2"}`),
		AvailableAt: time.Now().Add(time.Hour)}) // a future event the replay tries to pre-empt
	if err != nil {
		t.Fatal(err)
	}
	if st, err := rl.Drain(ctx); err != nil || st.Dispatched != 1 {
		t.Fatalf("drain %+v %v", st, err)
	}
	if err := pl.QStash.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	tap.mu.Lock()
	reqs := slices.Clone(tap.reqs)
	tap.mu.Unlock()
	if len(reqs) != 1 {
		t.Fatalf("%d deliveries captured, want 1", len(reqs))
	}
	wire := reqs[0]
	if wire.header.Get(receive.HeaderOutboxID) != id.String() || !strings.Contains(wire.target, "outbox_id="+id.String()) {
		t.Fatalf("captured delivery %s forwards X-Outbox-Id %q, want %s in both", wire.target, wire.header.Get(receive.HeaderOutboxID), id)
	}

	replay := func(edit func(http.Header)) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, pl.BaseURL+wire.target, bytes.NewReader(wire.body))
		req.Header = wire.header.Clone()
		edit(req.Header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := replay(func(h http.Header) { h.Set(receive.HeaderOutboxID, other.String()) }); got != http.StatusUnauthorized {
		t.Fatalf("replay under the future event's id: %d, want 401", got)
	}
	if got := replay(func(h http.Header) {
		h.Set(receive.HeaderOutboxID, other.String())
		h.Set(receive.HeaderOutboxGeneration, "3")
	}); got != http.StatusUnauthorized {
		t.Fatalf("replay with id and generation changed: %d, want 401", got)
	}
	if got := replay(func(http.Header) {}); got != http.StatusOK {
		t.Fatalf("unchanged replay: %d, want 200 (a duplicate)", got)
	}

	var effects, records []string
	for q, dst := range map[string]*[]string{`SELECT message_id FROM effects`: &effects, `SELECT message_id FROM processed_messages`: &records} {
		rows, err := db.Pool.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if *dst, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(effects, []string{id.String()}) || !slices.Equal(records, []string{id.String()}) {
		t.Fatalf("effects %v, dedupe records %v; want the event's own id once each", effects, records)
	}
}
