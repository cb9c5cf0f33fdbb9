package bench

import (
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// latencyTransport models a remote QStash: every request waits one round trip (RTT plus or
// minus up to Jitter, uniformly) before it is sent to the local server on loopback. The
// local QStash server has no latency option yet (issue 14 asks its owner for one), so the
// bench adds the delay on the client side, where it costs the relay exactly what a slow
// network would: a request in flight that the relay waits for.
type latencyTransport struct {
	base   http.RoundTripper
	rtt    time.Duration
	jitter time.Duration

	mu  sync.Mutex
	rng *rand.Rand
}

func newLatencyTransport(base http.RoundTripper, rtt, jitter time.Duration) http.RoundTripper {
	if rtt <= 0 {
		return base
	}
	return &latencyTransport{base: base, rtt: rtt, jitter: jitter, rng: rand.New(rand.NewPCG(uint64(rtt), 14))}
}

func (t *latencyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	d := t.rtt
	if t.jitter > 0 {
		t.mu.Lock()
		d += time.Duration(t.rng.Int64N(int64(2*t.jitter))) - t.jitter
		t.mu.Unlock()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-req.Context().Done():
		return nil, req.Context().Err()
	case <-timer.C:
	}
	return t.base.RoundTrip(req)
}

// latencyClient is an HTTP client with the latency model and enough idle connections for
// every request a relay (or the article's 50 at once) keeps in flight.
func latencyClient(rtt time.Duration, timeout time.Duration) *http.Client {
	base := &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}
	return &http.Client{Transport: newLatencyTransport(base, rtt, rtt/10), Timeout: timeout}
}
