package chaos

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"

	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// Fault kinds, as reported in Report.Faults.
const (
	FaultCrashBeforePublish  = "relay_crash_before_publish"
	FaultCrashAfterPublish   = "relay_crash_after_publish"
	FaultSlowPublish         = "relay_slow_publish_past_lease"
	FaultPublish500          = "publish_500"
	FaultPublish429          = "publish_429"
	FaultPublishReset        = "publish_connection_reset"
	FaultPublishDropResponse = "publish_accepted_response_dropped"
	FaultDeliveryDuplicate   = "delivery_duplicated"
	FaultDeliveryDelay       = "delivery_delayed"
	FaultConsumer500Before   = "consumer_500_before_effect"
	FaultConsumer500After    = "consumer_500_after_effect"
	FaultConsumerAckLost     = "consumer_ack_lost_after_commit"
	FaultDBKill              = "db_relay_backends_terminated"
	// FaultKillInFlight: a relay "process" dies while several of its batches are in
	// flight (pipelining): none of them is marked, whether its publish went out or not.
	FaultKillInFlight = "relay_killed_with_batches_in_flight"
	// FaultConsumerOutage counts deliveries refused (500) during Faults.ConsumerOutage; a
	// kind of the report only when an outage is configured.
	FaultConsumerOutage = "consumer_outage_deliveries_refused"
	// Kick faults, kinds of the report in the deployed shape only (Options.Lambda).
	FaultKickNotSent = "kick_not_sent_producer_died"
	FaultKickLost    = "kick_accepted_then_lost"
	FaultKickRefused = "kick_refused_429_500"
)

// kickFaultKinds are the deployed shape's own fault kinds.
var kickFaultKinds = []string{FaultKickNotSent, FaultKickLost, FaultKickRefused}

var faultKinds = []string{
	FaultCrashBeforePublish, FaultCrashAfterPublish, FaultSlowPublish,
	FaultPublish500, FaultPublish429, FaultPublishReset, FaultPublishDropResponse,
	FaultDeliveryDuplicate, FaultDeliveryDelay,
	FaultConsumer500Before, FaultConsumer500After, FaultConsumerAckLost, FaultDBKill, FaultKillInFlight,
}

// Random streams: every fault source draws from its own PCG stream of the seed, so a
// source's decisions do not depend on how often the others drew.
const (
	streamProducer uint64 = 1 << 32 * (iota + 1)
	streamRelay
	streamConsumer
	streamQStashFront
	streamDBKill
	streamKick
	streamPause
)

func newRand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }

// injector holds the fault switch, the per-kind counters and the time of the last fault.
type injector struct {
	kinds  []string
	on     atomic.Bool
	counts sync.Map // kind -> *atomic.Int64
	last   atomic.Int64
}

func newInjector(extra ...string) *injector {
	in := &injector{kinds: append(append([]string(nil), faultKinds...), extra...)}
	for _, k := range in.kinds {
		in.counts.Store(k, new(atomic.Int64))
	}
	return in
}

func (in *injector) add(kind string, n int64) {
	c, _ := in.counts.Load(kind)
	c.(*atomic.Int64).Add(n)
	now := time.Now().UnixNano()
	for {
		old := in.last.Load()
		if now <= old || in.last.CompareAndSwap(old, now) {
			return
		}
	}
}

func (in *injector) snapshot() map[string]int64 {
	out := make(map[string]int64, len(in.kinds))
	for _, k := range in.kinds {
		c, _ := in.counts.Load(k)
		out[k] = c.(*atomic.Int64).Load()
	}
	return out
}

