package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"

	"github.com/outbox-relay/outbox-relay/internal/envconfig/relayenv"
	"github.com/outbox-relay/outbox-relay/pkg/awsenv"
	"github.com/outbox-relay/outbox-relay/pkg/retention"
)

const retentionUsage = `usage: outboxctl retention run [--outbox-retention 7d] [--dedupe-ttl 14d] [--batch 1000]
                               [--max-batches 1000] [--dry-run] [--json]

Deletes dispatched outbox rows older than the outbox retention (never pending, leased, or
dead-lettered rows whose dead letter is unresolved) and processed_messages older than the
dedupe TTL, in small batches. Defaults come from OUTBOX_RETENTION and DEDUPE_TTL, like the
relay's; the dedupe TTL is refused if it does not exceed the retry horizon computed from
MAX_ATTEMPTS, BACKOFF_BASE, BACKOFF_MAX, LEASE and QSTASH_RETRIES.`

// overlayEnv returns getenv with the given variables replaced (flags win over the
// environment).
func overlayEnv(getenv func(string) string, set map[string]string) func(string) string {
	return func(k string) string {
		if v, ok := set[k]; ok {
			return v
		}
		return getenv(k)
	}
}

// stringFlags records which string flags were set, to overlay them on the environment.
type stringFlags map[string]*string

func (s stringFlags) add(fs *flag.FlagSet, name, envVar, usage string) {
	v := new(string)
	fs.StringVar(v, name, "", usage+" (default $"+envVar+" or the built-in default)")
	s[envVar] = v
}

func (s stringFlags) overlay() map[string]string {
	m := map[string]string{}
	for k, v := range s {
		if *v != "" {
			m[k] = *v
		}
	}
	return m
}

func runRetention(ctx context.Context, e env, args []string) error {
	if len(args) == 0 || args[0] != "run" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintln(e.stdout, retentionUsage)
			return nil
		}
		fmt.Fprintln(e.stderr, retentionUsage)
		return &exitError{code: 2, err: errors.New("expected: retention run")}
	}
	fs := newFlagSet(e, "retention run")
	fs.Usage = func() { fmt.Fprintln(e.stderr, retentionUsage) }
	sf := stringFlags{}
	sf.add(fs, "outbox-retention", "OUTBOX_RETENTION", "delete finished outbox rows older than this (e.g. 7d, 36h)")
	sf.add(fs, "dedupe-ttl", "DEDUPE_TTL", "delete processed_messages older than this")
	batch := fs.Int("batch", retention.DefaultBatchSize, "rows per delete statement")
	maxBatches := fs.Int("max-batches", retention.DefaultMaxBatches, "delete statements per table and run")
	dryRun := fs.Bool("dry-run", false, "count what would be deleted, delete nothing")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return &exitError{code: 2, err: fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	set := sf.overlay()
	// Retention does not publish: stand-ins for the publisher's required settings, so the
	// shared parser checks only what matters here (durations, retry budgets, the database).
	if e.getenv("QSTASH_TOKEN") == "" {
		set["QSTASH_TOKEN"] = "unused-by-retention"
	}
	if e.getenv("PUBLIC_BASE_URL") == "" {
		set["PUBLIC_BASE_URL"] = "https://unused-by-retention.invalid"
	}
	getenv, err := awsenv.Resolve(ctx, overlayEnv(e.getenv, set))
	if err != nil {
		return err
	}
	cfg, err := relayenv.Read(getenv)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	rc := cfg.Retention
	rc.BatchSize, rc.MaxBatches = *batch, *maxBatches
	rc.Logger = slog.New(slog.DiscardHandler)
	pool, err := poolFor(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	var res retention.Result
	if *dryRun {
		res, err = retention.Plan(ctx, pool, rc)
	} else {
		res, err = retention.Run(ctx, pool, rc)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		out := struct {
			DryRun bool `json:"dry_run"`
			retention.Result
			DurationMS int64 `json:"duration_ms"`
		}{*dryRun, res, res.Duration.Milliseconds()}
		return json.NewEncoder(e.stdout).Encode(out)
	}
	verb := "deleted"
	if *dryRun {
		verb = "would delete"
	}
	fmt.Fprintf(e.stdout, "%s %d outbox rows (older than %v) and %d processed_messages rows (older than %v)",
		verb, res.OutboxDeleted, rc.OutboxRetention, res.ProcessedDeleted, rc.DedupeTTL)
	if !*dryRun {
		state := "complete"
		if !res.Complete {
			state = "incomplete: run it again to continue"
		}
		fmt.Fprintf(e.stdout, " in %d batches, %s", res.Batches, state)
	}
	fmt.Fprintln(e.stdout)
	return nil
}
