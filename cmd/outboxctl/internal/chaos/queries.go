package chaos

// Statements of the harness and the checker. The checker reads only the database: the
// outbox, dead_letters and the devstack demo tables (demo_orders, the business rows;
// demo_effects, one row per application of an event, deliberately without a unique
// constraint so a second application is visible).
const (
	// qEffectsIndex lets the progress poll and the checker join effects by outbox id
	// without a sequential scan per poll. The demo table is the harness's to index.
	qEffectsIndex = `CREATE INDEX IF NOT EXISTS demo_effects_outbox_id_idx ON demo_effects (outbox_id)`

	qEmpty = `SELECT NOT EXISTS (SELECT 1 FROM outbox) AND NOT EXISTS (SELECT 1 FROM demo_effects)`

	qInsertOrder = `INSERT INTO demo_orders (id, customer, amount_cents, poison) VALUES ($1, $2, $3, $4)`

	// qLockCustomer serializes a customer's business transactions, as writes to one
	// aggregate do in a real application (a row lock on the aggregate). Without it two
	// concurrent transactions of one key commit in either order, and their outbox ids
	// (drawn at insert) need not follow the commit order.
	qLockCustomer = `SELECT pg_advisory_xact_lock(hashtext($1))`

	// qProgress: events settled (applied at least once, or dead-lettered) and outbox rows
	// still pending. It over-counts an event both applied and dead-lettered, which the
	// checker reports; the run ends only when the pipeline is also quiescent.
	qProgress = `
SELECT (SELECT count(*) FROM outbox),
       (SELECT count(DISTINCT outbox_id) FROM demo_effects) +
       (SELECT count(DISTINCT outbox_id) FROM dead_letters WHERE outbox_id IS NOT NULL AND resolution IS DISTINCT FROM 'superseded'),
       (SELECT count(*) FROM outbox WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL)`

	// qTerminate kills every backend of one relay pool, found by its application_name.
	qTerminate = `
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1 AND pid <> pg_backend_pid()`

	// qCheck computes every invariant in one statement. Per outbox row: is it a poison
	// event, how many times was it applied, how many dead letters name it, is it still
	// pending or leased, and does its business row exist.
	qCheck = `
WITH eff AS (
    SELECT outbox_id, count(*) AS n FROM demo_effects GROUP BY outbox_id
), dl AS (
    -- A superseded letter is history (a failed delivery of a generation its event has left,
    -- after a consumer outage put it back in the outbox), not a dead letter.
    SELECT outbox_id, count(*) AS n FROM dead_letters
    WHERE outbox_id IS NOT NULL AND resolution IS DISTINCT FROM 'superseded'
    GROUP BY outbox_id
), ev AS (
    SELECT o.id,
           coalesce(od.poison, false) AS poison,
           od.id IS NULL AS orphan,
           coalesce(e.n, 0) AS applied,
           coalesce(d.n, 0) AS dead,
           o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL AS pending,
           o.lease_token IS NOT NULL AS leased,
           o.dispatched_at IS NOT NULL AS dispatched
    FROM outbox o
    LEFT JOIN demo_orders od ON od.id = o.payload->>'order_id'
    LEFT JOIN eff e ON e.outbox_id = o.id
    LEFT JOIN dl d ON d.outbox_id = o.id
)
SELECT count(*),
       count(*) FILTER (WHERE applied = 1),
       count(*) FILTER (WHERE applied > 1),
       count(*) FILTER (WHERE applied = 0 AND dead = 0),
       count(*) FILTER (WHERE poison),
       count(*) FILTER (WHERE poison AND dead > 0),
       count(*) FILTER (WHERE NOT poison AND dead > 0),
       count(*) FILTER (WHERE poison AND applied > 0),
       count(*) FILTER (WHERE dead > 1),
       count(*) FILTER (WHERE pending),
       count(*) FILTER (WHERE leased AND dispatched),
       count(*) FILTER (WHERE leased AND NOT dispatched AND NOT pending),
       count(*) FILTER (WHERE orphan),
       (SELECT count(*) FROM demo_effects f WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = f.outbox_id)),
       (SELECT count(*) FROM demo_orders od WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.payload->>'order_id' = od.id)),
       (SELECT count(*) FROM (
            SELECT outbox_id, lag(outbox_id) OVER (PARTITION BY partition_key ORDER BY seq) AS prev
            FROM demo_effects) x
        WHERE prev > outbox_id)
FROM ev`
)
