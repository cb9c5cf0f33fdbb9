package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/localstack"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// Report is the outcome of a run: the checker's counts, the faults injected, timings and
// the configuration that produced them.
type Report struct {
	Counts
	Seed uint64 `json:"seed"`
	// Faults counts injected faults per kind (Fault* constants).
	Faults map[string]int64 `json:"faults"`
	// DrainSeconds is the time from the last injected fault to the moment every event was
	// applied or dead-lettered and the pipeline was quiescent.
	DrainSeconds float64 `json:"drain_seconds"`
	// DurationSeconds is the whole run, production included.
	DurationSeconds float64 `json:"duration_seconds"`
	// ProduceSeconds is how long the producers took.
	ProduceSeconds float64 `json:"produce_seconds"`
	// RelayRestarts counts relay "processes" started after one was killed or failed;
	// RelayErrors the drains that ended in an error (mostly killed connections).
	RelayRestarts int64 `json:"relay_restarts"`
	RelayErrors   int64 `json:"relay_errors"`
	// RolledBack counts business transactions that enqueued an event and rolled back.
	RolledBack int64 `json:"rolled_back_transactions"`
	// DeliveryAttempts counts QStash delivery attempts (callbacks included).
	DeliveryAttempts int64  `json:"delivery_attempts"`
	Ordering         string `json:"ordering"`
	Relays           int    `json:"relays"`
	Producers        int    `json:"producers"`
	Keys             int    `json:"keys"`
	// Settled is false when the run timed out before every event settled.
	Settled bool `json:"settled"`
	// Lambda is the deployed shape's counts (Options.Lambda); absent for long-lived relays.
	Lambda *LambdaReport `json:"lambda,omitempty"`
	// Violations lists every broken invariant; empty means the run passed.
	Violations []string `json:"violations"`
	Passed     bool     `json:"passed"`
}

