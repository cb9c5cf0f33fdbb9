package bench

import (
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/outbox-relay/outbox-relay/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/pkg/relay"
)

// newPublisher returns the relay's QStash publisher to qstashURL for events destined to
// destBase/events/<topic>. In publish mode it sends what the article sends (retries 5,
// flow control keyed by partition key with parallelism 1); fifo mode enqueues into the
// publisher's default number of FIFO queues.
func newPublisher(qstashURL, token, destBase string, fifo bool) (relay.Publisher, error) {
	cfg := qstash.PublisherConfig{BaseURL: qstashURL, Token: token, DestinationBaseURL: destBase, Retries: 5}
	if fifo {
		cfg.Ordering = qstash.OrderingFIFO
	} else {
		cfg.FlowControlParallelism = 1
	}
	return qstash.NewPublisher(cfg)
}

// sinkQStash is the local QStash (qstashtest) delivering to a loopback sink that answers
// 200 to everything, for scenarios that measure the publish path only.
type sinkQStash struct {
	*qstashtest.Server
	sink *httptest.Server
	// SinkURL is the destination base URL to publish to.
	SinkURL string
}

// startSinkQStash starts qstashtest and a sink that reads each delivery and answers 200.
func startSinkQStash() *sinkQStash {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
	}))
	return &sinkQStash{Server: startDelivering(), sink: sink, SinkURL: sink.URL}
}

func (q *sinkQStash) Close() {
	q.Server.Close()
	q.sink.Close()
}

// startDelivering starts the project's local QStash server on a free loopback port.
func startDelivering() *qstashtest.Server {
	return qstashtest.NewServer(qstashtest.Options{Logger: discardLogger()})
}
