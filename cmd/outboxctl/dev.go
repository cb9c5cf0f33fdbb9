package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/console"
	"github.com/outbox-relay/outbox-relay/v3/internal/localstack"
	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster"
	"github.com/outbox-relay/outbox-relay/v3/internal/telemetry"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

func runDev(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "dev").withUsage(`usage: outboxctl dev [--events N] [--rate R] [--keys K] [--poison PCT] [--ordering fifo|publish] [--json]
                     [--ui [--ui-listen ADDR]] [--forever] [--trace [--traces N]] [--timeout D] [-v]
                     [--keep] [--data-dir DIR] [--qstash-latency D] [--qstash-latency-jitter D]
                     [--qstash-max-in-flight N] [--deployed [--schedule D]]

Runs the local stack end to end (Postgres: DATABASE_URL in its own schema, else a throwaway
cluster; the built-in QStash unless QSTASH_URL is set; the relay, the webhook, the failure
callback) with a demo producer, and prints a summary read from the database. Exit status 1
when an event was lost, applied twice or dead-lettered without being poison.

--deployed runs the relay in the deployed shape: functions/relay built and run under
aws-lambda-rie (make rie-install) behind a local Lambda Invoke API with the template's
reserved concurrency (2), kicked by the producer after each commit and ticked every
--schedule; run it from the repository (it builds the bootstrap).`)
	events := fs.Int("events", 1000, "orders (and events) the demo producer writes")
	rate := fs.Float64("rate", 0, "events per second (0: as fast as possible)")
	keys := fs.Int("keys", 50, "partition keys (customers) the orders spread over")
	poison := fs.Float64("poison", 1, "percent of events with a payload the handler rejects as permanent (exactly floor(events*poison/100))")
	ordering := fs.String("ordering", "fifo", "QStash ordering mode: fifo (per-key order end to end, which the summary checks) or publish (no order; the SAM stack's default, set its Ordering parameter to fifo for this order)")
	asJSON := fs.Bool("json", false, "print the summary as one JSON object on the last line")
	forever := fs.Bool("forever", false, "keep the stack up after the demo until Ctrl-C")
	keep := fs.Bool("keep", false, "keep the dev schema for inspection, and print how to reach it (needs DATABASE_URL or --data-dir)")
	timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait for the pipeline to settle")
	dataDir := fs.String("data-dir", "", "directory for the throwaway Postgres cluster (default: a temporary one)")
	verbose := fs.Bool("v", false, "log the components' JSON logs to stderr")
	ui := fs.Bool("ui", false, "serve the operator console (outboxctl ui, redrive enabled) on --ui-listen while the stack runs; implies --forever")
	uiListen := fs.String("ui-listen", console.DefaultListen, "loopback address of the console with --ui")
	latency := fs.Duration("qstash-latency", 0, "built-in QStash: delay every API answer by this much (the round trip to a remote QStash)")
	jitter := fs.Duration("qstash-latency-jitter", 0, "built-in QStash: add a random extra delay in [0, this)")
	inFlight := fs.Int("qstash-max-in-flight", 0, "built-in QStash: cap on deliveries in flight (0: none)")
	trace := fs.Bool("trace", false, "record OpenTelemetry spans in memory and print the span trees of a few events at the end (producer -> relay batch -> delivery -> handler commit)")
	traces := fs.Int("traces", 3, "with --trace: how many events' trees to print")
	deployed := fs.Bool("deployed", false, "run the relay as deployed: the built bootstrap under aws-lambda-rie behind a local Lambda service, kicked after each commit, ticked every --schedule")
	schedule := fs.Duration("schedule", time.Minute, "with --deployed: the relay's scheduled tick (the template's RelaySchedule)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var bad []string
	if *events < 1 {
		bad = append(bad, "--events must be at least 1")
	}
	if *keys < 1 {
		bad = append(bad, "--keys must be at least 1")
	}
	if *poison < 0 || *poison > 100 {
		bad = append(bad, "--poison must be a percentage in 0..100")
	}
	if *traces < 1 {
		bad = append(bad, "--traces must be at least 1")
	}
	if *schedule <= 0 {
		bad = append(bad, "--schedule must be positive")
	}
	if *rate < 0 {
		bad = append(bad, "--rate must not be negative")
	}
	if *ordering != string(publish.OrderingFIFO) && *ordering != string(publish.OrderingPublish) {
		bad = append(bad, "--ordering must be fifo or publish")
	}
	if *keep && e.getenv("DATABASE_URL") == "" && *dataDir == "" {
		// The throwaway cluster's temporary directory is removed at exit: nothing to keep.
		bad = append(bad, "--keep needs a server that outlives the run: set DATABASE_URL, or pass --data-dir DIR to keep the cluster (stopped at exit)")
	}
	if *ui && console.CheckListen(*uiListen, "") != nil {
		bad = append(bad, "--ui-listen must be a loopback host:port (the dev console has no token)")
	}
	if len(bad) > 0 {
		for _, b := range bad {
			fmt.Fprintln(e.stderr, b)
		}
		return usageErr(fmt.Errorf("invalid flags"))
	}

	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if *verbose {
		logger = slog.New(slog.NewJSONHandler(e.stderr, nil))
	}
	progress := e.stdout
	if *asJSON {
		progress = e.stderr
	}
	pc := localstack.ProducerConfig{Events: *events, Rate: *rate, Keys: *keys, PoisonPercent: *poison}
	opts := localstack.Options{
		DatabaseURL:         e.getenv("DATABASE_URL"),
		DataDir:             *dataDir,
		QStashURL:           e.getenv("QSTASH_URL"),
		QStashToken:         e.getenv("QSTASH_TOKEN"),
		CurrentSigningKey:   e.getenv("QSTASH_CURRENT_SIGNING_KEY"),
		NextSigningKey:      e.getenv("QSTASH_NEXT_SIGNING_KEY"),
		Producer:            pc,
		Ordering:            publish.Ordering(*ordering),
		QStashLatency:       *latency,
		QStashLatencyJitter: *jitter,
		QStashMaxInFlight:   *inFlight,
		Forever:             *forever,
		Keep:                *keep,
		Timeout:             *timeout,
		Progress:            progress,
		Terminal:            isTerminal(progress),
		Logger:              logger,
		Deployed:            *deployed,
		Schedule:            *schedule,
	}
	if *ui {
		// The console is the point of --ui: the stack stays up until Ctrl-C. The dev schema
		// is throwaway, so redrive is on.
		opts.Forever = true
		opts.OnReady = func(_ context.Context, pool *pgxpool.Pool) (func(), error) {
			srv, ln, err := listenConsole(progress, console.Config{DB: pool, Listen: *uiListen, AllowRedrive: true, Logger: logger, Tracer: opts.Tracer})
			if err != nil {
				return nil, err
			}
			stop, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				if err := srv.Serve(stop, ln); err != nil {
					logger.Error("operator console", "error", err.Error())
				}
			}()
			return func() { cancel(); <-done }, nil
		}
	}
	where := "DATABASE_URL (own schema)"
	if opts.DatabaseURL == "" {
		where = "a throwaway cluster"
	}
	qs := "the built-in QStash server"
	if opts.QStashURL != "" {
		qs = opts.QStashURL
	}
	relayShape := "the relay in process"
	if *deployed {
		relayShape = fmt.Sprintf("the relay as deployed (aws-lambda-rie, kicked, ticked every %v)", *schedule)
	}
	fmt.Fprintf(progress, "outbox-relay local stack: Postgres on %s, %s, %s, %d events over %d keys, %d poison, %s mode\n",
		where, qs, relayShape, *events, *keys, pc.PoisonCount(), *ordering)
	if *ordering == string(publish.OrderingFIFO) {
		// Where the choice shows: a user who saw "order violations 0" here must not deploy
		// the template's default and expect the same.
		fmt.Fprintln(progress, "  (fifo keeps each key's order; the SAM stack deploys publish, which does not, unless its Ordering parameter is fifo)")
	}

	var spans *tracetest.SpanRecorder
	if *trace {
		spans = tracetest.NewSpanRecorder()
		tel, err := telemetry.NewProvider(ctx, spans, "outboxctl-dev")
		if err != nil {
			return err
		}
		defer tel.Shutdown(context.Background())
		opts.Tracer = tel.Tracer()
	}

	s, err := localstack.Run(ctx, opts)
	if err != nil && s.Produced == 0 {
		return err
	}
	if spans != nil {
		fmt.Fprintf(progress, "\ntraces (%d of %d events; the batch span links every event it published)\n", min(int64(*traces), s.Produced), s.Produced)
		localstack.RenderTraces(progress, spans.Ended(), *traces)
	}
	if *asJSON {
		b, _ := json.Marshal(s)
		fmt.Fprintln(e.stdout, string(b))
	} else {
		printSummary(e.stdout, s)
		if s.KeptSchema != "" {
			printKept(e.stdout, s, opts)
		}
	}
	if err != nil {
		return err
	}
	if !s.OK() {
		return negativeErr(fmt.Errorf("lost %d, applied twice %d, unexpected dead letters %d", s.Lost, s.DuplicateEffects, s.DeadLetters-s.PoisonDeadLettered))
	}
	return nil
}

