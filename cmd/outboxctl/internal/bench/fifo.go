package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// FIFOConfig sizes the hot-key scenario.
type FIFOConfig struct {
	Events int   `json:"events"`
	Keys   []int `json:"keys"`
	Batch  int   `json:"batch"`
	// Modes are the orderings run for every key count: fifo (waves, FIFO queues) and
	// publish (one call per batch, flow control).
	Modes []string `json:"modes"`
	// RTTMillis is the modelled round trip to QStash (the local server's Latency).
	RTTMillis int `json:"rtt_ms"`
	// Timeout bounds one case's wait for every delivery.
	Timeout time.Duration `json:"timeout_ns"`
}

// FIFOConfigFor returns the hot-key scenario's size.
func FIFOConfigFor(s Size) FIFOConfig {
	// In fifo mode a key gets one event per round trip (a key's events go one after the
	// other), so at 30 ms a single hot key drains about 33 events/s: the event counts keep
	// that case to a few minutes.
	modes := []string{ModeFIFO, ModePublish}
	switch s {
	case Full:
		return FIFOConfig{Events: 10_000, Keys: []int{1, 10, 100, 10_000}, Batch: 500, Modes: modes, RTTMillis: 30, Timeout: 15 * time.Minute}
	case Short:
		return FIFOConfig{Events: 1_000, Keys: []int{1, 10, 100, 10_000}, Batch: 500, Modes: modes, RTTMillis: 30, Timeout: 5 * time.Minute}
	default:
		return FIFOConfig{Events: 300, Keys: []int{1, 10, 300}, Batch: 100, Modes: modes, RTTMillis: 2, Timeout: time.Minute}
	}
}

