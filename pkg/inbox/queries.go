package inbox

const (
	// qClaim records a message id. Under READ COMMITTED, when another transaction holds an
	// uncommitted row for the same key, this statement waits for it: a commit makes it return
	// no row (a duplicate), a rollback lets it insert. That wait is what makes two concurrent
	// deliveries of one message produce one effect.
	qClaim = `
INSERT INTO processed_messages (consumer, message_id, payload_hash, retried)
VALUES ($1, $2, $3, $4::int)
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING true`

	// qStoredHash reads the committed record that made qClaim a no-op. It runs in a new
	// statement snapshot, so it sees the row the conflict waited for.
	qStoredHash = `
SELECT payload_hash FROM processed_messages WHERE consumer = $1 AND message_id = $2`
)
