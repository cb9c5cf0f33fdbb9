package bench_test

// These tests run every scenario at its tiny size against real Postgres so the bench code
// cannot rot. They check structure and counts (every event dispatched, order held), never
// times: timing targets are reported by outboxctl bench, not asserted.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/bench"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// The memory scenario's child: the test binary re-executed with this variable set.
const childEnv = "BENCH_TEST_DRAIN_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		if err := bench.RunDrainChild(context.Background(), os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// childSpawner re-executes the test binary as the relay child of the memory and backlog
// scenarios.
func childSpawner(ctx context.Context) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	return cmd
}

func logf(t *testing.T) func(string) { return func(s string) { t.Log(s) } }

// tiny runs a scenario at its tiny size, changed by tune if given, in a schema of its own,
// and fails the test if the scenario fails.
func tiny[C, R any](t *testing.T, configFor func(bench.Size) C, run func(context.Context, string, C, func(string)) (R, error), tune ...func(*C)) (*pgtest.DB, C, R) {
	t.Helper()
	db := pgtest.New(t)
	cfg := configFor(bench.Tiny)
	for _, f := range tune {
		f(&cfg)
	}
	res, err := run(t.Context(), db.URL, cfg, logf(t))
	if err != nil {
		t.Fatal(err)
	}
	return db, cfg, res
}

// spawning gives a scenario that starts child processes the test binary as its child.
func spawning[C, R any](run func(context.Context, string, C, bench.Spawner, func(string)) (R, error)) func(context.Context, string, C, func(string)) (R, error) {
	return func(ctx context.Context, url string, cfg C, progress func(string)) (R, error) {
		return run(ctx, url, cfg, childSpawner, progress)
	}
}

// The relay's round trips take turns, round by round, and its RTT 0 run is kept even when
// the batch table has no place for it (RTTBatch not among Batches; RTTMillis without 0).
func TestDrainRoundTripsTakeTurns(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	cfg := bench.DrainConfig{Events: 600, Keys: 20, Batches: []int{50}, Relays: []int{1}, BaselineBatch: 50, BaselinePool: 10,
		BaselineEvents: 200, RTTMillis: []int{5}, RTTBatch: 100, RTTRounds: 2}
	var lines []string
	res, err := bench.Drain(context.Background(), db.URL, cfg, func(s string) { lines = append(lines, s) })
	if err != nil {
		t.Fatal(err)
	}
	// Floor, relay and baseline at batch 50; the claim-shape pair; the relay at RTT 0 and
	// 5 ms; the baseline at 5 ms.
	if len(res.Runs) != 8 {
		t.Fatalf("got %d runs, want 8: %+v", len(res.Runs), res.Runs)
	}
	for _, rtt := range []int{0, 5} {
		n := 0
		for _, r := range res.Runs {
			if r.Way == bench.WayRelay && r.Batch == cfg.RTTBatch && r.RTTMillis == rtt {
				n++
				if len(r.Rounds) != 2 || r.Dispatched != cfg.Events {
					t.Errorf("rtt %d ms: %+v, want every event and two rounds", rtt, r)
				}
			}
		}
		if n != 1 {
			t.Errorf("rtt %d ms: %d relay runs at batch %d, want 1", rtt, n, cfg.RTTBatch)
		}
	}
	var order []string
	for _, l := range lines {
		if strings.HasPrefix(l, "  round ") {
			order = append(order, l[:strings.Index(l, ":")])
		}
	}
	want := []string{"  round 1 of 2, rtt=0ms", "  round 1 of 2, rtt=5ms", "  round 2 of 2, rtt=0ms", "  round 2 of 2, rtt=5ms"}
	if strings.Join(order, "|") != strings.Join(want, "|") {
		t.Errorf("rounds in the order %q, want %q", order, want)
	}
}