// FIFORun is one key count.
type FIFORun struct {
	Mode         string  `json:"mode"`
	RTTMillis    int     `json:"rtt_ms"`
	Keys         int     `json:"keys"`
	Events       int     `json:"events"`
	Delivered    int     `json:"delivered"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	// OrderViolations counts deliveries whose outbox id is lower than one already delivered
	// for the same key (a later event overtook an earlier one). Must be 0 in fifo mode;
	// publish mode promises no order.
	OrderViolations int `json:"order_violations"`
	// Duplicates counts repeated deliveries of one event (allowed: at-least-once).
	Duplicates   int `json:"duplicates"`
	PublishCalls int `json:"publish_calls"`
	RelayBatches int `json:"relay_batches"`
	// RelaySeconds is when the relay had published (and marked) every event; Seconds is
	// when the last delivery arrived. Their difference is the delivery side's tail.
	RelaySeconds float64 `json:"relay_seconds"`
}

// FIFOResult is the hot-key scenario's output.
type FIFOResult struct {
	Config FIFOConfig `json:"config"`
	Path   string     `json:"path"`
	Runs   []FIFORun  `json:"runs"`
}

// FIFO drains cfg.Events over 1, 10 and 10,000 keys through the relay and the local QStash
// in fifo mode to an endpoint that records arrival order, and checks per-key order.
func FIFO(ctx context.Context, url string, cfg FIFOConfig, progress func(string)) (*FIFOResult, error) {
	pool, err := openPool(ctx, url, 4)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	res := &FIFOResult{Config: cfg, Path: "relay -> local QStash (FIFO queues in fifo mode, flow control in publish mode) over HTTP " +
		"a modelled round trip away -> recording endpoint (in order of arrival)"}
	for _, mode := range cfg.Modes {
		for _, keys := range cfg.Keys {
			if err := Reset(ctx, pool); err != nil {
				return res, err
			}
			if err := LoadRows(ctx, pool, Load{Run: runID("f"), Pending: cfg.Events, Keys: keys}); err != nil {
				return res, err
			}
			if err := Analyze(ctx, pool); err != nil {
				return res, err
			}
			rec := newOrderRecorder(cfg.Events)
			sink := httptest.NewServer(rec)
			q := startDelivering(time.Duration(cfg.RTTMillis) * time.Millisecond)
			run, err := func() (FIFORun, error) {
				defer sink.Close()
				defer q.Close()
				fifo := mode == ModeFIFO
				pub, err := newPublisher(q.URL, q.Token, sink.URL, fifo)
				if err != nil {
					return FIFORun{}, err
				}
				r, err := relay.New(pool, pub, relayConfig(cfg.Batch, fifo))
				if err != nil {
					return FIFORun{}, err
				}
				run := FIFORun{Mode: mode, RTTMillis: cfg.RTTMillis, Keys: keys, Events: cfg.Events}
				start := time.Now()
				for {
					st, err := r.Drain(ctx)
					run.PublishCalls += st.PublishCalls
					run.RelayBatches += st.Batches
					if err != nil {
						return run, err
					}
					left, err := pendingCount(ctx, pool)
					if err != nil {
						return run, err
					}
					if left == 0 {
						break
					}
				}
				run.RelaySeconds = round3(time.Since(start).Seconds())
				last, err := rec.wait(ctx, cfg.Events, cfg.Timeout)
				run.Delivered, run.OrderViolations, run.Duplicates = rec.counts()
				if err != nil {
					return run, err
				}
				elapsed := last.Sub(start)
				run.Seconds = round3(elapsed.Seconds())
				run.EventsPerSec = rate(cfg.Events, elapsed)
				return run, nil
			}()
			if err != nil {
				return res, fmt.Errorf("%s mode over %d keys: %w", mode, keys, err)
			}
			res.Runs = append(res.Runs, run)
			if progress != nil {
				progress(fmt.Sprintf("hot-key %-7s keys=%-6d rtt=%dms %7.0f events/s  relay done %.2fs, last delivery %.2fs  delivered %d  order violations %d  duplicates %d  publish calls %d",
					mode, keys, cfg.RTTMillis, run.EventsPerSec, run.RelaySeconds, run.Seconds, run.Delivered, run.OrderViolations, run.Duplicates, run.PublishCalls))
			}
		}
	}
	return res, nil
}

// Orderings of the hot-key scenario.
const (
	ModeFIFO    = "fifo"
	ModePublish = "publish"
)

// Find returns the run of mode over keys, or nil.
func (r *FIFOResult) Find(mode string, keys int) *FIFORun {
	if r == nil {
		return nil
	}
	return find(r.Runs, func(x *FIFORun) bool { return x.Mode == mode && x.Keys == keys })
}

// orderRecorder is the receiving endpoint: it answers 200 and records, per key, the outbox
// ids in order of arrival.
type orderRecorder struct {
	mu         sync.Mutex
	last       map[string]int64
	seen       map[int64]bool
	violations int
	duplicates int
	lastAt     time.Time
	done       chan struct{}
	want       int
}

func newOrderRecorder(want int) *orderRecorder {
	return &orderRecorder{last: map[string]int64{}, seen: make(map[int64]bool, want), done: make(chan struct{}), want: want}
}

func (o *orderRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "read body", http.StatusInternalServerError)
		return
	}
	id, err := strconv.ParseInt(r.Header.Get("X-Outbox-Id"), 10, 64)
	var p struct {
		Key string `json:"key"`
	}
	if err != nil || json.Unmarshal(body, &p) != nil || p.Key == "" {
		// Not retryable: a delivery without an id or key is a bug of the path under test.
		w.Header().Set("Upstash-NonRetryable-Error", "true")
		w.WriteHeader(489)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.seen[id]:
		o.duplicates++
	case id < o.last[p.Key]:
		o.violations++
		o.seen[id] = true
	default:
		o.seen[id] = true
		o.last[p.Key] = id
	}
	o.lastAt = time.Now()
	if len(o.seen) == o.want {
		close(o.done)
		o.want = -1
	}
	w.WriteHeader(http.StatusOK)
}

func (o *orderRecorder) counts() (delivered, violations, duplicates int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.seen), o.violations, o.duplicates
}

// wait returns the time of the last delivery once n distinct events arrived.
func (o *orderRecorder) wait(ctx context.Context, n int, timeout time.Duration) (time.Time, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-o.done:
	case <-t.C:
		d, _, _ := o.counts()
		return time.Time{}, fmt.Errorf("only %d of %d events delivered after %v", d, n, timeout)
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lastAt, nil
}
