package bench

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// Results is one bench run: the JSON written by outboxctl bench --out.
type Results struct {
	Size     Size            `json:"size"`
	Started  time.Time       `json:"started"`
	Seconds  float64         `json:"seconds"`
	Summary  Summary         `json:"summary"`
	Targets  []Target        `json:"targets"`
	Machine  Machine         `json:"machine"`
	Drain    *DrainResult    `json:"drain,omitempty"`
	Claim    *ClaimResult    `json:"claim,omitempty"`
	FIFO     *FIFOResult     `json:"fifo,omitempty"`
	E2E      *E2EResult      `json:"e2e,omitempty"`
	Producer *ProducerResult `json:"producer,omitempty"`
	Consumer *ConsumerResult `json:"consumer,omitempty"`
	Memory   *MemoryResult   `json:"memory,omitempty"`
	Backlog  *BacklogResult  `json:"backlog,omitempty"`
	Pinned   *PinnedResult   `json:"pinned,omitempty"`
	Deployed *DeployedResult `json:"deployed,omitempty"`
	Outage   *OutageResult   `json:"outage,omitempty"`
	// Errors lists scenarios that failed; the others still report.
	Errors map[string]string `json:"errors,omitempty"`
}

// Summary holds the headline figures; a figure whose scenario did not run is null.
type Summary struct {
	// Drain at batch 500 with 1 relay; the baseline at its own batch of 50, 1 relay.
	RelayVsFloor    *float64 `json:"relay_vs_floor"`
	RelayVsBaseline *float64 `json:"relay_vs_baseline"`
	RelayEPS        *float64 `json:"relay_eps"`
	FloorEPS        *float64 `json:"floor_eps"`
	BaselineEPS     *float64 `json:"baseline_eps"`
	// Claim p99 with the largest history over none, at the largest pending count.
	ClaimP99Ratio5MVs0 *float64 `json:"claim_p99_ratio_5m_vs_0"`
	// One claim of the default batch over the claim scenario's largest backlog on a table
	// never analysed, and the same after ANALYZE (medians of 5).
	UnanalysedClaimMs *float64 `json:"unanalysed_claim_ms"`
	AnalysedClaimMs   *float64 `json:"analysed_claim_ms"`
	// End to end in linger mode (NOTIFY), and poll-only.
	E2EP50Ms     *float64 `json:"e2e_p50_ms"`
	E2EP95Ms     *float64 `json:"e2e_p95_ms"`
	E2EP99Ms     *float64 `json:"e2e_p99_ms"`
	E2EPollP50Ms *float64 `json:"e2e_poll_p50_ms"`
	E2EPollP99Ms *float64 `json:"e2e_poll_p99_ms"`
	// Producer commits/s at 64 clients, one event per transaction, with the long-lived relay
	// running: the shipped wake-up (0014) over no wake-up at all, and 0001's NOTIFY on every
	// insert over no wake-up.
	ProducerWakeupRatio *float64 `json:"producer_wakeup_ratio"`
	// ProducerWakeupVsPollingRatio is the sleeper arm against a relay that polls every
	// millisecond with no trigger: the commit path's cost alone.
	ProducerWakeupVsPollingRatio   *float64 `json:"producer_wakeup_vs_polling_ratio"`
	ProducerNotifyEveryInsertRatio *float64 `json:"producer_notify_every_insert_ratio"`
	// Webhook over its raw transaction at concurrency 16.
	WebhookVsRaw *float64 `json:"webhook_vs_raw"`
	// FIFO: order violations over every key count (must be 0).
	FIFOOrderViolations *int `json:"fifo_order_violations"`
	// A QStash a round trip away (RTT modelled by the bench): the relay with its defaults
	// (batch DefaultBatchSize, DefaultPublishConcurrency in flight), 1 relay, at RTT 30 ms,
	// over itself at RTT 0 and over the baseline at RTT 30 ms.
	RelayRTT30EPS        *float64 `json:"relay_rtt30_eps"`
	RelayRTT30VsRTT0     *float64 `json:"relay_rtt30_vs_rtt0"`
	RelayVsBaselineRTT30 *float64 `json:"relay_vs_baseline_rtt30"`
	// The serial floor with the pipelined claim's runs over the floor with one event per key
	// (same events, back to back): what the runs cost the claim.
	FloorRunsVsOneRun *float64 `json:"floor_runs_vs_one_run"`
	// Hot key: one key in fifo mode at RTT 30 ms (one event per round trip by design).
	HotKeyFIFORTT30EPS *float64 `json:"hot_key_fifo_rtt30_eps"`
	// Backlog: seconds to drain 1,000,000 events at RTT 30 ms with the Lambda's settings
	// (null unless the backlog scenario ran at that size).
	Backlog1MRTT30Seconds *float64 `json:"backlog_1m_rtt30_seconds"`
	RelayPeakRSSMiB       *float64 `json:"relay_peak_rss_mib"`
	// The backlog's settings sweep: the template's defaults (batch, PUBLISH_CONCURRENCY)
	// over the fastest setting (1 when the defaults are the fastest), and the relay's peak
	// RSS in the 1M-event run at the defaults.
	BacklogDefaultsVsBest  *float64 `json:"backlog_defaults_vs_best"`
	BacklogRelayPeakRSSMiB *float64 `json:"backlog_relay_peak_rss_mib"`
	// Lambda GB-seconds and QStash HTTP requests per million events, from the memory run.
	LambdaGBsPerMillion128   *float64 `json:"lambda_gb_s_per_million_128mb"`
	LambdaGBsPerMillion512   *float64 `json:"lambda_gb_s_per_million_512mb"`
	QStashRequestsPerMillion *float64 `json:"qstash_requests_per_million"`
	// Pinned horizon at 800 events/s: the worst p99 of a window with the snapshot held, the
	// p99 before it, seconds from its release until a window's p99 is back within 1.5x of
	// that (null: never), and events not delivered by the end.
	PinnedP99Ms           *float64 `json:"pinned_p99_ms"`
	PinnedCleanP99Ms      *float64 `json:"pinned_clean_p99_ms"`
	PinnedRecoverySeconds *float64 `json:"pinned_recovery_seconds"`
	PinnedLeftBehind      *int     `json:"pinned_left_behind"`
	// The claim's own p99 (the relay's claims that leased rows): the worst pinned window's
	// and the worst clean one's before the pin, what the bounded walks keep flat.
	PinnedClaimP99Ms      *float64 `json:"pinned_claim_p99_ms"`
	PinnedCleanClaimP99Ms *float64 `json:"pinned_clean_claim_p99_ms"`
	// The deployed shape (kicked relay Lambda under the emulator): the worst commit ->
	// dispatched p50 and p99 over every profile and rate; the relay's session-seconds per
	// idle minute, worst of each profile; the share of invocations that claimed nothing at
	// 20 commits/s with the defaults; producers' commits/s with kicks on over off.
	DeployedP50Ms                    *float64 `json:"deployed_p50_ms"`
	DeployedP99Ms                    *float64 `json:"deployed_p99_ms"`
	DeployedIdleSessionSeconds       *float64 `json:"deployed_idle_session_seconds"`
	DeployedIdleSessionSecondsToZero *float64 `json:"deployed_idle_session_seconds_scale_to_zero"`
	DeployedClaimedNothingShare20    *float64 `json:"deployed_claimed_nothing_share_20"`
	DeployedCommitRatio              *float64 `json:"deployed_commit_ratio"`
	// Consumer outages (every run): events dead-lettered, fifo order violations, the worst
	// billed messages per event, the worst recovery p99 (seconds, production-equivalent)
	// and the worst time until a circuit opened (-1: one never did).
	OutageDeadLettered       *int     `json:"outage_dead_lettered"`
	OutageOrderViolations    *int     `json:"outage_order_violations"`
	OutageBilledPerEvent     *float64 `json:"outage_billed_per_event"`
	OutageRecoveryP99Seconds *float64 `json:"outage_recovery_p99_s"`
	OutageVisibleSeconds     *float64 `json:"outage_visible_s"`
}

