package bench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/relayfunc"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// BacklogConfig sizes the backlog scenario: a large backlog drained through a QStash a round
// trip away with the relay Lambda's settings.
type BacklogConfig struct {
	Events    int `json:"events"`
	Keys      int `json:"keys"`
	RTTMillis int `json:"rtt_ms"`
	// Batch and Concurrency are the template's defaults (BatchSize, PublishConcurrency).
	Batch       int `json:"batch"`
	Concurrency int `json:"concurrency"`
	// Deadline is one Lambda invocation's budget (the 15-minute maximum); Reserve what the
	// function keeps back from it (relayfunc.DeadlineReserve).
	Deadline time.Duration `json:"deadline_ns"`
	Reserve  time.Duration `json:"reserve_ns"`
	// MemoryLimitMiB is the template's RelayMemorySize, applied as the relay process's soft
	// memory limit (the relay runs in a child process, the local QStash in this one).
	MemoryLimitMiB int64 `json:"memory_limit_mib"`
	// Sweep are other (batch, concurrency) settings, each drained from SweepEvents pending
	// events the same way before the main run: the measurement behind the template's
	// defaults.
	Sweep       []BacklogSetting `json:"sweep,omitempty"`
	SweepEvents int              `json:"sweep_events,omitempty"`
	// SweepRounds is how many times the sweep runs every setting, one round after the
	// other, so a drift of the machine touches every setting alike; a setting's rate is the
	// median of its rounds (two full runs an hour apart disagreed by 25 % on single rounds).
	SweepRounds int `json:"sweep_rounds,omitempty"`
}

// BacklogSetting is one relay setting the backlog scenario tries.
type BacklogSetting struct {
	Batch       int `json:"batch"`
	Concurrency int `json:"concurrency"`
}

// BacklogConfigFor returns the backlog scenario's size.
func BacklogConfigFor(s Size) BacklogConfig {
	c := BacklogConfig{Keys: 10_000, RTTMillis: 30, Batch: relay.DefaultBatchSize, Concurrency: relay.DefaultPublishConcurrency,
		Deadline: 15 * time.Minute, Reserve: relayfunc.DeadlineReserve, MemoryLimitMiB: 256}
	for _, b := range []int{100, 250, 500, 1000} {
		for _, n := range []int{2, 4, 8} {
			c.Sweep = append(c.Sweep, BacklogSetting{Batch: b, Concurrency: n})
		}
	}
	switch s {
	case Full:
		c.Events, c.SweepEvents, c.SweepRounds = 1_000_000, 100_000, 3
	case Short:
		c.Events, c.SweepEvents = 20_000, 20_000
		c.Sweep = []BacklogSetting{{100, 4}, {500, 4}, {500, 8}}
	default:
		c.Events, c.Keys, c.RTTMillis, c.Sweep = 2_000, 100, 5, nil
	}
	return c
}

// BacklogResult is the backlog scenario's output.
type BacklogResult struct {
	Config       BacklogConfig `json:"config"`
	Events       int           `json:"events"`
	RTTMillis    int           `json:"rtt_ms"`
	Drained      int           `json:"drained"`
	Seconds      float64       `json:"seconds"`
	EventsPerSec float64       `json:"events_per_sec"`
	// Drains counts Drain calls inside the one invocation (a drain ends at a short batch
	// that a concurrent tail can cause; the function would linger or run again).
	Drains       int `json:"drains"`
	PublishCalls int `json:"publish_calls"`
	// PeakRSSMiB is the relay process's own high-water mark (VmHWM), the local QStash
	// being in another process.
	PeakRSSMiB  float64 `json:"relay_peak_rss_mib"`
	LoadSeconds float64 `json:"load_seconds"`
	Path        string  `json:"path"`
	// Sweep is one drain of SweepEvents per setting in Config.Sweep.
	Sweep []BacklogRun `json:"sweep,omitempty"`
}

// Defaults returns the sweep's run at the template's defaults (Config.Batch and
// Concurrency), or nil.
func (r *BacklogResult) Defaults() *BacklogRun {
	return find(r.Sweep, func(x *BacklogRun) bool { return x.Batch == r.Config.Batch && x.Concurrency == r.Config.Concurrency })
}

// Fastest returns the sweep's fastest run, or nil.
func (r *BacklogResult) Fastest() *BacklogRun {
	var best *BacklogRun
	for i := range r.Sweep {
		if x := &r.Sweep[i]; best == nil || x.EventsPerSec > best.EventsPerSec {
			best = x
		}
	}
	return best
}

// BacklogRun is one drain of the settings sweep.
type BacklogRun struct {
	BacklogSetting
	Events int `json:"events"`
	// Seconds and EventsPerSec are the median round's; Rounds every round's events/s.
	Seconds      float64   `json:"seconds"`
	EventsPerSec float64   `json:"events_per_sec"`
	Rounds       []float64 `json:"rounds_events_per_sec,omitempty"`
	PublishCalls int       `json:"publish_calls"`
	PeakRSSMiB   float64   `json:"relay_peak_rss_mib"`
}

