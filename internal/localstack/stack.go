// Package localstack runs the whole pipeline on one machine: Postgres (given or throwaway),
// QStash (given or the built-in server), the webhook and failure-callback handlers on
// loopback, a relay as the schedule would run it (with LISTEN/NOTIFY), and a demo producer
// writing orders and their events in business transactions. The summary is read from the
// database, so it checks the guarantees rather than echoing counters.
package localstack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// Options configures Run. Zero values take the defaults noted.
type Options struct {
	// DatabaseURL is the server to use; the stack works in its own schema there and drops
	// it at the end (unless Keep). Empty: a throwaway cluster under DataDir.
	DatabaseURL string
	// DataDir holds the throwaway cluster. Default a temporary directory, removed at exit.
	DataDir string
	// QStashURL, QStashToken and the signing keys select an external QStash (the official
	// dev server). Empty QStashURL: the built-in server. Upstash itself cannot deliver to
	// this machine's loopback handlers.
	QStashURL, QStashToken, CurrentSigningKey, NextSigningKey string
	// QStashLatency and QStashLatencyJitter delay every answer of the built-in server like
	// a remote QStash; QStashMaxInFlight caps its deliveries in flight (0: none). See
	// qstashtest.Options.
	QStashLatency, QStashLatencyJitter time.Duration
	QStashMaxInFlight                  int
	// Producer shapes the demo load.
	Producer ProducerConfig
	// Ordering is "fifo" (default: per-key order end to end) or "publish".
	Ordering publish.Ordering
	// Forever keeps the stack up after the demo until ctx is cancelled.
	Forever bool
	// Keep leaves the schema in place for inspection; the Summary names it. A throwaway
	// cluster outlives the run only in a DataDir of the caller's (stopped).
	Keep bool
	// Timeout bounds the wait for the pipeline to settle. Default 2 minutes.
	Timeout time.Duration
	// Progress receives the live display; nil disables it. Terminal selects a one-line
	// display redrawn in place instead of periodic lines.
	Progress io.Writer
	Terminal bool
	// Logger receives component logs. Default: discard.
	Logger *slog.Logger
	// OnReady, when set, is called once the schema, the pipeline and the relay are up,
	// before the demo producer starts, with the stack's pool; the stop it returns runs
	// before the pool closes. outboxctl dev --ui serves the operator console this way.
	OnReady func(ctx context.Context, pool *pgxpool.Pool) (stop func(), err error)
	// Tracer, when set, traces the whole pipeline: the demo producer's business
	// transactions, the relay's batches, the deliveries and the failure callbacks
	// (outboxctl dev --trace records them in memory). Nil: tracing off.
	Tracer trace.Tracer
	// Deployed runs the relay as deployed instead of in this process: the built
	// functions/relay under aws-lambda-rie behind the local Lambda service, kicked by the
	// producer after each commit, ticked every Schedule (default a minute). The relay's
	// spans are not recorded then.
	Deployed bool
	Schedule time.Duration
}

// Run brings the stack up, runs the demo, waits until every event is applied or
// dead-lettered (or Timeout), and returns the summary.
func Run(ctx context.Context, opts Options) (Summary, error) {
	opts = opts.withDefaults()
	base, stopPostgres, err := startPostgres(ctx, opts)
	if err != nil {
		return Summary{}, err
	}
	defer stopPostgres()
	pool, schema, dropSchema, err := openSchema(ctx, base, opts.Keep)
	if err != nil {
		return Summary{}, err
	}
	defer dropSchema()
	defer pool.Close()

	// QStash, the receivers on loopback (the same handlers the Lambdas serve) and the
	// publisher; then the relay, as the schedule runs it, lingering on NOTIFY.
	var duplicates atomic.Int64
	pl, err := StartPipeline(ctx, pipelineConfig(pool, opts, &duplicates))
	if err != nil {
		return Summary{}, err
	}
	defer pl.Close()
	stopRelay, err := startRelay(ctx, pl, pool, schema, &opts)
	if err != nil {
		return Summary{}, err
	}
	defer stopRelay()

	if opts.OnReady != nil {
		stop, err := opts.OnReady(ctx, pool)
		if err != nil {
			return Summary{}, err
		}
		defer stop()
	}

	// The demo producer.
	produceCtx, cancelProduce := context.WithCancel(ctx)
	defer cancelProduce()
	produced := make(chan error, 1)
	go func() {
		pc := opts.Producer
		if pc.Tracer == nil {
			pc.Tracer = opts.Tracer
		}
		_, err := Produce(produceCtx, pool, pc)
		produced <- err
	}()
	prodErr, err := waitSettled(ctx, pool, opts, produced)
	if err != nil {
		return Summary{}, err
	}
	cancelProduce()
	relayErr := stopRelay()

	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Summarize(sctx, pool)
	if err != nil {
		return s, err
	}
	s.DuplicatesAbsorbed = duplicates.Load()
	s.Ordering = string(opts.Ordering)
	if opts.Keep {
		s.KeptSchema, s.KeptURL = schema.Name, redactedURL(schema.URL)
	}
	if prodErr != nil && !errors.Is(prodErr, context.Canceled) {
		return s, prodErr
	}
	if relayErr != nil && !s.OK() {
		return s, relayErr
	}
	return s, nil
}

