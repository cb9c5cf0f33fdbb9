package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig/relayenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/lambdasvc"
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/internal/relayfunc"
	"github.com/outbox-relay/outbox-relay/v3/pkg/kick"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// Defaults for Lambda.
const (
	// DefaultBackstop is the schedule's period in real time: the template's is a minute,
	// and the run's clock is compressed.
	DefaultBackstop = 2 * time.Second
	// DefaultLambdaIdleGap is the relay function's IDLE_GAP in a run: relayenv's default
	// (1 s) compressed, as the backstop is.
	DefaultLambdaIdleGap = 250 * time.Millisecond
	// DefaultPauseRate: see Lambda.PauseRate.
	DefaultPauseRate = 0.05
	// DefaultLambdaTimeout is the relay function's timeout: above the relay's deadline
	// margin (publish + mark timeout, 10 s here) and the handler's reserve (2 s).
	DefaultLambdaTimeout = 30 * time.Second
)

// Lambda is the deployed shape of a run. Relays is the relay function's reserved
// concurrency; each execution environment is a relay "process" (its own faulty publisher,
// the pool of a free slot) running the relay function's own handler (internal/relayfunc),
// as the built function does: a kick drains and stays the idle gap, a scheduled tick
// drains until short, a kick whose commit an earlier invocation claimed is answered
// without a session, and no session outlives an invocation. An environment the faults
// kill is replaced at the next invocation, as Lambda replaces a crashed runtime. The
// environments run behind the local Lambda service (internal/lambdasvc: reserved
// concurrency, the asynchronous queue and its retries of throttled events). Each producer
// commits through outbox.BeginFunc with a kick.Kicker of its own, which invokes the
// function through the Invoke API (asynchronously, coalesced, reading the relays'
// promises), and the schedule invokes it every Backstop.
type Lambda struct {
	// Backstop is the schedule's period. Default DefaultBackstop.
	Backstop time.Duration
	// IdleGap is the function's IDLE_GAP, and the kickers' Interval. Default
	// DefaultLambdaIdleGap.
	IdleGap time.Duration
	// PauseRate: after a transaction, a producer pauses with this probability, for up to
	// twice the idle gap, so relays go idle and return and the next commits need a kick
	// (producers that never pause are covered by the relays' promises and send almost
	// none). Default DefaultPauseRate; negative: never.
	PauseRate float64
	// Timeout is the function timeout. Default DefaultLambdaTimeout.
	Timeout time.Duration
}

func (l *Lambda) withDefaults() {
	if l.Backstop == 0 {
		l.Backstop = DefaultBackstop
	}
	if l.IdleGap == 0 {
		l.IdleGap = DefaultLambdaIdleGap
	}
	if l.PauseRate == 0 {
		// Negative stays: never (so defaults applied twice give the same answer).
		l.PauseRate = DefaultPauseRate
	}
	if l.Timeout == 0 {
		l.Timeout = DefaultLambdaTimeout
	}
}

func (l *Lambda) validate() []error {
	var errs []error
	if l.Backstop < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("chaos options Lambda.Backstop: %v is below 10ms", l.Backstop))
	}
	if l.IdleGap < 0 {
		errs = append(errs, fmt.Errorf("chaos options Lambda.IdleGap: %v is negative", l.IdleGap))
	}
	if l.PauseRate > 1 {
		errs = append(errs, fmt.Errorf("chaos options Lambda.PauseRate: %v is above 1", l.PauseRate))
	}
	if l.Timeout < 15*time.Second {
		errs = append(errs, fmt.Errorf("chaos options Lambda.Timeout: %v leaves the drain no time (the relay's deadline margin is 10s, the handler's reserve 2s): at least 15s", l.Timeout))
	}
	return errs
}