// Target is one of the goals, with the measured value. Met is reported, never
// asserted.
type Target struct {
	Name  string   `json:"name"`
	Goal  string   `json:"goal"`
	Value *float64 `json:"value"`
	Met   *bool    `json:"met"`
}

func ptr[T any](v T) *T { return &v }

// Summarise fills r.Summary and r.Targets from the scenario results.
func (r *Results) Summarise() {
	s := &r.Summary
	if d := r.Drain; d != nil {
		relay, floor, base := d.Find(WayRelay, 500, 1), d.Find(WayFloor, 500, 1), d.Baseline(1)
		if relay != nil {
			s.RelayEPS = ptr(relay.EventsPerSec)
		}
		if floor != nil {
			s.FloorEPS = ptr(floor.EventsPerSec)
		}
		if base != nil {
			s.BaselineEPS = ptr(base.EventsPerSec)
		}
		if relay != nil && floor != nil {
			s.RelayVsFloor = ptr(ratio(relay.EventsPerSec, floor.EventsPerSec))
		}
		if relay != nil && base != nil {
			s.RelayVsBaseline = ptr(ratio(relay.EventsPerSec, base.EventsPerSec))
		}
		if cs := d.ClaimShapes; cs != nil {
			s.FloorRunsVsOneRun = ptr(ratio(cs.Runs.EventsPerSec, cs.OneRun.EventsPerSec))
		}
		rtt0, rtt30, base30 := d.FindRTT(WayRelay, d.Config.RTTBatch, 1, 0), d.FindRTT(WayRelay, d.Config.RTTBatch, 1, 30), d.BaselineRTT(1, 30)
		if rtt30 != nil {
			s.RelayRTT30EPS = ptr(rtt30.EventsPerSec)
			if rtt0 != nil {
				s.RelayRTT30VsRTT0 = ptr(ratio(rtt30.EventsPerSec, rtt0.EventsPerSec))
			}
			if base30 != nil {
				s.RelayVsBaselineRTT30 = ptr(ratio(rtt30.EventsPerSec, base30.EventsPerSec))
			}
		}
	}
	if b := r.Backlog; b != nil && b.Events == 1_000_000 && b.RTTMillis == 30 && b.Drained == b.Events {
		s.Backlog1MRTT30Seconds = ptr(b.Seconds)
		s.BacklogRelayPeakRSSMiB = ptr(b.PeakRSSMiB)
	}
	if b := r.Backlog; b != nil {
		if def, best := b.Defaults(), b.Fastest(); def != nil && best != nil {
			s.BacklogDefaultsVsBest = ptr(ratio(def.EventsPerSec, best.EventsPerSec))
		}
	}
	if r.Claim != nil && r.Claim.Statistics != nil {
		s.UnanalysedClaimMs, s.AnalysedClaimMs = ptr(r.Claim.Statistics.UnanalysedMs), ptr(r.Claim.Statistics.AnalysedMs)
	}
	if v, ok := r.Claim.P99Ratio(); ok {
		s.ClaimP99Ratio5MVs0 = ptr(v)
	}
	if e := r.E2E; e != nil {
		if m := e.Mode(ModeLinger); m != nil {
			s.E2EP50Ms, s.E2EP95Ms, s.E2EP99Ms = ptr(m.Latency.P50), ptr(m.Latency.P95), ptr(m.Latency.P99)
		}
		if m := e.Mode(ModePoll); m != nil {
			s.E2EPollP50Ms, s.E2EPollP99Ms = ptr(m.Latency.P50), ptr(m.Latency.P99)
		}
	}
	if p := r.Producer; p != nil {
		if none := p.Find(ArmNoWakeUp, 64); none != nil {
			if a := p.Find(ArmSleeper, 64); a != nil {
				s.ProducerWakeupRatio = ptr(a.VsNoWakeUp)
				if p.Find(ArmNoWakeUpPolling, 64) != nil {
					s.ProducerWakeupVsPollingRatio = ptr(a.VsPolling)
				}
			}
			if a := p.Find(ArmNotifyEveryInsert, 64); a != nil {
				s.ProducerNotifyEveryInsertRatio = ptr(a.VsNoWakeUp)
			}
		}
	}
	if c := r.Consumer.At(16); c != nil {
		s.WebhookVsRaw = ptr(c.WebhookVsRaw)
	}
	if f := r.FIFO; f != nil {
		v := 0
		for _, run := range f.Runs {
			if run.Mode == ModeFIFO {
				v += run.OrderViolations
			}
		}
		s.FIFOOrderViolations = &v
		if hot := f.Find(ModeFIFO, 1); hot != nil && f.Config.RTTMillis == 30 {
			s.HotKeyFIFORTT30EPS = ptr(hot.EventsPerSec)
		}
	}
	if m := r.Memory; m != nil {
		s.RelayPeakRSSMiB = ptr(m.PeakRSSMiB)
		s.LambdaGBsPerMillion128 = ptr(m.LambdaGBsPerMillion[128])
		s.LambdaGBsPerMillion512 = ptr(m.LambdaGBsPerMillion[512])
		s.QStashRequestsPerMillion = ptr(m.QStashRequestsPerMillion)
	}
	if p := r.Pinned; p != nil {
		s.PinnedP99Ms, s.PinnedCleanP99Ms = ptr(p.WorstPinnedP99), ptr(p.CleanLatency.P99)
		s.PinnedRecoverySeconds, s.PinnedLeftBehind = p.RecoverySeconds, ptr(p.LeftBehind)
		s.PinnedClaimP99Ms, s.PinnedCleanClaimP99Ms = ptr(p.WorstPinnedClaimP99), ptr(p.CleanClaimP99)
	}
	if d := r.Deployed; d != nil {
		s.summariseDeployed(d)
	}
	if o := r.Outage; o != nil {
		s.summariseOutage(o)
	}

	target := func(name, goal string, v *float64, ok func(float64) bool) {
		t := Target{Name: name, Goal: goal, Value: v}
		if v != nil {
			t.Met = ptr(ok(*v))
		}
		r.Targets = append(r.Targets, t)
	}
	r.Targets = nil
	target("relay_vs_floor", ">= 0.7 (batch 500, 1 relay, RTT 0)", s.RelayVsFloor, func(v float64) bool { return v >= 0.7 })
	target("relay_vs_baseline", ">= 10 (batch 500, 1 relay)", s.RelayVsBaseline, func(v float64) bool { return v >= 10 })
	rttSetting := "the relay's defaults, 1 relay"
	if d := r.Drain; d != nil {
		rttSetting = fmt.Sprintf("batch %d, PUBLISH_CONCURRENCY %d, 1 relay", d.Config.RTTBatch, relay.DefaultPublishConcurrency)
	}
	target("relay_rtt30_vs_rtt0", ">= 0.8 ("+rttSetting+")", s.RelayRTT30VsRTT0, func(v float64) bool { return v >= 0.8 })
	target("relay_vs_baseline_rtt30", ">= 20 ("+rttSetting+", RTT 30 ms)", s.RelayVsBaselineRTT30, func(v float64) bool { return v >= 20 })
	target("backlog_1m_rtt30_seconds", "<= 900 (one 15-minute Lambda invocation)", s.Backlog1MRTT30Seconds, func(v float64) bool { return v <= 900 })
	target("claim_p99_ratio_5m_vs_0", "<= 1.5", s.ClaimP99Ratio5MVs0, func(v float64) bool { return v <= 1.5 })
	var unanalysedRatio *float64
	if s.UnanalysedClaimMs != nil && s.AnalysedClaimMs != nil && *s.AnalysedClaimMs > 0 {
		unanalysedRatio = ptr(round3(*s.UnanalysedClaimMs / *s.AnalysedClaimMs))
	}
	target("unanalysed_claim_vs_analysed", "<= 2 (one claim of the default batch, same backlog)", unanalysedRatio, func(v float64) bool { return v <= 2 })
	target("e2e_p50_ms", "< 100 (linger)", s.E2EP50Ms, func(v float64) bool { return v < 100 })
	target("e2e_p99_ms", "< 500 (linger)", s.E2EP99Ms, func(v float64) bool { return v < 500 })
	target("producer_wakeup_ratio", ">= 0.95 (64 clients, one event per transaction, relay running; against no wake-up)", s.ProducerWakeupRatio, func(v float64) bool { return v >= 0.95 })
	target("webhook_vs_raw", ">= 0.6 (concurrency 16)", s.WebhookVsRaw, func(v float64) bool { return v >= 0.6 })
	target("relay_peak_rss_mib", "< 64 (batch 1000)", s.RelayPeakRSSMiB, func(v float64) bool { return v < 64 })
	target("backlog_relay_peak_rss_mib", "< 64 (the defaults, 1M backlog)", s.BacklogRelayPeakRSSMiB, func(v float64) bool { return v < 64 })
	// Medians of a few rounds still move by several per cent: within 5 % of the fastest is
	// within this machine's noise.
	target("backlog_defaults_vs_best", ">= 0.95 (the defaults against the sweep's fastest setting)", s.BacklogDefaultsVsBest, func(v float64) bool { return v >= 0.95 })
	var fifo *float64
	if s.FIFOOrderViolations != nil {
		fifo = ptr(float64(*s.FIFOOrderViolations))
	}
	target("fifo_order_violations", "== 0", fifo, func(v float64) bool { return v == 0 })
	target("pinned_p99_ms", "<= 50 (worst window with a REPEATABLE READ snapshot held, 800 events/s)", s.PinnedP99Ms, func(v float64) bool { return v <= 50 })
	// A pin that never recovers is a miss, not a figure left out.
	recovery := s.PinnedRecoverySeconds
	if recovery == nil && r.Pinned != nil {
		t := Target{Name: "pinned_recovery_seconds", Goal: "<= 60 (p99 within 1.5x of the clean p99; never recovered)", Met: ptr(false)}
		r.Targets = append(r.Targets, t)
	} else {
		target("pinned_recovery_seconds", "<= 60 (p99 within 1.5x of the clean p99)", recovery, func(v float64) bool { return v <= 60 })
	}
	var left *float64
	if s.PinnedLeftBehind != nil {
		left = ptr(float64(*s.PinnedLeftBehind))
	}
	target("pinned_left_behind", "== 0 (every event delivered by the end)", left, func(v float64) bool { return v == 0 })
	target("deployed_p50_ms", "<= 150 (kicked relay Lambda, every profile and rate)", s.DeployedP50Ms, func(v float64) bool { return v <= 150 })
	target("deployed_p99_ms", "<= 1000 (kicked relay Lambda, every profile and rate)", s.DeployedP99Ms, func(v float64) bool { return v <= 1000 })
	target("deployed_idle_session_seconds", "<= 1 per idle minute (template defaults)", s.DeployedIdleSessionSeconds, func(v float64) bool { return v <= 1 })
	target("deployed_idle_session_seconds_scale_to_zero", "== 0 per idle minute (rate(15 minutes))", s.DeployedIdleSessionSecondsToZero, func(v float64) bool { return v == 0 })
	target("deployed_claimed_nothing_share_20", "<= 0.2 of invocations while commits flow (20 commits/s, defaults; coalesced kicks counted)", s.DeployedClaimedNothingShare20, func(v float64) bool { return v <= 0.2 })
	target("deployed_commit_ratio", ">= 0.95 (64 clients, kicks on over off)", s.DeployedCommitRatio, func(v float64) bool { return v >= 0.95 })
	asFloat := func(v *int) *float64 {
		if v == nil {
			return nil
		}
		return ptr(float64(*v))
	}
	target("outage_dead_lettered", "== 0 (every consumer outage run)", asFloat(s.OutageDeadLettered), func(v float64) bool { return v == 0 })
	target("outage_order_violations", "== 0 (fifo runs)", asFloat(s.OutageOrderViolations), func(v float64) bool { return v == 0 })
	target("outage_billed_per_event", "<= 1.2 (publishes, retries, probes and callbacks over the run; worst run)", s.OutageBilledPerEvent, func(v float64) bool { return v <= 1.2 })
	target("outage_recovery_p99_s", "<= 120 (recovery -> delivery of the outage's events, production-equivalent; worst run)", s.OutageRecoveryP99Seconds, func(v float64) bool { return v <= 120 })
	target("outage_visible_s", "<= 300 (outage start -> circuit open; worst run)", s.OutageVisibleSeconds, func(v float64) bool { return v >= 0 && v <= 300 })
}

