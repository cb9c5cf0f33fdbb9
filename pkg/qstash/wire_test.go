package qstash

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// refItem is a /v2/batch element as encoding/json writes it: the reference that
// appendBatchItem must match value for value.
type refItem struct {
	Destination string            `json:"destination"`
	Headers     map[string]string `json:"headers"`
	Body        string            `json:"body"`
	Queue       string            `json:"queue,omitempty"`
}

// refEncode is encode as it was written with encoding/json.
func refEncode(p *Publisher, m outbox.Message) refItem {
	h := map[string]string{}
	for k, v := range m.Headers {
		h["Upstash-Forward-"+k] = v
	}
	h["Content-Type"] = "application/json"
	h["Upstash-Forward-X-Outbox-Id"] = m.ID.String()
	h["Upstash-Forward-X-Outbox-Generation"] = strconv.Itoa(m.Generation)
	h["Upstash-Deduplication-Id"] = p.deduplicationID(m)
	h["Upstash-Label"] = label(m.Topic)
	h["Upstash-Retries"] = strconv.Itoa(p.cfg.Retries)
	if m.Probe { // a circuit's probe: one attempt
		h["Upstash-Retries"] = "0"
	} else if p.cfg.RetryDelay > 0 {
		h["Upstash-Retry-Delay"] = strconv.FormatInt(p.cfg.RetryDelay.Milliseconds(), 10)
	}
	if p.cfg.FailureCallbackURL != "" {
		h["Upstash-Failure-Callback"] = p.cfg.FailureCallbackURL
		if m.Probe {
			h["Upstash-Failure-Callback-Retries"] = "3"
		}
	}
	it := refItem{Destination: p.MessageDestination(m), Headers: h, Body: string(m.Payload)}
	if p.cfg.Ordering == publish.OrderingFIFO {
		it.Queue = p.queueName(m.PartitionKey)
		h["Upstash-Forward-X-Outbox-Ordering"] = "fifo"
	} else if p.flow != "" && m.PartitionKey != "" {
		h["Upstash-Flow-Control-Key"] = flowControlKey(p.cfg.Name, m.PartitionKey)
		h["Upstash-Flow-Control-Value"] = p.flow
	}
	return it
}