// LambdaReport is what the deployed shape did in a run.
type LambdaReport struct {
	BackstopSeconds float64 `json:"backstop_seconds"`
	IdleGapSeconds  float64 `json:"idle_gap_seconds"`
	// Invocations by trigger: a producer's kick or the schedule's tick.
	KickInvocations int64 `json:"kick_invocations"`
	TickInvocations int64 `json:"tick_invocations"`
	// Coalesced kicks were answered without a drain: an earlier invocation of their
	// environment had claimed their commit.
	Coalesced int64 `json:"coalesced_kicks"`
	// TicksThatClaimed: scheduled invocations that claimed events (handed a batch to the
	// publisher), whether or not a kick would have woken a relay for them. With every
	// kick lost they are what delivered the events.
	TicksThatClaimed int64 `json:"ticks_that_claimed"`
	// FunctionErrors are invocations that returned an error (a drain that failed: a
	// killed connection); died environments are the report's RelayRestarts.
	FunctionErrors int64 `json:"function_errors"`
	// The local Lambda service: events accepted (202), throttled events retried, events
	// dropped (aged out, or still queued at the end), environments started (cold starts).
	Accepted     int64 `json:"events_accepted"`
	Retried      int64 `json:"throttled_events_retried"`
	Dropped      int64 `json:"events_dropped"`
	Environments int64 `json:"environments_started"`
	// Kicks are the producers' kickers' counts, summed (kick.Stats).
	Kicks KickCounts `json:"kicks"`
}

// KickCounts are kick.Stats summed over the producers' kickers.
type KickCounts struct {
	Requested int64 `json:"requested"`
	Sent      int64 `json:"sent"`
	Failed    int64 `json:"failed"`
	// Skipped kicks caused no invoke of their own; Promised counts the promise reads that
	// spared one.
	Skipped  int64 `json:"skipped"`
	Promised int64 `json:"promised"`
}

// relayFunction is the relay function's name in the local Lambda service.
const relayFunction = "relay"

// errEnvironmentDied is the invocation's error when its relay "process" was killed.
var errEnvironmentDied = errors.New("chaos: the relay environment died (Runtime.ExitError)")

// deployed is a run's Lambda shape: the service, its fault front, the schedule and the
// producers' kickers.
type deployed struct {
	h       *harness
	svc     *lambdasvc.Service
	front   *http.Server
	stopTic func()
	kickers []*kick.Kicker

	kicked, ticks, coalesced, ticksClaimed, fnErrors atomic.Int64

	closeOnce sync.Once
}

