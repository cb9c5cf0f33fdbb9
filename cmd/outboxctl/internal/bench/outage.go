package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
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

// OutageConfig sizes the consumer outage scenario. Durations are production-equivalent:
// the run's clock is TimeScale of them (the local QStash's backoff and retry delay, the
// circuits' probe schedule, probe horizon and refresh, the outage and the traffic around
// it); Rate is real events a second.
type OutageConfig struct {
	Rate      int     `json:"rate"`
	Keys      int     `json:"keys"`
	TimeScale float64 `json:"time_scale"`
	// Outages are the consumer's outages, each run in every mode.
	Outages []time.Duration    `json:"outages_ns"`
	Modes   []publish.Ordering `json:"modes"`
	// Before and After are the traffic around the outage.
	Before time.Duration `json:"before_ns"`
	After  time.Duration `json:"after_ns"`
	// RetryDelay is QSTASH_RETRY_DELAY (the template's QStashRetryDelay).
	RetryDelay time.Duration `json:"retry_delay_ns"`
}

// OutageConfigFor returns the outage scenario's size.
func OutageConfigFor(s Size) OutageConfig {
	cfg := OutageConfig{Rate: 50, Keys: 20, TimeScale: 0.05, Outages: []time.Duration{10 * time.Minute, time.Hour},
		Modes: []publish.Ordering{publish.OrderingPublish, publish.OrderingFIFO}, Before: 5 * time.Minute, After: 5 * time.Minute,
		RetryDelay: 10 * time.Second}
	switch s {
	case Full:
	case Short:
		cfg.Outages = cfg.Outages[:1]
	default:
		cfg.Outages, cfg.Modes, cfg.Before, cfg.After = []time.Duration{2 * time.Minute}, []publish.Ordering{publish.OrderingFIFO}, time.Minute, time.Minute
	}
	return cfg
}

// OutageRun is one outage in one mode. Times are production-equivalent.
type OutageRun struct {
	Mode          publish.Ordering `json:"mode"`
	OutageMinutes float64          `json:"outage_minutes"`
	Events        int              `json:"events"`
	// DuringOutage counts the events produced while the consumer was down.
	DuringOutage    int `json:"during_outage"`
	DeadLettered    int `json:"dead_lettered"`
	OrderViolations int `json:"order_violations"`
	// Billed is every message QStash bills: delivery attempts (first attempts, retries,
	// probes) and failure callbacks.
	Attempts       int64   `json:"attempts"`
	Callbacks      int64   `json:"callbacks"`
	BilledPerEvent float64 `json:"billed_per_event"`
	// Recovery is the consumer's recovery -> each outage event's first apply, in seconds:
	// what the run waits on QStash's ladder and the circuit's probe counts scaled, and the
	// drain after the circuit closed counts as it ran (production drains as fast);
	// RecoveryAllScaled counts the whole wait scaled, the drain included.
	Recovery          SecondsSummary `json:"recovery"`
	RecoveryAllScaled SecondsSummary `json:"recovery_all_scaled"`
	// CircuitOpenedAfter is the outage's start -> the first open circuit, seconds (-1:
	// none opened); CircuitClosedAfter the recovery -> no circuit open.
	CircuitOpenedAfter float64 `json:"circuit_opened_after_s"`
	CircuitClosedAfter float64 `json:"circuit_closed_after_s"`
	// ClosedDuringOutage counts the times every circuit was closed while the consumer was
	// still down (sampled every 20 ms): the relay then published into the outage.
	ClosedDuringOutage int `json:"closed_during_outage"`
	// CloseReasons counts the relay's circuit closes while the consumer was down by what
	// told it the probe was delivered (its log's "why").
	CloseReasons map[string]int `json:"close_reasons_during_outage,omitempty"`
	// Answers counts the delivery attempts by the webhook's answer, and the failure
	// callbacks by the failure function's status; Generations the events by how often
	// they were put back (0: published once).
	Answers     map[string]int64 `json:"answers"`
	Generations map[int]int      `json:"generations"`
}

// OutageResult is the outage scenario's outcome.
type OutageResult struct {
	Config OutageConfig `json:"config"`
	Path   string       `json:"path"`
	Runs   []OutageRun  `json:"runs"`
}

