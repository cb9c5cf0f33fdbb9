package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/v3/internal/relayfunc"
	"github.com/outbox-relay/outbox-relay/v3/pkg/retention"
)

const retentionUsage = `usage: outboxctl retention run [--outbox-retention 7d] [--dedupe-ttl 14d] [--delete-batch 1000]
                               [--max-batches 1000] [--dry-run] [--json]

Deletes dispatched outbox rows older than the outbox retention (never pending, leased, or
dead-lettered rows whose dead letter is unresolved) and processed_messages older than the
dedupe TTL, in small batches. Defaults come from OUTBOX_RETENTION and DEDUPE_TTL, like the
relay's; the dedupe TTL is refused if it does not exceed the retry horizon computed from
MAX_ATTEMPTS, BACKOFF_BASE, BACKOFF_MAX, LEASE and QSTASH_RETRIES. --batch, the old spelling
of --delete-batch, is deprecated and goes in the next release.`

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

// loadRelayEnv reads the relay's settings from getenv (the environment, flags over it) as
// the relay Lambda does, AWS secret references resolved. A setting relayenv refuses is a
// usage error.
func loadRelayEnv(ctx context.Context, getenv func(string) string) (relayfunc.Env, error) {
	env, err := relayfunc.Load(ctx, getenv)
	if err != nil && envconfig.Vars(err) != nil {
		return relayfunc.Env{}, usageErr(err)
	}
	return env, err
}

// envVar registers --name, overriding the environment variable envVar; kind ("int" or
// "duration", as the variable is read) is the flag's type: a value that is not one is a
// flag error. envOverlay returns what the flags set.
func (f *flagSet) envVar(name, envVar, kind, usage string) {
	v := &envFlag{kind: kind}
	f.Var(v, name, usage+" (`"+kind+"`; default $"+envVar+" or the built-in default)")
	if f.env == nil {
		f.env = map[string]*string{}
	}
	f.env[envVar] = &v.value
}

// envFlag is a flag whose text is handed to the environment reader, checked for its kind.
type envFlag struct {
	kind, value string
}

func (f *envFlag) String() string { return f.value }

func (f *envFlag) Set(s string) error {
	switch f.kind {
	case "int":
		if _, err := strconv.Atoi(s); err != nil {
			return errors.New("not a whole number")
		}
	case "duration":
		if _, err := envconfig.ParseDuration(s); err != nil {
			return errors.New("not a duration (e.g. 30s, 15m, 1h, 7d)")
		}
	}
	f.value = s
	return nil
}

// envOverlay returns the environment variables the envVar flags given set, for overlayEnv.
func (f *flagSet) envOverlay() map[string]string {
	m := map[string]string{}
	for k, v := range f.env {
		if *v != "" {
			m[k] = *v
		}
	}
	return m
}

func runRetention(ctx context.Context, e env, args []string) error {
	return dispatch(ctx, e, "retention", retentionUsage, []subcommand{{"run", runRetentionRun}}, args)
}

func runRetentionRun(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "retention run").withUsage(retentionUsage)
	fs.envVar("outbox-retention", "OUTBOX_RETENTION", "duration", "delete finished outbox rows older than this (e.g. 7d, 36h)")
	fs.envVar("dedupe-ttl", "DEDUPE_TTL", "duration", "delete processed_messages older than this")
	// --batch is the relay's rows per claim everywhere else.
	batch := fs.Int("delete-batch", retention.DefaultBatchSize, "rows per delete statement")
	fs.alias("batch", "delete-batch")
	maxBatches := fs.Int("max-batches", retention.DefaultMaxBatches, "delete statements per table and run")
	dryRun := fs.Bool("dry-run", false, "count what would be deleted, delete nothing")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	set := fs.envOverlay()
	// Retention does not publish: stand-ins for the publisher's required settings, so the
	// shared parser checks only what matters here (durations, retry budgets, the database).
	// The relay Lambda's environment names the token by QSTASH_TOKEN_PARAM: not read here.
	if e.getenv("QSTASH_TOKEN") == "" {
		set["QSTASH_TOKEN"], set["QSTASH_TOKEN_PARAM"] = "unused-by-retention", ""
	}
	if e.getenv("PUBLIC_BASE_URL") == "" {
		set["PUBLIC_BASE_URL"] = "https://unused-by-retention.invalid"
	}
	cfg, err := loadRelayEnv(ctx, overlayEnv(e.getenv, set))
	if err != nil {
		return err
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
