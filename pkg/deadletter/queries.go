package deadletter

import "github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"

// letterColumns is the column list every read returns, in scanLetter's order.
const letterColumns = `
d.id, d.source, d.outbox_id, coalesce(d.topic, ''), coalesce(d.partition_key, ''), d.payload::text, d.headers::text,
d.error, d.attempts, d.status_code, coalesce(d.qstash_message_id, ''), coalesce(d.qstash_dlq_id, ''),
coalesce(d.response_body, ''), d.created_at, d.resolved_at, coalesce(d.resolution, ''), d.fingerprint`

// filterWhere selects letters by a Filter. NULL parameters match everything:
// $1 ids, $2 topic, $3 partition key, $4 since (inclusive), $5 until (exclusive),
// $6 whether resolved letters match too, $7 fingerprint.
const filterWhere = `
    ($1::bigint[] IS NULL OR d.id = ANY($1::bigint[]))
AND ($2::text IS NULL OR d.topic = $2::text)
AND ($3::text IS NULL OR d.partition_key = $3::text)
AND ($4::timestamptz IS NULL OR d.created_at >= $4::timestamptz)
AND ($5::timestamptz IS NULL OR d.created_at < $5::timestamptz)
AND ($6::bool OR d.resolved_at IS NULL)
AND ($7::text IS NULL OR d.fingerprint = $7::text)`

// The one rule for a letter that is history, not work: it is about an event generation its
// outbox row has left behind (the event was redriven since, so a newer generation is being
// or was delivered). Recording (callback and DLQ sync) stores such a letter resolved as
// superseded, and Redrive resolves one recorded open before this rule as superseded instead
// of resetting its row: resetting would put a newer, possibly delivered, generation back to
// pending. Every statement using it names the letter (or DLQ entry) e and its outbox row o;
// an unknown letter generation (NULL) or a missing row (NULL) is never superseded.
const (
	supersededIf         = `e.generation < o.generation`
	supersededResolvedAt = `CASE WHEN ` + supersededIf + ` THEN now() END`
	supersededResolution = `CASE WHEN ` + supersededIf + ` THEN '` + ResolutionSuperseded + `' END`
)

