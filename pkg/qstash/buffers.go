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
//
// A body asked for late (GetBody after the call returned) must never carry another call's
// bytes, so the guard is exact: state packs the arena's epoch (high 32 bits), bumped each
// time the arena leaves the stock, with its reference count (low 32 bits) in one atomic
// word, and a body is handed out only while the epoch is still the one its call was given
// and a reference is held. Counting references alone let a late GetBody in: the next
// call's arena() set the count back to 1 and the stale request took that call's bytes.
type arena struct {
	blocks  [][]byte // blocks[:used] hold items; the rest are kept for reuse
	used    int
	scratch []byte
	state   atomic.Uint64 // epoch<<32 | refs
	stock   *buffers
}

// lease is one Publish call's hold on an arena: the arena and the epoch it was taken in.
type lease struct {
	*arena
	epoch uint32
}

func (a *arena) refs() uint32  { return uint32(a.state.Load()) }
func (a *arena) epoch() uint32 { return uint32(a.state.Load() >> 32) }

const arenaBlock = 64 << 10

// arena returns an empty arena held once for the Publish call, in a new epoch (release
// it when the call returns). The epoch wraps after 2^32 reuses of one arena; a body
// closure kept that long is not a case worth a wider word.
func (b *buffers) arena() lease {
	a, _ := b.arenas.Get().(*arena)
	if a == nil {
		a = &arena{stock: b}
	}
	// Nothing else holds an arena taken from the stock (its references are 0, and a late
	// body of an older epoch cannot take one), so a plain store is enough.
	e := a.epoch() + 1
	a.state.Store(uint64(e)<<32 | 1)
	return lease{a, e}
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

// hold takes one more reference for epoch e, unless the arena has left that epoch: it is
// back in the stock or already serving a later call (a transport asking for a body after
// the call ended; the standard ones never do).
func (a *arena) hold(e uint32) bool {
	for {
		s := a.state.Load()
		if uint32(s>>32) != e || uint32(s) == 0 {
			return false
		}
		if a.state.CompareAndSwap(s, s+1) {
			return true
		}
	}
}

// largestKeptArena bounds the arenas the stock keeps (a batch of large payloads is left to
// the garbage collector rather than held between calls).
const largestKeptArena = 16 << 20

func (a *arena) release() {
	// Only a holder releases, so the count is positive and the decrement never borrows
	// from the epoch.
	if uint32(a.state.Add(^uint64(0))) == 0 && a.size() <= largestKeptArena {
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

// body returns a request body over parts for the call that holds l; it fails once that
// call's epoch has ended.
func (l lease) body(parts net.Buffers) (io.ReadCloser, error) {
	a := l.arena
	if !a.hold(l.epoch) {
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