func printSummary(w io.Writer, s localstack.Summary) {
	fmt.Fprintf(w, `
summary (from the database)
  produced              %d
  processed once        %d
  applied twice         %d
  duplicates absorbed   %d
  dead-lettered         %d (poison %d)
  lost                  %d
  order violations      %d (%s mode)
  latency p50 / p99     %.1f ms / %.1f ms
`, s.Produced, s.Processed, s.DuplicateEffects, s.DuplicatesAbsorbed, s.DeadLetters, s.Poison, s.Lost, s.OrderViolations, s.Ordering, s.LatencyP50ms, s.LatencyP99ms)
}

// printKept says where the kept schema is and how to reach it: the cluster to start again
// when it was the throwaway one, the DATABASE_URL the other commands take, how to drop it.
func printKept(w io.Writer, s localstack.Summary, opts localstack.Options) {
	fmt.Fprintf(w, "\nkept schema %s for inspection\n", s.KeptSchema)
	if opts.DatabaseURL == "" {
		port := "PORT"
		if u, err := url.Parse(s.KeptURL); err == nil {
			port = u.Port()
		}
		pgctl := "pg_ctl"
		if bin, err := pgcluster.FindPostgresBin(); err == nil {
			pgctl = filepath.Join(bin, "pg_ctl")
		}
		// pgcluster's own start command; as root, pgcluster ran it as the postgres user.
		fmt.Fprintf(w, "  the cluster in %s is stopped; start it (as the postgres user if you are root):\n"+
			"  %s -D %s -o '-p %s -k %s -c listen_addresses=127.0.0.1' -l %s -w start\n",
			opts.DataDir, pgctl, filepath.Join(opts.DataDir, "data"), port, opts.DataDir, filepath.Join(opts.DataDir, "server.log"))
	}
	if strings.Contains(s.KeptURL, "xxxxx") {
		fmt.Fprintln(w, "  (put DATABASE_URL's password where the URL says xxxxx)")
	}
	fmt.Fprintf(w, "  DATABASE_URL='%s' outboxctl status   # or dlq list --groups, ui\n", s.KeptURL)
	fmt.Fprintf(w, "  drop it when done: DROP SCHEMA %s CASCADE\n", s.KeptSchema)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
