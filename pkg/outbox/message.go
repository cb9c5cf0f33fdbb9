package outbox

import (
	"strconv"
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
	// Probe is set by the relay on the one event it publishes to a destination whose
	// consumer is down (an open circuit): the publisher sends it with a single delivery
	// attempt (no QStash retries), so its failure is reported at once and the next probe
	// can follow on the relay's schedule rather than QStash's.
	Probe bool
}

// defaultDeploymentName is the deployment name DeduplicationID uses: the one every id had
// before deployments were named, so outbox-<id> stays byte-identical.
const defaultDeploymentName = "outbox"

// DeduplicationID is DeduplicationIDFor(defaultDeploymentName): outbox-<id>, plus -r<n>
// after the n-th redrive.
func (m Message) DeduplicationID() string { return m.DeduplicationIDFor(defaultDeploymentName) }

// DeduplicationIDFor is the QStash deduplication id of this publish in the deployment
// name: <name>-<id>, plus -r<n> after the n-th redrive, because QStash would drop a reused
// id inside its window. The name keeps two deployments that share a QStash account from
// deduplicating each other's events (QStash's dedup scope is the account). The caller
// validates name (qstash.ValidName: [A-Za-z0-9_-]), so the id never contains ':', which
// QStash rejects in some regions.
func (m Message) DeduplicationIDFor(name string) string {
	b := make([]byte, 0, len(name)+24)
	b = append(b, name...)
	b = append(b, '-')
	b = strconv.AppendInt(b, int64(m.ID), 10)
	if m.Generation != 0 {
		b = append(b, "-r"...)
		b = strconv.AppendInt(b, int64(m.Generation), 10)
	}
	return string(b)
}
