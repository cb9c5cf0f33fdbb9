-- qDeadLetter of pkg/outbox/queries.go at f2c9285 (git show f2c9285:pkg/outbox/queries.go), verbatim.
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[]) AS u(id, err, status)
), dead AS (
    UPDATE outbox o
    SET dead_lettered_at = coalesce($5::timestamptz, now()), locked_until = NULL, lease_token = NULL, last_error = u.err
    FROM u
    WHERE o.id = u.id AND o.lease_token = $4
    RETURNING o.id, o.topic, o.partition_key, o.payload, o.headers, o.attempts, u.err, u.status
)
INSERT INTO dead_letters (source, outbox_id, topic, partition_key, payload, headers, error, attempts, status_code, created_at)
SELECT 'relay', id, topic, partition_key, payload, headers, err, attempts, nullif(status, 0), coalesce($5::timestamptz, now())
FROM dead