func TestDrain(t *testing.T) {
	t.Parallel()
	_, cfg, res := tiny(t, bench.DrainConfigFor, bench.Drain)
	rtts := 0
	for _, rtt := range cfg.RTTMillis {
		if rtt > 0 {
			rtts++
		}
	}
	// Floor and relay per batch plus the baseline, per relay count; the claim-shape pair;
	// relay and baseline per round trip.
	if want := len(cfg.Relays)*(2*len(cfg.Batches)+1) + 2 + 2*rtts; len(res.Runs) != want {
		t.Fatalf("got %d runs, want %d: %+v", len(res.Runs), want, res.Runs)
	}
	if cs := res.ClaimShapes; cs == nil || cs.OneRun.Way != bench.WayFloorOneRun || cs.Runs.Way != bench.WayFloor ||
		cs.OneRun.Dispatched != cfg.Events || cs.Runs.Dispatched != cfg.Events {
		t.Errorf("claim shapes %+v: want both floors draining all %d events", cs, cfg.Events)
	}
	for _, n := range cfg.Relays {
		for _, b := range cfg.Batches {
			for _, way := range []string{bench.WayFloor, bench.WayRelay} {
				r := res.Find(way, b, n)
				if r == nil {
					t.Fatalf("no %s run at batch %d relays %d", way, b, n)
				}
				if r.Dispatched != cfg.Events || r.EventsPerSec <= 0 {
					t.Errorf("%s batch %d relays %d: dispatched %d of %d at %v events/s", way, b, n, r.Dispatched, cfg.Events, r.EventsPerSec)
				}
				// The relay publishes every event in batch-sized requests (1,000 keys > batch
				// here, so no same-key waves split a batch); the floor publishes nothing.
				if way == bench.WayRelay && (r.PublishRequests < cfg.Events/b || r.PublishRequests > cfg.Events) {
					t.Errorf("relay batch %d: %d publish requests for %d events", b, r.PublishRequests, cfg.Events)
				}
				if way == bench.WayFloor && r.PublishRequests != 0 {
					t.Errorf("floor made %d publish requests", r.PublishRequests)
				}
			}
		}
		base := res.Baseline(n)
		if base == nil || base.Dispatched != cfg.BaselineEvents || base.PublishRequests != cfg.BaselineEvents {
			t.Errorf("baseline relays %d: %+v, want %d events, one request each", n, base, cfg.BaselineEvents)
		}
	}
	for _, rtt := range cfg.RTTMillis {
		r := res.FindRTT(bench.WayRelay, cfg.RTTBatch, 1, rtt)
		// The relay's round-trip runs (RTT 0 included) are the median of RTTRounds rounds:
		// the lower middle of two, so the slower.
		if r == nil || len(r.Rounds) != cfg.RTTRounds || r.EventsPerSec != min(r.Rounds[0], r.Rounds[1]) {
			t.Errorf("rtt %d ms: relay %+v, want the median of %d rounds", rtt, r, cfg.RTTRounds)
		}
		if r != nil && r.WALBytesPerEvent < 100 {
			t.Errorf("rtt %d ms: %v WAL bytes per event: a claim and a mark write more than that", rtt, r.WALBytesPerEvent)
		}
		if rtt == 0 {
			continue
		}
		base := res.BaselineRTT(1, rtt)
		if r == nil || r.Dispatched != cfg.Events || base == nil || base.Dispatched != cfg.BaselineEvents || len(base.Rounds) != 0 {
			t.Errorf("rtt %d ms: relay %+v, baseline %+v (one round)", rtt, r, base)
		}
	}
	var svg bytes.Buffer
	if err := bench.WriteDrainSVG(&svg, res, "test machine"); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(svg.String(), "<svg") || strings.Count(svg.String(), "<polyline") != 3*len(cfg.Relays) {
		t.Errorf("chart has %d lines, want %d:\n%s", strings.Count(svg.String(), "<polyline"), 3*len(cfg.Relays), svg.String())
	}
	svg.Reset()
	if err := bench.WriteRTTSVG(&svg, res, "test machine"); err != nil {
		t.Fatal(err)
	}
	// relay and baseline by round trip, the floor as a level.
	if got := strings.Count(svg.String(), "<polyline"); got != 3 || strings.Count(svg.String(), "<circle") != 2*len(cfg.RTTMillis) {
		t.Errorf("round-trip chart has %d lines and %d points, want 3 and %d:\n%s", got, strings.Count(svg.String(), "<circle"), 2*len(cfg.RTTMillis), svg.String())
	}
}

