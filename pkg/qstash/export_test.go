package qstash

import "github.com/outbox-relay/outbox-relay/v3/pkg/outbox"

// Names and URLs the publisher derives, for the external tests that pin them.
var (
	FlowControlKey = flowControlKey
	Label          = label
	QueueName      = fifoQueueName
)

// Queue is GET /v2/queues/{name}'s answer, for the tests that read a queue back.
type Queue = queue

func (p *Publisher) Destination(topic string) string { return p.destination(topic) }

// MessageDestination is the URL m is delivered to (appendMessageDestination).
func (p *Publisher) MessageDestination(m outbox.Message) string {
	return string(p.appendMessageDestination(nil, m))
}

func (p *Publisher) DeduplicationID(m outbox.Message) string { return p.deduplicationID(m) }

func (p *Publisher) QueueName(partitionKey string) string { return p.queueName(partitionKey) }

func (t *Token) Value() string { return t.get() }

// Rereads returns how many times the token was read again successfully.
func (t *Token) Rereads() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.gen
}
