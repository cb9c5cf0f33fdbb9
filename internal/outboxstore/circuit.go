package outboxstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Circuit is an open circuit of outbox_circuits (migration 0018): a topic whose consumer
// is down, as a relay sees it.
type Circuit struct {
	Topic    string
	OpenedAt time.Time
	// ProbeInFlight: a probe event is published and its outcome not known yet; ProbeKey
	// is its partition key, whose later events wait for it.
	ProbeInFlight bool
	ProbeKey      string
	// ProbeIn is how long until the next probe may be published (0: now), by the
	// database's clock.
	ProbeIn time.Duration
}

// ConsumersCTE is a WITH RECURSIVE element named consumers: the distinct consumers of
// processed_messages, one primary-key probe each (a loose index scan), so "did any
// consumer apply message m" is one probe per consumer instead of a scan of the table by
// its second key column. The circuit's close and the failure callback's reopen use it.
const ConsumersCTE = `consumers AS (
    (SELECT consumer FROM processed_messages ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT p.consumer FROM processed_messages p WHERE p.consumer > k.consumer ORDER BY p.consumer LIMIT 1)
    FROM consumers k
    WHERE k.consumer IS NOT NULL
)`

// Circuit statements (pkg/relay, circuit.go; the failure callback opens circuits, in
// pkg/deadletter). $1 is the probe horizon: how long after its publish a probe with no
// failure reported counts as delivered.
const (
	// qCloseCircuits closes every circuit whose probe is known delivered, and wakes the
	// held rows (qWakeHeld, $2 HeldError) in the same statement when it closed one. A
	// probe is delivered when its consumer committed it (processed_messages, when the
	// consumer shares this database: found through each consumer's primary key, one probe
	// per consumer, after the probe was published), when it was answered 489 (dead-lettered:
	// the consumer is up and refused the event), when its row is gone, or when it was
	// dispatched $1 ago and no failure callback reopened it. A failed probe never reaches
	// this statement: its callback frees the probe slot. A probe whose row left the probe's
	// generation other than through its own failure tells nothing and is freed: another may
	// go. In fifo mode that is a probe put back behind an earlier event of its key whose
	// failure came in after the probe was chosen (its delivery was still queued), or one
	// the webhook put back for the same reason; closing on it, as before, published the
	// held backlog into the outage. So is a probe pending at its generation and no longer
	// leased (its relay did not publish it: held, released, or died and a later claim held
	// it), or still leased $1 after it was taken.
	qCloseCircuits = `
WITH RECURSIVE ` + ConsumersCTE + `, probes AS (
    -- Each probe's row, one primary-key probe per circuit (LIMIT 1 keeps the lateral a
    -- nested loop: flattened into a join, a table without statistics was merge-joined
    -- over every outbox row, 476 ms over 205,000).
    SELECT c.topic, c.probe_id, c.probe_generation, c.probe_sent_at, o.id IS NOT NULL AS found, o.generation,
           o.dispatched_at, o.dead_lettered_at IS NOT NULL AS dead, o.lease_token IS NOT NULL AS leased
    FROM outbox_circuits c
    LEFT JOIN LATERAL (SELECT o.id, o.generation, o.dispatched_at, o.dead_lettered_at, o.lease_token
                       FROM outbox o WHERE o.id = c.probe_id LIMIT 1) o ON true
    WHERE c.probe_id IS NOT NULL
), verdicts AS (
    SELECT p.topic, p.probe_id,
           CASE WHEN NOT p.found THEN 'probe row deleted'
                WHEN p.generation <> p.probe_generation THEN NULL
                WHEN p.dead THEN 'probe dead-lettered: the consumer refused the event'
                WHEN p.dispatched_at IS NOT NULL AND EXISTS (
                      SELECT 1 FROM consumers k
                      WHERE EXISTS (SELECT 1 FROM processed_messages m
                                    WHERE m.consumer = k.consumer AND m.message_id = p.probe_id::text
                                      AND m.processed_at >= p.probe_sent_at)) THEN 'probe applied by its consumer'
                WHEN p.dispatched_at IS NOT NULL AND p.probe_sent_at <= now() - $1::interval
                     THEN 'probe horizon passed with no failure reported'
           END AS why
    FROM probes p
), closed AS (
    DELETE FROM outbox_circuits c
    USING verdicts v
    WHERE c.topic = v.topic AND c.probe_id = v.probe_id AND v.why IS NOT NULL
    RETURNING c.topic, v.why
), freed AS (
    UPDATE outbox_circuits c
    SET probe_id = NULL, probe_generation = NULL
    FROM probes p
    WHERE c.topic = p.topic AND c.probe_id = p.probe_id AND p.found
      AND (p.generation <> p.probe_generation
           OR (p.dispatched_at IS NULL AND NOT p.dead AND (NOT p.leased OR p.probe_sent_at < now() - $1::interval)))
), woken AS (
    UPDATE outbox
    SET available_at = clock_timestamp()
    WHERE EXISTS (SELECT 1 FROM closed) AND dispatched_at IS NULL AND dead_lettered_at IS NULL
      AND last_error = $2::text AND available_at > clock_timestamp() AND lease_token IS NULL
)
SELECT topic, why FROM closed`

	// qAnyCircuit says whether any circuit is open.
	qAnyCircuit = `SELECT EXISTS (SELECT 1 FROM outbox_circuits)`

	// qOpenCircuits lists the open circuits, with the partition key of the probe in flight.
	qOpenCircuits = `
SELECT c.topic, c.opened_at, c.probe_id IS NOT NULL, coalesce(o.partition_key, ''), greatest(c.probe_at - now(), interval '0')
FROM outbox_circuits c
LEFT JOIN LATERAL (SELECT o.partition_key FROM outbox o WHERE o.id = c.probe_id LIMIT 1) o ON true
ORDER BY c.topic`

	// qTakeProbe claims the probe slot of topic $1 for outbox row $2 at generation $3,
	// if the circuit is open, has no probe in flight and its probe is due.
	qTakeProbe = `
UPDATE outbox_circuits
SET probe_id = $2::bigint, probe_generation = $3::int, probe_sent_at = now()
WHERE topic = $1 AND probe_id IS NULL AND probe_at <= now()
RETURNING true`

	// qWakeProbe makes the probe candidate of topic $1 available now: its oldest pending
	// event that is its key's head (no earlier pending event of the key) and not leased,
	// when it is held (available later). The held events sleep long (Hold); the probe must
	// not wait for them. It walks the pending events oldest first (outbox_pending_age_idx:
	// the backlog, never the dispatched history; once per due probe) to the topic's first
	// key head; the head test is one probe of outbox_pending_key_idx (a min, not an
	// anti-join: as an anti-join the planner walked every pending row for each candidate,
	// 1.9 s over a 5,000-event backlog).
	qWakeProbe = `
UPDATE outbox o
SET available_at = clock_timestamp()
WHERE o.id = (
    SELECT h.id FROM outbox h
    WHERE h.topic = $1 AND h.dispatched_at IS NULL AND h.dead_lettered_at IS NULL AND h.lease_token IS NULL
      AND h.id = (SELECT min(e.id) FROM outbox e
                  WHERE e.partition_key = h.partition_key AND e.dispatched_at IS NULL AND e.dead_lettered_at IS NULL)
    ORDER BY h.created_at, h.id
    LIMIT 1)
  AND o.available_at > clock_timestamp()`

	// qDropProbe frees the probe slot of topic $1 held by row $2: the relay did not get the
	// probe published (QStash refused it, or time ran out), so another may go.
	qDropProbe = `
UPDATE outbox_circuits SET probe_id = NULL, probe_generation = NULL
WHERE topic = $1 AND probe_id = $2::bigint`
)

