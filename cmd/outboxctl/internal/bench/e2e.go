package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/internal/localstack"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// Relay wake-up modes of the end-to-end scenario.
const (
	// ModeLinger: relay.Linger woken by the outbox trigger's NOTIFY, 1 s poll as safety net.
	ModeLinger = "linger"
	// ModePoll: the same loop listening on a channel nobody notifies, so only the 1 s poll
	// wakes it: what a relay behind a pooler that drops LISTEN gets.
	ModePoll = "poll"
)

// E2EConfig sizes the end-to-end scenario.
type E2EConfig struct {
	// Rate events per second for Duration, produced in Ticks per second.
	Rate     int           `json:"rate"`
	Duration time.Duration `json:"duration_ns"`
	Ticks    int           `json:"ticks_per_sec"`
	Batch    int           `json:"batch"`
	// Timeout bounds the wait for the last deliveries after production stops.
	Timeout time.Duration `json:"timeout_ns"`
}

// E2EConfigFor returns the end-to-end scenario's size.
func E2EConfigFor(s Size) E2EConfig {
	c := E2EConfig{Ticks: 100, Batch: relay.DefaultBatchSize, Timeout: time.Minute}
	switch s {
	case Full:
		c.Rate, c.Duration = 800, 60*time.Second
	case Short:
		c.Rate, c.Duration = 200, 8*time.Second
	default:
		c.Rate, c.Duration = 100, 2*time.Second
	}
	return c
}

// E2EMode is one wake-up mode's latencies.
type E2EMode struct {
	Mode      string `json:"mode"`
	Produced  int    `json:"produced"`
	Delivered int    `json:"delivered"`
	// Latency is from the outbox row's created_at (the producer transaction's now()) to
	// clock_timestamp() read as the webhook handler's last statement before its commit,
	// both on the database clock.
	Latency Latency `json:"latency"`
	// RelayBatches shows how the relay woke (one batch per wake-up when idle).
	RelayBatches int `json:"relay_batches"`
}

// E2EResult is the end-to-end scenario's output.
type E2EResult struct {
	Config E2EConfig `json:"config"`
	Path   string    `json:"path"`
	Modes  []E2EMode `json:"modes"`
}

// Mode returns the named mode, or nil.
func (r *E2EResult) Mode(name string) *E2EMode {
	if r == nil {
		return nil
	}
	return find(r.Modes, func(m *E2EMode) bool { return m.Mode == name })
}

// E2E produces events at a steady rate through the producer API while a relay lingers,
// publishing to the local QStash, which delivers to webhook.Handler (order.created, its
// real transaction); it reports created_at -> handler commit latencies per mode.
func E2E(ctx context.Context, url string, cfg E2EConfig, progress func(string)) (*E2EResult, error) {
	res := &E2EResult{Config: cfg, Path: "producer (EnqueueBatch) -> relay -> local QStash (publish mode) over HTTP -> webhook.Handler (verify, inbox.HandleOnce, OrderCreated) -> commit"}
	for _, mode := range []string{ModeLinger, ModePoll} {
		m, err := e2eMode(ctx, url, cfg, mode)
		if err != nil {
			return res, fmt.Errorf("e2e %s: %w", mode, err)
		}
		res.Modes = append(res.Modes, m)
		if progress != nil {
			progress(fmt.Sprintf("e2e %-6s p50 %.1f ms  p95 %.1f ms  p99 %.1f ms  max %.1f ms  (%d events, %d relay batches)",
				mode, m.Latency.P50, m.Latency.P95, m.Latency.P99, m.Latency.Max, m.Delivered, m.RelayBatches))
		}
	}
	return res, nil
}

func e2eMode(ctx context.Context, url string, cfg E2EConfig, mode string) (E2EMode, error) {
	m := E2EMode{Mode: mode}
	pool, pl, commits, err := startCommitPipeline(ctx, url)
	if err != nil {
		return m, err
	}
	defer pool.Close()
	defer pl.Close()
	rcfg := relayConfig(cfg.Batch, false)
	rcfg.PollInterval = time.Second
	if mode == ModePoll {
		rcfg.Channel = "bench_never_notified"
	}
	r, err := pl.NewRelay(pool, rcfg)
	if err != nil {
		return m, err
	}

	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	var relayStats relay.Stats
	var relayErr error
	relayDone := make(chan struct{})
	go func() {
		defer close(relayDone)
		relayStats, relayErr = r.Linger(relayCtx, time.Now().Add(cfg.Duration+cfg.Timeout))
	}()

	ids, err := produce(ctx, pool, cfg)
	m.Produced = len(ids)
	if err != nil {
		return m, err
	}
	if err := commits.wait(ctx, ids, cfg.Timeout); err != nil {
		return m, err
	}
	stopRelay()
	<-relayDone
	if relayErr != nil && !errors.Is(relayErr, context.Canceled) {
		return m, fmt.Errorf("relay linger: %w", relayErr)
	}
	m.RelayBatches = relayStats.Batches

	created, err := createdAt(ctx, pool, ids)
	if err != nil {
		return m, err
	}
	lats := make([]time.Duration, 0, len(ids))
	for _, id := range ids {
		lats = append(lats, commits.get(int64(id)).Sub(created[int64(id)]))
	}
	m.Delivered = len(lats)
	m.Latency = summarise(lats)
	return m, nil
}