// startRelay starts the relay in process, or as deployed (opts.Deployed: the built
// function under the local Lambda service, kicked by the demo producer, which it sets as
// opts.Producer.Waker). The stop it returns may be called more than once.
func startRelay(ctx context.Context, pl *Pipeline, pool *pgxpool.Pool, schema *postgres.Schema, opts *Options) (stop func() error, err error) {
	if !opts.Deployed {
		return superviseRelay(pl, pool, opts.Logger)
	}
	dr, err := startDeployedRelay(ctx, pl, pool, schema.URL, *opts)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	opts.Producer.Waker = dr.kicker
	return func() error { once.Do(dr.stop); return nil }, nil
}

func (opts Options) withDefaults() Options {
	opts.Ordering = cmp.Or(opts.Ordering, publish.OrderingFIFO)
	opts.Timeout = cmp.Or(opts.Timeout, 2*time.Minute)
	opts.Schedule = cmp.Or(opts.Schedule, time.Minute)
	opts.Logger = cmp.Or(opts.Logger, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return opts
}

// startPostgres returns opts.DatabaseURL, or starts a throwaway cluster and returns its
// URL; stop removes what it started.
func startPostgres(ctx context.Context, opts Options) (url string, stop func(), err error) {
	if opts.DatabaseURL != "" {
		return opts.DatabaseURL, func() {}, nil
	}
	dir, cleanup, err := dataDir(opts.DataDir)
	if err != nil {
		return "", nil, err
	}
	cl, err := pgcluster.StartCluster(ctx, dir)
	if err != nil {
		cleanup()
		return "", nil, err
	}
	opts.Logger.InfoContext(ctx, "started throwaway postgres", "dir", dir, "port", cl.Port)
	return cl.URL, func() { cl.Stop(); cleanup() }, nil
}

// pipelineConfig is the demo's pipeline: its handler, the local QStash (or opts'
// external one) at opts' latency, counting the deliveries absorbed as duplicates.
func pipelineConfig(pool *pgxpool.Pool, opts Options, duplicates *atomic.Int64) PipelineConfig {
	pcfg := PipelineConfig{
		Pool:     pool,
		Handlers: webhook.Handlers{"order.created": DemoHandler},
		Observe: func(_, outcome string) {
			if outcome == webhook.OutcomeDuplicate {
				duplicates.Add(1)
			}
		},
		QStash: qstashtest.Options{TimeScale: 0.001, Latency: opts.QStashLatency, LatencyJitter: opts.QStashLatencyJitter,
			MaxInFlight: opts.QStashMaxInFlight},
		Publisher: qstash.PublisherConfig{Ordering: opts.Ordering},
		Logger:    opts.Logger,
		Tracer:    opts.Tracer,
	}
	if opts.QStashURL != "" {
		pcfg.External = &ExternalQStash{URL: opts.QStashURL, Token: opts.QStashToken, CurrentSigningKey: opts.CurrentSigningKey, NextSigningKey: opts.NextSigningKey}
	}
	return pcfg
}

// superviseRelay runs the pipeline's relay under relay.Supervise until stop, which waits
// for it and returns the last run's error (nil if it succeeded); stop may be called again.
func superviseRelay(pl *Pipeline, pool *pgxpool.Pool, log *slog.Logger) (stop func() error, err error) {
	r, err := pl.NewRelay(pool, relay.Config{BatchSize: 100, Logger: log})
	if err != nil {
		return nil, err
	}
	stopRelay, cancelRelay := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var relayErr error
	wg.Go(func() {
		_ = relay.Supervise(stopRelay, func(int) (*relay.Relay, error) { return r, nil }, relay.SuperviseConfig{
			OnRun: func(_ relay.Stats, err error) {
				if err != nil {
					relayErr = err // logged by Supervise
				}
			},
		})
	})
	return func() error { cancelRelay(); wg.Wait(); return relayErr }, nil
}

// waitSettled shows progress until every produced event is applied or dead-lettered,
// the producer fails, ctx ends or opts.Timeout passes (opts.Forever: until ctx ends). It
// returns the producer's error, and an error only when progress could not be read.
func waitSettled(ctx context.Context, pool *pgxpool.Pool, opts Options, produced <-chan error) (prodErr, err error) {
	want := int64(opts.Producer.Events)
	deadline := time.Now().Add(opts.Timeout)
	disp := newDisplay(opts.Progress, opts.Terminal)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	produceDone := false
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case err := <-produced:
			produceDone, prodErr = true, err
			if err != nil && ctx.Err() == nil {
				break wait
			}
		case <-tick.C:
			p, err := ReadProgress(ctx, pool)
			if err != nil {
				if ctx.Err() != nil {
					break wait
				}
				return prodErr, err
			}
			disp.show(p)
			settled := produceDone && p.Processed+p.DeadLetters >= want
			if settled && !opts.Forever {
				break wait
			}
			if !opts.Forever && time.Now().After(deadline) {
				opts.Logger.ErrorContext(ctx, "pipeline did not settle before the timeout", "timeout", opts.Timeout.String())
				break wait
			}
		}
	}
	disp.done()
	return prodErr, nil
}

