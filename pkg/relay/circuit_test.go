package relay_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// circuitRig is a relay over a fake queue that remembers which messages went out as
// probes, and the failure callback's reopen, as QStash would call it.
type circuitRig struct {
	t      *testing.T
	db     *pgtest.DB
	pub    *fakePublisher
	relay  *relay.Relay
	probes []outbox.ID
	log    logtest.Buffer
}

func newCircuitRig(t *testing.T) *circuitRig {
	rig := &circuitRig{t: t, db: pgtest.New(t), pub: &fakePublisher{}}
	rig.pub.before = func(_ context.Context, msgs []outbox.Message) {
		for _, m := range msgs {
			if m.Probe {
				rig.probes = append(rig.probes, m.ID)
			}
		}
	}
	rig.relay = newRelay(t, rig.db, rig.pub, relay.Config{Logger: slog.New(slog.NewTextHandler(&rig.log, nil))})
	return rig
}

func (rig *circuitRig) enqueue(topic, key string) outbox.ID {
	rig.t.Helper()
	return outboxtest.Enqueue(rig.t, rig.db.Pool, []outbox.Event{{Topic: topic, PartitionKey: key, Payload: json.RawMessage(`{"n":1}`)}})[0]
}

// drain runs one drain with a fresh view of the circuits and returns the ids it published.
func (rig *circuitRig) drain() []outbox.ID {
	rig.t.Helper()
	before := len(rig.pub.records())
	rig.relay.ForgetCircuits()
	if _, err := rig.relay.Drain(context.Background()); err != nil {
		rig.t.Fatal(err)
	}
	var ids []outbox.ID
	for _, r := range rig.pub.records()[before:] {
		ids = append(ids, r.id)
	}
	return ids
}

// failTransiently is the failure callback of id's current delivery after QStash's last
// retry with no answer (a timeout): the event is reopened and its topic's circuit opened.
func (rig *circuitRig) failTransiently(id outbox.ID) {
	rig.t.Helper()
	var gen int
	if err := rig.db.Pool.QueryRow(context.Background(), `SELECT generation FROM outbox WHERE id = $1`, id).Scan(&gen); err != nil {
		rig.t.Fatal(err)
	}
	re, err := deadletter.Reopen(context.Background(), rig.db.Pool, deadletter.DeliveryFailure{
		QStashMessageID: "msg-" + id.String(), OutboxID: id, Generation: &gen, Status: 0, Retried: 3, MaxRetries: 3},
		deadletter.ProbeSchedule{})
	if err != nil || re.State != deadletter.ReopenDone {
		rig.t.Fatalf("reopen %d: %+v %v", id, re, err)
	}
}

// dueNow moves the clock of the circuits and of the held rows: the next probe is due
// and the held rows' wait is over.
func (rig *circuitRig) dueNow() {
	rig.t.Helper()
	rig.exec(`UPDATE outbox_circuits SET probe_at = now()`)
	rig.exec(`UPDATE outbox SET available_at = now() WHERE last_error = $1`, outboxstore.HeldError)
}

func (rig *circuitRig) exec(sql string, args ...any) {
	rig.t.Helper()
	if _, err := rig.db.Pool.Exec(context.Background(), sql, args...); err != nil {
		rig.t.Fatal(err)
	}
}

func (rig *circuitRig) circuit(topic string) (open bool, probeID *int64, probeIn time.Duration) {
	rig.t.Helper()
	var secs float64
	err := rig.db.Pool.QueryRow(context.Background(),
		`SELECT probe_id, extract(epoch FROM probe_at - now()) FROM outbox_circuits WHERE topic = $1`, topic).Scan(&probeID, &secs)
	if err != nil {
		return false, nil, 0
	}
	return true, probeID, time.Duration(secs * float64(time.Second))
}