func TestClaim(t *testing.T) {
	t.Parallel()
	db, cfg, res := tiny(t, bench.ClaimConfigFor, bench.Claim)
	if len(res.Cases) != len(cfg.History)*len(cfg.Pending) {
		t.Fatalf("got %d cases, want %d", len(res.Cases), len(cfg.History)*len(cfg.Pending))
	}
	// The tests connect as a superuser, so the never-analysed comparison runs; its plan was
	// taken on a table without statistics (no row estimate at all).
	if st := res.Statistics; st == nil || st.UnanalysedMs <= 0 || st.AnalysedMs <= 0 || !strings.Contains(st.UnanalysedPlan, "outbox_pkey") {
		t.Errorf("claim statistics comparison missing or empty: %+v", st)
	}
	for _, c := range res.Cases {
		// The claim sizes its window from the one before; a window that turns out too small
		// leaves a batch a few rows short now and then (it says More), never many.
		if c.Claim.Samples != cfg.Iterations || c.RowsPerClaim > float64(cfg.Batch) || c.RowsPerClaim < 0.95*float64(cfg.Batch) {
			t.Errorf("history %d pending %d: %d samples of %v rows, want %d of %d (at least 95 %%)", c.History, c.Pending, c.Claim.Samples, c.RowsPerClaim, cfg.Iterations, cfg.Batch)
		}
		if !strings.Contains(c.Plan, "outbox_ready_idx") || c.PlanExecMillis <= 0 {
			t.Errorf("history %d pending %d: plan does not use outbox_ready_idx or has no execution time:\n%s", c.History, c.Pending, c.Plan)
		}
	}
	if _, ok := res.P99Ratio(); !ok {
		t.Error("no p99 ratio")
	}
	// EXPLAIN ANALYZE ran in a rolled-back transaction: it claimed nothing for real.
	var leased int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE lease_token IS NOT NULL`).Scan(&leased); err != nil {
		t.Fatal(err)
	}
	if leased != 0 {
		t.Errorf("%d rows left leased after the scenario", leased)
	}
}

func TestConsumer(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 2})
	cfg := bench.ConsumerConfigFor(bench.Tiny)
	res, err := bench.Consumer(context.Background(), db.URL, cfg, logf(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != len(cfg.Concurrency) {
		t.Fatalf("got %d runs, want %d", len(res.Runs), len(cfg.Concurrency))
	}
	for _, r := range res.Runs {
		if r.WebhookStatus[200] != cfg.Messages || len(r.WebhookStatus) != 1 {
			t.Errorf("concurrency %d: statuses %v, want %d x 200", r.Concurrency, r.WebhookStatus, cfg.Messages)
		}
		if r.ProcessedRows != int64(2*cfg.Messages) || r.ChargeRows != int64(2*cfg.Messages) || r.RawPerSec <= 0 || r.WebhookVsRaw <= 0 {
			t.Errorf("concurrency %d: %+v", r.Concurrency, r)
		}
	}
}

func TestMemory(t *testing.T) {
	t.Parallel()
	_, cfg, res := tiny(t, bench.MemoryConfigFor, spawning(bench.Memory))
	if res.PeakRSSMiB <= 0 || res.RusageMaxRSSMiB < res.PeakRSSMiB || res.CPUSeconds <= 0 {
		t.Errorf("memory figures inconsistent: %+v", res)
	}
	if res.PublishCalls < cfg.Events/cfg.Batch || res.QStashRequestsPerMillion <= 0 {
		t.Errorf("publish calls %d for %d events at batch %d", res.PublishCalls, cfg.Events, cfg.Batch)
	}
	if g128, g512 := res.LambdaGBsPerMillion[128], res.LambdaGBsPerMillion[512]; g128 <= 0 || math.Abs(g512-4*g128) > 0.5 {
		t.Errorf("GB-s should scale with memory: %v", res.LambdaGBsPerMillion)
	}
}

func TestSummaryAndMarkdown(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// Run makes (and drops) its own bench_ schemas on the server of DATABASE_URL.
	var schemas []string
	progress := func(s string) {
		t.Log(s)
		if _, rest, ok := strings.Cut(s, "(schema "); ok {
			schemas = append(schemas, strings.TrimSuffix(rest, ")"))
		}
	}
	res, err := bench.Run(context.Background(), pgtest.URL(), bench.Options{
		Size: bench.Tiny, Scenarios: []string{bench.ScenarioDrain, bench.ScenarioMemory}, Spawn: childSpawner, Progress: progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Summary, Machine map[string]any }
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"relay_vs_floor", "relay_vs_baseline", "relay_eps", "floor_eps", "baseline_eps",
		"claim_p99_ratio_5m_vs_0", "e2e_p50_ms", "e2e_p99_ms", "webhook_vs_raw", "relay_peak_rss_mib",
		"relay_rtt30_eps", "relay_rtt30_vs_rtt0", "relay_vs_baseline_rtt30", "backlog_1m_rtt30_seconds", "hot_key_fifo_rtt30_eps",
		"backlog_defaults_vs_best", "backlog_relay_peak_rss_mib"} {
		if _, ok := doc.Summary[k]; !ok {
			t.Errorf("summary has no %s", k)
		}
	}
	// Scenarios that ran have numbers; the others are null.
	for _, k := range []string{"relay_vs_floor", "relay_vs_baseline", "relay_peak_rss_mib"} {
		if v, _ := doc.Summary[k].(float64); v <= 0 {
			t.Errorf("summary %s = %v", k, doc.Summary[k])
		}
	}
	if doc.Summary["webhook_vs_raw"] != nil {
		t.Errorf("webhook_vs_raw = %v for a run without the consumer scenario", doc.Summary["webhook_vs_raw"])
	}
	if doc.Machine["nproc"].(float64) < 1 || doc.Machine["postgres_version"] == "" {
		t.Errorf("machine: %v", doc.Machine)
	}
	var md bytes.Buffer
	res.WriteMarkdown(&md)
	for _, want := range []string{"| relay_vs_floor |", "## 1. Drain throughput", "## 6. Memory and cost"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	if len(schemas) != 2 {
		t.Fatalf("schemas %v, want one per scenario", schemas)
	}
	var left int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_namespace WHERE nspname = ANY($1)`, schemas).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d of the schemas %v were not dropped", left, schemas)
	}
}