func dataDir(dir string) (string, func(), error) {
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", nil, fmt.Errorf("create data dir: %w", err)
		}
		return dir, func() {}, nil
	}
	d, err := os.MkdirTemp("", "outbox-dev-pg-")
	if err != nil {
		return "", nil, fmt.Errorf("create data dir: %w", err)
	}
	return d, func() { _ = os.RemoveAll(d) }, nil
}

// openSchema creates dev_<random> on base, migrated, with the demo tables, and opens a
// pool on it.
func openSchema(ctx context.Context, base string, keep bool) (pool *pgxpool.Pool, sc *postgres.Schema, drop func(), err error) {
	sc, err = postgres.CreateSchema(ctx, base, "dev", true, nil)
	if err != nil {
		return nil, nil, nil, err
	}
	drop = func() {
		if !keep {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_ = sc.Drop(dctx)
		}
	}
	cfg, err := pgxpool.ParseConfig(sc.URL)
	if err != nil {
		drop()
		return nil, nil, nil, fmt.Errorf("parse database url: %w", err)
	}
	cfg.MaxConns = 12
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		drop()
		return nil, nil, nil, fmt.Errorf("open pool: %w", err)
	}
	if err := CreateDemoTables(ctx, pool); err != nil {
		pool.Close()
		drop()
		return nil, nil, nil, err
	}
	return pool, sc, drop, nil
}

// redactedURL is raw with its password, if any, shown as "xxxxx": a kept schema's URL is
// printed, and DATABASE_URL's password must not be.
func redactedURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "" // CreateSchema made it from a URL that connected: cannot happen
	}
	return u.Redacted()
}

// display renders progress: one line redrawn in place on a terminal, else a line a second.
type display struct {
	w        io.Writer
	terminal bool
	start    time.Time
	last     time.Time
}

func newDisplay(w io.Writer, terminal bool) *display {
	return &display{w: w, terminal: terminal, start: time.Now()}
}

func (d *display) show(p Progress) {
	if d.w == nil {
		return
	}
	if !d.terminal && time.Since(d.last) < time.Second {
		return
	}
	d.last = time.Now()
	rate := float64(p.Processed+p.DeadLetters) / time.Since(d.start).Seconds()
	line := fmt.Sprintf("produced %d  dispatched %d  processed %d  dead letters %d  backlog %d  oldest %.1fs  %.0f events/s",
		p.Produced, p.Dispatched, p.Processed, p.DeadLetters, p.Backlog, p.OldestAgeSeconds, rate)
	if d.terminal {
		fmt.Fprintf(d.w, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(d.w, line)
	}
}

func (d *display) done() {
	if d.w != nil && d.terminal {
		fmt.Fprintln(d.w)
	}
}