// Outage measures a consumer outage: producers at cfg.Rate over cfg.Keys, the relay, the
// local QStash (its backoff scaled), the failure callback and the webhook sharing the
// outbox's database, which answers 500 to every delivery for the outage. It reports what
// the outage cost: dead letters, order, billed messages, and the wait after recovery.
func Outage(ctx context.Context, url string, cfg OutageConfig, progress func(string)) (*OutageResult, error) {
	pool, err := openPool(ctx, url, 16)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	res := &OutageResult{Config: cfg, Path: fmt.Sprintf("producers (one event per transaction) -> relay -> local QStash (backoff and retry delay scaled %gx) -> webhook sharing the outbox's database (500 to every delivery while down) -> failure callback (reschedules, opens the topic's circuit)", cfg.TimeScale)}
	for _, outage := range cfg.Outages {
		for _, mode := range cfg.Modes {
			run, err := outageRun(ctx, pool, cfg, mode, outage)
			if err != nil {
				return res, fmt.Errorf("%s, %v down: %w", mode, outage, err)
			}
			res.Runs = append(res.Runs, run)
			if progress != nil {
				progress(fmt.Sprintf("outage %s %v: %d events (%d during), %d dead-lettered, %d order violations, billed %.2f per event, recovery p50 %.0f p99 %.0f max %.0f s (all scaled: p99 %.0f s), circuit open after %.0f s, closed %.0f s after recovery, closed during the outage %d times %v",
					mode, outage, run.Events, run.DuringOutage, run.DeadLettered, run.OrderViolations, run.BilledPerEvent, run.Recovery.P50, run.Recovery.P99, run.Recovery.Max,
					run.RecoveryAllScaled.P99, run.CircuitOpenedAfter, run.CircuitClosedAfter, run.ClosedDuringOutage, run.CloseReasons))
			}
		}
	}
	return res, nil
}

// outageConsumer is the consumer's side of one run: its outage switch, what it was asked
// and what it applied.
type outageConsumer struct {
	down                atomic.Bool
	attempts, callbacks atomic.Int64
	// answers counts the deliveries by the webhook's status (500: the outage) and reason
	// (a body's "error" or "outcome", for 503s and superseded 200s).
	answersMu sync.Mutex
	answers   map[string]int64

	mu      sync.Mutex
	applied []outageApply
}

type outageApply struct {
	key string
	id  int64
	at  time.Time
}

// front counts deliveries and callbacks and fails deliveries while down.
func (c *outageConsumer) front(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, localstack.FailurePath) {
			c.callbacks.Add(1)
			rec := &answerRecorder{ResponseWriter: w, status: http.StatusOK}
			next.ServeHTTP(rec, r)
			c.answer(fmt.Sprintf("failure callback %d", rec.status))
			return
		}
		c.attempts.Add(1)
		if c.down.Load() {
			c.answer("500 down")
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		rec := &answerRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		var body struct {
			Error   string `json:"error"`
			Outcome string `json:"outcome"`
		}
		_ = json.Unmarshal(rec.body, &body)
		c.answer(strings.TrimSpace(fmt.Sprintf("%d %s%s", rec.status, body.Error, body.Outcome)))
	})
}

func (c *outageConsumer) answer(a string) {
	c.answersMu.Lock()
	defer c.answersMu.Unlock()
	if c.answers == nil {
		c.answers = map[string]int64{}
	}
	c.answers[a]++
}

// answerRecorder keeps a response's status and the start of its body.
type answerRecorder struct {
	http.ResponseWriter
	status int
	body   []byte
}

func (a *answerRecorder) WriteHeader(code int) {
	a.status = code
	a.ResponseWriter.WriteHeader(code)
}

func (a *answerRecorder) Write(b []byte) (int, error) {
	if len(a.body) < 512 {
		a.body = append(a.body, b[:min(len(b), 512-len(a.body))]...)
	}
	return a.ResponseWriter.Write(b)
}

func (c *outageConsumer) handler(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
	id, err := strconv.ParseInt(d.MessageID, 10, 64)
	if err != nil {
		return webhook.Permanent(fmt.Errorf("message id %q is not an outbox id", d.MessageID))
	}
	c.mu.Lock()
	c.applied = append(c.applied, outageApply{key: d.Headers.Get("X-Partition-Key"), id: id, at: time.Now()})
	c.mu.Unlock()
	return nil
}

