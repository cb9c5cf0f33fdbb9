// Package devstack runs the whole pipeline on one machine: Postgres (given or throwaway),
// QStash (given or the built-in server), the webhook and failure-callback handlers on
// loopback, a relay as the schedule would run it (with LISTEN/NOTIFY), and a demo producer
// writing orders and their events in business transactions. The summary is read from the
// database, so it checks the guarantees rather than echoing counters.
package devstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/pkg/postgres"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/pkg/relay"
	"github.com/outbox-relay/outbox-relay/pkg/webhook"
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
	// Producer shapes the demo load.
	Producer ProducerConfig
	// Ordering is "fifo" (default: per-key order end to end) or "publish".
	Ordering qstash.Ordering
	// Forever keeps the stack up after the demo until ctx is cancelled.
	Forever bool
	// Keep leaves the schema in place for inspection.
	Keep bool
	// Timeout bounds the wait for the pipeline to settle. Default 2 minutes.
	Timeout time.Duration
	// Progress receives the live display; nil disables it. Terminal selects a one-line
	// display redrawn in place instead of periodic lines.
	Progress io.Writer
	Terminal bool
	// Logger receives component logs. Default: discard.
	Logger *slog.Logger
}

// Run brings the stack up, runs the demo, waits until every event is applied or
// dead-lettered (or Timeout), and returns the summary.
func Run(ctx context.Context, opts Options) (Summary, error) {
	if opts.Ordering == "" {
		opts.Ordering = qstash.OrderingFIFO
	}
	if opts.Timeout == 0 {
		opts.Timeout = 2 * time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	log := opts.Logger

	// Postgres.
	base := opts.DatabaseURL
	if base == "" {
		dir, cleanup, err := dataDir(opts.DataDir)
		if err != nil {
			return Summary{}, err
		}
		defer cleanup()
		cl, err := StartCluster(ctx, dir)
		if err != nil {
			return Summary{}, err
		}
		defer cl.Stop()
		base = cl.URL
		log.Info("started throwaway postgres", "dir", dir, "port", cl.Port)
	}
	pool, dropSchema, err := openSchema(ctx, base, opts.Keep)
	if err != nil {
		return Summary{}, err
	}
	defer dropSchema()
	defer pool.Close()

	// QStash.
	qsURL, token, cur, next := opts.QStashURL, opts.QStashToken, opts.CurrentSigningKey, opts.NextSigningKey
	if qsURL == "" {
		srv := qstashtest.NewServer(qstashtest.Options{TimeScale: 0.001, Logger: log})
		defer srv.Close()
		qsURL, token, cur, next = srv.URL, srv.Token, srv.CurrentSigningKey, srv.NextSigningKey
	}
	if token == "" || cur == "" || next == "" {
		return Summary{}, errors.New("with QSTASH_URL set, QSTASH_TOKEN, QSTASH_CURRENT_SIGNING_KEY and QSTASH_NEXT_SIGNING_KEY are required too")
	}
	verifier, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: cur, NextSigningKey: next})
	if err != nil {
		return Summary{}, err
	}

	// Consumers on loopback: the same handlers the Lambdas serve.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Summary{}, fmt.Errorf("listen for handlers: %w", err)
	}
	baseURL := "http://" + ln.Addr().String()
	failureURL := baseURL + "/failure"
	var duplicates atomic.Int64
	hook, err := webhook.New(webhook.Config{
		Pool:          pool,
		Verifier:      verifier,
		Handlers:      webhook.Handlers{"order.created": DemoHandler},
		PublicBaseURL: baseURL,
		Logger:        log,
		Observe: func(_, outcome string) {
			if outcome == webhook.OutcomeDuplicate {
				duplicates.Add(1)
			}
		},
	})
	if err != nil {
		return Summary{}, err
	}
	cb, err := deadletter.NewCallbackHandler(deadletter.CallbackConfig{Pool: pool, Verifier: verifier, FailureURL: failureURL, Logger: log})
	if err != nil {
		return Summary{}, err
	}
	mux := http.NewServeMux()
	mux.Handle("/events/", hook)
	mux.Handle("/failure", cb)
	// A slow body must not hold a handler (and its database connection) forever.
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() { _ = httpSrv.Serve(ln) }()
	defer httpSrv.Close()

	// The relay, as the schedule runs it, lingering on NOTIFY.
	pub, err := qstash.NewPublisher(qstash.PublisherConfig{
		BaseURL: qsURL, Token: token, DestinationBaseURL: baseURL, FailureCallbackURL: failureURL,
		Ordering: opts.Ordering,
	})
	if err != nil {
		return Summary{}, err
	}
	if err := pub.EnsureQueues(ctx); err != nil {
		return Summary{}, fmt.Errorf("check qstash fifo queues: %w", err)
	}
	r, err := relay.New(pool, pub, relay.Config{BatchSize: 100, Logger: log})
	if err != nil {
		return Summary{}, err
	}
	stopRelay, cancelRelay := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var relayErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for stopRelay.Err() == nil {
			if _, err := r.Run(stopRelay); err != nil {
				log.Error("relay run", "error", err.Error())
				relayErr = err
				select { // the next "tick"
				case <-stopRelay.Done():
				case <-time.After(time.Second):
				}
			}
		}
	}()
	defer func() { cancelRelay(); wg.Wait() }()

	// The demo producer.
	produceCtx, cancelProduce := context.WithCancel(ctx)
	defer cancelProduce()
	produced := make(chan error, 1)
	go func() {
		_, err := Produce(produceCtx, pool, opts.Producer)
		produced <- err
	}()

	want := int64(opts.Producer.Events)
	deadline := time.Now().Add(opts.Timeout)
	disp := newDisplay(opts.Progress, opts.Terminal)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	produceDone := false
	var prodErr error
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
				return Summary{}, err
			}
			disp.show(p)
			settled := produceDone && p.Processed+p.DeadLetters >= want
			if settled && !opts.Forever {
				break wait
			}
			if !opts.Forever && time.Now().After(deadline) {
				log.Error("pipeline did not settle before the timeout", "timeout", opts.Timeout.String())
				break wait
			}
		}
	}
	disp.done()
	cancelProduce()
	cancelRelay()
	wg.Wait()

	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Summarize(sctx, pool)
	if err != nil {
		return s, err
	}
	s.DuplicatesAbsorbed = duplicates.Load()
	s.Ordering = string(opts.Ordering)
	if prodErr != nil && !errors.Is(prodErr, context.Canceled) {
		return s, prodErr
	}
	if relayErr != nil && !s.OK() {
		return s, relayErr
	}
	return s, nil
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

// openSchema creates dev_<random> on base, migrates it and opens a pool on it.
func openSchema(ctx context.Context, base string, keep bool) (*pgxpool.Pool, func(), error) {
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to postgres: %w", err)
	}
	defer admin.Close(context.Background())
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "dev_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, nil, fmt.Errorf("create schema: %w", err)
	}
	drop := func() {
		if keep {
			return
		}
		c, err := pgx.Connect(context.Background(), base)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}
	url, err := pgtest.WithSearchPath(base, schema)
	if err != nil {
		drop()
		return nil, nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		drop()
		return nil, nil, fmt.Errorf("parse database url: %w", err)
	}
	cfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		drop()
		return nil, nil, fmt.Errorf("open pool: %w", err)
	}
	if _, err := postgres.Migrate(ctx, pool, nil); err != nil {
		pool.Close()
		drop()
		return nil, nil, err
	}
	if err := CreateDemoTables(ctx, pool); err != nil {
		pool.Close()
		drop()
		return nil, nil, err
	}
	return pool, drop, nil
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