// Run starts the pipeline in this process (local QStash server, webhook and failure
// handlers on loopback, Relays relays, Producers producers), injects the faults, waits
// until every event settles with the faults off, stops everything and checks the
// invariants from the database. An error means the run could not be carried out; a run
// that completed with broken invariants returns a Report with Passed false and no error.
func Run(ctx context.Context, opts Options) (Report, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return Report{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	kinds := opts.DayTwo.kinds()
	if opts.Faults.ConsumerOutage > 0 {
		kinds = append(kinds, FaultConsumerOutage)
	}
	if opts.Lambda != nil {
		kinds = append(kinds, kickFaultKinds...)
	}
	h := &harness{opts: opts, in: newInjector(kinds...), runID: randomHex(4)}
	h.dayTwo = &dayTwo{h: h}
	return h.run(ctx)
}

type harness struct {
	opts  Options
	in    *injector
	runID string
	// dayTwo injects the DayTwo events.
	dayTwo *dayTwo

	app *pgxpool.Pool
	qs  *qstashtest.Server
	pub *qstash.Publisher
	// pcfg is pub's configuration: the relay function's handler builds its own from it.
	pcfg qstash.PublisherConfig
	// lambda is the deployed shape (Options.Lambda), nil with long-lived relays.
	lambda   *deployed
	ep       Endpoints
	attempts atomic.Int64
	restarts atomic.Int64
	relayErr atomic.Int64
	poison   atomic.Int64
	rolled   atomic.Int64
}

func (h *harness) run(ctx context.Context) (Report, error) {
	start := time.Now()
	o := h.opts
	log := o.Logger
	rep := Report{Seed: o.Seed, Ordering: string(o.Ordering), Relays: o.Relays, Producers: o.Producers, Keys: o.Keys}

	var err error
	if h.app, err = h.pool(ctx, "app", 16); err != nil {
		return rep, err
	}
	defer h.app.Close()
	if err := localstack.CreateDemoTables(ctx, h.app); err != nil {
		return rep, err
	}
	if _, err := h.app.Exec(ctx, qEffectsIndex); err != nil {
		return rep, fmt.Errorf("index demo effects: %w", err)
	}
	var empty bool
	if err := h.app.QueryRow(ctx, qEmpty).Scan(&empty); err != nil {
		return rep, fmt.Errorf("inspect chaos schema: %w", err)
	}
	if !empty {
		return rep, errors.New("chaos run needs an empty schema: the outbox or demo_effects already has rows")
	}

	// The pipeline: QStash with its own faults behind the front that resets connections,
	// and the webhook (the demo handler, poison rejected permanently) and the
	// failure-callback recorder behind the consumer fault front.
	f := o.Faults
	stopAll, stop := context.WithCancel(context.Background())
	defer stop()
	pl, err := localstack.StartPipeline(ctx, localstack.PipelineConfig{
		Pool:     h.app,
		Handlers: webhook.Handlers{"order.created": faultyHandler(h.in, localstack.DemoHandler)},
		QStash: qstashtest.Options{
			Seed: o.Seed, TimeScale: o.QStashTimeScale,
			// Whether a FIFO queue waits for a failed message's failure callback is not
			// documented: half the seeds take each behaviour.
			FailureCallbackBeside: o.Seed%2 == 1,
			Faults: qstashtest.Faults{Publish5xxRate: f.Publish500, Publish429Rate: f.Publish429,
				DropResponseRate: f.PublishDropResponse, DuplicateRate: f.DeliveryDuplicate},
			OnAttempt: func(a qstashtest.Attempt) {
				h.attempts.Add(1)
				if a.Duplicate {
					h.in.add(FaultDeliveryDuplicate, 1)
				}
			},
		},
		QStashFront: func(qs http.Handler) http.Handler {
			return &qstashFront{inner: qs, in: h.in, rate: f.PublishReset, rng: newRand(o.Seed, streamQStashFront)}
		},
		ReceiverFront: func(rc http.Handler) http.Handler {
			down := time.Now().Add(f.ConsumerOutageAfter)
			return &consumerFront{inner: rc, in: h.in, f: f, stop: stopAll, rng: newRand(o.Seed, streamConsumer),
				down: down, up: down.Add(f.ConsumerOutage)}
		},
		// A consumer outage's circuit probes on the run's compressed clock, not every minute.
		Probes: deadletter.ProbeSchedule{Wait: 20 * time.Millisecond, MaxWait: 200 * time.Millisecond},
		Publisher: qstash.PublisherConfig{
			// 12 QStash retries by default: more than the pay-as-you-go cap, so the fixed plan.
			Retries: o.QStashRetries, Plan: qstash.PlanFixed, Ordering: o.Ordering, FIFOQueues: o.FIFOQueues, RequestTimeout: 5 * time.Second,
			HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * o.Relays, IdleConnTimeout: 30 * time.Second}},
		},
		Logger: log,
	})
	if err != nil {
		return rep, err
	}
	defer pl.Close()
	h.qs, h.pub, h.pcfg = pl.QStash, pl.Publisher, pl.PublisherConfig
	h.ep = Endpoints{WebhookBaseURL: pl.BaseURL, FailureURL: pl.FailureURL, QStashURL: pl.QStashURL, QStashToken: pl.Token,
		CurrentKey: pl.CurrentSigningKey, NextKey: pl.NextSigningKey}

	// Relays, each with its own pool (its own "process"; in the deployed shape, the pool
	// of an execution environment's slot), and the killer of their backends.
	h.in.on.Store(true)
	clock := newClock(o.ClockSpeed)
	var relays sync.WaitGroup
	appNames := make([]string, o.Relays)
	pools := make([]*pgxpool.Pool, o.Relays)
	for i := range o.Relays {
		appNames[i] = h.appName(fmt.Sprintf("relay%d", i))
		// A claim, a mark per batch in flight (pipelining at its default concurrency), one
		// spare, and in the deployed shape the LISTEN session of the idle gap: the relay
		// Lambda's pool.
		conns := int32(2 + relay.DefaultPublishConcurrency)
		if o.Lambda != nil {
			conns++
		}
		pool, err := h.pool(ctx, fmt.Sprintf("relay%d", i), conns)
		if err != nil {
			stop()
			relays.Wait()
			return rep, err
		}
		defer pool.Close()
		pools[i] = pool
		if o.Lambda == nil {
			relays.Go(func() { h.superviseRelay(stopAll, i, pool, clock) })
		}
	}
	defer func() { stop(); relays.Wait() }()
	if o.Lambda != nil {
		if h.lambda, err = h.startLambda(ctx, stopAll, pools, clock); err != nil {
			return rep, err
		}
		// Before the pools close: the service waits for the invocations running.
		defer h.lambda.close()
	}
	var killer sync.WaitGroup
	killer.Go(func() { dbKiller(stopAll, h.app, appNames, f.DBKillsPerSecond, o.Seed, h.in) })
	defer killer.Wait()
	if o.OnStart != nil {
		o.OnStart(h.ep)
	}

	// Producers.
	prodDone := make(chan error, 1)
	go func() { prodDone <- h.produce(ctx) }()

	settled, err := h.wait(ctx, prodDone, &rep)
	err = errors.Join(append([]error{err}, h.dayTwo.wait()...)...)
	h.in.on.Store(false)
	h.qs.SetFaults(qstashtest.Faults{})
	stop()
	relays.Wait()
	killer.Wait()
	if h.lambda != nil {
		h.lambda.close()
		rep.Lambda = h.lambda.report()
	}
	if err != nil {
		return rep, err
	}
	rep.Settled = !settled.IsZero()
	if rep.Settled {
		if last := h.in.lastFault(); !last.IsZero() {
			rep.DrainSeconds = settled.Sub(last).Seconds()
		}
	}

	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer ccancel()
	rep.Counts, err = Check(cctx, h.app)
	if err != nil {
		return rep, err
	}
	rep.Faults = h.in.snapshot()
	rep.RelayRestarts, rep.RelayErrors = h.restarts.Load(), h.relayErr.Load()
	rep.RolledBack = h.rolled.Load()
	rep.DeliveryAttempts = h.attempts.Load()
	rep.DurationSeconds = time.Since(start).Seconds()
	rep.Violations = rep.Counts.Violations(int64(o.Events), h.poison.Load(), o.Ordering == publish.OrderingFIFO)
	if !rep.Settled {
		rep.Violations = append(rep.Violations, fmt.Sprintf("not settled within %v", o.Timeout))
	}
	if rep.Violations == nil {
		rep.Violations = []string{}
	}
	rep.Passed = len(rep.Violations) == 0
	return rep, nil
}