// summariseOutage fills the consumer outages' headline figures.
func (s *Summary) summariseOutage(o *OutageResult) {
	dead, violations := 0, 0
	var billed, rec, visible float64
	for _, run := range o.Runs {
		dead += run.DeadLettered
		if run.Mode == publish.OrderingFIFO {
			violations += run.OrderViolations
		}
		billed, rec = max(billed, run.BilledPerEvent), max(rec, run.Recovery.P99)
		if run.CircuitOpenedAfter < 0 {
			visible = -1 // a circuit that never opened: the outage stayed invisible
		} else if visible >= 0 {
			visible = max(visible, run.CircuitOpenedAfter)
		}
	}
	s.OutageDeadLettered, s.OutageOrderViolations = ptr(dead), ptr(violations)
	s.OutageBilledPerEvent, s.OutageRecoveryP99Seconds, s.OutageVisibleSeconds = ptr(billed), ptr(rec), ptr(visible)
}

// summariseDeployed fills the deployed shape's headline figures.
func (s *Summary) summariseDeployed(d *DeployedResult) {
	worst := func(cur *float64, v float64) *float64 {
		if cur == nil || v > *cur {
			return ptr(v)
		}
		return cur
	}
	for _, run := range d.Runs {
		s.DeployedP50Ms, s.DeployedP99Ms = worst(s.DeployedP50Ms, run.Latency.P50), worst(s.DeployedP99Ms, run.Latency.P99)
		switch run.Profile {
		case profileDefaults.Name:
			s.DeployedIdleSessionSeconds = worst(s.DeployedIdleSessionSeconds, run.IdleSessionSecondsPerMinute)
			if run.Rate == 20 {
				s.DeployedClaimedNothingShare20 = ptr(run.ClaimedNothingShare)
			}
		case profileScaleToZero.Name:
			s.DeployedIdleSessionSecondsToZero = worst(s.DeployedIdleSessionSecondsToZero, run.IdleSessionSecondsPerMinute)
		}
	}
	if d.CommitRatio > 0 {
		s.DeployedCommitRatio = ptr(d.CommitRatio)
	}
}