func TestFIFO(t *testing.T) {
	t.Parallel()
	_, cfg, res := tiny(t, bench.FIFOConfigFor, bench.FIFO)
	if len(res.Runs) != len(cfg.Keys)*len(cfg.Modes) {
		t.Fatalf("got %d runs, want %d", len(res.Runs), len(cfg.Keys)*len(cfg.Modes))
	}
	for _, r := range res.Runs {
		if r.Delivered != cfg.Events || (r.Mode == bench.ModeFIFO && r.OrderViolations != 0) || r.EventsPerSec <= 0 {
			t.Errorf("%s mode, %d keys: delivered %d of %d, %d order violations", r.Mode, r.Keys, r.Delivered, cfg.Events, r.OrderViolations)
		}
		// Publish mode: one call per batch, so a single key's events need no more calls
		// than batches; fifo mode sends a key's events one after the other.
		if r.Mode == bench.ModePublish && r.PublishCalls > r.RelayBatches {
			t.Errorf("publish mode, %d keys: %d calls for %d batches", r.Keys, r.PublishCalls, r.RelayBatches)
		}
		if r.Mode == bench.ModeFIFO && r.Keys == 1 && r.PublishCalls < cfg.Events {
			t.Errorf("fifo mode, one key: %d calls for %d events", r.PublishCalls, cfg.Events)
		}
	}
}