func outageRun(ctx context.Context, pool *pgxpool.Pool, cfg OutageConfig, mode publish.Ordering, outage time.Duration) (OutageRun, error) {
	run := OutageRun{Mode: mode, OutageMinutes: outage.Minutes(), CircuitOpenedAfter: -1, CircuitClosedAfter: -1}
	real := func(prod time.Duration) time.Duration { return time.Duration(float64(prod) * cfg.TimeScale) }
	prod := func(real time.Duration) float64 { return round3(real.Seconds() / cfg.TimeScale) }
	if err := Reset(ctx, pool); err != nil {
		return run, err
	}
	cons := &outageConsumer{}
	pl, err := localstack.StartPipeline(ctx, localstack.PipelineConfig{
		Pool:          pool,
		Handlers:      webhook.Handlers{Topic: cons.handler},
		QStash:        qstashtest.Options{TimeScale: cfg.TimeScale, Logger: discardLogger(), LogLimit: -1},
		ReceiverFront: cons.front,
		Probes:        deadletter.ProbeSchedule{Wait: real(deadletter.CircuitProbeWait), MaxWait: real(deadletter.CircuitProbeMaxWait)},
		// The production delay: the server scales Upstash-Retry-Delay by its TimeScale.
		Publisher: qstash.PublisherConfig{Ordering: mode, FIFOQueues: 8, RetryDelay: cfg.RetryDelay},
		Logger:    discardLogger(),
	})
	if err != nil {
		return run, err
	}
	defer pl.Close()
	// The relay's probe horizon and circuit refresh (1 s) on the run's clock.
	closes := &closeRecorder{}
	r, err := pl.NewRelay(pool, relay.Config{Logger: slog.New(closes), ProbeHorizon: real(relay.DefaultProbeHorizon), CircuitRefresh: real(time.Second)})
	if err != nil {
		return run, err
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan struct{})
	go func() {
		defer close(relayDone)
		for rctx.Err() == nil {
			_, _ = r.Drain(rctx)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer func() { stopRelay(); <-relayDone }()

	pctx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	var produced atomic.Int64
	prodErr := make(chan error, 1)
	go func() { prodErr <- produceKeyed(pctx, pool, cfg, &produced) }()

	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := sleep(real(cfg.Before)); err != nil {
		return run, err
	}
	down := time.Now()
	cons.down.Store(true)
	var openedAt, closedAt time.Time
	wasOpen := false
	for time.Since(down) < real(outage) {
		open := circuitsOpen(ctx, pool) > 0
		if openedAt.IsZero() && open {
			openedAt = time.Now()
		}
		if wasOpen && !open {
			run.ClosedDuringOutage++
		}
		wasOpen = open
		if err := sleep(20 * time.Millisecond); err != nil {
			return run, err
		}
	}
	up := time.Now()
	cons.down.Store(false)
	for time.Since(up) < real(cfg.After) {
		if closedAt.IsZero() && circuitsOpen(ctx, pool) == 0 {
			closedAt = time.Now()
		}
		if err := sleep(20 * time.Millisecond); err != nil {
			return run, err
		}
	}
	stopProducing()
	if err := <-prodErr; err != nil {
		return run, err
	}
	total := int(produced.Load())
	if err := waitFor(ctx, 10*time.Minute, func() (bool, error) {
		n, err := countRows(ctx, pool, qPendingCount)
		return n == 0 && appliedCount(cons) >= total-deadLetters(ctx, pool), err
	}); err != nil {
		return run, fmt.Errorf("wait for every event applied: %w", err)
	}
	if closedAt.IsZero() {
		closedAt = time.Now()
	}
	run.CloseReasons = closes.between(down, up)
	if !openedAt.IsZero() {
		run.CircuitOpenedAfter = prod(openedAt.Sub(down))
		run.CircuitClosedAfter = prod(max(closedAt.Sub(up), 0))
	}
	return run, run.settle(ctx, pool, cons, total, down, up, closedAt, prod)
}

// settle fills the run's figures from the consumer's applies and the outbox.
func (run *OutageRun) settle(ctx context.Context, pool *pgxpool.Pool, cons *outageConsumer, total int, down, up, closedAt time.Time, prod func(time.Duration) float64) error {
	rows, err := pool.Query(ctx, `SELECT id, created_at FROM outbox ORDER BY id`)
	if err != nil {
		return err
	}
	type created struct {
		id int64
		at time.Time
	}
	var all []created
	for rows.Next() {
		var c created
		if err := rows.Scan(&c.id, &c.at); err != nil {
			rows.Close()
			return err
		}
		all = append(all, c)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	cons.mu.Lock()
	applied := slices.Clone(cons.applied)
	cons.mu.Unlock()
	first := map[int64]time.Time{}
	last := map[string]int64{}
	for _, a := range applied {
		if _, ok := first[a.id]; !ok {
			first[a.id] = a.at
		}
		if a.id < last[a.key] {
			run.OrderViolations++
		}
		last[a.key] = max(last[a.key], a.id)
	}
	var rec, recScaled []time.Duration
	for _, c := range all {
		if c.at.Before(down) || !c.at.Before(up) {
			continue
		}
		at, ok := first[c.id]
		if !ok {
			continue // dead-lettered: counted below
		}
		wait := max(at.Sub(up), 0)
		recScaled = append(recScaled, time.Duration(prod(wait)*float64(time.Second)))
		if at.After(closedAt) && closedAt.After(up) {
			// Held until the circuit closed (scaled), then drained at real speed.
			wait = time.Duration(prod(closedAt.Sub(up))*float64(time.Second)) + at.Sub(closedAt)
		} else {
			wait = time.Duration(prod(wait) * float64(time.Second))
		}
		rec = append(rec, wait)
	}
	run.Events, run.DuringOutage = total, len(rec)
	run.DeadLettered = deadLetters(ctx, pool)
	run.Attempts, run.Callbacks = cons.attempts.Load(), cons.callbacks.Load()
	cons.answersMu.Lock()
	run.Answers = maps.Clone(cons.answers)
	cons.answersMu.Unlock()
	gens, err := pool.Query(ctx, `SELECT generation, count(*)::int FROM outbox GROUP BY 1`)
	if err != nil {
		return err
	}
	run.Generations = map[int]int{}
	for gens.Next() {
		var g, n int
		if err := gens.Scan(&g, &n); err != nil {
			gens.Close()
			return err
		}
		run.Generations[g] = n
	}
	if err := gens.Err(); err != nil {
		return err
	}
	run.BilledPerEvent = ratio(float64(run.Attempts+run.Callbacks), float64(total))
	run.Recovery, run.RecoveryAllScaled = seconds(summarise(rec)), seconds(summarise(recScaled))
	return nil
}

// SecondsSummary is a Latency in seconds, named so in the JSON.
type SecondsSummary struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_s"`
	P95     float64 `json:"p95_s"`
	P99     float64 `json:"p99_s"`
	Max     float64 `json:"max_s"`
	Mean    float64 `json:"mean_s"`
}

// seconds converts a millisecond summary to seconds.
func seconds(l Latency) SecondsSummary {
	s := func(ms float64) float64 { return round3(ms / 1000) }
	return SecondsSummary{Samples: l.Samples, P50: s(l.P50), P95: s(l.P95), P99: s(l.P99), Max: s(l.Max), Mean: s(l.Mean)}
}

// produceKeyed commits cfg.Rate events a second, round-robin over cfg.Keys, each in a
// transaction of its own, until ctx ends.
func produceKeyed(ctx context.Context, pool *pgxpool.Pool, cfg OutageConfig, n *atomic.Int64) error {
	tick := time.NewTicker(time.Second / time.Duration(cfg.Rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		key := KeyName(i % cfg.Keys)
		_, err := outbox.Enqueue(ctx, pool, outbox.Event{Topic: Topic, PartitionKey: key,
			Payload: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, i)), Headers: map[string]string{"X-Partition-Key": key}})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("produce: %w", err)
		}
		n.Add(1)
	}
}

