// Command riverpeer measures River, the Postgres job queue this project's relay is compared
// with, on the machine at hand: it inserts N no-op jobs, then times one River client working
// them all with the fetch settings of River's own benchmark (riverbench: FetchCooldown 2 ms,
// FetchPollInterval 20 ms, 2,000 workers). It is a module of its own so River never enters
// the product's go.mod; `make bench-river` runs it. Its tables live in a throwaway schema.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type noopArgs struct {
	N int `json:"n"`
}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

func main() {
	url := flag.String("database-url", os.Getenv("DATABASE_URL"), "Postgres URL (a throwaway schema is created in it)")
	jobs := flag.Int("jobs", 200_000, "no-op jobs to insert, then work")
	flag.Parse()
	if err := run(context.Background(), *url, *jobs); err != nil {
		fmt.Fprintln(os.Stderr, "riverpeer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url string, n int) error {
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "riverpeer_" + hex.EncodeToString(b[:])
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("parse database url: %w", err)
	}
	admin, err := pgxpool.NewWithConfig(ctx, cfg.Copy())
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	defer admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck // best effort

	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate river: %w", err)
	}

	workers := river.NewWorkers()
	river.AddWorker(workers, noopWorker{})
	client, err := river.NewClient(driver, &river.Config{
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2_000}},
		Workers:           workers,
	})
	if err != nil {
		return err
	}
	t0 := time.Now()
	params := make([]river.InsertManyParams, 0, 5_000)
	for i := 0; i < n; i++ {
		params = append(params, river.InsertManyParams{Args: noopArgs{N: i}})
		if len(params) == cap(params) || i == n-1 {
			if _, err := client.InsertMany(ctx, params); err != nil {
				return fmt.Errorf("insert jobs: %w", err)
			}
			params = params[:0]
		}
	}
	loaded := time.Since(t0)

	// River drops events for a full subscriber channel; one slot per job loses none.
	done, cancel := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: n, Kinds: []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed}})
	defer cancel()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	var last time.Time
	for worked := 0; worked < n; worked++ {
		select {
		case <-done:
			last = time.Now()
		case <-time.After(time.Minute):
			return fmt.Errorf("only %d of %d jobs worked", worked, n)
		}
	}
	elapsed := last.Sub(start)
	if err := client.Stop(ctx); err != nil {
		return err
	}
	fmt.Printf("river v0.51.2: %d no-op jobs worked in %.2f s: %.0f jobs/s (inserted in %.1f s)\n", n, elapsed.Seconds(), float64(n)/elapsed.Seconds(), loaded.Seconds())
	return nil
}
