-- qInsert of pkg/outbox/queries.go at f2c9285 (git show f2c9285:pkg/outbox/queries.go), verbatim.
INSERT INTO outbox (topic, partition_key, payload, headers, available_at)
VALUES ($1, $2, $3::jsonb, $4::jsonb, coalesce($5::timestamptz, now()))
RETURNING id