// ErrNoCircuits is returned by Circuits on a schema without outbox_circuits (before
// migration 0018): nothing opens circuits there.
var ErrNoCircuits = errors.New("no circuit table (migration 0018 not applied)")

// Closed is a circuit Circuits closed, and what told it the probe was delivered.
type Closed struct {
	Topic, Why string
}

// Circuits closes the circuits whose probe was delivered (waking the rows held behind
// them) and returns those still open, and those it closed. probeHorizon is how long
// after its publish a probe with no failure reported counts as delivered.
func (s *Store) Circuits(ctx context.Context, probeHorizon time.Duration) (open []Circuit, closed []Closed, err error) {
	// Nearly always none: then one look at the tiny table, not the statements that plan
	// updates of the outbox (measured under a pinned horizon at 800 events/s, those took
	// over 100 ms dozens of times a minute, and every claim waited for them).
	rows, err := s.query(ctx, "", qAnyCircuit)
	var exists []bool
	if err == nil {
		exists, err = pgx.CollectRows(rows, pgx.RowTo[bool])
	}
	if err != nil {
		return nil, nil, circuitErr("read open circuits", err)
	}
	if len(exists) == 0 || !exists[0] {
		return nil, nil, nil
	}
	rows, err = s.query(ctx, "", qCloseCircuits, probeHorizon, HeldError)
	if err == nil {
		closed, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Closed])
	}
	if err != nil {
		return nil, nil, circuitErr("close delivered circuits", err)
	}
	rows, err = s.query(ctx, "", qOpenCircuits)
	if err == nil {
		open, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Circuit, error) {
			var c Circuit
			err := row.Scan(&c.Topic, &c.OpenedAt, &c.ProbeInFlight, &c.ProbeKey, &c.ProbeIn)
			return c, err
		})
	}
	if err != nil {
		return nil, closed, circuitErr("read open circuits", err)
	}
	return open, closed, nil
}

// TakeProbe claims topic's probe slot for the outbox row id at generation gen; false when
// another relay took it first, or the probe is not due.
func (s *Store) TakeProbe(ctx context.Context, topic string, id int64, gen int) (bool, error) {
	rows, err := s.query(ctx, "", qTakeProbe, topic, id, gen)
	var got []bool
	if err == nil {
		got, err = pgx.CollectRows(rows, pgx.RowTo[bool])
	}
	if err != nil {
		return false, circuitErr("take circuit probe", err)
	}
	return len(got) == 1, nil
}

// WakeProbe makes the probe candidate of topic available now, if it is held.
func (s *Store) WakeProbe(ctx context.Context, topic string) error {
	if _, err := s.exec(ctx, qWakeProbe, topic); err != nil {
		return circuitErr("wake circuit probe", err)
	}
	return nil
}

// DropProbe frees topic's probe slot if row id holds it.
func (s *Store) DropProbe(ctx context.Context, topic string, id int64) error {
	if _, err := s.exec(ctx, qDropProbe, topic, id); err != nil {
		return circuitErr("drop circuit probe", err)
	}
	return nil
}

func circuitErr(what string, err error) error { return tableErr(what, err, ErrNoCircuits) }

// tableErr wraps err as what failed, as missing when the statement's table does not exist
// (a migration not yet applied).
func tableErr(what string, err, missing error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("%s: %w", what, missing)
	}
	return fmt.Errorf("%s: %w", what, err)
}
