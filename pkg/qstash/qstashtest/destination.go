package qstashtest

import (
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
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

// V2Gateway returns the URL of a proxy in front of s that adds /v2 to every path: what a
// client whose QSTASH_URL ends in /v2 sends (/v2/v2/batch), which QStash answers 404. It is
// for tests of that misconfiguration; the proxy closes when the test ends.
func V2Gateway(tb TB, s *Server) string {
	tb.Helper()
	target, err := url.Parse(s.URL)
	if err != nil {
		panic("qstashtest: server url: " + err.Error())
	}
	gw := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.URL.Path = "/v2" + r.In.URL.Path
		r.Out.URL.RawPath = ""
	}})
	tb.Cleanup(gw.Close)
	return gw.URL
}