// wait polls the database until production is done and every event settled with the
// pipeline quiescent. Faults are switched off once production is done and SettledShare of
// the events settled. It returns when the run settled (zero if it timed out).
func (h *harness) wait(ctx context.Context, prodDone <-chan error, rep *Report) (time.Time, error) {
	const poll = 100 * time.Millisecond
	produced := false
	t := time.NewTicker(poll)
	defer t.Stop()
	start := time.Now()
	lastLine := time.Now()
	var quietSince time.Time
	for {
		select {
		case <-ctx.Done():
			return time.Time{}, nil
		case err := <-prodDone:
			if err != nil {
				return time.Time{}, fmt.Errorf("produce chaos events: %w", err)
			}
			produced = true
			rep.ProduceSeconds = time.Since(start).Seconds()
			continue
		case <-t.C:
		}
		var events, settled, pending int64
		if err := h.app.QueryRow(ctx, qProgress).Scan(&events, &settled, &pending); err != nil {
			if ctx.Err() != nil {
				return time.Time{}, nil
			}
			return time.Time{}, fmt.Errorf("read chaos progress: %w", err)
		}
		if h.opts.Progress != nil && time.Since(lastLine) >= time.Second {
			lastLine = time.Now()
			fmt.Fprintf(h.opts.Progress, "chaos: %6.1fs produced %d settled %d outbox pending %d qstash pending %d faults on %v\n",
				time.Since(start).Seconds(), events, settled, pending, h.qs.Pending(), h.in.on.Load())
		}
		if !produced {
			continue
		}
		if h.in.on.Load() && events > 0 {
			h.dayTwo.step(ctx, float64(settled)/float64(events))
		}
		if h.in.on.Load() && float64(settled) >= h.opts.SettledShare*float64(events) && !h.dayTwo.busy() {
			h.in.on.Store(false)
			h.qs.SetFaults(qstashtest.Faults{})
		}
		if h.in.on.Load() {
			continue
		}
		quiet := pending == 0 && h.qs.Pending() == 0
		if quiet && settled >= events {
			return time.Now(), nil
		}
		// Quiescent but unsettled: something was lost. Give stragglers a moment, then stop
		// and let the checker say what.
		switch {
		case !quiet:
			quietSince = time.Time{}
		case quietSince.IsZero():
			quietSince = time.Now()
		case time.Since(quietSince) > 10*time.Second:
			return time.Time{}, nil
		}
	}
}

