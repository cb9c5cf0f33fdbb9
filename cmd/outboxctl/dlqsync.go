package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/outbox-relay/outbox-relay/v3/internal/awsenv"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

const dlqSyncUsage = `usage: outboxctl dlq sync [--delete-synced] [--json]

Reads QStash's dead-letter queue (every cursor page) and records each entry of this outbox
that dead_letters lacks, once however often it runs: deliveries whose failure callback was
never configured, or failed (a receiver down, a rotating key). The relay runs it daily
({"task":"dlq-sync"}). An entry is this outbox's when its URL is <PUBLIC_BASE_URL>/events/<topic>,
it names an outbox id, and any deduplication id or queue it shows carries OUTBOX_NAME.

Environment: DATABASE_URL (or DB_SECRET_ARN), QSTASH_TOKEN (or QSTASH_TOKEN_PARAM),
PUBLIC_BASE_URL (required); QSTASH_URL (default https://qstash.upstash.io); OUTBOX_NAME
(default outbox): the relay function's own variables will do.

--delete-synced then deletes from QStash the entries dead_letters holds, and nothing else.`

func dlqSync(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "dlq sync").withUsage(dlqSyncUsage)
	deleteSynced := fs.Bool("delete-synced", false, "delete from QStash the entries dead_letters holds")
	asJSON := fs.Bool("json", false, "print the counts as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	// The relay function's environment names its secrets (QSTASH_TOKEN_PARAM,
	// DB_SECRET_ARN): they are read once, as its dlq-sync task reads them.
	getenv, err := awsenv.Resolve(ctx, e.getenv)
	if err != nil {
		return err
	}
	cfg, err := syncConfigFromEnv(getenv)
	if err != nil {
		return usageErr(err)
	}
	cfg.DeleteSynced = *deleteSynced
	// The summary below says what the log line would.
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	pool, err := resolvedPool(ctx, getenv)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := deadletter.Sync(ctx, pool, cfg)
	if *asJSON {
		if werr := writeJSON(e.stdout, res); werr != nil {
			return werr
		}
	} else {
		fmt.Fprintf(e.stdout, "read %d QStash DLQ entries in %d page(s): %d recorded as new dead letters, %d recorded resolved (their event was redriven since), %d already recorded, %d being recorded by another writer, %d of other senders left alone\n",
			res.Scanned, res.Pages, res.Recorded, res.Superseded, res.AlreadyRecorded, res.Pending, res.Foreign)
		if res.Rescheduled > 0 {
			fmt.Fprintf(e.stdout, "%d of the resolved failed for a transient reason (the consumer down): their events are back in the outbox, not dead-lettered\n", res.Rescheduled)
		}
		if cfg.DeleteSynced {
			fmt.Fprintf(e.stdout, "deleted %d recorded entries from QStash\n", res.Deleted)
		}
		if res.Recorded > 0 {
			fmt.Fprintln(e.stdout, "next: outboxctl dlq list --groups")
		}
	}
	return err
}

// syncConfigFromEnv reads what dlq sync needs, reporting every missing variable at once.
func syncConfigFromEnv(getenv func(string) string) (deadletter.SyncConfig, error) {
	cfg := deadletter.SyncConfig{DestinationBaseURL: getenv("PUBLIC_BASE_URL"), Name: getenv("OUTBOX_NAME")}
	token := getenv("QSTASH_TOKEN")
	var errs []error
	if token == "" {
		errs = append(errs, errors.New("QSTASH_TOKEN (or QSTASH_TOKEN_PARAM) is not set (the token the relay publishes with)"))
	}
	if cfg.DestinationBaseURL == "" {
		errs = append(errs, errors.New("PUBLIC_BASE_URL is not set (the webhook's base URL the relay publishes to)"))
	}
	if len(errs) > 0 {
		return cfg, errors.Join(errs...)
	}
	// The DLQ is read through the relay's own QStash client, configured as the relay's.
	pub, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: getenv("QSTASH_URL"), Token: token,
		DestinationBaseURL: cfg.DestinationBaseURL, Name: cfg.Name})
	if err != nil {
		return cfg, fmt.Errorf("QSTASH_URL, QSTASH_TOKEN, PUBLIC_BASE_URL or OUTBOX_NAME: %w", err)
	}
	cfg.DLQ = pub.DLQ()
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("PUBLIC_BASE_URL: %w", err)
	}
	return cfg, nil
}