func TestBacklog(t *testing.T) {
	t.Parallel()
	_, cfg, res := tiny(t, bench.BacklogConfigFor, spawning(bench.Backlog))
	if res.Drained != cfg.Events || res.EventsPerSec <= 0 || res.PublishCalls < cfg.Events/cfg.Batch || res.PeakRSSMiB <= 0 {
		t.Fatalf("backlog %+v", res)
	}
}

func TestE2E(t *testing.T) {
	t.Parallel()
	db, cfg, res := tiny(t, bench.E2EConfigFor, bench.E2E)
	want := int(float64(cfg.Rate) * cfg.Duration.Seconds())
	for _, mode := range []string{bench.ModeLinger, bench.ModePoll} {
		m := res.Mode(mode)
		if m == nil {
			t.Fatalf("no %s mode", mode)
		}
		if m.Produced != want || m.Delivered != want || m.Latency.Samples != want || m.Latency.P50 <= 0 || m.Latency.P99 < m.Latency.P50 {
			t.Errorf("%s: %+v, want %d events", mode, m, want)
		}
	}
	// Every event was charged once by the real handler.
	var charges int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM billing_charges`).Scan(&charges); err != nil {
		t.Fatal(err)
	}
	if charges != want {
		t.Errorf("%d billing_charges rows after the poll run, want %d", charges, want)
	}
}

// TestBacklogDefaultsVsBest: the summary compares the sweep's run at the template's defaults
// with its fastest run, and the target says whether the defaults are within 5 % of it.
func TestBacklogDefaultsVsBest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		fastest float64
		met     bool
	}{{1000, true}, {1040, true}, {1200, false}} {
		r := &bench.Results{Backlog: &bench.BacklogResult{
			Config: bench.BacklogConfig{Batch: 500, Concurrency: 4},
			Sweep: []bench.BacklogRun{
				{BacklogSetting: bench.BacklogSetting{Batch: 100, Concurrency: 4}, EventsPerSec: 400},
				{BacklogSetting: bench.BacklogSetting{Batch: 500, Concurrency: 4}, EventsPerSec: 1000},
				{BacklogSetting: bench.BacklogSetting{Batch: 1000, Concurrency: 8}, EventsPerSec: tc.fastest},
			},
		}}
		r.Summarise()
		got := r.Summary.BacklogDefaultsVsBest
		if got == nil || math.Abs(*got-1000/tc.fastest) > 0.01 {
			t.Fatalf("fastest %v: defaults vs best %v", tc.fastest, got)
		}
		for _, tg := range r.Targets {
			if tg.Name == "backlog_defaults_vs_best" && (tg.Met == nil || *tg.Met != tc.met) {
				t.Errorf("fastest %v: target met %v, want %v", tc.fastest, tg.Met, tc.met)
			}
		}
	}
}

// TestBacklogSweepRounds: a short sweep with two rounds keeps every round's rate and shows
// the median's.
func TestBacklogSweepRounds(t *testing.T) {
	t.Parallel()
	_, _, res := tiny(t, bench.BacklogConfigFor, spawning(bench.Backlog), func(cfg *bench.BacklogConfig) {
		cfg.Sweep = []bench.BacklogSetting{{Batch: 50, Concurrency: 2}, {Batch: 500, Concurrency: 4}}
		cfg.SweepEvents, cfg.SweepRounds = 500, 2
	})
	for _, x := range res.Sweep {
		if len(x.Rounds) != 2 || x.EventsPerSec != min(x.Rounds[0], x.Rounds[1]) || x.PeakRSSMiB <= 0 {
			t.Errorf("sweep run %+v: want two rounds and the lower middle of them", x)
		}
	}
	if len(res.Sweep) != 2 {
		t.Fatalf("%d sweep settings, want 2", len(res.Sweep))
	}
}

// The producer scenario runs every arm at its size, with pgbench and the Go API, while the
// relay publishes (with no wake-up it may sleep through the tiny arm: its poll is 1 s); the
// trigger is left as migration 0014 made it.
func TestProducer(t *testing.T) {
	t.Parallel()
	db, cfg, res := tiny(t, bench.ProducerConfigFor, bench.Producer)
	for _, arm := range []string{bench.ArmNotifyEveryInsert, bench.ArmNoWakeUp, bench.ArmSleeper, bench.ArmNoWakeUpPolling, bench.ArmGoEnqueue} {
		a := res.Find(arm, cfg.Clients[0])
		if a == nil || a.CommitsPerSec <= 0 || len(a.Rounds) != cfg.Rounds || (a.RelayDispatched <= 0 && arm != bench.ArmNoWakeUp) {
			t.Errorf("%s: %+v, want commits, and relay publishes if woken", arm, a)
			continue
		}
		if len(a.RoundRatios) != cfg.Rounds || a.VsNoWakeUp <= 0 || (arm == bench.ArmNoWakeUp && a.VsNoWakeUp != 1) {
			t.Errorf("%s: ratios %v, median %v; want one per round, each over the same round's no-wake-up arm", arm, a.RoundRatios, a.VsNoWakeUp)
		}
		if a.VsPolling <= 0 || (arm == bench.ArmNoWakeUpPolling && a.VsPolling != 1) {
			t.Errorf("%s: / polling %v, want the median of its ratios over the same rounds' polling arm", arm, a.VsPolling)
		}
	}
	var def string
	if err := db.Pool.QueryRow(context.Background(), `SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'outbox'::regclass AND tgname = 'outbox_notify_insert' AND tgenabled = 'O'`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(def, "WHEN ((NOT pg_try_advisory_xact_lock_shared(1868724343") {
		t.Errorf("trigger after the scenario: %s, want 0014's", def)
	}
}

// The pinned scenario at its tiny size: windows cover production after the warm-up, some have the
// snapshot held, the dead tuples are read, and at this rate nothing is left behind; its
// summary and targets are filled.
func TestPinned(t *testing.T) {
	t.Parallel()
	db, cfg, res := tiny(t, bench.PinnedConfigFor, bench.Pinned)
	production := cfg.Clean + cfg.Hold + cfg.Recovery
	if want := int(production / cfg.Window); len(res.Windows) != want {
		t.Fatalf("%d windows, want %d: %+v", len(res.Windows), want, res.Windows)
	}
	pinned, produced, dead, claims, publishes, marks := 0, 0, int64(0), 0, 0, 0
	for _, w := range res.Windows {
		if w.Pinned {
			pinned++
		}
		produced += w.Produced
		dead = max(dead, w.DeadTuples)
		claims, publishes, marks = claims+w.Claim.Samples, publishes+w.Publish.Samples, marks+w.Mark.Samples
		if w.Claim.Samples > 0 && (w.Claim.P50 <= 0 || w.Claim.P99 < w.Claim.P50) {
			t.Errorf("window %+v: claim durations out of order", w)
		}
		// Every delivered event was marked dispatched (its mark may start after its handler
		// committed: QStash delivers while the publish call returns).
		if w.Dispatch.Samples != w.Delivered || w.Dispatch.P50 <= 0 {
			t.Errorf("window %+v: want a dispatch time per delivered event", w)
		}
		if w.Produced > 0 && (w.Latency.Samples != w.Produced || w.Latency.P99 < w.Latency.P50) {
			t.Errorf("window %+v: want a latency per event", w)
		}
	}
	if pinned == 0 || pinned == len(res.Windows) {
		t.Errorf("%d of %d windows pinned, want some", pinned, len(res.Windows))
	}
	if res.WarmupProduced == 0 || produced == 0 || produced+res.WarmupProduced != res.Produced || res.LeftBehind != 0 || !res.RelayStopped {
		t.Errorf("produced %d (warm-up %d, windows %d), left behind %d, relay stopped %v: want every event delivered", res.Produced, res.WarmupProduced, produced, res.LeftBehind, res.RelayStopped)
	}
	if res.PinStartSec < cfg.Clean.Seconds() || res.PinEndSec-res.PinStartSec < cfg.Hold.Seconds() {
		t.Errorf("snapshot held from %.3f to %.3f s, want from %v for %v", res.PinStartSec, res.PinEndSec, cfg.Clean, cfg.Hold)
	}
	if dead == 0 {
		t.Error("no dead outbox tuples read in any window")
	}
	if claims == 0 || res.WorstPinnedClaimP99 <= 0 {
		t.Errorf("%d claims timed, worst pinned claim p99 %.2f ms: want the relay's claims in the windows", claims, res.WorstPinnedClaimP99)
	}
	if publishes < claims || marks < claims {
		t.Errorf("%d claims, %d publishes, %d marks timed: want a publish and a mark for every claim", claims, publishes, marks)
	}
	var delivered int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM billing_charges`).Scan(&delivered); err != nil {
		t.Fatal(err)
	}
	if delivered != res.Produced {
		t.Errorf("%d billing_charges rows, want %d", delivered, res.Produced)
	}

	r := &bench.Results{Pinned: res}
	r.Summarise()
	s := r.Summary
	if s.PinnedP99Ms == nil || s.PinnedCleanP99Ms == nil || s.PinnedLeftBehind == nil || *s.PinnedLeftBehind != 0 || s.PinnedClaimP99Ms == nil {
		t.Errorf("summary %+v", s)
	}
	var md bytes.Buffer
	r.WriteMarkdown(&md)
	for _, want := range []string{"pinned_p99_ms", "pinned_recovery_seconds", "pinned_left_behind", "## 8. Pinned xmin horizon"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
}

