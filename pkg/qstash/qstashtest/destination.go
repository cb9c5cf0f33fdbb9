package qstashtest

import (
	"io"
	"maps"
	"net/http"
	"sync"

	"github.com/outbox-relay/outbox-relay/pkg/qstash"
)

// Destination is a webhook stand-in for tests that need deliveries to land somewhere but
// do not test the consumer: an http.Handler (serve it with httptest.NewServer) that reads
// each delivery, answers 200 and counts deliveries per outbox id, the outbox_id of the URL
// the relay published to. It verifies no signature. The zero value is ready to use.
type Destination struct {
	mu   sync.Mutex
	seen map[string]int
}

// ServeHTTP counts the delivery and answers 200.
func (d *Destination) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	d.mu.Lock()
	if d.seen == nil {
		d.seen = map[string]int{}
	}
	d.seen[r.URL.Query().Get(qstash.IdentityIDParam)]++
	d.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// Counts returns a copy of the deliveries so far per outbox id; a count above 1 is a
// duplicate delivery.
func (d *Destination) Counts() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.seen)
}