// TestCircuitOpenProbeClose: an outage reported by the failure callback opens the topic's
// circuit. The relay then holds the topic's events in the outbox, and every later event
// of their keys, whatever its topic, with no attempt spent; other topics and keys flow.
// When the probe is due one event goes out as the probe (one QStash attempt); a failed
// probe frees the slot and doubles the wait; a delivered probe (the consumer's commit in
// processed_messages) closes the circuit and wakes every held event, which go out in key
// order.
func TestCircuitOpenProbeClose(t *testing.T) {
	t.Parallel()
	rig := newCircuitRig(t)
	const down, up = "order.created", "order.paid"
	e1 := rig.enqueue(down, "k1")
	if got := rig.drain(); !slices.Equal(got, []outbox.ID{e1}) {
		t.Fatalf("published %v, want [%d]", got, e1)
	}
	rig.failTransiently(e1)
	if open, _, in := rig.circuit(down); !open || in <= 0 || in > deadletter.CircuitProbeWait {
		t.Fatalf("circuit after the outage's first failure: open %v, probe in %v", open, in)
	}
	e2 := rig.enqueue(down, "k2")
	e3 := rig.enqueue(up, "k1") // behind e1 on its key
	e4 := rig.enqueue(up, "k3")

	if got := rig.drain(); !slices.Equal(got, []outbox.ID{e4}) {
		t.Fatalf("published %v while %s is down, want only [%d]", got, down, e4)
	}
	for _, id := range []outbox.ID{e1, e2, e3} {
		var attempts int
		var lastError string
		var later bool
		if err := rig.db.Pool.QueryRow(context.Background(), `SELECT attempts, last_error, available_at > now() FROM outbox
			WHERE id = $1 AND dispatched_at IS NULL AND dead_lettered_at IS NULL`, id).Scan(&attempts, &lastError, &later); err != nil {
			t.Fatalf("row %d not pending: %v", id, err)
		}
		if attempts != 0 || lastError != outboxstore.HeldError || !later {
			t.Fatalf("held row %d: attempts %d, last_error %q, available later %v", id, attempts, lastError, later)
		}
	}

	// The probe: the oldest held event of the topic, alone; its key's later event waits.
	rig.dueNow()
	if got := rig.drain(); !slices.Equal(got, []outbox.ID{e1}) || !slices.Equal(rig.probes, []outbox.ID{e1}) {
		t.Fatalf("published %v, probes %v; want the probe [%d] only", got, rig.probes, e1)
	}
	if _, probe, _ := rig.circuit(down); probe == nil || outbox.ID(*probe) != e1 {
		t.Fatalf("probe slot %v, want %d", probe, e1)
	}
	rig.dueNow()
	if got := rig.drain(); len(got) != 0 {
		t.Fatalf("published %v with a probe in flight", got)
	}

	// The probe fails (one attempt, then the callback): slot free, the wait doubled.
	rig.failTransiently(e1)
	if open, probe, in := rig.circuit(down); !open || probe != nil || in <= deadletter.CircuitProbeWait {
		t.Fatalf("after a failed probe: open %v, probe %v, next in %v (want more than %v)", open, probe, in, deadletter.CircuitProbeWait)
	}
	rig.dueNow()
	if got := rig.drain(); !slices.Equal(got, []outbox.ID{e1}) {
		t.Fatalf("second probe published %v, want [%d]", got, e1)
	}

	// The consumer is back: it commits the probe; the circuit closes and the held events go.
	rig.exec(`INSERT INTO processed_messages (consumer, message_id) VALUES ('webhook', $1)`, e1.String())
	if got := rig.drain(); !slices.Equal(got, []outbox.ID{e2, e3}) {
		t.Fatalf("after the probe was delivered published %v, want [%d %d]", got, e2, e3)
	}
	if open, _, _ := rig.circuit(down); open {
		t.Fatal("circuit still open after its probe was delivered")
	}
	if log := rig.log.String(); !strings.Contains(log, `consumer circuit closed`) || !strings.Contains(log, `why="probe applied by its consumer"`) {
		t.Fatalf("the close is not logged with what told it the probe was delivered:\n%s", log)
	}
	var attempts int
	if err := rig.db.Pool.QueryRow(context.Background(), `SELECT max(attempts) FROM outbox WHERE id = ANY($1)`, []outbox.ID{e2, e3}).Scan(&attempts); err != nil || attempts != 1 {
		t.Fatalf("held events went out on attempt %d (%v), want 1: holding spends none", attempts, err)
	}
}

// TestCircuitProbePutBackTellsNothing: a probe whose row is put back under a new
// generation with no outcome of its own did not reach the consumer: in fifo mode, put
// back behind an earlier event of its key whose failure came in after the probe was
// chosen (its delivery was still queued), or by the webhook for the same reason. The
// circuit stays open, the held events stay held, and the slot is free for another probe.
// Before, the relay took the new generation for a redrive, closed the circuit, and
// published the held backlog into the outage (the outage scenario's fifo runs).
func TestCircuitProbePutBackTellsNothing(t *testing.T) {
	t.Parallel()
	rig := newCircuitRig(t)
	const down = "order.created"
	e1 := rig.enqueue(down, "k1")
	rig.drain()
	rig.failTransiently(e1)
	e2 := rig.enqueue(down, "k2")
	rig.dueNow()
	if got := rig.drain(); !slices.Equal(got, []outbox.ID{e1}) {
		t.Fatalf("published %v, want the probe [%d]", got, e1)
	}
	// As the webhook's put-back (or the reopen of an earlier event of k1) leaves it.
	rig.exec(`UPDATE outbox SET dispatched_at = NULL, attempts = 0, available_at = clock_timestamp(), lease_token = NULL,
		locked_until = NULL, generation = generation + 1 WHERE id = $1`, e1)
	got := rig.drain()
	if open, _, _ := rig.circuit(down); !open || slices.Contains(got, e2) || strings.Contains(rig.log.String(), "consumer circuit closed") {
		t.Fatalf("after the probe was put back: circuit open %v, published %v (held %d among them?); want it open, %d held:\n%s",
			open, got, e2, e2, rig.log.String())
	}
	var probeGen *int
	if err := rig.db.Pool.QueryRow(context.Background(), `SELECT probe_generation FROM outbox_circuits WHERE topic = $1`, down).Scan(&probeGen); err != nil {
		t.Fatal(err)
	}
	if probeGen != nil && *probeGen == 0 {
		t.Fatal("the slot still holds the probe's old generation: no other probe can go")
	}
}

// TestCircuitBeforeMigration0018: a relay on a schema without the circuit table (binaries
// rolled out before `migrate up`) drains as before.
func TestCircuitBeforeMigration0018(t *testing.T) {
	t.Parallel()
	rig := newCircuitRig(t)
	rig.exec(`DROP TABLE outbox_circuits`)
	ids := []outbox.ID{rig.enqueue("order.created", "k1"), rig.enqueue("order.created", "k2")}
	if got := rig.drain(); !slices.Equal(got, ids) {
		t.Fatalf("published %v, want %v", got, ids)
	}
}
