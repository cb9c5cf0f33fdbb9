package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/bench"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// runBench runs the benchmark scenarios against DATABASE_URL, each in a throwaway
// bench_<random> schema, prints a markdown table on stdout and progress on stderr.
//
// "bench drain-child" is internal: the memory scenario re-executes outboxctl with it so the
// relay's peak RSS is measured in a process of its own. "bench relay-drain" times one drain
// of the drain scenario's relay.
func runBench(ctx context.Context, e env, args []string) error {
	if len(args) > 0 && args[0] == "drain-child" {
		return bench.RunDrainChild(ctx, os.Stdin, e.stdout)
	}
	if len(args) > 0 && args[0] == "relay-drain" {
		return runRelayDrain(ctx, e, args[1:])
	}
	fs := newFlagSet(e, "bench").withUsage("usage: outboxctl bench [--short | --size tiny|short|full] [--out results.json] [--chart drain.svg] [--scenarios " + strings.Join(bench.Scenarios, ",") + "]\n" +
		"       outboxctl bench relay-drain [--events N] [--keys K] [--batch B] [--rtt ms]   (one relay drain; -h for more)\n" +
		"\nRuns against DATABASE_URL (unset: a throwaway cluster with PostgreSQL's defaults) in throwaway bench_<random> schemas; markdown on stdout, progress on stderr.")
	short := fs.Bool("short", false, "run every scenario at its short size (under two minutes on 2 cores)")
	size := fs.String("size", "", "scenario size: tiny, short or full (default full; --short means short)")
	out := fs.String("out", "", "write the results as JSON to this file")
	chart := fs.String("chart", "", "write an SVG chart of drain throughput by batch size to this file, and one by round trip to QStash beside it (name-rtt.svg)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process (relay, local QStash, webhook) to this file")
	pinnedHold := fs.Duration("pinned-hold", 0, "hold the pinned scenario's snapshot this long instead of its size's (e.g. 2h: the opt-in long pin)")
	scenarios := fs.String("scenarios", strings.Join(bench.Scenarios, ","), "comma-separated scenarios to run")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	sz := bench.Full
	if *short {
		sz = bench.Short
	}
	if *size != "" {
		s, err := bench.ParseSize(*size)
		if err != nil {
			return usageErr(err)
		}
		sz = s
	}
	names, err := bench.ParseScenarios(*scenarios)
	if err != nil {
		return usageErr(err)
	}
	url, cluster := e.getenv("DATABASE_URL"), ""
	if url == "" {
		u, stop, err := bench.StartThrowawayCluster(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = stop() }()
		url, cluster = u, bench.ThrowawayCluster
		fmt.Fprintf(e.stderr, "bench: DATABASE_URL is unset: running on a throwaway cluster with PostgreSQL's defaults (autovacuum on) at %s\n", u)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("create cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("start cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find outboxctl executable for the drain child: %w", err)
	}
	res, runErr := bench.Run(ctx, url, bench.Options{
		Size: sz, Scenarios: names, Cluster: cluster, PinnedHold: *pinnedHold,
		Spawn:    func(ctx context.Context) *exec.Cmd { return exec.CommandContext(ctx, self, "bench", "drain-child") },
		Progress: func(s string) { fmt.Fprintln(e.stderr, s) },
	})
	if res == nil {
		return runErr
	}
	res.WriteMarkdown(e.stdout)
	if *out != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return fmt.Errorf("encode results: %w", err)
		}
		if err := writeFile(*out, append(b, '\n')); err != nil {
			return err
		}
	}
	if *chart != "" && res.Drain != nil {
		var b bytes.Buffer
		m := res.Machine
		caption := fmt.Sprintf("%d × %s, PostgreSQL %s, %s, %s size", m.NProc, m.CPUModel, m.Postgres, m.GoVersion, res.Size)
		if err := bench.WriteDrainSVG(&b, res.Drain, caption); err != nil {
			return err
		}
		if err := writeFile(*chart, b.Bytes()); err != nil {
			return err
		}
		// The round-trip chart goes beside it: drain.svg -> drain-rtt.svg.
		b.Reset()
		if err := bench.WriteRTTSVG(&b, res.Drain, caption); err != nil {
			return err
		}
		if err := writeFile(rttChartPath(*chart), b.Bytes()); err != nil {
			return err
		}
	}
	return runErr
}

// runRelayDrain times one relay drain (bench.RelayDrain) and prints its rate.
func runRelayDrain(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "bench relay-drain").withUsage("usage: outboxctl bench relay-drain [--events N] [--keys K] [--batch B] [--rtt ms]\n" +
		"\nTimes one drain of the drain scenario's relay against DATABASE_URL, in a throwaway bench_<random> schema.")
	events := fs.Int("events", 200_000, "events pending at the start")
	keys := fs.Int("keys", 1000, "partition keys the events are spread over")
	batch := fs.Int("batch", relay.DefaultBatchSize, "the relay's batch size (PUBLISH_CONCURRENCY is the default)")
	rtt := fs.Int("rtt", 0, "round trip to the local QStash in milliseconds")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *events <= 0 || *keys <= 0 || *batch <= 0 || *rtt < 0 {
		return usageErr(fmt.Errorf("--events, --keys and --batch must be positive and --rtt not negative (got %d, %d, %d, %d)", *events, *keys, *batch, *rtt))
	}
	url, err := databaseURL(e)
	if err != nil {
		return err
	}
	run, err := bench.RelayDrain(ctx, url, *events, *keys, *batch, *rtt)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "outbox-relay: %d events over %d keys drained in %.2f s: %.0f events/s (batch %d, PUBLISH_CONCURRENCY %d, rtt %d ms, %d publish requests)\n",
		run.Dispatched, *keys, run.Seconds, run.EventsPerSec, run.Batch, relay.DefaultPublishConcurrency, run.RTTMillis, run.PublishRequests)
	return nil
}

// rttChartPath names the round-trip chart after the drain chart: d.svg -> d-rtt.svg.
func rttChartPath(chart string) string {
	ext := filepath.Ext(chart)
	return strings.TrimSuffix(chart, ext) + "-rtt" + ext
}

func writeFile(path string, b []byte) error {
	if dir := filepath.Dir(path); dir != "." {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