// startCommitPipeline empties the schema's tables and starts the local QStash delivering
// to webhook.Handler, whose order.created handler records its commits in the log. The
// pool (the webhook's, 32 connections) and the pipeline are the caller's to close.
func startCommitPipeline(ctx context.Context, url string) (*pgxpool.Pool, *localstack.Pipeline, *commitLog, error) {
	// Deployed, every delivery in flight has a webhook environment and a connection of its
	// own (the template leaves the webhook's concurrency unreserved). With 12 connections
	// here, the deliveries of a batch queued for the pool: in the pinned scenario the gap
	// between dispatch and handler p99 reached 145 ms (worst pinned window 183 ms); with
	// 32, 15 ms (53 ms) in the next run on the same machine.
	pool, err := openPool(ctx, url, 32)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := Reset(ctx, pool); err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	commits := newCommitLog()
	pl, err := localstack.StartPipeline(ctx, localstack.PipelineConfig{
		Pool:      pool,
		Handlers:  webhook.Handlers{Topic: commitHandler(commits)},
		QStash:    deliveringOptions(0),
		Publisher: articlePublisher(false),
		Logger:    discardLogger(),
	})
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return pool, pl, commits, nil
}

// produce enqueues cfg.Rate events per second in cfg.Ticks batches per second through the
// producer API (each batch its own statement and commit, waking the relay once).
func produce(ctx context.Context, pool *pgxpool.Pool, cfg E2EConfig) ([]outbox.ID, error) {
	per := max(1, cfg.Rate/cfg.Ticks)
	total := int(float64(cfg.Rate) * cfg.Duration.Seconds())
	tick := time.NewTicker(time.Second / time.Duration(cfg.Ticks))
	defer tick.Stop()
	run := runID("e")
	ids := make([]outbox.ID, 0, total)
	for n := 0; n < total; {
		select {
		case <-ctx.Done():
			return ids, ctx.Err()
		case <-tick.C:
		}
		evs := make([]outbox.Event, 0, per)
		for i := 0; i < per && n < total; i++ {
			key := KeyName(n % 1000)
			evs = append(evs, outbox.Event{Topic: Topic, PartitionKey: key, Payload: Payload(run, n, key)})
			n++
		}
		got, err := outbox.EnqueueBatch(ctx, pool, evs)
		if err != nil {
			return ids, err
		}
		ids = append(ids, got...)
	}
	return ids, nil
}

func createdAt(ctx context.Context, pool *pgxpool.Pool, ids []outbox.ID) (map[int64]time.Time, error) {
	rows, err := pool.Query(ctx, qCreatedAt, ids)
	if err != nil {
		return nil, fmt.Errorf("read created_at: %w", err)
	}
	out := make(map[int64]time.Time, len(ids))
	var id int64
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &at}, func() error { out[id] = at; return nil })
	if err != nil {
		return nil, fmt.Errorf("read created_at: %w", err)
	}
	return out, nil
}

// commitLog records, per outbox id, the database clock at the end of the handler's
// transaction.
type commitLog struct {
	mu   sync.Mutex
	at   map[int64]time.Time
	wake chan struct{}
}

func newCommitLog() *commitLog {
	return &commitLog{at: map[int64]time.Time{}, wake: make(chan struct{}, 1)}
}

func (c *commitLog) record(id int64, t time.Time) {
	c.mu.Lock()
	c.at[id] = t
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *commitLog) get(id int64) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at[id]
}

// wait returns once every id has a commit time, or after timeout.
func (c *commitLog) wait(ctx context.Context, ids []outbox.ID, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		missing := 0
		for _, id := range ids {
			if _, ok := c.at[int64(id)]; !ok {
				missing++
			}
		}
		c.mu.Unlock()
		if missing == 0 {
			return nil
		}
		select {
		case <-c.wake:
		case <-deadline.C:
			return fmt.Errorf("%d of %d events not processed %v after production ended", missing, len(ids), timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// commitHandler is the example OrderCreated handler followed by reading
// clock_timestamp() in the same transaction, recorded in log.
func commitHandler(log *commitLog) webhook.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		if err := orders.OrderCreated(ctx, tx, d); err != nil {
			return err
		}
		id, err := strconv.ParseInt(d.MessageID, 10, 64)
		if err != nil {
			return webhook.Permanent(fmt.Errorf("message id %q is not an outbox id", d.MessageID))
		}
		var at time.Time
		if err := tx.QueryRow(ctx, qClockTimestamp).Scan(&at); err != nil {
			return fmt.Errorf("read commit clock: %w", err)
		}
		// Recorded before the commit returns; a failed commit is retried by QStash and
		// overwrites this entry.
		log.record(id, at)
		return nil
	}
}
