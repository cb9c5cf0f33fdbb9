package qstash

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// lateTransport answers every request at once and leaves its body unread, as a transport
// may after an early answer; the test reads the bodies later.
type lateTransport struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (t *lateTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.mu.Lock()
	t.reqs = append(t.reqs, req)
	t.mu.Unlock()
	return oneAccepted(req), nil
}

// oneAccepted is a batch answer accepting one message.
func oneAccepted(req *http.Request) *http.Response {
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(`[{"messageId":"msg_1"}]`)), ContentLength: -1, Request: req}
}

// transportPublisher is a Publisher whose requests go to tr.
func transportPublisher(t *testing.T, tr http.RoundTripper) *Publisher {
	t.Helper()
	p, err := NewPublisher(PublisherConfig{BaseURL: "http://127.0.0.1:1", Token: "t", DestinationBaseURL: "https://hooks.example.com",
		HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// msg is a one-message call whose 64-byte payload repeats c.
func msg(id int, c byte) []outbox.Message {
	return []outbox.Message{{ID: outbox.ID(id), Topic: "t", PartitionKey: "k", Payload: []byte(strings.Repeat(string(c), 64))}}
}

// A body the transport is still writing after Publish returned keeps its arena: the next
// call must not encode over bytes on their way to QStash.
func TestArenaOutlivesAnEarlyAnswer(t *testing.T) {
	tr := &lateTransport{}
	p := transportPublisher(t, tr)
	first := p.Publish(context.Background(), msg(1, 'a'))
	for range 20 { // more calls while the first body is unread
		p.Publish(context.Background(), msg(2, 'b'))
	}
	if first[0].Err != nil {
		t.Fatal(first[0].Err)
	}
	// Checked directly too: the pool may or may not have handed the arena out again.
	if a := tr.reqs[0].Body.(*arenaBody).arena; a.refs() != 1 {
		t.Fatalf("the first call's arena has %d references with its body unread, want 1", a.refs())
	}
	for i, req := range tr.reqs {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 && (!strings.Contains(string(b), strings.Repeat("a", 64)) || !strings.Contains(string(b), "outbox_id=1&")) {
			t.Fatalf("the first request's body was overwritten after Publish returned: %s", b)
		}
	}
}

func TestArenaBodyReadsNothingAfterClose(t *testing.T) {
	var stock buffers
	a := stock.arena()
	item := a.add([]byte("abc"))
	b, err := a.body([][]byte{item})
	if err != nil {
		t.Fatal(err)
	}
	if a.refs() != 2 {
		t.Fatalf("refs %d with the call and one body", a.refs())
	}
	a.release() // the call returns; the body still holds the arena
	if a.refs() != 1 || a.used != 1 {
		t.Fatalf("arena released with a body open: refs %d, %d blocks in use", a.refs(), a.used)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	_ = b.Close() // a second Close releases nothing more
	if a.refs() != 0 {
		t.Fatalf("refs %d after the last close", a.refs())
	}
	if _, err := a.body([][]byte{item}); !errors.Is(err, errArenaReleased) {
		t.Fatalf("a body from a released arena: %v", err)
	}
	if n, err := b.Read(make([]byte, 8)); n != 0 || !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("read after close: %d, %v", n, err)
	}
}

// The point of the stock: a call after another finds the arena it left (the race detector
// makes sync.Pool drop a quarter of what it is given, hence several tries).
func TestArenaIsReused(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `[{"messageId":"msg_1"}]`)
	}))
	defer srv.Close()
	p, err := NewPublisher(PublisherConfig{BaseURL: srv.URL, Token: "t", DestinationBaseURL: "https://hooks.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []outbox.Message{{ID: 1, Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)}}
	for range 10 {
		if r := p.Publish(context.Background(), msgs); r[0].Err != nil {
			t.Fatal(r[0].Err)
		}
		if a, _ := p.bufs.arenas.Get().(*arena); a != nil {
			if a.refs() != 0 || a.used != 0 {
				t.Fatalf("an arena in the stock with %d references and %d blocks in use", a.refs(), a.used)
			}
			return
		}
	}
	t.Fatal("no arena came back to the stock in 10 calls")
}

// Items never overlap, whatever their sizes: small ones share a block, one larger than a
// block gets its own, and a reused arena's blocks are refilled from the start.
func TestArenaKeepsItemsApart(t *testing.T) {
	var stock buffers
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 3 {
		a := stock.arena()
		var items [][]byte
		var want []string
		for i := range 400 {
			n := rng.IntN(3000)
			if i%97 == 0 {
				n = arenaBlock + rng.IntN(arenaBlock)
			}
			item := bytes.Repeat([]byte{byte('a' + i%26)}, n)
			items = append(items, a.add(item))
			want = append(want, string(item))
		}
		for i := range items {
			if string(items[i]) != want[i] || cap(items[i]) != len(items[i]) {
				t.Fatalf("round %d: item %d changed or can grow into its neighbour (len %d cap %d)", round, i, len(items[i]), cap(items[i]))
			}
		}
		if used := a.size(); used > 2*(400*1500+5*2*arenaBlock) {
			t.Fatalf("round %d: arena holds %d bytes", round, used)
		}
		a.release()
	}
}

// reuseTransport answers every request at once, after reading its body, and asks an
// earlier call's request for its body again (GetBody) from inside the first later request
// whose body comes from the same arena: a late retry while another call holds the arena.
type reuseTransport struct {
	first    *http.Request
	seen     map[*arena]*http.Request // each arena's last request, from an earlier call
	reused   bool
	late     error // GetBody's error at that moment
	lateBody string
}

func (t *reuseTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if _, err := io.Copy(io.Discard, req.Body); err != nil {
		return nil, err
	}
	req.Body.Close()
	if t.first == nil {
		t.first, t.seen = req, map[*arena]*http.Request{}
	}
	a := req.Body.(*arenaBody).arena
	if prev, ok := t.seen[a]; ok && !t.reused {
		t.reused = true
		late, err := prev.GetBody()
		t.late = err
		if err == nil {
			lb, _ := io.ReadAll(late)
			late.Close()
			t.lateBody = string(lb)
		}
	}
	t.seen[a] = req
	return oneAccepted(req), nil
}

// A body asked for after its call returned is refused, also once a later call has taken
// the same arena from the stock (its references are then back at 1): before the epoch it
// was handed the later call's bytes.
func TestLateGetBodyRefusedAfterReuse(t *testing.T) {
	tr := &reuseTransport{}
	p := transportPublisher(t, tr)
	if r := p.Publish(context.Background(), msg(1, 'a')); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	// The call returned: its arena is back in the stock (or dropped by it).
	if _, err := tr.first.GetBody(); !errors.Is(err, errArenaReleased) {
		t.Fatalf("GetBody after the call returned: %v, want errArenaReleased", err)
	}
	// The race detector makes sync.Pool drop a quarter of what it is given: try until a
	// later call gets an earlier call's arena.
	for i := 0; i < 100 && !tr.reused; i++ {
		if r := p.Publish(context.Background(), msg(2+i, 'b')); r[0].Err != nil {
			t.Fatal(r[0].Err)
		}
	}
	if !tr.reused {
		t.Fatal("no later call reused an earlier call's arena in 100 calls")
	}
	if !errors.Is(tr.late, errArenaReleased) {
		t.Fatalf("GetBody of an earlier request while a later call held its arena: err %v, body %q; want errArenaReleased", tr.late, tr.lateBody)
	}
}
