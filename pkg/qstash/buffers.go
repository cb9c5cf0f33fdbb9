package qstash

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// Every Publish call encodes its messages into one buffer and reads each answer into
// another. Profiled at batch 1,000, these two were half of everything the relay
// allocated, so the Publisher reuses them.

// buffers is a Publisher's stock of encode arenas and response buffers.
type buffers struct {
	arenas    sync.Pool // *arena
	responses sync.Pool // *bytes.Buffer
}

// arena holds one Publish call's batch items, packed into blocks of arenaBlock bytes.
// Each item is encoded into scratch first and then copied whole into a block, so the
// arena holds what the items take plus part of one block, where one buffer sized in
// advance had to allow for escapes it rarely needed (1.4 times the items' size, measured
// on ~300-byte JSON payloads). With 8 batches of 1,000 in flight that was 4 MB of the
// relay's heap.
//
// The transport may still be writing a request body after the response has arrived
// (http.RoundTripper closes the body "even after RoundTrip returns"), so the arena is
// reused only once the call has returned and every body written from it is closed.
type arena struct {
	blocks  [][]byte // blocks[:used] hold items; the rest are kept for reuse
	used    int
	scratch []byte
	refs    atomic.Int32
	stock   *buffers
}

const arenaBlock = 64 << 10

// arena returns an empty arena held once for the Publish call (release it when the call
// returns).
func (b *buffers) arena() *arena {
	a, _ := b.arenas.Get().(*arena)
	if a == nil {
		a = &arena{stock: b}
	}
	a.refs.Store(1)
	return a
}

// add copies item into the arena and returns the copy, which no later add can overwrite.
func (a *arena) add(item []byte) []byte {
	if a.used > 0 {
		if b := a.blocks[a.used-1]; cap(b)-len(b) >= len(item) {
			start := len(b)
			b = append(b, item...)
			a.blocks[a.used-1] = b
			return b[start:len(b):len(b)]
		}
	}
	if a.used == len(a.blocks) {
		a.blocks = append(a.blocks, nil)
	}
	b := a.blocks[a.used]
	if cap(b) < len(item) {
		b = make([]byte, 0, max(arenaBlock, len(item)))
	}
	b = append(b[:0], item...)
	a.blocks[a.used] = b
	a.used++
	return b[:len(b):len(b)]
}

// size is the memory the arena holds.
func (a *arena) size() int {
	n := cap(a.scratch)
	for _, b := range a.blocks {
		n += cap(b)
	}
	return n
}

// hold takes one more reference, unless the arena is already back in the stock (a
// transport asking for a body after the call ended; the standard ones never do).
func (a *arena) hold() bool {
	for {
		n := a.refs.Load()
		if n <= 0 {
			return false
		}
		if a.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// largestKeptArena bounds the arenas the stock keeps (a batch of large payloads is left to
// the garbage collector rather than held between calls).
const largestKeptArena = 16 << 20

func (a *arena) release() {
	if a.refs.Add(-1) == 0 && a.size() <= largestKeptArena {
		for i := range a.blocks[:a.used] {
			a.blocks[i] = a.blocks[i][:0]
		}
		a.used = 0
		a.stock.arenas.Put(a)
	}
}

// arenaBody is one request body written from an arena's items. After Close it reads
// nothing more, so a reused arena is never sent.
type arenaBody struct {
	mu     sync.Mutex
	bufs   net.Buffers
	arena  *arena
	closed bool
}

func (a *arena) body(parts net.Buffers) (io.ReadCloser, error) {
	if !a.hold() {
		return nil, errArenaReleased
	}
	return &arenaBody{bufs: parts, arena: a}, nil
}

var errArenaReleased = errors.New("request body asked for after the publish call returned")

func (b *arenaBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, io.ErrClosedPipe
	}
	return b.bufs.Read(p)
}

func (b *arenaBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		b.bufs = nil
		b.arena.release()
	}
	return nil
}

// readResponse reads up to limit bytes of resp's body into a buffer from the stock; put
// it back with putResponse once nothing refers to its bytes.
func (b *buffers) readResponse(resp *http.Response, limit int64) (*bytes.Buffer, error) {
	buf, _ := b.responses.Get().(*bytes.Buffer)
	if buf == nil {
		buf = new(bytes.Buffer)
	}
	buf.Reset()
	if n := resp.ContentLength; n > 0 && n < limit {
		buf.Grow(int(n) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(io.LimitReader(resp.Body, limit))
	return buf, err
}

// largestKeptResponse bounds what the stock keeps: an answer far larger than a batch's
// (an error page, say) is left to the garbage collector.
const largestKeptResponse = 1 << 20

func (b *buffers) putResponse(buf *bytes.Buffer) {
	if buf.Cap() <= largestKeptResponse {
		b.responses.Put(buf)
	}
}
