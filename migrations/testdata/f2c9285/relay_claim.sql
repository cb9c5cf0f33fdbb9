-- qClaim of pkg/outbox/queries.go at f2c9285 (git show f2c9285:pkg/outbox/queries.go), verbatim.
WITH win AS MATERIALIZED (
    SELECT o.id, o.partition_key, hd.head_id
    FROM outbox o
    CROSS JOIN LATERAL (
        SELECT h.id AS head_id, h.available_at AS head_at
        FROM outbox h
        WHERE h.partition_key = o.partition_key
          AND h.dispatched_at IS NULL AND h.dead_lettered_at IS NULL
        ORDER BY h.id
        LIMIT 1) hd
    WHERE o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL
      AND o.available_at <= coalesce($3::timestamptz, now())
      AND hd.head_at <= coalesce($3::timestamptz, now())
    ORDER BY o.available_at, o.id
    LIMIT $5
), heads AS (
    SELECT partition_key, head_id AS id, min(w.ord) AS ord
    FROM (SELECT partition_key, head_id, row_number() OVER () AS ord FROM win) w
    GROUP BY partition_key, head_id
    ORDER BY min(w.ord)
    LIMIT $1
), per_key AS (
    SELECT ceil($1::numeric / greatest(count(*), 1))::int AS lim FROM heads
), runs AS (
    SELECT h.partition_key, h.ord, h.id, 1::bigint AS rn
    FROM heads h, per_key
    WHERE per_key.lim = 1
    UNION ALL
    SELECT h.partition_key, h.ord, r.id, r.rn
    FROM heads h
    CROSS JOIN per_key
    CROSS JOIN LATERAL (
        SELECT s.id,
               row_number() OVER (ORDER BY s.id) AS rn,
               bool_and(s.available_at <= coalesce($3::timestamptz, now())) OVER (ORDER BY s.id) AS ready
        FROM (
            SELECT p.id, p.available_at
            FROM outbox p
            WHERE p.partition_key = h.partition_key
              AND p.dispatched_at IS NULL AND p.dead_lettered_at IS NULL
              AND p.id >= h.id
            ORDER BY p.id
            LIMIT per_key.lim) s) r
    WHERE per_key.lim > 1 AND r.ready
), chosen AS (
    SELECT id, partition_key, rn FROM runs ORDER BY rn, ord LIMIT $1
), locked AS (
    SELECT o.id
    FROM outbox o
    WHERE o.id = ANY (ARRAY(SELECT id FROM chosen))
      AND o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL
      AND o.available_at <= coalesce($3::timestamptz, now())
    FOR UPDATE SKIP LOCKED
), eligible AS (
    SELECT id
    FROM (SELECT c.id, c.rn, row_number() OVER (PARTITION BY c.partition_key ORDER BY c.rn) AS lrn
          FROM chosen c JOIN locked l ON l.id = c.id) x
    WHERE lrn = rn
)
UPDATE outbox o
SET lease_token  = $2,
    attempts     = o.attempts + 1,
    locked_until = coalesce($3::timestamptz, now()) + $4::interval,
    available_at = coalesce($3::timestamptz, now()) + $4::interval
WHERE o.id = ANY (ARRAY(SELECT id FROM eligible))
RETURNING o.id, o.topic, o.partition_key, o.payload::text, o.headers, o.attempts, o.generation, o.created_at,
          (SELECT count(*) FROM win) AS window_rows