// A relay that cannot finish (from the last second of production on, every mark hangs in
// the server, as behind a lock nobody releases) does not hold the scenario: it ends within
// production plus the grace, reports the events left behind, and does not fail. The
// marks hang by a trigger armed for that instant, so the relay cannot outrun the test.
func TestPinnedStuckRelayIsBounded(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	cfg := bench.PinnedConfigFor(bench.Tiny)
	cfg.Grace = 4 * time.Second
	planned := cfg.Warmup + cfg.Clean + cfg.Hold + cfg.Recovery

	var armed time.Time
	if err := db.Pool.QueryRow(ctx, "SELECT clock_timestamp() + $1::interval",
		(planned - time.Second).String()).Scan(&armed); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`
CREATE FUNCTION stall_marks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF clock_timestamp() >= '%s'::timestamptz THEN PERFORM pg_sleep(3600); END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER stall_marks BEFORE UPDATE ON outbox FOR EACH ROW
    WHEN (OLD.dispatched_at IS NULL AND NEW.dispatched_at IS NOT NULL)
    EXECUTE FUNCTION stall_marks();`, armed.UTC().Format(time.RFC3339Nano))); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	res, err := bench.Pinned(ctx, db.URL, cfg, logf(t))
	took := time.Since(began)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("took %v; relay stopped %v, terminated %v (%s)", took, res.RelayStopped, res.RelayTerminated, res.RelayError)
	if res.LeftBehind == 0 {
		t.Errorf("nothing left behind with marks hanging: %+v", res)
	}
	if limit := planned + cfg.Grace + 3*time.Second; took > limit {
		t.Errorf("scenario took %v, want within %v", took, limit)
	}
}

