package outbox

// Producer statements.
const (
	qInsert = `
INSERT INTO outbox (topic, partition_key, payload, headers, available_at)
VALUES ($1, $2, $3::jsonb, $4::jsonb, coalesce($5::timestamptz, clock_timestamp()))
RETURNING id`

	qInsertBatch = `
INSERT INTO outbox (topic, partition_key, payload, headers, available_at)
SELECT t, k, p::jsonb, h::jsonb, coalesce(a, clock_timestamp())
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[]) AS u(t, k, p, h, a)
RETURNING id`
)
