package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/chaos"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
)

const chaosUsage = `usage: outboxctl chaos [--events N] [--seed S] [--json] [--relays N] [--ordering fifo|publish]
                       [--lambda [--backstop D] [--idle-gap D] [--pause P]] [--<fault> RATE ...] [--no-faults] [--keep] [-v]

Runs the whole pipeline in this process against DATABASE_URL (in its own chaos_<random>
schema, dropped afterwards unless --keep): producers in business transactions, several
relays, the local QStash server, the webhook and the failure-callback recorder, with every
fault on by default. Once production is done and most events have settled, the faults
stop; when everything has settled, the invariants are read from the database: nothing
lost, nothing applied twice, poison (and only poison) dead-lettered, per-key order in fifo
mode. With --lambda the relays run in the deployed shape: the relay function's handler in
execution environments behind a local Lambda service (--relays is its reserved
concurrency), woken by the producers' kicks and a schedule (--backstop), with the kick
faults on: a producer dying before its kick, a kick accepted and lost, a kick refused.
Exit status 0 when every invariant holds, 1 when one fails (the seed is printed to
rerun it with --seed), 2 for bad flags, 3 when the run itself fails.`

func runChaos(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "chaos").withUsage(chaosUsage)
	opts := chaos.Options{Seed: uint64(time.Now().UnixNano()), Faults: chaos.DefaultFaults()}.WithDefaults()
	fl := chaos.BindFlags(fs.FlagSet, &opts)
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	keep := fs.Bool("keep", false, "keep the chaos schema for inspection")
	verbose := fs.Bool("v", false, "log the components' JSON logs to stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fl.Apply()
	base, err := databaseURL(e)
	if err != nil {
		return usageErr(err)
	}
	opts.DatabaseURL = base // validated below; replaced by the schema's URL
	if err := opts.Validate(); err != nil {
		return usageErr(err)
	}
	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = slog.New(slog.NewJSONHandler(e.stderr, nil))
	}
	opts.Logger = logger
	if !*asJSON {
		opts.Progress = e.stderr
	}

	sc, err := postgres.CreateSchema(ctx, base, "chaos", true, logger)
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintf(e.stderr, "outboxctl chaos: keeping the schema; connect with %s\n", redactURL(sc.URL))
	} else {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			defer cancel()
			_ = sc.Drop(dctx)
		}()
	}
	opts.DatabaseURL = sc.URL
	rep, err := chaos.Run(ctx, opts)
	if err != nil {
		return fmt.Errorf("chaos run (seed %d): %w", opts.Seed, err)
	}
	if *asJSON {
		b, _ := json.Marshal(rep)
		fmt.Fprintln(e.stdout, string(b))
	} else {
		printChaos(e.stdout, rep)
	}
	if !rep.Passed {
		return negativeErr(fmt.Errorf("invariants failed with seed %d (rerun: outboxctl chaos --seed %d --events %d): %v",
			rep.Seed, rep.Seed, opts.Events, rep.Violations))
	}
	return nil
}

func printChaos(w io.Writer, r chaos.Report) {
	verdict := "PASSED"
	if !r.Passed {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "chaos run %s  seed %d  ordering %s  relays %d  producers %d  keys %d\n",
		verdict, r.Seed, r.Ordering, r.Relays, r.Producers, r.Keys)
	fmt.Fprintf(w, "events %d  applied once %d  applied more than once %d  lost %d\n",
		r.Events, r.AppliedOnce, r.AppliedMoreThanOnce, r.Lost)
	fmt.Fprintf(w, "poison %d  poison dead-lettered %d  non-poison dead-lettered %d  order violations %d\n",
		r.Poison, r.PoisonDeadLettered, r.NonPoisonDeadLettered, r.OrderViolations)
	fmt.Fprintf(w, "drain after last fault %.2fs  run %.1fs  relay restarts %d  rolled-back transactions %d\n",
		r.DrainSeconds, r.DurationSeconds, r.RelayRestarts, r.RolledBack)
	if l := r.Lambda; l != nil {
		fmt.Fprintf(w, "lambda: invocations %d kicked, %d scheduled (%d claimed events), %d kicks coalesced; environments %d; events retried %d, dropped %d\n",
			l.KickInvocations, l.TickInvocations, l.TicksThatClaimed, l.Coalesced, l.Environments, l.Retried, l.Dropped)
		fmt.Fprintf(w, "kicks: requested %d, sent %d, failed %d, covered %d (by a relay's promise %d)\n",
			l.Kicks.Requested, l.Kicks.Sent, l.Kicks.Failed, l.Kicks.Skipped, l.Kicks.Promised)
	}
	fmt.Fprintln(w, "faults injected:")
	for _, k := range chaos.FaultKinds() {
		fmt.Fprintf(w, "  %-36s %d\n", k, r.Faults[k])
	}
	if r.Lambda != nil {
		for _, k := range chaos.KickFaultKinds() {
			fmt.Fprintf(w, "  %-36s %d\n", k, r.Faults[k])
		}
	}
	for _, v := range r.Violations {
		fmt.Fprintf(w, "VIOLATION: %s\n", v)
	}
}

// redactURL drops the password from a connection URL for display.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return "(the schema URL)"
}