// superviseRelay runs relay "processes" in slot i until stop: each is a fresh Relay with
// its own faulty publisher; one killed by a fault (Goexit) or failed (a killed
// connection) is replaced, as a scheduler would start the next invocation.
func (h *harness) superviseRelay(stop context.Context, i int, pool *pgxpool.Pool, clock *clock) {
	err := relay.Supervise(stop, func(run int) (*relay.Relay, error) {
		pub := h.publisher(stop, i, run)
		return relay.New(pool, pub, h.relayConfig(i, run, pub, clock))
	}, relay.SuperviseConfig{
		// A killed or failed relay "process" is replaced at the next "tick".
		RestartMin: 20 * time.Millisecond, RestartMax: 20 * time.Millisecond,
		OnRun: func(_ relay.Stats, err error) {
			if err == nil {
				return
			}
			if !errors.Is(err, relay.ErrRunDied) {
				h.relayErr.Add(1)
			}
			h.restarts.Add(1)
		},
	})
	if err != nil {
		h.opts.Logger.Error("chaos relay config", "error", err.Error())
	}
}

// publisher is the faulty publisher of relay "process" gen of slot i.
func (h *harness) publisher(stop context.Context, i, gen int) *faultyPublisher {
	o := h.opts
	return &faultyPublisher{inner: h.pub, rng: newRand(o.Seed, streamRelay+uint64(i)<<20+uint64(gen)), f: o.Faults, in: h.in,
		hold: o.LeaseReal + o.LeaseReal/2, stop: stop}
}

// relayConfig is the configuration of relay "process" gen of slot i, publishing through pub.
func (h *harness) relayConfig(i, gen int, pub *faultyPublisher, clock *clock) relay.Config {
	o := h.opts
	return relay.Config{
		BatchSize: o.BatchSize, MaxAttempts: o.MaxAttempts, Ordering: o.Ordering,
		// The faults kill a relay holding a row far more often than a deployment sees
		// (a few percent of publish calls, a killed connection a second): a healthy row
		// dies with three processes in a row within a run, as a real one would with
		// MaxAttempts retryable failures. Like MaxAttempts, the budget is the run's.
		MaxDeaths:      o.MaxAttempts,
		Lease:          time.Duration(float64(o.LeaseReal) * o.ClockSpeed),
		PublishTimeout: 5 * time.Second, MarkTimeout: 5 * time.Second,
		BackoffBase: relay.MinBackoff, BackoffMax: 8 * time.Second,
		Rand: newRand(o.Seed, streamRelay+uint64(i)<<20+uint64(gen)+1<<19).Float64,
		// A killed "process" is gone at once: its drain loop claims nothing more and
		// its batches mark nothing more (the relay reads the clock before each claim and
		// each mark). Without this the loop went on claiming until it collected a dead
		// batch, and every row it claimed meanwhile counted a death no real process
		// could have caused: healthy rows were dead-lettered as killers.
		Now:          pub.now(clock.Now),
		PollInterval: 20 * time.Millisecond, Logger: o.Logger.With("relay", i),
		// Deferrals pause in real time (the relay's clock does not reach them): a short
		// first pause keeps a run's 429s and outages from idling it for seconds.
		DeferPause: 50 * time.Millisecond,
		// A probe's failure comes back within milliseconds here (one attempt against a
		// local consumer); the default three minutes would idle a run whose probe was
		// applied before it was taken (its relay died before the mark).
		ProbeHorizon: 2 * time.Second,
	}
}