// Producers that cannot keep the rate stop at the end of production all the same: fewer
// events than planned, none abandoned mid-insert, and no failure.
func TestPinnedProducersBehindStopAtTheEnd(t *testing.T) {
	t.Parallel()
	_, _, res := tiny(t, bench.PinnedConfigFor, bench.Pinned, func(cfg *bench.PinnedConfig) {
		cfg.Rate, cfg.Producers = 50_000, 1
		cfg.Warmup, cfg.Clean, cfg.Hold, cfg.Recovery, cfg.Window = 0, time.Second, time.Second, time.Second, time.Second
	})
	if res.Produced == 0 || res.Produced >= res.Planned || res.InsertsStuck != 0 {
		t.Errorf("produced %d of %d planned, %d inserts stuck: want the producer stopped at the end, behind", res.Produced, res.Planned, res.InsertsStuck)
	}
}

// TestDeployed: the deployed scenario at its tiny size runs the built relay under the local
// Lambda service and reports every event dispatched, the invocations, the kicks and the
// commit rates; the summary and its targets name them.
func TestDeployed(t *testing.T) {
	t.Parallel()
	_, cfg, res := tiny(t, bench.DeployedConfigFor, bench.Deployed)
	if len(res.Runs) != len(cfg.Profiles)*len(cfg.Rates) {
		t.Fatalf("runs %+v, want one per profile and rate", res.Runs)
	}
	for _, run := range res.Runs {
		if run.Events == 0 || run.Latency.Samples != run.Events || run.Drained == 0 || run.Failed != 0 || run.KicksSent == 0 {
			t.Errorf("run %+v: want events dispatched by kicked invocations", run)
		}
	}
	if res.CommitsOnBest <= 0 || res.CommitsOffBest <= 0 || res.CommitRatio <= 0 {
		t.Errorf("commit rates on %v off %v ratio %v", res.CommitRoundsOn, res.CommitRoundsOff, res.CommitRatio)
	}
	r := bench.Results{Deployed: res}
	r.Summarise()
	if r.Summary.DeployedP99Ms == nil || r.Summary.DeployedClaimedNothingShare20 == nil || r.Summary.DeployedCommitRatio == nil {
		t.Errorf("summary %+v lacks the deployed figures", r.Summary)
	}
	var md strings.Builder
	r.WriteMarkdown(&md)
	if !strings.Contains(md.String(), "## 9. The deployed shape") {
		t.Errorf("no deployed section in:\n%s", md.String())
	}
}

