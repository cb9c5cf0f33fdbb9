package outboxstore

// Relay statements. Every one runs once per batch. The clock (@now in the claim, the last
// timestamptz parameter of the others) is NULL in production (the
// database clock) and a fixed instant in tests, so no test sleeps for time to pass.
const (
	// qClaim leases up to @batch ready rows under token @token for @lease (an interval) in ONE statement,
	// keeping per-key FIFO: a row is claimed only together with every pending row of its key
	// that has a smaller id. @window is the window size (how far into the ready index to look).
	//
	// win walks outbox_ready_idx in (available_at, id) order and looks up each row's key head
	// (its smallest pending id, outbox_pending_key_idx, one probe). Rows whose head is not
	// ready (backing off, or leased by a relay) are skipped during the walk, so a blocked key
	// does not fill the window and starve the others.
	//
	// heads keeps the heads of up to @batch keys seen in the window, in walk order (a head itself
	// may lie beyond the window, e.g. after a redrive). chosen extends each head with its
	// key's next pending ids while they are ready, up to lim per key, and takes whole runs,
	// oldest key first, until it has @batch rows: a hot key's backlog goes out in one batch, not
	// one per claim. lim is @batch shared out over the heads, but at least @key_run: a relay with @key_run
	// batches in flight needs the keys' backlogs spread over @key_run batches, not one event per
	// key in each, because a key whose head is in flight cannot be claimed again (measured at
	// a 30 ms round trip, 1,000 keys, batch 500: with one event per key only two batches could
	// be in flight). The heads go into the lateral in walk order and each run comes out in id
	// order, so the nested loop's output is already in (ord, rn) order and LIMIT @batch stops it
	// after the @batchst row: the runs of later keys are never read. There is deliberately no
	// ORDER BY: on a table without statistics the planner answered one with a full sort over
	// every key's run (8,000 probes for a batch of 1,000). Should a run ever come out of order,
	// eligible still takes only gap-free prefixes, so order costs fairness, never
	// correctness. With lim 1 (one
	// batch in flight, at least @batch keys) every key gets one row, the head itself, whose
	// readiness win already checked: the first branch answers that case without an index
	// probe per key (measured: about a quarter of the claim's time at batch 500 over 1,000
	// keys).
	//
	// locked takes row locks, skipping rows another claim holds, and re-checks readiness (a
	// concurrent claim may have leased or dispatched a row since this statement's snapshot).
	// Its pending test is written as coalesce(...) IS NULL so that no partial index's
	// predicate is implied: on a never-analysed table the planner otherwise walked the whole
	// outbox_ready_idx for the ids (1,038 ms against 40 ms per claim over a 190k backlog)
	// instead of probing the primary key. eligible keeps, per key, the locked rows up to the
	// first one it could not lock, so a gap is never skipped over; it tells locked from
	// unlocked rows with one aggregate over both sets rather than a join, which an
	// unanalysed table planned as a nested loop of a million comparisons.
	// TestClaimPlanIgnoresStatistics checks the plan never analysed, analysed empty and
	// analysed: 25 against 20 ms over a 190k backlog, batch 1,000, 1,000 keys, the
	// machine's Postgres 15.
	//
	// The lease moves available_at to the lease's end as well as locked_until, so claimed rows
	// leave the front of the ready index (measured: about twice the claim rate of leaving
	// them there), and a crashed relay's rows become ready again when the lease ends.
	//
	// Ids are handed on as arrays (= ANY) rather than joins so the plan stays an index probe
	// per id even before the table has statistics (an unanalysed table got a nested loop
	// over every pending row here).
	//
	// @ready_from, @id_from and @pending_from bound the walks that a pinned xmin horizon would
	// otherwise make grow with every event since the pin (walk.go says how the Store chooses
	// them and why they are safe; NULL, 0 and NULL walk everything). bounds lowers them, in
	// this statement's snapshot, to those of every writer in @writers (transactions that were
	// running when the bounds were learnt) that has ended since (ended): its rows are now
	// visible and may lie below the bounds, but not below its own (@writer_ids,
	// @writer_ats). win starts the ready index at the ready bound, and each head probe starts
	// its key at the id bound, or at the window row's own id if that is smaller (so a row
	// below the bound still finds itself as its key's head and is never starved by it),
	// unless migration 0016's counter of reopened rows is no longer @reopened: a row made
	// pending again below @id_from counts there before its transaction commits, so a claim
	// that can see the row sees the count too, and then probes every key from its start. The
	// counter is looked up by name (to_regclass), not referenced: binaries deployed before
	// `migrate up` ran 0016 claim as before, with no id bound (reopened -1), instead of
	// failing every claim until the migration (the day-two chaos run starts its relays on
	// an older schema). A counter never used reads 0 on both sides (pg_sequence_last_value
	// is NULL until the first nextval; compared as -1, it once turned every key's probe
	// into a walk from its start: 15,000 buffers per claim after two minutes of a pin).
	// bounds is a materialized CTE read through scalar subqueries, evaluated once, because
	// pg_sequence_last_value is volatile: inside the probe's condition it kept the bound out
	// of the index condition.
	//
	// The last columns feed the next claim's bounds, read in this statement's snapshot:
	// db_now, ready_from (the oldest ready row at or after the ready bound), pending_from, a
	// lower bound of the pending ids: a walk of the primary key from the pending bound up to
	// the first pending row, or over 2,000 rows, after which it says "past the last row
	// walked" (a long run of dispatched rows after a row that backed off for an hour takes
	// several claims, not one long one). The 2,000 are a LIMIT on an ordered subquery rather
	// than an upper bound on id: a range with both ends was planned as a bitmap scan and a
	// sort of every row in it on a never-analysed table, the LIMIT as an index walk in every
	// state (the plan test checks it). With no pending bound (NULL, or 0 after a writer that
	// may have reopened rows ended), the minimum over the pending rows, written min(id + 0)
	// so the planner cannot make it a primary-key walk over the retained history. Then
	// max_id, reopened (migration 0016's counter of rows made pending again), the claim's own
	// transaction id and its snapshot's running transaction ids, the next claim's writers
	// (scalar subqueries, evaluated once: pg_current_snapshot copies and sorts the snapshot's
	// running transaction ids at every call).
	//
	// window_rows tells the caller whether the window was full: if not, every ready row was
	// seen and a short batch means the outbox is drained (or blocked). run_cut tells it that
	// some key's run reached lim, so that key may have ready events this batch left out
	// even though the batch is short (uneven keys: 9 keys, one with 5 events, lim 4).
	// keys_end is the window position of the last key the batch took rows from: how much of
	// the window the batch needed, from which the caller sizes the next claim's window.
	//
	// kept is the byte budget: chosen's rows in chosen's order (oldest keys first, each
	// key's run in id order) while the payloads up to and including a row, as stored
	// (pg_column_size, read from the tuple locked already: no TOASTed value is fetched),
	// stay within @budget. The first row always fits, so one event larger than the budget
	// still moves, and a cut in that order leaves every key a prefix of its run. Rows cut
	// are locked by this statement only and stay ready. bytes_cut tells the caller the
	// budget left rows out.
	// Measured on the dev machine (batch 1,000 over 1,000 keys, ~300-byte payloads, budget
	// not reached): the sort and running sum cost about 1.5 ms of EXPLAIN ANALYZE time in a
	// 20-250 ms claim, and claims alternating with the statement without them took a median
	// 25.2 vs 23.8 ms and 84 vs 78 ms in two runs on the shared machine (its noise: the
	// interquartile ranges were 15 and 50 ms wide).
	//
	// A row that still carries a lease token when it is locked is a suspect: the claim that
	// left the token ended without an outcome (every outcome statement clears it), so the
	// relay holding it died (killed for memory, a panic, the Lambda deadline) and may die
	// again on the same row. locked gives a suspect no stored size, and kept lets it in only
	// as the first row, alone, counting it as the whole budget: a suspect at the front of
	// the order is claimed on its own, one further back ends the batch before it (and before
	// every later row of its key). So a batch that killed its process comes back one row
	// per claim, and the row that kills is never inside a batch again: it may take the
	// batches in flight beside it once more, but the relay publishes the claim that would
	// dead-letter it with nothing else in flight. The update counts such claims in
	// relay_deaths (migration 0020; NULL again after a claim of the row that follows an
	// outcome), which Claim reads to dead-letter a row that keeps dying. isolated tells the
	// caller that a suspect shaped the batch (bytes_cut is then true too, not for want of
	// memory). qClaimPre0020 is this statement for a schema without the column.
	qClaim = `
WITH ended AS MATERIALIZED (
    SELECT min(w.low_id) AS low_id, min(w.low_at) AS low_at
    FROM unnest(@writers::bigint[], @writer_ids::bigint[], @writer_ats::timestamptz[]) AS w(xid, low_id, low_at)
    WHERE pg_visible_in_snapshot(w.xid::text::xid8, pg_current_snapshot())
), bounds AS MATERIALIZED (
    SELECT least(CASE WHEN @reopened::bigint >= 0 AND to_regclass('outbox_reopened_seq') IS NOT NULL
                           AND coalesce(pg_sequence_last_value(to_regclass('outbox_reopened_seq')), 0) = @reopened::bigint
                      THEN @id_from::bigint ELSE 0 END, e.low_id) AS id_from,
           CASE WHEN @ready_from::timestamptz IS NULL THEN '-infinity'::timestamptz
                ELSE least(@ready_from::timestamptz, e.low_at) END AS ready_from,
           CASE WHEN @pending_from::bigint IS NOT NULL THEN least(@pending_from::bigint, e.low_id) END AS pending_from
    FROM ended e
), win AS MATERIALIZED (
    SELECT o.id, o.partition_key, hd.head_id
    FROM outbox o
    CROSS JOIN LATERAL (
        SELECT h.id AS head_id, h.available_at AS head_at
        FROM outbox h
        WHERE h.partition_key = o.partition_key
          AND h.dispatched_at IS NULL AND h.dead_lettered_at IS NULL
          AND h.id >= least((SELECT id_from FROM bounds), o.id)
        ORDER BY h.id
        LIMIT 1) hd
    WHERE o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL
      AND o.available_at >= (SELECT ready_from FROM bounds)
      AND o.available_at <= coalesce(@now::timestamptz, now())
      AND hd.head_at <= coalesce(@now::timestamptz, now())
    ORDER BY o.available_at, o.id
    LIMIT @window
), heads AS (
    SELECT partition_key, head_id AS id, min(w.ord) AS ord
    FROM (SELECT partition_key, head_id, row_number() OVER () AS ord FROM win) w
    GROUP BY partition_key, head_id
    ORDER BY min(w.ord)
    LIMIT @batch
), per_key AS (
    SELECT greatest(ceil(@batch::numeric / greatest(count(*), 1))::int, @key_run) AS lim FROM heads
), chosen AS (
    SELECT h.partition_key, h.id, 1::bigint AS rn, h.ord
    FROM heads h, per_key
    WHERE per_key.lim = 1
    UNION ALL
    (SELECT h.partition_key, r.id, r.rn, h.ord
    FROM (SELECT * FROM heads ORDER BY ord) h
    CROSS JOIN per_key
    CROSS JOIN LATERAL (
        SELECT s.id,
               row_number() OVER (ORDER BY s.id) AS rn,
               bool_and(s.available_at <= coalesce(@now::timestamptz, now())) OVER (ORDER BY s.id) AS ready
        FROM (
            SELECT p.id, p.available_at
            FROM outbox p
            WHERE p.partition_key = h.partition_key
              AND p.dispatched_at IS NULL AND p.dead_lettered_at IS NULL
              AND p.id >= h.id
            ORDER BY p.id
            LIMIT per_key.lim) s) r
    WHERE per_key.lim > 1 AND r.ready
    LIMIT @batch)
), locked AS (
    SELECT o.id, o.partition_key, CASE WHEN o.lease_token IS NULL THEN pg_column_size(o.payload) END AS stored
    FROM outbox o
    WHERE o.id = ANY (ARRAY(SELECT id FROM chosen))
      AND coalesce(o.dispatched_at, o.dead_lettered_at) IS NULL
      AND o.available_at <= coalesce(@now::timestamptz, now())
    FOR UPDATE SKIP LOCKED
), eligible AS (
    SELECT id, ord, rn, stored
    FROM (SELECT id, ord, rn, stored,
                 bool_and(is_locked) OVER (PARTITION BY partition_key ORDER BY rn) AS prefix_locked
          FROM (SELECT id, partition_key, max(ord) AS ord, max(rn) AS rn, max(stored) AS stored,
                       count(*) = 2 AS is_locked
                FROM (SELECT id, partition_key, ord, rn, NULL::int AS stored FROM chosen
                      UNION ALL
                      SELECT id, partition_key, NULL, NULL, stored FROM locked) u
                GROUP BY id, partition_key) g) x
    WHERE prefix_locked
), kept AS (
    SELECT id
    FROM (SELECT id, stored,
                 sum(coalesce(stored, @budget::bigint)) OVER (ORDER BY ord, rn ROWS UNBOUNDED PRECEDING) - coalesce(stored, @budget::bigint) AS before
          FROM eligible) y
    WHERE before = 0 OR (stored IS NOT NULL AND before + stored <= @budget)
)
UPDATE outbox o
SET lease_token  = @token,
    attempts     = o.attempts + 1,
    relay_deaths = CASE WHEN o.lease_token IS NULL THEN NULL ELSE coalesce(o.relay_deaths, 0) + 1 END,
    locked_until = coalesce(@now::timestamptz, now()) + @lease::interval,
    available_at = coalesce(@now::timestamptz, now()) + @lease::interval
WHERE o.id = ANY (ARRAY(SELECT id FROM kept))
RETURNING o.id, o.topic, o.partition_key, o.payload::text, o.headers, o.attempts, o.generation, o.created_at,
          pg_column_size(o.payload) AS stored, o.relay_deaths, EXISTS (SELECT FROM eligible WHERE stored IS NULL) AS isolated,
          (SELECT count(*) FROM win) AS window_rows,
          coalesce((SELECT lim FROM per_key) > 1 AND (SELECT max(rn) FROM chosen) >= (SELECT lim FROM per_key), false) AS run_cut,
          (SELECT coalesce(max(ord), 0) FROM chosen) AS keys_end,
          (SELECT count(*) FROM eligible) > (SELECT count(*) FROM kept) AS bytes_cut,
          coalesce(@now::timestamptz, now()) AS db_now,
          (SELECT a.available_at FROM outbox a
           WHERE a.dispatched_at IS NULL AND a.dead_lettered_at IS NULL
             AND a.available_at >= (SELECT ready_from FROM bounds)
             AND a.available_at <= coalesce(@now::timestamptz, now())
           ORDER BY a.available_at, a.id LIMIT 1) AS ready_from,
          CASE WHEN coalesce((SELECT pending_from FROM bounds), 0) <= 0 THEN
              (SELECT min(p.id + 0) FROM outbox p
               WHERE p.dispatched_at IS NULL AND p.dead_lettered_at IS NULL)
          ELSE coalesce((SELECT s.id
                         FROM (SELECT p.id, p.dispatched_at, p.dead_lettered_at FROM outbox p
                               WHERE p.id >= (SELECT pending_from FROM bounds) ORDER BY p.id LIMIT 2000) s
                         WHERE coalesce(s.dispatched_at, s.dead_lettered_at) IS NULL
                         ORDER BY s.id LIMIT 1),
                        (SELECT max(s.id) + 1
                         FROM (SELECT p.id FROM outbox p WHERE p.id >= (SELECT pending_from FROM bounds) ORDER BY p.id LIMIT 2000) s),
                        (SELECT pending_from FROM bounds)) END AS pending_from,
          (SELECT m.id FROM outbox m ORDER BY m.id DESC LIMIT 1) AS max_id,
          CASE WHEN to_regclass('outbox_reopened_seq') IS NULL THEN -1
               ELSE coalesce(pg_sequence_last_value(to_regclass('outbox_reopened_seq')), 0) END AS reopened,
          (SELECT pg_current_xact_id()::text::bigint) AS xid,
          ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(pg_current_snapshot()) AS x) AS xip`

	// qClaimPlanner runs before qClaim in its implicit transaction: no sorts where an index
	// gives the order. Every walk of the claim (the ready index for win, a key's pending
	// ids for the head probes and runs, the primary key for pending_from) has an index
	// that yields its rows in the order it needs; a plan that sorts there instead has
	// scanned some other index whole. Statistics invite exactly that: analysed while the
	// outbox was drained (the steady state), the table says no row is pending, every
	// pending partial index looks empty, and the planner scanned the smallest one
	// (outbox_pending_age_idx) whole and sorted it, once per window row; under a pinned
	// horizon that index held every dead entry since the pin, and a claim took 8 s, then
	// more than its 15 s (measured, pinned bench on a cluster with PostgreSQL's defaults).
	// enable_sort off does not forbid the sorts the claim cannot avoid (heads, the prefix
	// and budget windows): it makes each sort cost more than any index walk, so where an
	// index gives the order it wins whatever the estimates say. TestClaimPlanIgnoresStatistics
	// checks the plan in that state too. jit goes off with it: the sorts' penalty lifts the
	// claim's estimated cost far past jit_above_cost, and compiling the statement took about
	// 0.9 s per claim of 100 rows (the machine's Postgres 15, jit on by default).
	qClaimPlanner = `SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true)`

	// qBelowBound finds the oldest ready row with available_at below $1 ($2 is the clock
	// override, as in qClaim): the probe of walk.go, a walk of the ready index from its
	// start, away from the claims.
	qBelowBound = `
SELECT min(available_at) FROM outbox
WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL
  AND available_at < $1::timestamptz AND available_at <= coalesce($2::timestamptz, now())`

	// qMarkDispatched marks the published rows of one lease. QStash's failure callback can
	// beat this statement (a 489 answered within the publish round trip); its dead letter
	// and error then stay authoritative.
	qMarkDispatched = `
UPDATE outbox
SET dispatched_at = coalesce($3::timestamptz, now()), locked_until = NULL, lease_token = NULL,
    last_error = CASE WHEN dead_lettered_at IS NULL THEN NULL ELSE last_error END
WHERE id = ANY($1::bigint[]) AND lease_token = $2`

	// qReschedule puts retryable failures back with a per-row backoff.
	qReschedule = `
UPDATE outbox o
SET available_at = coalesce($5::timestamptz, clock_timestamp()) + u.delay_ms * interval '1 millisecond',
    locked_until = NULL, lease_token = NULL, last_error = u.err
FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS u(id, delay_ms, err)
WHERE o.id = u.id AND o.lease_token = $4`

	// qDeadLetter marks rows dead-lettered and records them in dead_letters in one
	// statement (so in one transaction): both happen, or neither. A row the failure callback
	// dead-lettered first keeps its time and error, and its open letter (unique per outbox id
	// and generation) makes this insert a no-op. The statement returns the rows the lease
	// held, so RowsAffected still counts them when no letter was added.
	qDeadLetter = `
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[]) AS u(id, err, status)
), dead AS (
    UPDATE outbox o
    SET dead_lettered_at = coalesce(o.dead_lettered_at, $5::timestamptz, now()), locked_until = NULL, lease_token = NULL,
        last_error = CASE WHEN o.dead_lettered_at IS NULL THEN u.err ELSE o.last_error END
    FROM u
    WHERE o.id = u.id AND o.lease_token = $4
    RETURNING o.id, o.topic, o.partition_key, o.payload, o.headers, o.attempts, o.generation, u.err, u.status
), letters AS (
    INSERT INTO dead_letters (source, outbox_id, topic, partition_key, payload, headers, error, attempts, status_code, generation, created_at)
    SELECT 'relay', id, topic, partition_key, payload, headers, err, attempts, nullif(status, 0), generation, coalesce($5::timestamptz, now())
    FROM dead
    ON CONFLICT DO NOTHING
)
SELECT id FROM dead`

	// qRelease returns claimed-but-unpublished rows (held back behind a failed same-key
	// event, or out of time) without counting an attempt.
	qRelease = `
UPDATE outbox
SET available_at = coalesce($3::timestamptz, clock_timestamp()), attempts = attempts - 1, locked_until = NULL, lease_token = NULL
WHERE id = ANY($1::bigint[]) AND lease_token = $2`

	// qUnclaim hands claimed rows back as though the claim had not happened: the attempt
	// and the relay death it counted are taken back, and the row keeps the lease token
	// with the lease ended now, so the next claim sees the same suspect (qClaim counts
	// the death again) instead of a row with an outcome (which resets its deaths).
	qUnclaim = `
UPDATE outbox
SET available_at = coalesce($3::timestamptz, clock_timestamp()), locked_until = coalesce($3::timestamptz, clock_timestamp()),
    attempts = attempts - 1, relay_deaths = relay_deaths - 1
WHERE id = ANY($1::bigint[]) AND lease_token = $2 AND relay_deaths IS NOT NULL`

	// qReleaseLease is qRelease for every row lease $1 holds, when the claim that took
	// them was cut off before its rows reached the relay. Leased rows are pending and
	// available only at the lease's end: the walk is the ready index above now.
	qReleaseLease = `
UPDATE outbox
SET available_at = clock_timestamp(), attempts = attempts - 1, locked_until = NULL, lease_token = NULL
WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL AND available_at > clock_timestamp() AND lease_token = $1`
)
