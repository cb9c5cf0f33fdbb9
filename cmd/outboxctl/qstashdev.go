package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// runQStashDev runs the local QStash-compatible server until ctx is cancelled, printing
// the environment a client needs, as the official `qstash dev` does.
func runQStashDev(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "qstash-dev").withUsage(`usage: outboxctl qstash-dev [--port 8080] [--host 127.0.0.1] [--time-scale 1] [--plan free|payg|fixed] [--<fault> RATE ...] [-v]

Runs the local QStash-compatible server until Ctrl-C and prints the environment a client
needs (QSTASH_URL, QSTASH_TOKEN, the signing keys), as the official "qstash dev" does.`)
	port := fs.Int("port", 8080, "port to listen on")
	host := fs.String("host", "127.0.0.1", "address to listen on")
	timeScale := fs.Float64("time-scale", 1, "multiplier for retry delays (1: QStash's real backoff; 0.001 for fast local runs)")
	dedup := fs.Duration("dedup-window", qstashtest.DefaultDedupWindow, "how long deduplication ids are remembered")
	allowRemote := fs.Bool("allow-non-loopback", false, "deliver to non-loopback destinations too")
	nextKey := fs.Bool("sign-with-next-key", false, "sign deliveries with the next signing key")
	seed := fs.Uint64("seed", 1, "seed for fault injection")
	pub5xx := fs.Float64("fault-publish-5xx", 0, "probability a publish request is answered 500")
	pub429 := fs.Float64("fault-publish-429", 0, "probability a publish request is answered 429")
	drop := fs.Float64("fault-drop-response", 0, "probability a publish is accepted but its response dropped")
	dup := fs.Float64("fault-duplicate", 0, "probability a successful delivery is repeated")
	plan := fs.String("plan", "", "enforce a QStash plan's limits: free, payg or fixed (default: none, as the official dev server)")
	batchErrors := fs.String("batch-errors", string(qstashtest.BatchErrorsPerItem), "how a batch with an invalid message is answered: per-item (documented) or whole-request (observed in production)")
	quota := fs.Int("quota", 0, "daily message quota: answer 429 with RateLimit-* headers once this many messages were accepted (0: none)")
	quotaWindow := fs.Duration("quota-window", qstashtest.DefaultQuotaWindow, "how often the quota count restarts")
	latency := fs.Duration("latency", 0, "delay every API answer by this much (network round trip to QStash)")
	jitter := fs.Duration("latency-jitter", 0, "add a random extra delay in [0, this) to every API answer")
	maxInFlight := fs.Int("max-in-flight", 0, "cap on delivery attempts in flight (QStash's parallelism; default: the plan's, none without --plan; -1: none)")
	hold := fs.Bool("hold-deliveries", false, "accept and keep every message but deliver none (measure a publisher alone)")
	verbose := fs.Bool("v", false, "log every delivery attempt to stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *port < 1 || *port > 65535 {
		return usageErr(fmt.Errorf("--port %d is outside 1..65535", *port))
	}
	if *plan != "" {
		if _, err := qstash.Plan(*plan).Limits(); err != nil {
			return usageErr(fmt.Errorf("--plan: %w", err))
		}
	}
	switch qstashtest.BatchErrorMode(*batchErrors) {
	case qstashtest.BatchErrorsPerItem, qstashtest.BatchErrorsWholeRequest:
	default:
		return usageErr(fmt.Errorf("--batch-errors %q must be %s or %s", *batchErrors, qstashtest.BatchErrorsPerItem, qstashtest.BatchErrorsWholeRequest))
	}
	if *quota < 0 || *latency < 0 || *jitter < 0 {
		return usageErr(fmt.Errorf("--quota, --latency and --latency-jitter must not be negative"))
	}
	opts := qstashtest.Options{
		Addr:             net.JoinHostPort(*host, strconv.Itoa(*port)),
		TimeScale:        *timeScale,
		DedupWindow:      *dedup,
		AllowNonLoopback: *allowRemote,
		SignWithNextKey:  *nextKey,
		Seed:             *seed,
		Faults:           qstashtest.Faults{Publish5xxRate: *pub5xx, Publish429Rate: *pub429, DropResponseRate: *drop, DuplicateRate: *dup},
		Plan:             qstash.Plan(*plan),
		BatchErrors:      qstashtest.BatchErrorMode(*batchErrors),
		QuotaMessages:    *quota,
		QuotaWindow:      *quotaWindow,
		Latency:          *latency,
		LatencyJitter:    *jitter,
		MaxInFlight:      *maxInFlight,
		HoldDeliveries:   *hold,
	}
	if *verbose {
		log := slog.New(slog.NewJSONHandler(e.stderr, nil))
		opts.Logger = log
		opts.OnAttempt = func(a qstashtest.Attempt) {
			log.Info("delivery attempt", "message_id", a.MessageID, "url", a.URL, "queue", a.Queue,
				"retried", a.Retried, "status", a.Status, "error", a.Err, "duplicate", a.Duplicate,
				"failure_callback", a.FailureCallback, "duration_ms", a.End.Sub(a.Start).Milliseconds())
		}
	}
	srv, err := qstashtest.Start(opts)
	if err != nil {
		return fmt.Errorf("start local qstash: %w", err)
	}
	defer srv.Close()
	fmt.Fprintf(e.stdout, "QStash-compatible local server is running at %s\n", srv.URL)
	planName := *plan
	if planName == "" {
		planName = "none (as the official dev server)"
	}
	fmt.Fprintf(e.stdout, "plan limits: %s; batch errors: %s; daily quota: %d (0: none); latency: %v + [0, %v); max in flight: %d (0: plan's or none)\n\n",
		planName, *batchErrors, *quota, *latency, *jitter, *maxInFlight)
	fmt.Fprintf(e.stdout, "QSTASH_URL=%s\nQSTASH_TOKEN=%s\nQSTASH_CURRENT_SIGNING_KEY=%s\nQSTASH_NEXT_SIGNING_KEY=%s\n",
		srv.URL, srv.Token, srv.CurrentSigningKey, srv.NextSigningKey)
	<-ctx.Done()
	return nil
}
