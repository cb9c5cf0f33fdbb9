package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/awsenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/health"
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics/relaymetrics"
	"github.com/outbox-relay/outbox-relay/v3/internal/relayfunc"
	"github.com/outbox-relay/outbox-relay/v3/internal/telemetry"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/retention"
)

const relayUsage = `usage: outboxctl relay [--batch N] [--lease D] [--poll-interval 1s] [--listen 127.0.0.1:9090]
                       [--retention-interval 24h] [--gauge-interval 15s] [--grace D]

Runs the relay engine as a long-lived process (a container or a VM): drains continuously,
woken by LISTEN/NOTIFY with polling as the safety net, and runs retention every
--retention-interval (0 turns it off). It reads the same environment as the relay Lambda
(DATABASE_URL, QSTASH_TOKEN, QSTASH_URL, PUBLIC_BASE_URL, ...; see outboxctl env);
flags override it. Serves /healthz and /metrics (Prometheus text format) on --listen, a
loopback address. SIGTERM or Ctrl-C stops it after the batches in flight are published and
marked: within the lease (a claim gives up at the lease minus the publish and mark
timeouts, a batch is marked by the end of its lease). --grace (default: the lease) bounds
the stop whatever the database does; past it the process exits 3 and the rows of the
batches still in flight go out again after their lease. Set the orchestrator's grace period
(terminationGracePeriodSeconds, ECS stopTimeout) a few seconds above it. With DB_SECRET_ARN
a password the database refuses after a rotation is re-read from the secret, with
QSTASH_TOKEN_PARAM a token QStash refuses from the parameter. Any number of instances may
run against one database.`

// relayChunk is how long one relay.Run lasts before the process records its counters and
// starts the next; a stop request ends the current chunk at once.
const relayChunk = 5 * time.Second

func runRelay(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "relay").withUsage(relayUsage)
	fs.envVar("batch", "BATCH_SIZE", "int", "rows per claim")
	fs.envVar("lease", "LEASE", "duration", "lease per claimed batch")
	pollInterval := fs.Duration("poll-interval", relay.DefaultPollInterval, "drain at least this often when no notification arrives")
	listen := fs.String("listen", "127.0.0.1:9090", "loopback address for /healthz and /metrics (port 0 picks one)")
	retentionEvery := fs.Duration("retention-interval", 24*time.Hour, "run retention this often (0: never)")
	gaugeEvery := fs.Duration("gauge-interval", 15*time.Second, "refresh the backlog gauges this often")
	grace := fs.Duration("grace", 0, "exit at most this long after SIGTERM, batches in flight or not (0: the lease)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkLoopback(*listen); err != nil {
		return usageErr(err)
	}
	if *pollInterval <= 0 || *gaugeEvery <= 0 || *retentionEvery < 0 || *grace < 0 {
		return usageErr(errors.New("--poll-interval and --gauge-interval must be positive, --retention-interval and --grace not negative"))
	}
	// One read of the environment, AWS secret references resolved, for the whole process;
	// the database secret and the QStash token are read again when they are refused.
	cfg, err := loadRelayEnv(ctx, overlayEnv(e.getenv, fs.envOverlay()))
	if err != nil {
		return err
	}
	logger := slog.New(telemetry.LogHandler(slog.NewJSONHandler(e.stderr, &slog.HandlerOptions{Level: cfg.LogLevel})))
	pub, err := qstash.NewPublisher(cfg.Publisher)
	if err != nil {
		return usageErr(err)
	}
	// In FIFO ordering the queues must exist with parallelism 1 and not be paused.
	if err := pub.EnsureQueues(ctx); err != nil {
		return fmt.Errorf("relay: check qstash fifo queues: %w", err)
	}
	pool, err := openRelayPool(ctx, cfg, *retentionEvery > 0, logger)
	if err != nil {
		return err
	}
	// A stop past its grace period leaves connections acquired: Close would wait for them.
	abandoned := false
	defer func() {
		if !abandoned {
			pool.Close()
		}
	}()

	tr, stopTracing, err := startTracing(ctx, cfg.Getenv, tracingRelayServiceName)
	if err != nil {
		return err
	}
	defer stopTracing() // flushes the last batches' spans on exit
	rc := cfg.Relay
	rc.PollInterval, rc.Logger, rc.Tracer = *pollInterval, logger, tr
	r, err := relay.New(pool, pub, rc)
	if err != nil {
		return usageErr(err)
	}
	ret := cfg.Retention
	ret.Logger = logger
	p := &relayProcess{
		pool: pool, relay: r, relayCfg: rc.WithDefaults(), retention: ret, retentionEvery: *retentionEvery, gaugeEvery: *gaugeEvery, grace: *grace,
		reg: metrics.NewRegistry(metrics.RegistryConfig{Functions: []string{metrics.FunctionRelay}}),
		log: logger,
	}
	if p.grace == 0 {
		p.grace = p.relayCfg.Lease
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	err = p.run(ctx, ln)
	abandoned = errors.Is(err, errGraceExceeded)
	return err
}