// Machine describes where the numbers came from.
type Machine struct {
	// Cluster says which server ran the bench: DATABASE_URL's, or ThrowawayCluster.
	Cluster    string            `json:"cluster"`
	NProc      int               `json:"nproc"`
	CPUModel   string            `json:"cpu_model"`
	Kernel     string            `json:"kernel"`
	GoVersion  string            `json:"go_version"`
	Postgres   string            `json:"postgres_version"`
	Settings   map[string]string `json:"postgres_settings"`
	LoadStart  string            `json:"loadavg_start"`
	LoadEnd    string            `json:"loadavg_end,omitempty"`
	MemTotalKB string            `json:"mem_total"`
}

// settingsShown are the server settings that move these numbers.
var settingsShown = []string{
	"server_version", "shared_buffers", "synchronous_commit", "fsync", "wal_sync_method",
	"full_page_writes", "work_mem", "effective_cache_size", "max_connections", "max_wal_size",
	"checkpoint_timeout", "autovacuum", "random_page_cost", "jit",
}

// DescribeMachine reads /proc and the server's SHOW values.
func DescribeMachine(ctx context.Context, url string) (Machine, error) {
	m := Machine{NProc: runtime.NumCPU(), GoVersion: runtime.Version(), Settings: map[string]string{}}
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	m.MemTotalKB = procField("/proc/meminfo", "MemTotal")
	m.Kernel = readTrim("/proc/sys/kernel/osrelease")
	m.LoadStart = readTrim("/proc/loadavg")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return m, fmt.Errorf("connect to database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, name := range settingsShown {
		var v string
		if err := conn.QueryRow(ctx, "SHOW "+name).Scan(&v); err != nil {
			return m, fmt.Errorf("show %s: %w", name, err)
		}
		m.Settings[name] = v
	}
	m.Postgres = m.Settings["server_version"]
	return m, nil
}

