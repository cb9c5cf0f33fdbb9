package bench

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/pkg/relay"
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
	// function keeps back from it (functions/relay's deadlineReserve).
	Deadline time.Duration `json:"deadline_ns"`
	Reserve  time.Duration `json:"reserve_ns"`
	// MemoryLimitMiB is the template's RelayMemorySize, applied as the Go runtime's soft
	// memory limit while the scenario runs.
	MemoryLimitMiB int64 `json:"memory_limit_mib"`
}

// BacklogConfigFor returns the backlog scenario's size.
func BacklogConfigFor(s Size) BacklogConfig {
	c := BacklogConfig{Keys: 10_000, RTTMillis: 30, Batch: relay.DefaultBatchSize, Concurrency: relay.DefaultPublishConcurrency,
		Deadline: 15 * time.Minute, Reserve: 2 * time.Second, MemoryLimitMiB: 256}
	switch s {
	case Full:
		c.Events = 1_000_000
	case Short:
		c.Events = 20_000
	default:
		c.Events, c.Keys, c.RTTMillis = 2_000, 100, 5
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
	// PeakHeapMiB is the bench process's peak heap in use, sampled every 250 ms: the relay
	// AND the in-process local QStash (which keeps every accepted message), so an upper
	// bound of the relay's own.
	PeakHeapMiB float64 `json:"peak_heap_mib"`
	LoadSeconds float64 `json:"load_seconds"`
	Path        string  `json:"path"`
}

// Backlog loads cfg.Events pending events and drains them as one relay Lambda invocation
// would: the template's batch size and concurrency, a pool of 2+concurrency connections,
// a context that ends at the 15-minute deadline minus the reserve, the memory size as the
// runtime's memory limit.
func Backlog(ctx context.Context, url string, cfg BacklogConfig, progress func(string)) (*BacklogResult, error) {
	res := &BacklogResult{Config: cfg, Events: cfg.Events, RTTMillis: cfg.RTTMillis,
		Path: "relay (publish mode) -> local QStash over HTTP a modelled round trip away; deliveries held back (publish path only)"}
	admin, err := openPool(ctx, url, 2)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	t0 := time.Now()
	if err := Reset(ctx, admin); err != nil {
		return res, err
	}
	if err := LoadRows(ctx, admin, Load{Run: runID("b"), Pending: cfg.Events, Keys: cfg.Keys}); err != nil {
		return res, err
	}
	if err := Analyze(ctx, admin); err != nil {
		return res, err
	}
	res.LoadSeconds = round3(time.Since(t0).Seconds())

	q := startSinkQStash(time.Duration(cfg.RTTMillis) * time.Millisecond)
	defer q.Close()
	pool, err := openPool(ctx, url, int32(2+cfg.Concurrency))
	if err != nil {
		return res, err
	}
	defer pool.Close()
	pub, err := newPublisher(q.URL, q.Token, q.SinkURL, false)
	if err != nil {
		return res, err
	}
	rc := relayConfig(cfg.Batch, false)
	rc.PublishConcurrency = cfg.Concurrency
	r, err := relay.New(pool, pub, rc)
	if err != nil {
		return res, err
	}

	old := debug.SetMemoryLimit(cfg.MemoryLimitMiB << 20)
	defer debug.SetMemoryLimit(old)
	peak, stopSampling := sampleHeap()
	start := time.Now()
	ictx, cancel := context.WithDeadline(ctx, start.Add(cfg.Deadline-cfg.Reserve))
	defer cancel()
	for ictx.Err() == nil {
		st, err := r.Drain(ictx)
		res.Drains++
		res.Drained += st.Dispatched
		res.PublishCalls += st.PublishCalls
		if err != nil {
			stopSampling()
			return res, err
		}
		left, err := pendingCount(ctx, admin)
		if err != nil {
			stopSampling()
			return res, err
		}
		if left == 0 || st.StoppedAtDeadline {
			break
		}
	}
	elapsed := time.Since(start)
	stopSampling()
	res.PeakHeapMiB = round3(float64(*peak) / (1 << 20))
	res.Seconds = round3(elapsed.Seconds())
	res.EventsPerSec = rate(res.Drained, elapsed)
	if progress != nil {
		progress(fmt.Sprintf("backlog %d events rtt=%dms batch=%d concurrency=%d: %.1fs (%.0f events/s), %d drains, peak heap %.1f MiB",
			cfg.Events, cfg.RTTMillis, cfg.Batch, cfg.Concurrency, res.Seconds, res.EventsPerSec, res.Drains, res.PeakHeapMiB))
	}
	if res.Drained != cfg.Events {
		return res, fmt.Errorf("backlog: drained %d of %d events within the %v invocation", res.Drained, cfg.Events, cfg.Deadline)
	}
	return res, nil
}

// sampleHeap records the peak HeapInuse every 250 ms until stop is called.
func sampleHeap() (peak *uint64, stop func()) {
	peak = new(uint64)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			*peak = max(*peak, ms.HeapInuse)
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	var once sync.Once
	return peak, func() { once.Do(func() { close(done); wg.Wait() }) }
}