const (
	// qList returns matching letters newest first; $8 is the limit.
	qList = `SELECT` + letterColumns + `
FROM dead_letters d
WHERE` + filterWhere + `
ORDER BY d.created_at DESC, d.id DESC
LIMIT $8`

	qGet = `SELECT` + letterColumns + ` FROM dead_letters d WHERE d.id = $1`

	// qGroups groups the matching letters by failure fingerprint, largest group first; $8 is
	// the limit. The newest letter of a group (max id) is its sample, and its error pattern
	// the group's (every letter of a group has the same one).
	qGroups = `
WITH g AS (
    SELECT d.fingerprint, d.topic, d.source, d.status_code,
           count(*) AS n, count(*) FILTER (WHERE d.resolved_at IS NULL) AS open,
           min(d.created_at) AS first_seen, max(d.created_at) AS last_seen, max(d.id) AS sample_id
    FROM dead_letters d
    WHERE` + filterWhere + `
    GROUP BY d.fingerprint, d.topic, d.source, d.status_code
)
SELECT g.fingerprint, coalesce(g.topic, ''), g.source, g.status_code, dead_letter_error_pattern(s.error), g.n, g.open,
       g.first_seen, g.last_seen, g.sample_id, s.error
FROM g
JOIN dead_letters s ON s.id = g.sample_id
ORDER BY g.n DESC, g.last_seen DESC, g.fingerprint
LIMIT $8`

	// qSelectForRedrive classifies the matching letters: resolved or not, and the state of
	// their outbox row (gone, superseded: at a newer generation than the letter's, pending,
	// or finished: dispatched or dead-lettered), with the letter's and the row's generation.
	// qLockSuffix locks the letters (Redrive) or not (Plan), so two concurrent redrives do not
	// both reset a row. e is the letter again, under the name supersededIf reads.
	qSelectForRedrive = `
SELECT d.id, d.outbox_id, d.resolved_at IS NOT NULL,
       o.id IS NOT NULL,
       coalesce(` + supersededIf + `, false),
       o.id IS NOT NULL AND o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL,
       d.generation, coalesce(o.generation, 0)
FROM dead_letters d
CROSS JOIN LATERAL (SELECT d.generation) AS e(generation)
LEFT JOIN outbox o ON o.id = d.outbox_id
WHERE` + filterWhere + `
ORDER BY d.id`
	qLockSuffix = `
FOR UPDATE OF d`

	// qResetOutbox puts finished outbox rows ($1) back to pending with a new generation, so
	// their QStash deduplication id changes (QStash would drop a reused one). Rows already
	// pending (being relayed) are left alone: resetting would void the live lease. So is a
	// row that has left the letter's generation ($2) behind, checked again here because the
	// classifying select does not lock the rows: a concurrent redrive may have moved it on.
	// available_at is the update's own time, not the transaction's start, which the relay's
	// claims may already have walked past (internal/outboxstore, walk.go).
	qResetOutbox = `
UPDATE outbox o
SET dispatched_at = NULL, dead_lettered_at = NULL, attempts = 0, available_at = clock_timestamp(),
    lease_token = NULL, locked_until = NULL, last_error = NULL, generation = o.generation + 1
FROM unnest($1::bigint[], $2::int[]) AS e(outbox_id, generation)
WHERE o.id = e.outbox_id AND (o.dispatched_at IS NOT NULL OR o.dead_lettered_at IS NOT NULL)
  AND NOT (` + supersededIf + `)
RETURNING o.id, o.generation`

	// qLetterHeaders reads the headers (with the producer's traceparent) of redriven
	// letters; a traced Redrive links their producer spans.
	qLetterHeaders = `SELECT headers::text FROM dead_letters WHERE id = ANY($1::bigint[]) ORDER BY id`

	// qResolve resolves letters $1, each with its resolution in $2.
	qResolve = `
UPDATE dead_letters d
SET resolved_at = now(), resolution = r.resolution
FROM unnest($1::bigint[], $2::text[]) AS r(id, resolution)
WHERE d.id = r.id AND d.resolved_at IS NULL`

	// qRecordDelivery records one QStash failure callback and marks its outbox row, in one
	// statement (so atomically). ON CONFLICT without a target makes the insert a no-op (no
	// row returned, nothing updated) on either unique index: a repeated callback for the same
	// QStash message, or an event generation that already has an open letter (the relay's,
	// when both gave up on the same delivery).
	// Topic, partition key and headers come from the outbox row (headers from the row, not
	// from the callback, which may carry the relay's Authorization header); topic falls
	// back to the one in the destination URL when the row is gone. The payload is the
	// delivered body, falling back to the row's payload when that is not JSON.
	// The letter is about generation $10 (from the signed destination URL), else the row's
	// current one. A letter about a generation the row has left behind (a late callback for
	// a delivery that was redriven since) is recorded resolved as superseded, as DLQ sync
	// records it. The outbox row is marked only if this callback is about its current
	// generation and it is not already dead-lettered, so such a callback does not stop the
	// redriven event.
	// row locks the outbox row before the insert touches an index, the order the relay's
	// dead-letter statement takes them in (row, then letter): in the opposite order the two
	// deadlock when they race for the same event.
	qRecordDelivery = `
WITH locked AS (
    SELECT o.topic, o.partition_key, o.payload, o.headers, o.generation
    FROM outbox o
    WHERE o.id = $1::bigint
    FOR UPDATE
), ins AS (
    INSERT INTO dead_letters (source, outbox_id, topic, partition_key, payload, headers, error, attempts,
                              status_code, qstash_message_id, qstash_dlq_id, response_body, generation,
                              resolved_at, resolution)
    SELECT 'delivery', $1::bigint, coalesce(o.topic, $2::text), o.partition_key,
           coalesce($3::jsonb, o.payload), coalesce(o.headers, '{}'::jsonb), $4::text, $5::int,
           $6::int, $7::text, nullif($8::text, ''), $9::text, coalesce(e.generation, o.generation, 0),
           ` + supersededResolvedAt + `,
           ` + supersededResolution + `
    FROM (SELECT $10::int AS generation) AS e
    LEFT JOIN locked o ON true
    ON CONFLICT DO NOTHING
    RETURNING id, outbox_id, generation, resolved_at IS NOT NULL AS superseded
), mark AS (
    UPDATE outbox o
    SET dead_lettered_at = now(), last_error = $4::text
    FROM ins
    WHERE o.id = ins.outbox_id AND NOT ins.superseded AND o.dead_lettered_at IS NULL
      AND o.generation = ins.generation
    RETURNING o.id
)
SELECT ins.id, ins.outbox_id, (SELECT count(*) FROM mark) > 0, ins.superseded FROM ins`

	// qReopenDelivery puts the outbox row $1 back to pending after a transient delivery
	// failure of its generation $2 (NULL: the current one), with last_error $3: the same
	// reset as qResetOutbox (generation+1: a deduplication id QStash has not seen;
	// available_at the statement's own time, for the claim's walks), for a row that is at
	// that generation and not dead-lettered, whatever the relay thinks of it: a row pending
	// without a lease may have been published all the same (QStash took it and the answer
	// was lost: the chaos run's dropped responses). A row still leased at it (the callback beat
	// its relay's mark: a fast failure, or a relay that died after publishing) loses its
	// lease here: the relay's mark, conditioned on the lease, changes nothing (lease
	// fencing), and the row is published again under the new generation. It returns the
	// row's state as locked and whether it was reopened, so the caller can tell a repeated
	// callback from a reopen. The row lock comes first, as in qRecordDelivery.
	// qReopenDeliveryCircuit adds the circuit of the row's topic.
	qReopenDelivery = reopenHead + reopenTail
	reopenHead      = `
WITH RECURSIVE cur AS (
    SELECT o.id, o.generation, o.topic, o.partition_key, o.dispatched_at,
           o.dispatched_at IS NOT NULL AS dispatched, o.dead_lettered_at IS NOT NULL AS dead,
           o.lease_token IS NOT NULL AS leased
    FROM outbox o
    WHERE o.id = $1::bigint
    FOR UPDATE
), re AS (
    UPDATE outbox o
    SET dispatched_at = NULL, attempts = 0, available_at = clock_timestamp(), lease_token = NULL,
        locked_until = NULL, last_error = $3::text, generation = o.generation + 1
    FROM cur
    WHERE o.id = cur.id AND NOT cur.dead AND cur.generation = coalesce($2::int, cur.generation)
    RETURNING o.generation, o.topic
), ` + outboxstore.ConsumersCTE + `, behind AS (
    -- The key's later events already handed to QStash, not yet applied: in fifo mode they
    -- wait in the same queue behind the failed one and would be delivered before its
    -- re-publish. They go back to pending too (generation+1), so the relay publishes the
    -- key again in order; their queued deliveries are of a generation the row has left,
    -- which a webhook that shares this database acknowledges unapplied (webhook
    -- Config.SharesOutbox), and whose failure is recorded as superseded history. Found
    -- through outbox_dispatched_idx from the failed event's own dispatch (the same
    -- batch's rows share its time); applied ones (processed_messages, one primary-key
    -- probe per consumer) are left alone.
    UPDATE outbox o
    SET dispatched_at = NULL, attempts = 0, available_at = clock_timestamp(), lease_token = NULL,
        locked_until = NULL, last_error = $3::text, generation = o.generation + 1
    FROM cur
    WHERE EXISTS (SELECT 1 FROM re)
      AND o.dispatched_at >= cur.dispatched_at AND o.partition_key = cur.partition_key AND o.id > cur.id
      AND o.dead_lettered_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM consumers k
                      WHERE EXISTS (SELECT 1 FROM processed_messages m
                                    WHERE m.consumer = k.consumer AND m.message_id = o.id::text))
), leased_behind AS (
    -- The key's later events a relay is publishing right now (claimed while the failed one
    -- was dispatched, not yet marked): their lease is taken and their generation moved, so
    -- the relay's mark changes nothing (fenced) and a copy it did publish is superseded.
    -- Pending rows of the key: outbox_pending_key_idx.
    UPDATE outbox o
    SET available_at = clock_timestamp(), lease_token = NULL, locked_until = NULL,
        last_error = $3::text, generation = o.generation + 1
    FROM cur
    WHERE EXISTS (SELECT 1 FROM re)
      AND o.partition_key = cur.partition_key AND o.id > cur.id
      AND o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL AND o.lease_token IS NOT NULL
)`
	reopenTail = `
SELECT coalesce((SELECT generation FROM re), cur.generation), cur.topic, cur.dispatched, cur.dead,
       EXISTS (SELECT 1 FROM re)
FROM cur`

	// qReopenDeliveryCircuit is qReopenDelivery that also opens (or keeps open) the circuit
	// of the reopened row's topic (migration 0018), which makes the relay hold the topic's
	// events and probe: a new circuit's first probe waits $4 (an interval); a failed probe
	// (the circuit's probe_id, $1) frees the probe slot and doubles the wait, from $4 up to
	// $5. Other failures reported while it is open (deliveries published before it opened)
	// count, and while a probe is in flight they restart its horizon (probe_sent_at): the
	// consumer still fails, so a probe that waits behind retried messages in its FIFO queue
	// is not taken for delivered when the horizon passes (the relay closed such circuits
	// during an outage and published into it again). So does the failure of a delivery its
	// row has left behind (seen): put back behind its key's failed event, its queued
	// delivery is still retried, fails, and reopens nothing. In fifo mode most failures of
	// an outage are such, and counting only the others left a probe queued behind them
	// minutes without a reported failure: the outage scenario closed the circuit at its
	// horizon in every run of a series. It is not counted among the circuit's failures (a
	// callback QStash repeats looks the same) and opens no circuit. In one statement with
	// the reopen: a reopened event and its held topic appear together.
	qReopenDeliveryCircuit = reopenHead + `, seen AS (
    UPDATE outbox_circuits c
    SET probe_sent_at = greatest(c.probe_sent_at, now())
    FROM cur
    WHERE c.topic = cur.topic AND c.probe_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM re)
), circuit AS (
    INSERT INTO outbox_circuits AS c (topic, probe_at, last_error)
    SELECT re.topic, now() + $4::interval, $3::text FROM re
    ON CONFLICT (topic) DO UPDATE
    SET failures = c.failures + 1, last_error = excluded.last_error,
        probe_failures = c.probe_failures + (c.probe_id IS NOT DISTINCT FROM $1::bigint)::int,
        probe_at = CASE WHEN c.probe_id = $1::bigint
                        THEN now() + least($5::interval, $4::interval * power(2, least(c.probe_failures + 1, 20)))
                        ELSE c.probe_at END,
        probe_sent_at = CASE WHEN c.probe_id IS NOT NULL AND c.probe_id IS DISTINCT FROM $1::bigint
                             THEN greatest(c.probe_sent_at, now()) ELSE c.probe_sent_at END,
        probe_id = CASE WHEN c.probe_id = $1::bigint THEN NULL ELSE c.probe_id END,
        probe_generation = CASE WHEN c.probe_id = $1::bigint THEN NULL ELSE c.probe_generation END
)` + reopenTail

	// qExistingLetter finds the letter that made qRecordDelivery a no-op: the one recorded
	// for this QStash message ($1), else the open letter of the event generation ($2, $3;
	// $3 NULL: the row's current generation).
	qExistingLetter = `
SELECT d.id
FROM dead_letters d
WHERE (d.source = 'delivery' AND d.qstash_message_id = $1)
   OR (d.outbox_id = $2::bigint AND d.resolved_at IS NULL
       AND d.generation = coalesce($3::int, (SELECT o.generation FROM outbox o WHERE o.id = $2::bigint), 0))
ORDER BY d.qstash_message_id IS NOT DISTINCT FROM $1 DESC, d.id
LIMIT 1`

	// qLegacyWindowOpen: migration 0007's window for deliveries published before the
	// identity moved into the signed URL.
	qLegacyWindowOpen = `SELECT coalesce((SELECT now() < accept_until FROM legacy_identity), false)`

	// qRecordSynced records one page of QStash DLQ entries (dlq sync) in one statement, as
	// qRecordDelivery records one callback: a delivery letter per entry, its outbox row
	// marked dead-lettered when the entry is about the row's current generation and the
	// row is not dead-lettered yet. The outbox rows are locked first, in id order, so two
	// syncs of the same page take turns instead of deadlocking. ON CONFLICT without a
	// target makes an entry recorded before (by QStash message id, or any other unique
	// key) a no-op. An entry about a generation the row has left (redriven since) is
	// recorded resolved as superseded (supersededIf), as the failure callback records it. Per entry it returns: created, superseded, and
	// whether dead_letters holds it (created now, or visible from before: a letter of the
	// same QStash message, or of the same event generation).
	qRecordSynced = `
WITH e AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::bigint[], $4::int[], $5::text[], $6::text[], $7::text[],
                $8::int[], $9::int[], $10::text[], $11::timestamptz[])
        AS e(message_id, dlq_id, outbox_id, generation, topic, payload, error, attempts, status_code,
             response_body, failed_at)
), locked AS (
    SELECT o.id, o.topic, o.partition_key, o.payload, o.headers, o.generation
    FROM outbox o
    WHERE o.id IN (SELECT outbox_id FROM e)
    ORDER BY o.id
    FOR UPDATE
), ins AS (
    INSERT INTO dead_letters (source, outbox_id, topic, partition_key, payload, headers, error, attempts,
                              status_code, qstash_message_id, qstash_dlq_id, response_body, created_at,
                              generation, resolved_at, resolution)
    SELECT 'delivery', e.outbox_id, coalesce(o.topic, e.topic), o.partition_key,
           coalesce(e.payload::jsonb, o.payload), coalesce(o.headers, '{}'::jsonb), e.error, e.attempts,
           e.status_code, e.message_id, nullif(e.dlq_id, ''), e.response_body, coalesce(e.failed_at, now()),
           coalesce(e.generation, o.generation, 0),
           ` + supersededResolvedAt + `,
           ` + supersededResolution + `
    FROM e
    LEFT JOIN locked o ON o.id = e.outbox_id
    ON CONFLICT DO NOTHING
    RETURNING id, outbox_id, generation, qstash_message_id, error, resolved_at IS NOT NULL AS superseded
), mark AS (
    UPDATE outbox o
    SET dead_lettered_at = now(), last_error = ins.error
    FROM ins
    WHERE o.id = ins.outbox_id AND NOT ins.superseded AND o.dead_lettered_at IS NULL
      AND o.generation = ins.generation
    RETURNING o.id
)
SELECT e.message_id, ins.id IS NOT NULL, coalesce(ins.superseded, false),
       ins.id IS NOT NULL
       OR EXISTS (SELECT 1 FROM dead_letters d
                  WHERE d.source = 'delivery' AND d.qstash_message_id = e.message_id)
       OR (e.generation IS NOT NULL AND EXISTS (SELECT 1 FROM dead_letters d
                  WHERE d.outbox_id = e.outbox_id AND d.generation = e.generation))
FROM e
LEFT JOIN ins ON ins.qstash_message_id = e.message_id`
)