// relayConns is the pool size of outboxctl relay: a connection for everything that can
// hold one at the same time. The drain claims on one while each batch in flight
// (PublishConcurrency) may be marking on its own; the LISTEN session holds one for as long
// as the relay runs; the backlog gauge and, when on, the retention loop run beside the
// drain on their own schedules. A pool sized by CPU count (4 on a 2-core machine) had 3
// connections for 8 batches, and the marks waited behind the LISTEN session, the gauge and
// retention, past their 5 s budget.
func relayConns(rc relay.Config, retention bool) int32 {
	n := 1 + rc.WithDefaults().PublishConcurrency + 1 + 1
	if retention {
		n++
	}
	return int32(n)
}

// openRelayPool opens the relay's pool, sized by relayConns, re-reading a rotated password
// when the environment names a secret, and checks that the database answers.
func openRelayPool(ctx context.Context, cfg relayfunc.Env, retention bool, logger *slog.Logger) (*pgxpool.Pool, error) {
	return checkedPool(ctx, cfg.DatabaseURL, awsenv.PoolConfig{MaxConns: relayConns(cfg.Relay, retention), Credentials: cfg.Credentials, Logger: logger})
}

// errGraceExceeded: the relay did not stop within its grace period.
var errGraceExceeded = errors.New("relay did not stop within its grace period")

// checkLoopback refuses a non-loopback listen address: /metrics and /healthz carry
// operational detail and have no authentication; put a proxy in front to expose them.
func checkLoopback(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("--listen %q: bad port", addr)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--listen %q must be a loopback address (127.0.0.1, ::1, localhost)", addr)
	}
	return nil
}

// relayProcess is the long-lived relay: a drain loop, a retention loop, a gauge loop and
// an HTTP server for health and metrics.
type relayProcess struct {
	pool           *pgxpool.Pool
	relay          *relay.Relay
	relayCfg       relay.Config // with its defaults, as the relay runs it
	retention      retention.Config
	retentionEvery time.Duration
	gaugeEvery     time.Duration
	// grace bounds the stop after ctx ends.
	grace time.Duration
	reg   *metrics.Registry
	log   *slog.Logger

	// lastOK is when the drain loop last completed a chunk without error (unix nanos);
	// lastErr the error of the last failed chunk.
	lastOK  atomic.Int64
	lastErr atomic.Pointer[string]
}