func (in *injector) lastFault() time.Time {
	if n := in.last.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// faultyPublisher is one relay "process"'s publisher: it kills the batch's goroutine (by
// runtime.Goexit, so nothing after the publish runs: no mark, no release) before or after
// publishing, holds the publish past the lease, or kills the whole "process" while
// several batches are in flight: every Publish call in flight or still to come ends in
// Goexit, so none of those batches is marked. A pipelined relay calls Publish from one
// goroutine per batch in flight, so rng is locked.
type faultyPublisher struct {
	inner relay.Publisher
	f     Faults
	in    *injector
	hold  time.Duration
	stop  context.Context

	mu  sync.Mutex
	rng *rand.Rand
	// armed: the kill was drawn; it strikes at the first publish that finds another
	// batch of this relay in flight (a trickle of events rarely pipelines).
	armed    bool
	inFlight atomic.Int32
	dead     atomic.Bool
	// calls counts Publish calls: an invocation that made one claimed events.
	calls atomic.Int64
}

func (p *faultyPublisher) Publish(ctx context.Context, msgs []outbox.Message) []publish.Result {
	p.calls.Add(1)
	if p.dead.Load() {
		runtime.Goexit() // the process is gone
	}
	if !p.in.on.Load() {
		return p.inner.Publish(ctx, msgs)
	}
	p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	p.mu.Lock()
	x := p.rng.Float64()
	if p.rng.Float64() < p.f.KillInFlight {
		p.armed = true
	}
	kill := p.armed && p.inFlight.Load() >= 2
	p.mu.Unlock()
	if kill {
		// The other batches in flight die where they stand: on their way in or out of
		// their own publish (a publish that went out is never marked).
		p.dead.Store(true)
		p.in.add(FaultKillInFlight, 1)
		p.inner.Publish(ctx, msgs)
		runtime.Goexit()
	}
	res := p.publish(ctx, msgs, x)
	if p.dead.Load() {
		runtime.Goexit() // the process died while this publish was in flight
	}
	return res
}

// now is the relay's clock for this "process": once the process is killed, a goroutine
// of it that reads the clock (the drain loop before a claim, a batch before its mark)
// ends there.
func (p *faultyPublisher) now(clock func() time.Time) func() time.Time {
	return func() time.Time {
		if p.dead.Load() {
			runtime.Goexit()
		}
		return clock()
	}
}

// publish draws the per-batch faults with x.
func (p *faultyPublisher) publish(ctx context.Context, msgs []outbox.Message, x float64) []publish.Result {
	switch f := p.f; {
	case x < f.CrashBeforePublish:
		p.in.add(FaultCrashBeforePublish, 1)
		runtime.Goexit()
	case x < f.CrashBeforePublish+f.CrashAfterPublish:
		p.inner.Publish(ctx, msgs)
		p.in.add(FaultCrashAfterPublish, 1)
		runtime.Goexit()
	case x < f.CrashBeforePublish+f.CrashAfterPublish+f.SlowPublish:
		p.in.add(FaultSlowPublish, 1)
		t := time.NewTimer(p.hold)
		select {
		case <-t.C:
		case <-p.stop.Done():
			t.Stop()
		}
		// The relay's own publish deadline has passed; a stuck client that finally sends
		// is what this models, so the request goes out regardless.
		return p.inner.Publish(context.WithoutCancel(ctx), msgs)
	}
	return p.inner.Publish(ctx, msgs)
}

// qstashFront sits in front of the local QStash server: it resets the TCP connection of
// some batch requests before QStash sees them, and counts the faults QStash itself
// injects (500, 429, accepted-then-dropped) from what QStash answers.
type qstashFront struct {
	inner http.Handler
	in    *injector
	rate  float64
	mu    sync.Mutex
	rng   *rand.Rand
}

func (q *qstashFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v2/batch" {
		q.inner.ServeHTTP(w, r)
		return
	}
	if q.in.on.Load() && q.rate > 0 {
		q.mu.Lock()
		reset := q.rng.Float64() < q.rate
		q.mu.Unlock()
		if reset && resetConn(w) {
			q.in.add(FaultPublishReset, 1)
			return
		}
	}
	q.inner.ServeHTTP(&countingWriter{ResponseWriter: w, in: q.in}, r)
}

// resetConn closes the client's connection with SO_LINGER 0, which sends a TCP RST.
func resetConn(w http.ResponseWriter) bool {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return false
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return false
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
	return true
}

// countingWriter counts QStash's injected publish faults as they are answered. The local
// server answers 500 and 429 only when injecting, and hijacks a connection only to drop
// an accepted request's response.
type countingWriter struct {
	http.ResponseWriter
	in *injector
}

func (c *countingWriter) WriteHeader(code int) {
	switch code {
	case http.StatusInternalServerError:
		c.in.add(FaultPublish500, 1)
	case http.StatusTooManyRequests:
		c.in.add(FaultPublish429, 1)
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *countingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := c.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("chaos: response writer cannot hijack")
	}
	c.in.add(FaultPublishDropResponse, 1)
	return hj.Hijack()
}

// consumerFault is drawn once per delivery and carried to the handler in the context.
type consumerFault int

const (
	noConsumerFault consumerFault = iota
	fail500Before
	fail500After
	ackLost
)

type consumerFaultKey struct{}

