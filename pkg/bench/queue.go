package bench

// INTERIM: until pkg/qstash (Publisher) and pkg/qstash/qstashtest (the local server) land,
// the scenarios publish through this stand-in that answers like QStash (201 {"messageId"}
// for a publish, an array for /v2/batch) and delivers nothing. It is replaced, not kept.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/outbox-relay/outbox-relay/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/pkg/relay"
)

type localQStash struct {
	URL, Token string
	srv        *httptest.Server
	seq        atomic.Int64
}

func startQStash() *localQStash {
	q := &localQStash{Token: qstash.DevToken}
	q.srv = httptest.NewServer(http.HandlerFunc(q.serve))
	q.URL = q.srv.URL
	return q
}

func (q *localQStash) Close() { q.srv.Close() }

func (q *localQStash) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.URL.Path == "/v2/batch":
		var items []json.RawMessage
		if err := json.Unmarshal(body, &items); err != nil {
			w.WriteHeader(400)
			return
		}
		w.WriteHeader(201)
		var b bytes.Buffer
		b.WriteByte('[')
		for i := range items {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"messageId":"msg_%d"}`, q.seq.Add(1))
		}
		b.WriteByte(']')
		_, _ = w.Write(b.Bytes())
	case strings.HasPrefix(r.URL.Path, "/v2/publish/"):
		w.WriteHeader(201)
		fmt.Fprintf(w, `{"messageId":"msg_%d"}`, q.seq.Add(1))
	default:
		w.WriteHeader(404)
	}
}

func (q *localQStash) publisher(baseURL string) relay.Publisher {
	p, err := newPublisher(q.URL, q.Token, baseURL, false)
	if err != nil {
		panic(err) // constant, valid configuration
	}
	return p
}

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

// deliveringQStash is a local QStash that delivers to its destinations.
type deliveringQStash struct {
	URL, Token string
	close      func()
}

func (q *deliveringQStash) Close() { q.close() }

func (q *deliveringQStash) publisher(destBase string, fifo bool) (relay.Publisher, error) {
	return newPublisher(q.URL, q.Token, destBase, fifo)
}

func startDelivering() (*deliveringQStash, error) {
	return nil, fmt.Errorf("the local QStash server (pkg/qstash/qstashtest) has not landed yet")
}