// TestOutage: the consumer outage scenario at its tiny size (fifo, a 2-minute outage on
// a 20x clock) loses nothing to the outage, keeps key order, opens a circuit and reports
// the recovery; the summary's targets name the figures.
func TestOutage(t *testing.T) {
	t.Parallel()
	_, cfg, res := tiny(t, bench.OutageConfigFor, bench.Outage)
	if len(res.Runs) != len(cfg.Modes)*len(cfg.Outages) {
		t.Fatalf("runs %+v", res.Runs)
	}
	for _, run := range res.Runs {
		if run.Events == 0 || run.DuringOutage == 0 || run.DeadLettered != 0 || run.OrderViolations != 0 || run.Attempts < int64(run.Events) ||
			run.Recovery.Samples != run.DuringOutage || run.CircuitOpenedAfter < 0 {
			t.Errorf("run %+v: want every outage event applied in key order, none dead-lettered, the circuit opened", run)
		}
	}
	r := bench.Results{Outage: res}
	r.Summarise()
	if r.Summary.OutageBilledPerEvent == nil || r.Summary.OutageRecoveryP99Seconds == nil || *r.Summary.OutageDeadLettered != 0 {
		t.Errorf("summary %+v", r.Summary)
	}
	var md strings.Builder
	r.WriteMarkdown(&md)
	if !strings.Contains(md.String(), "## 10. Consumer outage") {
		t.Errorf("no outage section in:\n%s", md.String())
	}
}