// errInjected is the transient error of an injected consumer failure.
var errInjected = errors.New("chaos: injected transient consumer failure")

// consumerFront delays some deliveries, draws the consumer fault of each, and refuses
// every delivery while the consumer outage lasts (down to up).
type consumerFront struct {
	inner    http.Handler
	in       *injector
	f        Faults
	stop     context.Context
	down, up time.Time
	mu       sync.Mutex
	rng      *rand.Rand
}

func (c *consumerFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !c.in.on.Load() || r.Method != http.MethodPost || len(r.URL.Path) < len("/events/") || r.URL.Path[:len("/events/")] != "/events/" {
		c.inner.ServeHTTP(w, r)
		return
	}
	if now := time.Now(); now.After(c.down) && now.Before(c.up) {
		c.in.add(FaultConsumerOutage, 1)
		http.Error(w, "chaos: consumer down", http.StatusInternalServerError)
		return
	}
	c.mu.Lock()
	var hold time.Duration
	if c.f.DeliveryDelay > 0 && c.rng.Float64() < c.f.DeliveryDelay {
		hold = time.Duration(c.rng.Int64N(int64(c.f.MaxDeliveryDelay)) + 1)
	}
	x := c.rng.Float64()
	c.mu.Unlock()
	fault := noConsumerFault
	switch f := c.f; {
	case x < f.Consumer500Before:
		fault = fail500Before
	case x < f.Consumer500Before+f.Consumer500After:
		fault = fail500After
	case x < f.Consumer500Before+f.Consumer500After+f.ConsumerAckLost:
		fault = ackLost
	}
	if hold > 0 {
		c.in.add(FaultDeliveryDelay, 1)
		t := time.NewTimer(hold)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
	}
	r = r.WithContext(context.WithValue(r.Context(), consumerFaultKey{}, fault))
	if fault != ackLost {
		c.inner.ServeHTTP(w, r)
		return
	}
	// Let the handler commit, then lose its answer: QStash sees a 500 and redelivers.
	buf := &bufferedWriter{header: http.Header{}}
	c.inner.ServeHTTP(buf, r)
	if buf.status == http.StatusOK {
		c.in.add(FaultConsumerAckLost, 1)
		http.Error(w, "chaos: response lost", http.StatusInternalServerError)
		return
	}
	for k, vs := range buf.header {
		w.Header()[k] = vs
	}
	w.WriteHeader(buf.status)
	_, _ = w.Write(buf.body.Bytes())
}

type bufferedWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header { return b.header }
func (b *bufferedWriter) WriteHeader(code int) {
	b.status = cmp.Or(b.status, code)
}
func (b *bufferedWriter) Write(p []byte) (int, error) {
	b.status = cmp.Or(b.status, http.StatusOK)
	return b.body.Write(p)
}

// faultyHandler wraps the consumer's handler with the drawn fault: fail before the side
// effect, or apply it and then fail (the inbox transaction must roll it back).
func faultyHandler(in *injector, next webhook.HandlerFunc) webhook.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		fault, _ := ctx.Value(consumerFaultKey{}).(consumerFault)
		if fault == fail500Before {
			in.add(FaultConsumer500Before, 1)
			return errInjected
		}
		if err := next(ctx, tx, d); err != nil {
			return err
		}
		if fault == fail500After {
			in.add(FaultConsumer500After, 1)
			return errInjected
		}
		return nil
	}
}

// dbKiller terminates every backend of one random relay pool, DBKillsPerSecond times a
// second on average, through admin (a pool the relays do not use).
func dbKiller(ctx context.Context, admin outbox.Querier, appNames []string, rate float64, seed uint64, in *injector) {
	if rate <= 0 || len(appNames) == 0 {
		return
	}
	const tick = 50 * time.Millisecond
	p := rate * tick.Seconds()
	rng := newRand(seed, streamDBKill)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !in.on.Load() || rng.Float64() >= p {
			continue
		}
		var n int64
		if err := admin.QueryRow(ctx, qTerminate, appNames[rng.IntN(len(appNames))]).Scan(&n); err == nil && n > 0 {
			in.add(FaultDBKill, n)
		}
	}
}

// FaultKinds lists the fault kinds of Report.Faults in a fixed order.
func FaultKinds() []string { return append([]string(nil), faultKinds...) }

// KickFaultKinds lists the deployed shape's own fault kinds (Options.Lambda).
func KickFaultKinds() []string { return append([]string(nil), kickFaultKinds...) }
