package bench

// INTERIM: until pkg/qstash (Publisher) and pkg/qstash/qstashtest (the local server) land,
// the scenarios publish through this stand-in that answers like QStash (201 {"messageId"}
// for a publish, an array for /v2/batch) and delivers nothing. It is replaced, not kept.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/outbox-relay/outbox-relay/pkg/outbox"
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

type interimPublisher struct {
	url, token string
	base       string
	client     *http.Client
}

func (q *localQStash) publisher(baseURL string) relay.Publisher {
	p, _ := newPublisher(q.URL, q.Token, baseURL, false)
	return p
}

// newPublisher returns the relay's QStash publisher to qstashURL for events destined to
// destBase/events/<topic>, in fifo or publish mode.
func newPublisher(qstashURL, token, destBase string, fifo bool) (relay.Publisher, error) {
	return &interimPublisher{url: qstashURL, token: token, base: destBase, client: &http.Client{}}, nil
}

func (p *interimPublisher) Publish(ctx context.Context, msgs []outbox.Message) []relay.Result {
	type item struct {
		Destination string            `json:"destination"`
		Headers     map[string]string `json:"headers"`
		Body        string            `json:"body"`
	}
	items := make([]item, len(msgs))
	for i, m := range msgs {
		items[i] = item{
			Destination: p.base + "/events/" + m.Topic,
			Headers: map[string]string{
				"Content-Type": "application/json", "Upstash-Deduplication-Id": m.DeduplicationID(),
				"Upstash-Forward-X-Outbox-Id": strconv.FormatInt(int64(m.ID), 10),
			},
			Body: string(m.Payload),
		}
	}
	res := make([]relay.Result, len(msgs))
	fail := func(err error) []relay.Result {
		for i := range res {
			res[i].Err = err
		}
		return res
	}
	body, _ := json.Marshal(items)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/v2/batch", bytes.NewReader(body))
	if err != nil {
		return fail(err)
	}
	req.Header.Set("Authorization", "Bearer "+p.token)
	resp, err := p.client.Do(req)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	var out []struct {
		MessageID string `json:"messageId"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out) != len(msgs) {
		return fail(fmt.Errorf("decode batch response: %v", err))
	}
	for i := range res {
		res[i].MessageID = out[i].MessageID
	}
	return res
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
