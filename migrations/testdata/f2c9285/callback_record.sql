-- qRecordDelivery of pkg/deadletter/queries.go at f2c9285 (git show f2c9285:pkg/deadletter/queries.go), verbatim.
WITH ins AS (
    INSERT INTO dead_letters (source, outbox_id, topic, partition_key, payload, headers, error, attempts,
                              status_code, qstash_message_id, qstash_dlq_id, response_body)
    SELECT 'delivery', $1::bigint, coalesce(o.topic, $2::text), o.partition_key,
           coalesce($3::jsonb, o.payload), coalesce(o.headers, '{}'::jsonb), $4::text, $5::int,
           $6::int, $7::text, nullif($8::text, ''), $9::text
    FROM (SELECT 1) AS one
    LEFT JOIN outbox o ON o.id = $1::bigint
    ON CONFLICT (qstash_message_id) WHERE source = 'delivery' AND qstash_message_id IS NOT NULL DO NOTHING
    RETURNING id, outbox_id
), mark AS (
    UPDATE outbox o
    SET dead_lettered_at = now(), last_error = $4::text
    FROM ins
    WHERE o.id = ins.outbox_id AND o.dead_lettered_at IS NULL
      AND ($10::int IS NULL OR o.generation = $10::int)
    RETURNING o.id
)
SELECT ins.id, ins.outbox_id, (SELECT count(*) FROM mark) > 0 FROM ins
