package deadletter

import (
	"net/http"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// TestMatcher pins which QStash DLQ entries are this outbox's.
func TestMatcher(t *testing.T) {
	t.Parallel()
	const base = "https://hooks.example.com/events/"
	ours := matcher{base: base, name: "outbox", queuePrefix: "outbox"}
	staging := matcher{base: base, name: "staging", queuePrefix: "staging"}
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	gen := func(g int) *int { return &g }
	for _, c := range []struct {
		name  string
		m     matcher
		e     qstash.DLQEntry
		ok    bool
		id    int64
		gen   *int
		topic string
	}{
		{"url identity", ours, qstash.DLQEntry{URL: base + "order.created?outbox_id=7&generation=1"}, true, 7, gen(1), "order.created"},
		{"legacy header", ours, qstash.DLQEntry{URL: base + "order.created", Header: hdr("X-Outbox-Id", "7")}, true, 7, nil, "order.created"},
		{"legacy header with generation", ours, qstash.DLQEntry{URL: base + "t", Header: hdr("X-Outbox-Id", "7", "X-Outbox-Generation", "2")}, true, 7, gen(2), "t"},
		{"forward-prefixed header", ours, qstash.DLQEntry{URL: base + "t", Header: hdr("Upstash-Forward-X-Outbox-Id", "9")}, true, 9, nil, "t"},
		{"escaped topic", ours, qstash.DLQEntry{URL: base + "a~b?outbox_id=1&generation=0"}, true, 1, gen(0), "a~b"},
		{"own queue", ours, qstash.DLQEntry{URL: base + "t?outbox_id=1&generation=0", QueueName: "outbox-3"}, true, 1, gen(0), "t"},
		{"own dedup id", ours, qstash.DLQEntry{URL: base + "t?outbox_id=7&generation=0", DeduplicationID: "outbox-7"}, true, 7, gen(0), "t"},
		{"own redriven dedup id", ours, qstash.DLQEntry{URL: base + "t?outbox_id=7&generation=2", DeduplicationID: "outbox-7-r2"}, true, 7, gen(2), "t"},
		{"staging queue as staging", staging, qstash.DLQEntry{URL: base + "t", Header: hdr("X-Outbox-Id", "7"), QueueName: "staging-0"}, true, 7, nil, "t"},

		{"another webhook", ours, qstash.DLQEntry{URL: "https://other.example.com/events/t?outbox_id=1&generation=0"}, false, 0, nil, ""},
		{"a host that only starts alike", ours, qstash.DLQEntry{URL: "https://hooks.example.com.evil.net/events/t?outbox_id=1&generation=0"}, false, 0, nil, ""},
		{"nested path", ours, qstash.DLQEntry{URL: base + "a/b?outbox_id=1&generation=0"}, false, 0, nil, ""},
		{"no topic", ours, qstash.DLQEntry{URL: base + "?outbox_id=1&generation=0"}, false, 0, nil, ""},
		{"no identity", ours, qstash.DLQEntry{URL: base + "t"}, false, 0, nil, ""},
		{"bad outbox id", ours, qstash.DLQEntry{URL: base + "t?outbox_id=x&generation=0"}, false, 0, nil, ""},
		{"repeated outbox id", ours, qstash.DLQEntry{URL: base + "t?outbox_id=1&outbox_id=2&generation=0"}, false, 0, nil, ""},
		{"generation alone", ours, qstash.DLQEntry{URL: base + "t?generation=0", Header: hdr("X-Outbox-Id", "1")}, false, 0, nil, ""},
		{"zero id header", ours, qstash.DLQEntry{URL: base + "t", Header: hdr("X-Outbox-Id", "0")}, false, 0, nil, ""},
		{"another deployment's queue", ours, qstash.DLQEntry{URL: base + "t", Header: hdr("X-Outbox-Id", "7"), QueueName: "staging-0"}, false, 0, nil, ""},
		{"queue without a number", ours, qstash.DLQEntry{URL: base + "t", Header: hdr("X-Outbox-Id", "7"), QueueName: "outbox-x"}, false, 0, nil, ""},
		{"another deployment's dedup id", ours, qstash.DLQEntry{URL: base + "t?outbox_id=7&generation=0", DeduplicationID: "staging-7"}, false, 0, nil, ""},
		{"dedup id of another event", ours, qstash.DLQEntry{URL: base + "t?outbox_id=7&generation=0", DeduplicationID: "outbox-70"}, false, 0, nil, ""},
		{"dedup id of another generation", ours, qstash.DLQEntry{URL: base + "t?outbox_id=7&generation=1", DeduplicationID: "outbox-7-r2"}, false, 0, nil, ""},
	} {
		e := c.e
		e.MessageID, e.DLQID = "msg_1", "1725323658779-0"
		id, ok := c.m.match(e)
		if ok != c.ok {
			t.Errorf("%s: match = %v, want %v", c.name, ok, c.ok)
			continue
		}
		if !ok {
			continue
		}
		if id.outboxID != c.id || id.topic != c.topic || (id.generation == nil) != (c.gen == nil) || (c.gen != nil && *id.generation != *c.gen) {
			t.Errorf("%s: identity %+v (gen %v), want %d %v %q", c.name, id, id.generation, c.id, c.gen, c.topic)
		}
	}
	// An entry without its ids cannot be recorded once per message: it is not taken.
	for _, e := range []qstash.DLQEntry{
		{DLQID: "d", URL: base + "t?outbox_id=1&generation=0"},
		{MessageID: "m", URL: base + "t?outbox_id=1&generation=0"},
	} {
		if _, ok := ours.match(e); ok {
			t.Errorf("entry without ids taken: %+v", e)
		}
	}
}