// TestBatchItemEncoding: the hand-written batch item decodes to exactly the value
// encoding/json wrote, for payloads and headers with quotes, backslashes, control
// characters, non-ASCII, U+2028 and invalid UTF-8, in both orderings, and an event header
// named like the relay's own loses to it. A circuit's probe goes with Upstash-Retries 0.
func TestBatchItemEncoding(t *testing.T) {
	t.Parallel()
	pieces := []string{"a", "Z", "0", " ", `"`, `\`, "/", "\n", "\r", "\t", "\x00", "\x1f", "\x7f", "<", ">", "&",
		"é", "€", "😀", "\u2028", "\xff", "\xc3", "\xed\xa0\x80", `{"k":"v\"q"}`}
	rng := rand.New(rand.NewPCG(1, 2))
	// Header values may not hold control characters other than tab (validHeaderValue).
	valuePieces := slices.DeleteFunc(slices.Clone(pieces), func(s string) bool { return !validHeaderValue(s) })
	pick := func(from []string, n int) string {
		s := ""
		for range rng.IntN(n) {
			s += from[rng.IntN(len(from))]
		}
		return s
	}
	text := func(n int) string { return pick(pieces, n) }
	topics := []string{"orders.created", "orders.created", "billing~paid", "billing.paid"}
	names := []string{"Traceparent", "X-Tenant", "X-Outbox-Id", "X-Outbox-Generation", "A", "zz-Last"}
	pubs := []PublisherConfig{
		{Retries: 3, FlowControlParallelism: 1, FailureCallbackURL: "https://cb.example/fail?x=1&y=\"2\"", RetryDelay: 20 * time.Second},
		{Ordering: publish.OrderingFIFO, Name: "blue"},
	}
	for _, cfg := range pubs {
		cfg.BaseURL, cfg.Token, cfg.DestinationBaseURL = "http://127.0.0.1:1", "t", "https://hooks.example.com/base"
		p, err := NewPublisher(cfg)
		if err != nil {
			t.Fatal(err)
		}
		// One encodeNames for the whole run, as for one Publish call: a name kept from the
		// previous message must never leak into the next one's item.
		var cache encodeNames
		prevKey := ""
		for i := range 2000 {
			m := outbox.Message{ID: outbox.ID(i + 1), Topic: topics[rng.IntN(len(topics))], PartitionKey: "key-" + text(6),
				Payload: []byte(text(40)), Generation: rng.IntN(3), Headers: map[string]string{}, Probe: rng.IntN(4) == 0}
			if m.PartitionKey == "key-" {
				m.PartitionKey = ""
			}
			if i > 0 && rng.IntN(2) == 0 { // a key's run, as in a claimed batch
				m.PartitionKey = prevKey
			}
			prevKey = m.PartitionKey
			for range rng.IntN(4) {
				m.Headers[names[rng.IntN(len(names))]] = pick(valuePieces, 8)
			}
			data, err := p.encode(nil, &cache, i, m)
			if err != nil {
				t.Fatal(err)
			}
			var got, want refItem
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatalf("message %d: %v in %q", i, err, data)
			}
			ref, err := json.Marshal(refEncode(p, m))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(ref, &want); err != nil {
				t.Fatal(err)
			}
			if !utf8.Valid(data) {
				t.Fatalf("message %d: item is not UTF-8 (RFC 8259 §8.1): %q", i, data)
			}
			if dup := duplicateHeader(t, data); dup != "" {
				t.Fatalf("message %d: header %q written twice in %q", i, dup, data)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("message %d (%+v):\n got %+v\nwant %+v\n raw %q", i, m, got, want, data)
			}
		}
	}
}

// duplicateHeader returns a name the item's headers object holds twice (json.Unmarshal
// would keep the last silently), or "".
func duplicateHeader(t *testing.T, item []byte) string {
	t.Helper()
	var raw struct{ Headers json.RawMessage }
	if err := json.Unmarshal(item, &raw); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw.Headers))
	seen := map[string]bool{}
	if _, err := dec.Token(); err != nil { // {
		t.Fatal(err)
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		if seen[k.(string)] {
			return k.(string)
		}
		seen[k.(string)] = true
		if _, err := dec.Token(); err != nil {
			t.Fatal(err)
		}
	}
	return ""
}

// roundTripFunc is an http.RoundTripper from a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestBatchBodyResendable: the /v2/batch request declares its length and GetBody gives
// the same bytes again (the transport resends a request whose kept-alive connection the
// server had closed only then), and the bytes are the items as one JSON array.
func TestBatchBodyResendable(t *testing.T) {
	t.Parallel()
	var seen int
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		first, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		if r.GetBody == nil {
			t.Fatal("no GetBody: the transport could not resend the request")
		}
		again, err := r.GetBody()
		if err != nil {
			return nil, err
		}
		second, _ := io.ReadAll(again)
		var items []refItem
		if err := json.Unmarshal(first, &items); err != nil || int64(len(first)) != r.ContentLength || !bytes.Equal(first, second) {
			t.Fatalf("body %q (err %v), length %d declared %d, resent %q", first, err, len(first), r.ContentLength, second)
		}
		seen += len(items)
		out := make([]string, len(items))
		for i := range out {
			out[i] = `{"messageId":"msg_` + strconv.Itoa(i) + `"}`
		}
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("[" + strings.Join(out, ",") + "]"))}, nil
	})}
	p, err := NewPublisher(PublisherConfig{BaseURL: "http://127.0.0.1:1", Token: "t", DestinationBaseURL: "https://hooks.example.com", HTTPClient: client})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []outbox.Message{{ID: 1, Topic: "t", PartitionKey: "a", Payload: []byte(`{"n":1}`)}, {ID: 2, Topic: "t", PartitionKey: "b", Payload: []byte(`{"n":"\"2\""}`)}}
	for i, r := range p.Publish(context.Background(), msgs) {
		if r.Err != nil || r.MessageID == "" {
			t.Fatalf("message %d: %+v", i, r)
		}
	}
	if seen != len(msgs) {
		t.Fatalf("%d items sent, want %d", seen, len(msgs))
	}
}

// BenchmarkBatchItem: one batch item of a 300-byte payload with a trace header, written by
// hand (the relay's) and by encoding/json from the header map (as it was written before).
func BenchmarkBatchItem(b *testing.B) {
	p, err := NewPublisher(PublisherConfig{BaseURL: "http://127.0.0.1:1", Token: "t", DestinationBaseURL: "https://hooks.example.com",
		FlowControlParallelism: 1, FailureCallbackURL: "https://hooks.example.com/qstash/failure"})
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"order_id":"ord_` + strings.Repeat("7", 20) + `","customer":"cus_42","items":[{"sku":"sku-1","qty":2,"price_cents":1999},{"sku":"sku-2","qty":1,"price_cents":4999}],"note":"leave at the \"side\" door","currency":"EUR","total_cents":8997,"created_at":"2026-12-03T12:00:00Z"}`)
	m := outbox.Message{ID: 123456, Topic: "orders.created", PartitionKey: "cus_42", Payload: payload,
		Headers: map[string]string{"Traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		var names encodeNames
		for range b.N {
			buf, _ = p.encode(buf[:0], &names, 0, m)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := json.Marshal(refEncode(p, m)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