// LoadAvg returns /proc/loadavg, for the end-of-run record.
func LoadAvg() string { return readTrim("/proc/loadavg") }

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func procField(path, field string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == field {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// WriteMarkdown renders r as markdown tables.
func (r *Results) WriteMarkdown(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	m := r.Machine
	p("# outbox-relay bench (%s size)\n\n", r.Size)
	p("Run %s, %.0f s. Machine: %d × %s, %s RAM, Linux %s, %s, PostgreSQL %s (shared_buffers=%s, synchronous_commit=%s, fsync=%s, wal_sync_method=%s, work_mem=%s, autovacuum=%s) on %s. Load average at start %s, at end %s.\n\n",
		r.Started.UTC().Format(time.RFC3339), r.Seconds, m.NProc, m.CPUModel, m.MemTotalKB, m.Kernel, m.GoVersion, m.Postgres,
		m.Settings["shared_buffers"], m.Settings["synchronous_commit"], m.Settings["fsync"], m.Settings["wal_sync_method"], m.Settings["work_mem"],
		m.Settings["autovacuum"], cmp.Or(m.Cluster, "DATABASE_URL's server"), m.LoadStart, m.LoadEnd)

	p("## Targets\n\n| figure | goal | measured | met |\n|---|---|---:|---|\n")
	for _, t := range r.Targets {
		v := fmtPtr(t.Value)
		if t.Value == nil && t.Met != nil {
			v = "never" // measured, and no figure reached (pinned_recovery_seconds)
		}
		p("| %s | %s | %s | %s |\n", t.Name, t.Goal, v, fmtMet(t.Met))
	}
	p("\n")

	if d := r.Drain; d != nil {
		p("## 1. Drain throughput (%d events, %d keys, ~300-byte payloads; baseline %d events)\n\n", d.Config.Events, d.Config.Keys, d.Config.BaselineEvents)
		p("Local QStash delivery: %s. Latencies are per batch (means).", d.Delivery)
		if d.Config.RTTRounds > 1 && len(d.Config.RTTMillis) > 1 {
			p(" The relay at batch %d with 1 relay is the median of %d rounds, taken in turns with the round trips of 1b; every other run is a single one.", d.Config.RTTBatch, d.Config.RTTRounds)
		}
		p("\n\n")
		p("| relays | batch | floor ev/s | relay ev/s | relay/floor | baseline ev/s (batch %d) | relay/baseline | relay HTTP requests | floor claim ms | floor mark ms | relay publish ms |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", d.Config.BaselineBatch)
		for _, n := range d.Config.Relays {
			base := d.Baseline(n)
			for _, b := range d.Config.Batches {
				f, rl := d.Find(WayFloor, b, n), d.Find(WayRelay, b, n)
				if f == nil || rl == nil {
					continue
				}
				bs, rb := "–", "–"
				if base != nil {
					bs = fmt.Sprintf("%.0f", base.EventsPerSec)
					rb = fmt.Sprintf("%.1f×", ratio(rl.EventsPerSec, base.EventsPerSec))
				}
				p("| %d | %d | %.0f | %.0f | %.2f | %s | %s | %d | %.2f | %.2f | %.2f |\n", n, b, f.EventsPerSec, rl.EventsPerSec, ratio(rl.EventsPerSec, f.EventsPerSec), bs, rb,
					rl.PublishRequests, f.ClaimMillisMean, f.MarkMillisMean, rl.PublishMillisMean)
			}
		}
		p("\n")
		if len(d.Config.RTTMillis) > 1 {
			p("### 1b. A QStash a round trip away (the local server's Latency, RTT ± 10%%; relay at batch %d, 1 relay, PUBLISH_CONCURRENCY %d, median of %d round(s), the round trips taking turns)\n\n",
				d.Config.RTTBatch, relay.DefaultPublishConcurrency, max(d.Config.RTTRounds, 1))
			p("Every drain starts right after a `CHECKPOINT` (when the bench's role may run one); WAL is what the whole server wrote during the relay's drain, per event.\n\n")
			p("| RTT ms | relay ev/s | rounds ev/s | relay / relay at RTT 0 | baseline ev/s | relay/baseline | relay publish ms | WAL bytes/event |\n|---:|---:|---|---:|---:|---:|---:|---:|\n")
			rtt0 := d.FindRTT(WayRelay, d.Config.RTTBatch, 1, 0)
			for _, rtt := range d.Config.RTTMillis {
				rl, base := d.FindRTT(WayRelay, d.Config.RTTBatch, 1, rtt), d.BaselineRTT(1, rtt)
				if rl == nil || base == nil || rtt0 == nil {
					continue
				}
				p("| %d | %.0f | %s | %.2f | %.0f | %.1f× | %.2f | %.0f |\n", rtt, rl.EventsPerSec, roundsList(rl.Rounds), ratio(rl.EventsPerSec, rtt0.EventsPerSec), base.EventsPerSec,
					ratio(rl.EventsPerSec, base.EventsPerSec), rl.PublishMillisMean, rl.WALBytesPerEvent)
			}
			p("\n")
		}
	}
	if cs := r.Drain.claimShapes(); cs != nil {
		p("### 1c. The claim's shape (serial floor, batch %d, 1 relay, same events, back to back)\n\n", cs.Runs.Batch)
		p("| claim | floor ev/s | claim ms | mark ms |\n|---|---:|---:|---:|\n")
		p("| one event per key per batch (PUBLISH_CONCURRENCY 1) | %.0f | %.2f | %.2f |\n", cs.OneRun.EventsPerSec, cs.OneRun.ClaimMillisMean, cs.OneRun.MarkMillisMean)
		p("| runs of up to %d per key (the pipelined relay's) | %.0f | %.2f | %.2f |\n\n", relay.DefaultPublishConcurrency, cs.Runs.EventsPerSec, cs.Runs.ClaimMillisMean, cs.Runs.MarkMillisMean)
	}
	if c := r.Claim; c != nil {
		p("## 2. Claim cost vs dispatched history (batch %d, %d claims per case)\n\n", c.Config.Batch, c.Config.Iterations)
		if c.Config.Note != "" {
			p("%s.\n\n", c.Config.Note)
		}
		p("| dispatched rows | pending rows | claim p50 ms | p99 ms | max ms | rows/claim | table MB | ready idx MB | plan exec ms | seq scan |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, x := range c.Cases {
			p("| %d | %d | %.2f | %.2f | %.2f | %.0f | %.0f | %.1f | %.2f | %v |\n", x.History, x.Pending, x.Claim.P50, x.Claim.P99, x.Claim.Max,
				x.RowsPerClaim, mib(x.TableBytes), mib(x.ReadyIdxBytes), x.PlanExecMillis, x.PlanUsesSeqScan)
		}
		if v, ok := c.P99Ratio(); ok {
			p("\np99 ratio, most history vs none: **%.2f**. The EXPLAIN (ANALYZE, BUFFERS) plans are in the JSON (`claim.cases[].plan`).\n", v)
		}
		if st := c.Statistics; st != nil {
			p("\nOne claim of %d over %d pending rows (median of %d on one Store after its first claim, rolled back): never analysed **%.2f ms**, after ANALYZE **%.2f ms**. A new Store's first claim (it reads every pending row for the smallest pending id), never analysed: %.2f ms.\n",
				st.Batch, st.Pending, st.Samples, st.UnanalysedMs, st.AnalysedMs, st.FirstMs)
		}
		p("\n")
	}
	if f := r.FIFO; f != nil {
		p("## 3. Hot keys (%d events per case, RTT %d ms)\n\n%s. Order is promised (and counted as a violation) in fifo mode only.\n\n| mode | keys | events/s | relay done s | last delivery s | delivered | order violations | duplicates | relay publish calls |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n", f.Config.Events, f.Config.RTTMillis, f.Path)
		for _, x := range f.Runs {
			p("| %s | %d | %.0f | %.2f | %.2f | %d | %d | %d | %d |\n", x.Mode, x.Keys, x.EventsPerSec, x.RelaySeconds, x.Seconds, x.Delivered, x.OrderViolations, x.Duplicates, x.PublishCalls)
		}
		p("\n")
	}
	if e := r.E2E; e != nil {
		p("## 4. End-to-end latency (%d events/s for %.0f s per mode)\n\n%s.\n\n| mode | events | p50 ms | p95 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|\n", e.Config.Rate, e.Config.Duration.Seconds(), e.Path)
		for _, x := range e.Modes {
			p("| %s | %d | %.1f | %.1f | %.1f | %.1f |\n", x.Mode, x.Latency.Samples, x.Latency.P50, x.Latency.P95, x.Latency.P99, x.Latency.Max)
		}
		p("\n")
	}
	if pr := r.Producer; pr != nil {
		p("## 4b. Producer commits (one event per transaction, %.0f s per arm, %d round(s) in turns, the arms in reverse order every other round; the median shown; relay.Run publishing meanwhile)\n\n%s. pgbench: %s. \"/ no wake-up\" is the median of the rounds' ratios, each taken within one round; \"/ polling\" the same against the no-wake-up-polling arm (no trigger, the relay polling every millisecond: the relay's work as when awake, so the ratio is the commit path's cost alone).\n\n",
			pr.Config.Duration.Seconds(), max(pr.Config.Rounds, 1), pr.Path, pr.Pgbench)
		p("| clients | wake-up | driver | commits/s | every round | / no wake-up | every round's ratio | / polling | relay published |\n|---:|---|---|---:|---|---:|---|---:|---:|\n")
		for _, x := range pr.Arms {
			p("| %d | %s | %s | %.0f | %s | %.2f | %s | %.2f | %d |\n", x.Clients, x.Arm, x.Driver, x.CommitsPerSec, roundsList(x.Rounds), x.VsNoWakeUp, ratiosList(x.RoundRatios), x.VsPolling, x.RelayDispatched)
		}
		p("\n")
	}
	if c := r.Consumer; c != nil {
		p("## 5. Consumer throughput (%d messages per level and way)\n\n| concurrency | webhook msg/s | raw transaction msg/s | webhook/raw |\n|---:|---:|---:|---:|\n", c.Config.Messages)
		for _, x := range c.Runs {
			p("| %d | %.0f | %.0f | %.2f |\n", x.Concurrency, x.WebhookPerSec, x.RawPerSec, x.WebhookVsRaw)
		}
		p("\n")
	}
	if mm := r.Memory; mm != nil {
		p("## 6. Memory and cost (relay drain of %d events at batch %d in a child process)\n\n", mm.Events, mm.Batch)
		p("| peak RSS MiB | drain events/s | child CPU s | Lambda GB-s per 1M events @128 MB | @512 MB | QStash HTTP requests per 1M events |\n|---:|---:|---:|---:|---:|---:|\n")
		p("| %.1f | %.0f | %.2f | %.1f | %.1f | %.0f |\n\n", mm.PeakRSSMiB, mm.EventsPerSec, mm.CPUSeconds, mm.LambdaGBsPerMillion[128], mm.LambdaGBsPerMillion[512], mm.QStashRequestsPerMillion)
		p("%s\n\n", mm.Note)
	}
	if b := r.Backlog; b != nil {
		p("## 7. Backlog (%d events over %d keys, RTT %d ms, the relay Lambda's settings: batch %d, PUBLISH_CONCURRENCY %d, %v deadline, %d MiB memory limit)\n\n",
			b.Events, b.Config.Keys, b.RTTMillis, b.Config.Batch, b.Config.Concurrency, b.Config.Deadline, b.Config.MemoryLimitMiB)
		p("| drained | seconds | events/s | drains | publish calls | relay peak RSS MiB |\n|---:|---:|---:|---:|---:|---:|\n")
		p("| %d | %.1f | %.0f | %d | %d | %.1f |\n\n%s.\n\n", b.Drained, b.Seconds, b.EventsPerSec, b.Drains, b.PublishCalls, b.PeakRSSMiB, b.Path)
		if len(b.Sweep) > 0 {
			p("Settings sweep (%d events per setting, same keys and round trip, %d round(s), the median shown; the template's defaults are batch %d, concurrency %d):\n\n",
				b.Config.SweepEvents, max(b.Config.SweepRounds, 1), b.Config.Batch, b.Config.Concurrency)
			p("| batch | PUBLISH_CONCURRENCY | events/s | every round | seconds | publish calls | relay peak RSS MiB |\n|---:|---:|---:|---|---:|---:|---:|\n")
			for _, x := range b.Sweep {
				p("| %d | %d | %.0f | %s | %.1f | %d | %.1f |\n", x.Batch, x.Concurrency, x.EventsPerSec, roundsList(x.Rounds), x.Seconds, x.PublishCalls, x.PeakRSSMiB)
			}
			p("\n")
		}
	}
	if pn := r.Pinned; pn != nil {
		c := pn.Config
		p("## 8. Pinned xmin horizon (%d events/s, one plain INSERT per transaction over %d keys; after a %.0f-s warm-up, snapshot held %.0f s after %.0f s clean, then %.0f s of recovery; %.0f-s windows)\n\n",
			c.Rate, c.Keys, c.Warmup.Seconds(), c.Hold.Seconds(), c.Clean.Seconds(), c.Recovery.Seconds(), c.Window.Seconds())
		p("%s. Windows hold the events created in them; latency is created_at -> handler commit, an event never delivered counted at its age at the end. n_dead_tup is the outbox's (pg_stat_user_tables) at the window's end. Claims are the relay's claims that leased rows, by their start, timed by the relay (statement and decoding); publish is one call to the local QStash, mark the statement after it; dispatch is created_at -> dispatched_at, the relay's share of the latency.\n\n", pn.Path)
		p("Warm-up (%d events, not in the windows) p50 / p99 %.1f / %.1f ms. Snapshot held from %.1f s to %.1f s. Clean p50 / p99 **%.1f / %.1f ms**; worst pinned window p99 **%.1f ms**; recovery %s; %d of %d events left behind (%d planned, %d inserts stuck); relay stopped: %v.\n\n",
			pn.WarmupProduced, pn.WarmupLatency.P50, pn.WarmupLatency.P99, pn.PinStartSec, pn.PinEndSec, pn.CleanLatency.P50, pn.CleanLatency.P99, pn.WorstPinnedP99,
			fmtSeconds(pn.RecoverySeconds), pn.LeftBehind, pn.Produced, pn.Planned, pn.InsertsStuck, pn.RelayStopped)
		p("Claim p99: clean windows up to %.1f ms, pinned windows up to %.1f ms. The relay's share, created_at -> dispatched_at (the mark after the publish), clean p50 / p99 %.1f / %.1f ms.\n\n",
			pn.CleanClaimP99, pn.WorstPinnedClaimP99, pn.CleanDispatch.P50, pn.CleanDispatch.P99)
		if pn.RelayRestarts > 0 {
			p("The relay's run failed and was started again %d times; the last: %s\n\n", pn.RelayRestarts, pn.RelayRunError)
		}
		p("| window s | pinned | produced | delivered | handler commits in window | p50 ms | p99 ms | max ms | n_dead_tup | vacuums | claims | claim p50 ms | claim p99 ms | publish p99 ms | mark p99 ms | dispatch p50 ms | dispatch p99 ms |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, w := range pn.Windows {
			p("| %.0f | %v | %d | %d | %d | %.1f | %.1f | %.1f | %d | %d | %d | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f |\n", w.StartSec, w.Pinned, w.Produced, w.Delivered, w.CommittedInWindow,
				w.Latency.P50, w.Latency.P99, w.Latency.Max, w.DeadTuples, w.Vacuums, w.Claim.Samples, w.Claim.P50, w.Claim.P99, w.Publish.P99, w.Mark.P99, w.Dispatch.P50, w.Dispatch.P99)
		}
		p("\n")
	}
	if d := r.Deployed; d != nil {
		c := d.Config
		p("## 9. The deployed shape (%d producer processes, %.0f s at each rate, then %.0f s idle)\n\n", c.Producers, c.Run.Seconds(), c.Idle.Seconds())
		p("%s. Latency is created_at -> dispatched_at of every event (the first, in a new environment, is the cold start). Invocations are those that started while producers committed and until the last one ended: drained claimed events, found nothing opened sessions and claimed none, coalesced kicks were answered without a session; the idle span's (the schedule's ticks) are counted apart. Kicks: invokes the producers sent, and their reads of a relay's promise that spared one.\n\n", d.Path)
		p("| profile | commits/s | events | p50 ms | p99 ms | max ms | first event ms | invocations | drained | found nothing | coalesced | claimed nothing | kicks sent | kicks spared | environments | idle invocations (claimed nothing) | idle session-s per minute |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")
		for _, x := range d.Runs {
			p("| %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %d | %d | %d | %d | %.0f %% | %d | %d | %d | %d (%d) | %.2f |\n", x.Profile, x.Rate, x.Events, x.Latency.P50, x.Latency.P99, x.Latency.Max, x.ColdStartMs,
				x.Invocations, x.Drained, x.FoundNothing, x.Coalesced, 100*x.ClaimedNothingShare, x.KicksSent, x.KicksPromised, x.Environments, x.IdleInvocations, x.IdleClaimedNothing, x.IdleSessionSecondsPerMinute)
		}
		p("\nProducer commits/s, %d clients, one event per transaction, best of %d rounds each in turns: kicks on **%.0f**, kicks off %.0f (**%.2f**); rounds on %s, off %s.\n\n",
			c.CommitClients, max(c.CommitRounds/2, 1), d.CommitsOnBest, d.CommitsOffBest, d.CommitRatio, roundsList(d.CommitRoundsOn), roundsList(d.CommitRoundsOff))
	}
	if o := r.Outage; o != nil {
		c := o.Config
		p("## 10. Consumer outage (%d events/s over %d keys, %.0f min of traffic before and after, QSTASH_RETRY_DELAY %v, time scaled %gx)\n\n", c.Rate, c.Keys, c.Before.Minutes(), c.RetryDelay, c.TimeScale)
		p("%s. Times are production-equivalent. Recovery is the consumer's recovery -> the first apply of each event produced during the outage: the wait on QStash's ladder and the circuit's probe scaled, the drain after the circuit closed as it ran; \"all scaled\" counts the drain scaled too. Billed: delivery attempts (first attempts, retries, probes) and failure callbacks, per event of the run.\n\n", o.Path)
		p("| mode | outage min | events | during | dead-lettered | order violations | attempts | callbacks | billed per event | recovery p50 / p99 / max s | all scaled p99 s | circuit open after s | closed after recovery s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n")
		for _, x := range o.Runs {
			p("| %s | %.0f | %d | %d | %d | %d | %d | %d | %.2f | %.0f / %.0f / %.0f | %.0f | %.0f | %.0f |\n", x.Mode, x.OutageMinutes, x.Events, x.DuringOutage, x.DeadLettered, x.OrderViolations,
				x.Attempts, x.Callbacks, x.BilledPerEvent, x.Recovery.P50, x.Recovery.P99, x.Recovery.Max, x.RecoveryAllScaled.P99, x.CircuitOpenedAfter, x.CircuitClosedAfter)
		}
		p("\n")
	}
	if len(r.Errors) > 0 {
		p("## Errors\n\n")
		for k, v := range r.Errors {
			p("- %s: %s\n", k, v)
		}
		p("\n")
	}
}

// fmtSeconds renders an optional duration in seconds ("never" when nil).
func fmtSeconds(v *float64) string {
	if v == nil {
		return "never"
	}
	return fmt.Sprintf("%.0f s", *v)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func fmtPtr(v *float64) string {
	if v == nil {
		return "not run"
	}
	return fmt.Sprintf("%.2f", *v)
}

func fmtMet(m *bool) string {
	switch {
	case m == nil:
		return "–"
	case *m:
		return "yes"
	default:
		return "**no**"
	}
}

// roundsList renders every round's events/s in round order ("–" for a single run).
// ratiosList is roundsList for ratios.
func ratiosList(ratios []float64) string { return joinRounds(ratios, "%.2f") }

func roundsList(rates []float64) string { return joinRounds(rates, "%.0f") }

// joinRounds lists one value per round, formatted.
func joinRounds(vals []float64, format string) string {
	if len(vals) == 0 {
		return "–"
	}
	rounds := make([]string, len(vals))
	for i, v := range vals {
		rounds[i] = fmt.Sprintf(format, v)
	}
	return strings.Join(rounds, " / ")
}