// run serves until ctx ends, then stops in order: no new claims, the batch in flight is
// published and marked, retention stops between batches, the HTTP server shuts down.
func (p *relayProcess) run(ctx context.Context, ln net.Listener) error {
	p.lastOK.Store(time.Now().UnixNano())
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", p.healthz)
	mux.Handle("GET /metrics", p.reg)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	p.log.InfoContext(ctx, "relay started", slog.String("addr", ln.Addr().String()),
		slog.Int("batch_size", p.relayCfg.BatchSize), slog.Duration("lease", p.relayCfg.Lease),
		slog.Duration("retention_interval", p.retentionEvery))

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		var wg sync.WaitGroup
		wg.Go(func() { p.gauges(ctx) })
		if p.retentionEvery > 0 {
			wg.Go(func() { p.retentionLoop(ctx) })
		}
		p.drainLoop(ctx)
		wg.Wait()
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		// Every statement has a bound (claims ClaimTimeout, marks MarkTimeout, the gauge
		// 5 s, retention its context) and a batch is marked by the end of its lease; the
		// timer is the bound that holds whatever the database or a dependency does.
		t := time.NewTimer(p.grace)
		defer t.Stop()
		select {
		case <-stopped:
		case <-t.C:
			p.log.ErrorContext(ctx, "relay did not stop within its grace period; exiting with work in flight: rows of unmarked batches go out again after their lease",
				slog.Duration("grace", p.grace))
			_ = srv.Close()
			return fmt.Errorf("%w (%v)", errGraceExceeded, p.grace)
		}
	}

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut down metrics server: %w", err)
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve metrics: %w", err)
	}
	p.log.InfoContext(ctx, "relay stopped")
	return nil
}

// drainLoop keeps the relay running in chunks, so counters reach /metrics while it runs.
// After a failed run (database down) relay.Supervise backs off (1s doubling to 30s) and
// tries again: the process outlives an outage, and /healthz reports it.
func (p *relayProcess) drainLoop(ctx context.Context) {
	_ = relay.Supervise(ctx, func(int) (*relay.Relay, error) { return p.relay, nil }, relay.SuperviseConfig{
		Chunk: relayChunk,
		OnRun: func(st relay.Stats, err error) {
			p.record(relaymetrics.Values(st))
			if err == nil || ctx.Err() != nil {
				p.lastOK.Store(time.Now().UnixNano())
				p.lastErr.Store(nil)
				return
			}
			msg := err.Error()
			p.lastErr.Store(&msg)
		},
	})
}

func (p *relayProcess) retentionLoop(ctx context.Context) {
	t := time.NewTicker(p.retentionEvery)
	defer t.Stop()
	for {
		res, err := retention.Run(ctx, p.pool, p.retention)
		p.record(metrics.Retention(res.OutboxDeleted, res.ProcessedDeleted))
		if err != nil {
			p.log.ErrorContext(ctx, "retention run failed", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *relayProcess) gauges(ctx context.Context) {
	t := time.NewTicker(p.gaugeEvery)
	defer t.Stop()
	for {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		g, err := health.Backlog(gctx, p.pool)
		cancel()
		if err == nil {
			p.record(metrics.Backlog(g.Pending, g.Lateness, g.OldestCreatedAge, g.OpenCircuits))
		} else if ctx.Err() == nil {
			p.log.WarnContext(ctx, "backlog gauge failed", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *relayProcess) record(values []metrics.Value) {
	if err := p.reg.Record(metrics.Event{Function: metrics.FunctionRelay, Values: values}); err != nil {
		p.log.Error("record metrics", slog.Any("error", err))
	}
}

// healthz answers 200 while the drain loop completes chunks, 503 with the last error when
// it has not for three chunks (the database is down, or the loop is stuck).
func (p *relayProcess) healthz(w http.ResponseWriter, _ *http.Request) {
	since := time.Since(time.Unix(0, p.lastOK.Load()))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if last := p.lastErr.Load(); last != nil && since > 3*relayChunk {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "unhealthy: no successful drain for %s: %s\n", since.Round(time.Second), strings.TrimSpace(*last))
		return
	}
	if since > 3*relayChunk+p.relayCfg.Lease {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "unhealthy: the drain loop has not completed for %s\n", since.Round(time.Second))
		return
	}
	fmt.Fprintln(w, "ok")
}