// produce commits Events business transactions (an order row and its event) from
// Producers goroutines; RollbackRate of the transactions are extra ones that enqueue an
// event and roll back.
func (h *harness) produce(ctx context.Context) error {
	o := h.opts
	var wg sync.WaitGroup
	errs := make([]error, o.Producers)
	for p := range o.Producers {
		from, to := p*o.Events/o.Producers, (p+1)*o.Events/o.Producers
		wg.Go(func() {
			rng := newRand(o.Seed, streamProducer+uint64(p))
			// In the deployed shape each producer "process" kicks the relay after its
			// commits, and sends the kick it still owes when it stops.
			var w outbox.Waker
			var pauses *mrand.Rand
			if h.lambda != nil {
				w, pauses = h.lambda.waker(p), newRand(o.Seed, streamPause+uint64(p))
				defer h.lambda.closeKicker(p)
			}
			for n := from; n < to; n++ {
				if o.RollbackRate > 0 && rng.Float64() < o.RollbackRate {
					if err := h.rollbackOne(ctx, n, rng); err != nil {
						errs[p] = err
						return
					}
				}
				if err := h.produceOne(ctx, n, rng, w); err != nil {
					errs[p] = err
					return
				}
				if pauses != nil {
					h.lambda.pause(ctx, pauses)
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (h *harness) event(id string, rng interface{ IntN(int) int }, poison bool) (string, outbox.Event, int64) {
	customer := fmt.Sprintf("customer-%d", rng.IntN(h.opts.Keys))
	amount := int64(100 + rng.IntN(100000))
	if poison {
		amount = 0 // order.created rejects it permanently
	}
	payload, _ := json.Marshal(map[string]any{"order_id": id, "amount_cents": amount, "currency": "EUR", "customer": customer})
	return customer, outbox.Event{Topic: "order.created", PartitionKey: customer, Payload: payload,
		Headers: map[string]string{"X-Partition-Key": customer, "X-Correlation-Id": id}}, amount
}

func (h *harness) produceOne(ctx context.Context, n int, rng interface {
	IntN(int) int
	Float64() float64
}, w outbox.Waker) error {
	id := fmt.Sprintf("c-%s-%07d", h.runID, n)
	poison := rng.Float64() < h.opts.PoisonRate
	customer, ev, amount := h.event(id, rng, poison)
	err := outbox.BeginFunc(ctx, h.app, w, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qLockCustomer, customer); err != nil {
			return fmt.Errorf("lock customer: %w", err)
		}
		if _, err := tx.Exec(ctx, qInsertOrder, id, customer, amount, poison); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		_, err := outbox.Enqueue(ctx, tx, ev)
		return err
	})
	if err != nil {
		return fmt.Errorf("commit order %s: %w", id, err)
	}
	if poison {
		h.poison.Add(1)
	}
	return nil
}

var errRollback = errors.New("chaos: business transaction rolled back")

func (h *harness) rollbackOne(ctx context.Context, n int, rng interface {
	IntN(int) int
	Float64() float64
}) error {
	id := fmt.Sprintf("ghost-%s-%07d", h.runID, n)
	customer, ev, amount := h.event(id, rng, false)
	err := pgx.BeginFunc(ctx, h.app, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qInsertOrder, id, customer, amount, false); err != nil {
			return err
		}
		if _, err := outbox.Enqueue(ctx, tx, ev); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		return fmt.Errorf("roll back order %s: %w", id, err)
	}
	h.rolled.Add(1)
	return nil
}

func (h *harness) appName(role string) string { return "chaos_" + h.runID + "_" + role }

// pool opens a pool on the run's schema whose sessions carry application_name
// chaos_<run>_<role>, so the killer can find a relay's backends.
func (h *harness) pool(ctx context.Context, role string, maxConns int32) (*pgxpool.Pool, error) {
	if h.opts.DayTwo.ReadDatabaseURL != nil {
		return h.credentialedPool(ctx, role, maxConns)
	}
	cfg, err := pgxpool.ParseConfig(h.opts.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse chaos database url: %w", err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = h.appName(role)
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open chaos %s pool: %w", role, err)
	}
	return p, nil
}

// clock runs speed times faster than real time from its creation: the relays' Now.
type clock struct {
	start time.Time
	speed float64
}

func newClock(speed float64) *clock { return &clock{start: time.Now(), speed: speed} }

// Now is the scaled time.
func (c *clock) Now() time.Time {
	return c.start.Add(time.Duration(float64(time.Since(c.start)) * c.speed))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