// Backlog drains cfg.SweepEvents pending events once per setting of cfg.Sweep, then loads
// cfg.Events pending events and drains them as one relay Lambda invocation would with the
// template's batch size and concurrency. The relay runs in a child process started by spawn
// (RunDrainChild), so the Lambda's memory limit applies to it alone.
func Backlog(ctx context.Context, url string, cfg BacklogConfig, spawn Spawner, progress func(string)) (*BacklogResult, error) {
	res := &BacklogResult{Config: cfg, Events: cfg.Events, RTTMillis: cfg.RTTMillis,
		Path: "relay (publish mode) -> local QStash over HTTP a modelled round trip away; deliveries held back (publish path only)"}
	admin, err := openPool(ctx, url, 2)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	rounds := make([][]BacklogRun, len(cfg.Sweep))
	for round := range max(cfg.SweepRounds, 1) {
		for i, set := range cfg.Sweep {
			run := BacklogRun{BacklogSetting: set, Events: cfg.SweepEvents}
			if _, err := loadBacklog(ctx, admin, cfg.SweepEvents, cfg.Keys); err != nil {
				return res, err
			}
			d, err := drainBacklog(ctx, url, cfg, set, spawn)
			if err != nil {
				return res, err
			}
			run.Seconds, run.EventsPerSec, run.PublishCalls, run.PeakRSSMiB = d.Seconds, rate(d.Dispatched, secs(d.Seconds)), d.PublishCalls, rssMiB(d)
			rounds[i] = append(rounds[i], run)
			if progress != nil {
				progress(fmt.Sprintf("backlog sweep round %d: %d events rtt=%dms batch=%d concurrency=%d: %.1fs (%.0f events/s)",
					round+1, run.Events, cfg.RTTMillis, set.Batch, set.Concurrency, run.Seconds, run.EventsPerSec))
			}
			if d.Dispatched != cfg.SweepEvents {
				return res, fmt.Errorf("backlog sweep batch %d concurrency %d: drained %d of %d events", set.Batch, set.Concurrency, d.Dispatched, cfg.SweepEvents)
			}
		}
	}
	for _, runs := range rounds {
		res.Sweep = append(res.Sweep, medianRun(runs))
	}

	if res.LoadSeconds, err = loadBacklog(ctx, admin, cfg.Events, cfg.Keys); err != nil {
		return res, err
	}
	d, err := drainBacklog(ctx, url, cfg, BacklogSetting{Batch: cfg.Batch, Concurrency: cfg.Concurrency}, spawn)
	if err != nil {
		return res, err
	}
	res.Drains, res.Drained, res.PublishCalls, res.PeakRSSMiB = d.Drains, d.Dispatched, d.PublishCalls, rssMiB(d)
	res.Seconds, res.EventsPerSec = d.Seconds, rate(d.Dispatched, secs(d.Seconds))
	if progress != nil {
		progress(fmt.Sprintf("backlog %d events rtt=%dms batch=%d concurrency=%d: %.1fs (%.0f events/s), %d drains, relay peak RSS %.1f MiB",
			cfg.Events, cfg.RTTMillis, cfg.Batch, cfg.Concurrency, res.Seconds, res.EventsPerSec, res.Drains, res.PeakRSSMiB))
	}
	if res.Drained != cfg.Events {
		return res, fmt.Errorf("backlog: drained %d of %d events within the %v invocation", res.Drained, cfg.Events, cfg.Deadline)
	}
	return res, nil
}

// loadBacklog empties the outbox and loads events pending rows over keys, analysed, and
// returns the seconds it took.
func loadBacklog(ctx context.Context, admin *pgxpool.Pool, events, keys int) (float64, error) {
	t0 := time.Now()
	if err := Reset(ctx, admin); err != nil {
		return 0, err
	}
	if err := LoadRows(ctx, admin, Load{Run: runID("b"), Pending: events, Keys: keys}); err != nil {
		return 0, err
	}
	if err := Analyze(ctx, admin); err != nil {
		return 0, err
	}
	if err := checkpoint(ctx, admin); err != nil {
		return 0, err
	}
	return round3(time.Since(t0).Seconds()), nil
}

// drainBacklog drains the loaded backlog as one relay Lambda invocation would with set's
// batch size and concurrency, in a child process: a pool of 2+concurrency connections, a
// budget of the deadline minus the reserve, the memory size as the runtime's memory limit.
// The local QStash, a round trip away, stays in this process.
func drainBacklog(ctx context.Context, url string, cfg BacklogConfig, set BacklogSetting, spawn Spawner) (ChildReport, error) {
	q := startSinkQStash(time.Duration(cfg.RTTMillis) * time.Millisecond)
	defer q.Close()
	rep, _, err := runChild(ctx, spawn, ChildConfig{DatabaseURL: url, QStashURL: q.URL, Token: q.Token, Destination: q.SinkURL,
		Batch: set.Batch, Concurrency: set.Concurrency, Deadline: cfg.Deadline - cfg.Reserve, MemoryLimitMiB: cfg.MemoryLimitMiB})
	return rep, err
}

func rssMiB(r ChildReport) float64 { return round3(float64(r.VmHWMKiB) / 1024) }

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// medianRun returns the run with the median rate, its Rounds holding every run's rate in
// round order and PeakRSSMiB the highest of them.
func medianRun(runs []BacklogRun) BacklogRun {
	m, rates := median(runs, func(r BacklogRun) float64 { return r.EventsPerSec })
	m.Rounds = rates
	for _, r := range runs {
		m.PeakRSSMiB = max(m.PeakRSSMiB, r.PeakRSSMiB)
	}
	return m
}

// median returns the run with the median rate (the lower middle of an even count) and
// every run's rate in round order.
func median[R any](runs []R, rate func(R) float64) (R, []float64) {
	sorted := slices.Clone(runs)
	slices.SortFunc(sorted, func(a, b R) int { return cmp.Compare(rate(a), rate(b)) })
	rates := make([]float64, len(runs))
	for i, r := range runs {
		rates[i] = rate(r)
	}
	return sorted[(len(sorted)-1)/2], rates
}
