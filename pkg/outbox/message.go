package outbox

import (
	"fmt"
	"time"
)

// Message is a claimed outbox row, ready to publish.
type Message struct {
	ID           ID
	Topic        string
	PartitionKey string
	// Payload is the stored JSON, byte for byte what the consumer receives.
	Payload []byte
	Headers map[string]string
	// Attempt is 1 for the first publish attempt of this generation.
	Attempt int
	// Generation counts redrives (0 until the first redrive).
	Generation int
	CreatedAt  time.Time
}

// DeduplicationID is the QStash deduplication id of this publish: outbox-<id>, plus -r<n>
// after the n-th redrive, because QStash would drop a reused id inside its window. It
// contains no ':' (QStash rejects it in some regions).
func (m Message) DeduplicationID() string {
	if m.Generation == 0 {
		return fmt.Sprintf("outbox-%d", m.ID)
	}
	return fmt.Sprintf("outbox-%d-r%d", m.ID, m.Generation)
}