// startLambda starts the relay function's environments over pools (one slot each) behind
// the local Lambda service, the fault front of its Invoke API, the schedule, and a kicker
// per producer.
func (h *harness) startLambda(ctx, stop context.Context, pools []*pgxpool.Pool, clock *clock) (*deployed, error) {
	o := h.opts
	lam := *o.Lambda
	d := &deployed{h: h}
	envs := &relayEnvs{h: h, d: d, pools: pools, clock: clock, stop: stop, gens: make([]int, len(pools))}
	for i := range pools {
		envs.free = append(envs.free, len(pools)-1-i)
	}
	svc, err := lambdasvc.Start(lambdasvc.FunctionConfig{
		Name: relayFunction, Launch: envs.launch, Timeout: lam.Timeout, ReservedConcurrency: len(pools),
		OnResult: d.count,
	})
	if err != nil {
		return nil, fmt.Errorf("chaos lambda: %w", err)
	}
	d.svc = svc
	target, err := url.Parse(svc.URL)
	if err != nil {
		d.close()
		return nil, fmt.Errorf("chaos lambda service url: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		d.close()
		return nil, fmt.Errorf("chaos invoke api front: %w", err)
	}
	d.front = &http.Server{Handler: &kickFront{inner: httputil.NewSingleHostReverseProxy(target), in: h.in, f: o.Faults,
		rng: newRand(o.Seed, streamKick)}, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = d.front.Serve(ln) }()
	if d.stopTic, err = svc.Schedule(relayFunction, lam.Backstop, []byte(`{"task":"drain"}`)); err != nil {
		d.close()
		return nil, fmt.Errorf("chaos lambda: %w", err)
	}
	client := lambdasvc.Client("http://" + ln.Addr().String())
	for p := range o.Producers {
		k, err := kick.New(ctx, kick.Config{Function: relayFunction, Interval: lam.IdleGap, DB: h.app, Client: client,
			Logger: o.Logger.With("producer", p)})
		if err != nil {
			d.close()
			return nil, fmt.Errorf("chaos lambda: producer %d: %w", p, err)
		}
		d.kickers = append(d.kickers, k)
	}
	return d, nil
}

// pause is producer p's pause after a transaction (Lambda.PauseRate); rng is the
// producer's own.
func (d *deployed) pause(ctx context.Context, rng *rand.Rand) {
	l := d.h.opts.Lambda
	if l.PauseRate <= 0 || rng.Float64() >= l.PauseRate {
		return
	}
	t := time.NewTimer(time.Duration(rng.Int64N(int64(2*l.IdleGap) + 1)))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// waker is producer p's: its kicker, which the producer "process" may die before calling
// (Faults.KickNotSent). It is only called from that producer's goroutine.
func (d *deployed) waker(p int) outbox.Waker {
	return &faultyWaker{k: d.kickers[p], in: d.h.in, rate: d.h.opts.Faults.KickNotSent, rng: newRand(d.h.opts.Seed, streamKick+1+uint64(p))}
}

// count tallies one invocation's outcome.
func (d *deployed) count(r lambdasvc.Result) {
	if isKick(r.Payload) {
		d.kicked.Add(1)
	} else {
		d.ticks.Add(1)
	}
	switch {
	case errors.Is(r.Err, errEnvironmentDied):
		d.h.restarts.Add(1)
		return
	case r.Err != nil:
		d.fnErrors.Add(1)
		d.h.relayErr.Add(1)
		return
	}
	var res struct {
		Coalesced bool `json:"coalesced"`
	}
	_ = json.Unmarshal(r.Body, &res)
	if res.Coalesced {
		d.coalesced.Add(1)
	}
}

// isKick reports whether an invocation's payload is a producer's kick ({"task":"kick"}),
// not the schedule's tick.
func isKick(payload []byte) bool {
	var req struct {
		Task string `json:"task"`
	}
	return json.Unmarshal(payload, &req) == nil && req.Task == "kick"
}

// closeKicker closes producer p's kicker: it sends the kick it still owes, within a
// bound of its own (the run's context may be done).
func (d *deployed) closeKicker(p int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.kickers[p].Close(ctx); err != nil {
		d.h.opts.Logger.Warn("chaos kicker close", "producer", p, "error", err.Error())
	}
}

// close stops the schedule, the front and the service (it waits for the invocations
// running).
func (d *deployed) close() {
	d.closeOnce.Do(func() {
		if d.stopTic != nil {
			d.stopTic()
		}
		if d.front != nil {
			_ = d.front.Close()
		}
		if d.svc != nil {
			d.svc.Close()
		}
	})
}

func (d *deployed) report() *LambdaReport {
	lam := d.h.opts.Lambda
	st := d.svc.Stats(relayFunction)
	r := &LambdaReport{BackstopSeconds: lam.Backstop.Seconds(), IdleGapSeconds: lam.IdleGap.Seconds(),
		KickInvocations: d.kicked.Load(), TickInvocations: d.ticks.Load(), Coalesced: d.coalesced.Load(),
		TicksThatClaimed: d.ticksClaimed.Load(), FunctionErrors: d.fnErrors.Load(),
		Accepted: st.Accepted, Retried: st.Retried, Dropped: st.Dropped, Environments: st.Environments}
	for _, k := range d.kickers {
		s := k.Stats()
		r.Kicks.Requested += s.Requested
		r.Kicks.Sent += s.Sent
		r.Kicks.Failed += s.Failed
		r.Kicks.Skipped += s.Skipped
		r.Kicks.Promised += s.Promised
	}
	return r
}

// relayEnvs launches the relay function's environments, each in a free slot: the slot's
// pool, whose application_name the backend killer targets.
type relayEnvs struct {
	h     *harness
	d     *deployed
	pools []*pgxpool.Pool
	clock *clock
	stop  context.Context

	mu   sync.Mutex
	free []int
	gens []int
}

func (e *relayEnvs) launch() (lambdasvc.Environment, error) {
	e.mu.Lock()
	if len(e.free) == 0 {
		e.mu.Unlock()
		return nil, errors.New("chaos: every relay slot is taken (the service exceeded the reserved concurrency)")
	}
	i := e.free[len(e.free)-1]
	e.free = e.free[:len(e.free)-1]
	gen := e.gens[i]
	e.gens[i]++
	e.mu.Unlock()
	o := e.h.opts
	pub := e.h.publisher(e.stop, i, gen)
	cfg := relayfunc.Env{Config: relayenv.Config{Relay: e.h.relayConfig(i, gen, pub, e.clock), Publisher: e.h.pcfg,
		IdleGap: o.Lambda.IdleGap, MetricsNamespace: metrics.DefaultNamespace}}
	fn, err := relayfunc.NewInProcess(cfg, e.pools[i], pub, io.Discard, o.Logger.With("relay", i, "environment", gen))
	if err != nil {
		e.release(i)
		return nil, err
	}
	return &relayEnv{envs: e, slot: i, fn: fn, pub: pub, timeout: o.Lambda.Timeout}, nil
}

func (e *relayEnvs) release(i int) {
	e.mu.Lock()
	e.free = append(e.free, i)
	e.mu.Unlock()
}

// relayEnv is one execution environment: a relay "process" in a slot.
type relayEnv struct {
	envs    *relayEnvs
	slot    int
	fn      *relayfunc.InProcess
	pub     *faultyPublisher
	timeout time.Duration
	exited  atomic.Bool
	stopped sync.Once
}

// Invoke runs the handler on a goroutine of its own, so a fault that kills the "process"
// (runtime.Goexit) ends the environment, not the service.
func (r *relayEnv) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	var (
		body     []byte
		err      error
		returned bool
	)
	calls := r.pub.calls.Load()
	done := make(chan struct{})
	go func() {
		defer close(done)
		body, err = r.fn.Invoke(ctx, payload)
		returned = true
	}()
	<-done
	// A tick that handed a batch to the publisher claimed events, whether or not its
	// environment then died (most do under the default rates: its body is then lost).
	if r.pub.calls.Load() > calls && !isKick(payload) {
		r.envs.d.ticksClaimed.Add(1)
	}
	if !returned || r.pub.dead.Load() {
		r.exited.Store(true)
		return nil, errEnvironmentDied
	}
	return body, err
}

func (r *relayEnv) Exited() bool { return r.exited.Load() }

// Stop frees the slot for the environment that replaces this one.
func (r *relayEnv) Stop() { r.stopped.Do(func() { r.envs.release(r.slot) }) }

// faultyWaker is a producer's kicker: with rate, the producer "dies" between its commit
// and its kick, so the kick is never requested.
type faultyWaker struct {
	k    *kick.Kicker
	in   *injector
	rate float64
	rng  *rand.Rand
}

func (w *faultyWaker) Kick() {
	if w.in.on.Load() && w.rate > 0 && w.rng.Float64() < w.rate {
		w.in.add(FaultKickNotSent, 1)
		return
	}
	w.k.Kick()
}

// kickFront sits in front of the Invoke API, where only the producers' kicks arrive (the
// schedule invokes the service directly): it accepts some and loses them, and refuses
// others as Lambda does when it throttles or fails.
type kickFront struct {
	inner http.Handler
	in    *injector
	f     Faults
	mu    sync.Mutex
	rng   *rand.Rand
}

func (k *kickFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !k.in.on.Load() {
		k.inner.ServeHTTP(w, r)
		return
	}
	k.mu.Lock()
	x, throttle := k.rng.Float64(), k.rng.IntN(2) == 0
	k.mu.Unlock()
	switch {
	case x < k.f.KickLost:
		_, _ = io.Copy(io.Discard, r.Body)
		k.in.add(FaultKickLost, 1)
		w.WriteHeader(http.StatusAccepted)
	case x < k.f.KickLost+k.f.KickRefused:
		k.in.add(FaultKickRefused, 1)
		status, typ := http.StatusInternalServerError, "ServiceException"
		if throttle {
			status, typ = http.StatusTooManyRequests, "TooManyRequestsException"
		}
		w.Header().Set("X-Amzn-Errortype", typ)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = fmt.Fprintf(w, `{"Type":"Service","message":"chaos: %s"}`, typ)
	default:
		k.inner.ServeHTTP(w, r)
	}
}