func appliedCount(c *outageConsumer) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[int64]bool{}
	for _, a := range c.applied {
		seen[a.id] = true
	}
	return len(seen)
}

func circuitsOpen(ctx context.Context, pool *pgxpool.Pool) int {
	n, _ := countRows(ctx, pool, `SELECT count(*) FROM outbox_circuits`)
	return n
}

func deadLetters(ctx context.Context, pool *pgxpool.Pool) int {
	n, _ := countRows(ctx, pool, `SELECT count(*) FROM dead_letters WHERE resolved_at IS NULL`)
	return n
}

func countRows(ctx context.Context, pool *pgxpool.Pool, query string) (int, error) {
	var n int
	err := pool.QueryRow(ctx, query).Scan(&n)
	return n, err
}

// closeRecorder is the relay's logger in the outage scenario: it keeps, of everything the
// relay logs, when a circuit closed and why.
type closeRecorder struct {
	mu     sync.Mutex
	closes []circuitClose
}

type circuitClose struct {
	at  time.Time
	why string
}

func (h *closeRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *closeRecorder) Handle(_ context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, "consumer circuit closed") {
		return nil
	}
	c := circuitClose{at: r.Time}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "why" {
			c.why = a.Value.String()
		}
		return true
	})
	h.mu.Lock()
	h.closes = append(h.closes, c)
	h.mu.Unlock()
	return nil
}

func (h *closeRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *closeRecorder) WithGroup(string) slog.Handler      { return h }

// between counts the closes logged in [from, to) by why.
func (h *closeRecorder) between(from, to time.Time) map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var m map[string]int
	for _, c := range h.closes {
		if !c.at.Before(from) && c.at.Before(to) {
			if m == nil {
				m = map[string]int{}
			}
			m[c.why]++
		}
	}
	return m
}
