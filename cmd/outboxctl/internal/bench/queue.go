package bench

import (
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// newPublisher returns the relay's QStash publisher to qstashURL for events destined to
// destBase/events/<topic>, configured by articlePublisher.
func newPublisher(qstashURL, token, destBase string, fifo bool) (relay.Publisher, error) {
	cfg := articlePublisher(fifo)
	cfg.BaseURL, cfg.Token, cfg.DestinationBaseURL = qstashURL, token, destBase
	return qstash.NewPublisher(cfg)
}

// relayConfig is the relay's configuration for a publisher built by newPublisher: the
// ordering matches the publisher's (waves only for FIFO queues), the rest the defaults.
func relayConfig(batch int, fifo bool) relay.Config {
	c := relay.Config{BatchSize: batch, Ordering: publish.OrderingPublish, Logger: discardLogger()}
	if fifo {
		c.Ordering = publish.OrderingFIFO
	}
	return c
}

// articlePublisher is the publisher's configuration: in publish mode what the article
// sends (retries 5, flow control keyed by partition key with parallelism 1); fifo mode
// enqueues into the publisher's default number of FIFO queues.
func articlePublisher(fifo bool) qstash.PublisherConfig {
	cfg := qstash.PublisherConfig{Retries: 5}
	if fifo {
		cfg.Ordering = publish.OrderingFIFO
	} else {
		cfg.FlowControlParallelism = 1
	}
	return cfg
}

// sinkQStash is the local QStash (qstashtest) for scenarios that measure the publish path
// only: it holds every accepted message (HoldDeliveries), so while the drain runs the
// server only accepts, as QStash's API does for a relay whose deliveries happen on QStash's
// machines; Close drops what is held. The destination is a loopback sink answering 200
// that nothing reaches.
type sinkQStash struct {
	*qstashtest.Server
	sink *httptest.Server
	// SinkURL is the destination base URL to publish to.
	SinkURL string
}

// startSinkQStash starts a holding qstashtest and the sink.
func startSinkQStash(rtt time.Duration) *sinkQStash {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
	}))
	opts := deliveringOptions(rtt)
	opts.HoldDeliveries = true
	return &sinkQStash{Server: qstashtest.NewServer(opts), sink: sink, SinkURL: sink.URL}
}

func (q *sinkQStash) Close() {
	q.Server.Close()
	q.sink.Close()
}

// startDelivering starts the project's local QStash server on a free loopback port, with
// deliveringOptions.
func startDelivering(rtt time.Duration) *qstashtest.Server {
	return qstashtest.NewServer(deliveringOptions(rtt))
}

// deliveringOptions: the delivery client keeps up to 1024 idle connections per host.
// qstashtest delivers every ready message at once (up to one per flow-control key, here
// 1,000 keys), and with its default of 64 idle connections most deliveries dial a new TCP
// connection: profiled, dialing took a fifth of the process's CPU and slowed the relay
// under test by half.
//
// rtt models a QStash a network round trip away: the server answers every API request
// after rtt ± 10% (its Latency option; deliveries are not delayed). Zero: loopback.
//
// No scenario reads the server's request and attempt logs, and they live in the process
// under test: kept (131,072 attempts, each with its header map), the pinned scenario's
// process spent 30 of its 222 CPU-seconds marking in the garbage collector, whose workers
// take a processor from the relay and the webhook under test on 2 cores; without them, 14
// of 194 (the scenario alone, 2026-12-07 16:16 and 17:45 UTC).
func deliveringOptions(rtt time.Duration) qstashtest.Options {
	return qstashtest.Options{
		Latency: rtt - rtt/10, LatencyJitter: rtt / 5,
		Logger:   discardLogger(),
		LogLimit: -1,
		HTTPClient: &http.Client{
			Transport:     &http.Transport{MaxIdleConnsPerHost: 1024, IdleConnTimeout: 30 * time.Second},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}
