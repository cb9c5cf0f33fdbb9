package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os/exec"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// MemoryConfig sizes the memory scenario.
type MemoryConfig struct {
	Events int `json:"events"`
	Keys   int `json:"keys"`
	Batch  int `json:"batch"`
}

// MemoryConfigFor returns the memory scenario's size.
func MemoryConfigFor(s Size) MemoryConfig {
	switch s {
	case Full:
		return MemoryConfig{Events: 200_000, Keys: 1000, Batch: 1000}
	case Short:
		return MemoryConfig{Events: 50_000, Keys: 1000, Batch: 1000}
	default:
		return MemoryConfig{Events: 3_000, Keys: 100, Batch: 1000}
	}
}

// ChildConfig is what the parent sends the drain child on its stdin (JSON), so no
// credential appears on a command line.
type ChildConfig struct {
	DatabaseURL string `json:"database_url"`
	QStashURL   string `json:"qstash_url"`
	Token       string `json:"token"`
	Destination string `json:"destination"`
	Batch       int    `json:"batch"`
	// Concurrency is PUBLISH_CONCURRENCY (0: the default); the pool has two connections
	// more, as the Lambda's.
	Concurrency int `json:"concurrency,omitempty"`
	// Deadline, when set, makes the child one relay Lambda invocation of that budget: it
	// drains again after a drain that ended with rows still pending (a short batch at a
	// concurrent tail), until none is or the budget is spent. Zero: one Drain.
	Deadline time.Duration `json:"deadline_ns,omitempty"`
	// MemoryLimitMiB, when set, is the runtime's soft memory limit: the Lambda's memory
	// size, applied to the relay alone (the local QStash stays in the parent).
	MemoryLimitMiB int64 `json:"memory_limit_mib,omitempty"`
}

// ChildReport is what the drain child prints on its stdout (JSON).
type ChildReport struct {
	Dispatched   int     `json:"dispatched"`
	PublishCalls int     `json:"publish_calls"`
	Drains       int     `json:"drains"`
	Seconds      float64 `json:"seconds"`
	// VmHWMKiB is the child's own high-water mark from /proc/self/status at the end.
	VmHWMKiB int64 `json:"vm_hwm_kib"`
}

// Spawner returns a command that runs RunDrainChild in a fresh process (outboxctl bench
// drain-child; in tests, the test binary re-executed).
type Spawner func(ctx context.Context) *exec.Cmd

// RunDrainChild is the child side: read a ChildConfig from in, drain the outbox with one
// relay.Relay through the QStash publisher, write a ChildReport to out.
func RunDrainChild(ctx context.Context, in io.Reader, out io.Writer) error {
	var cfg ChildConfig
	if err := json.NewDecoder(in).Decode(&cfg); err != nil {
		return fmt.Errorf("read drain child config: %w", err)
	}
	if cfg.MemoryLimitMiB > 0 {
		debug.SetMemoryLimit(cfg.MemoryLimitMiB << 20)
	}
	rc := relayConfig(cfg.Batch, false)
	rc.PublishConcurrency = cfg.Concurrency
	pool, err := openPool(ctx, cfg.DatabaseURL, int32(2+cmp.Or(cfg.Concurrency, relay.DefaultPublishConcurrency)))
	if err != nil {
		return err
	}
	defer pool.Close()
	pub, err := newPublisher(cfg.QStashURL, cfg.Token, cfg.Destination, false)
	if err != nil {
		return err
	}
	r, err := relay.New(pool, pub, rc)
	if err != nil {
		return err
	}
	start := time.Now()
	dctx := ctx
	if cfg.Deadline > 0 {
		var cancel context.CancelFunc
		dctx, cancel = context.WithDeadline(ctx, start.Add(cfg.Deadline))
		defer cancel()
	}
	var rep ChildReport
	for {
		st, err := r.Drain(dctx)
		rep.Drains++
		rep.Dispatched += st.Dispatched
		rep.PublishCalls += st.PublishCalls
		if err != nil {
			return fmt.Errorf("drain: %w", err)
		}
		if cfg.Deadline == 0 || st.StoppedAtDeadline || dctx.Err() != nil {
			break
		}
		left, err := pendingCount(ctx, pool)
		if err != nil {
			return err
		}
		if left == 0 {
			break
		}
	}
	rep.Seconds = round3(time.Since(start).Seconds())
	rep.VmHWMKiB = vmHWM()
	return json.NewEncoder(out).Encode(rep)
}

// runChild runs the drain child with cfg and returns its report and resource usage.
func runChild(ctx context.Context, spawn Spawner, cfg ChildConfig) (ChildReport, *syscall.Rusage, error) {
	var rep ChildReport
	in, err := json.Marshal(cfg)
	if err != nil {
		return rep, nil, err
	}
	cmd := spawn(ctx)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return rep, nil, fmt.Errorf("run drain child: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	if err := json.Unmarshal(lastLine(stdout.Bytes()), &rep); err != nil {
		return rep, nil, fmt.Errorf("read drain child report %q: %w", stdout.String(), err)
	}
	if rep.VmHWMKiB == 0 {
		return rep, nil, errors.New("drain child reported no VmHWM (is /proc mounted?)")
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return rep, nil, errors.New("drain child: no rusage on this platform")
	}
	return rep, ru, nil
}

func vmHWM() int64 {
	v := procField("/proc/self/status", "VmHWM")
	var kib int64
	_, _ = fmt.Sscanf(v, "%d kB", &kib)
	return kib
}

// MemoryResult is the memory and cost scenario's output.
type MemoryResult struct {
	Events int `json:"events"`
	Batch  int `json:"batch"`
	// PeakRSSMiB is the child's own high-water mark, VmHWM of /proc/self/status at the end
	// of the drain: the relay's peak RSS.
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// RusageMaxRSSMiB is wait4's ru_maxrss for the child. It is an upper bound only: Go
	// starts children with vfork semantics (CLONE_VM), so until exec the child shares the
	// parent's address space and Linux carries that high-water mark over the exec.
	RusageMaxRSSMiB float64 `json:"rusage_max_rss_mib"`
	EventsPerSec    float64 `json:"events_per_sec"`
	// CPUSeconds is the child's user+system CPU time.
	CPUSeconds   float64 `json:"cpu_seconds"`
	PublishCalls int     `json:"publish_calls"`
	// LambdaGBsPerMillion: GB-seconds billed per million events at the measured drain rate,
	// by memory size in MB (duration x memory/1024).
	LambdaGBsPerMillion map[int]float64 `json:"lambda_gb_s_per_million"`
	// LambdaCPUBoundGBsPerMillion: the same if the relay's own CPU time were the limit
	// (Lambda gives 1 vCPU at 1,769 MB, proportionally less below), the larger of the two
	// being what a real Lambda would be billed.
	LambdaCPUBoundGBsPerMillion map[int]float64 `json:"lambda_cpu_bound_gb_s_per_million"`
	// QStashRequestsPerMillion is HTTP requests to QStash per million events (the relay
	// batches); QStash bills per message, so billed messages per million stay 1,000,000
	// plus deliveries' retries.
	QStashRequestsPerMillion         float64 `json:"qstash_requests_per_million"`
	BaselineQStashRequestsPerMillion float64 `json:"baseline_qstash_requests_per_million"`
	Note                             string  `json:"note"`
}

// lambdaVCPUMB is the memory size at which Lambda allocates one vCPU (AWS docs).
const lambdaVCPUMB = 1769

// Memory drains cfg.Events in a child process started by spawn and reads its peak RSS.
func Memory(ctx context.Context, url string, cfg MemoryConfig, spawn Spawner, progress func(string)) (*MemoryResult, error) {
	pool, err := openPool(ctx, url, 2)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := Reset(ctx, pool); err != nil {
		return nil, err
	}
	if err := LoadRows(ctx, pool, Load{Run: runID("m"), Pending: cfg.Events, Keys: cfg.Keys}); err != nil {
		return nil, err
	}
	if err := Analyze(ctx, pool); err != nil {
		return nil, err
	}
	// The local QStash and its sink run in this process, not the child's, so the child's
	// memory is the relay's alone.
	q := startSinkQStash(0)
	defer q.Close()

	rep, ru, err := runChild(ctx, spawn, ChildConfig{DatabaseURL: url, QStashURL: q.URL, Token: q.Token, Destination: q.SinkURL, Batch: cfg.Batch})
	if err != nil {
		return nil, err
	}
	if rep.Dispatched != cfg.Events {
		return nil, fmt.Errorf("drain child dispatched %d of %d events", rep.Dispatched, cfg.Events)
	}
	res := &MemoryResult{
		Events: cfg.Events, Batch: cfg.Batch,
		PeakRSSMiB:                  round3(float64(rep.VmHWMKiB) / 1024),
		RusageMaxRSSMiB:             round3(float64(ru.Maxrss) / 1024), // Linux reports KiB
		EventsPerSec:                rate(rep.Dispatched, secs(rep.Seconds)),
		CPUSeconds:                  round3(time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()),
		PublishCalls:                rep.PublishCalls,
		LambdaGBsPerMillion:         map[int]float64{},
		LambdaCPUBoundGBsPerMillion: map[int]float64{},
	}
	perMillion := 1e6 / float64(cfg.Events)
	wallPerMillion := rep.Seconds * perMillion
	cpuPerMillion := res.CPUSeconds * perMillion
	for _, mb := range []int{128, 512} {
		gb := float64(mb) / 1024
		res.LambdaGBsPerMillion[mb] = round1(wallPerMillion * gb)
		vcpu := math.Min(1, float64(mb)/lambdaVCPUMB)
		res.LambdaCPUBoundGBsPerMillion[mb] = round1(math.Max(wallPerMillion, cpuPerMillion/vcpu) * gb)
	}
	res.QStashRequestsPerMillion = math.Round(float64(rep.PublishCalls) * perMillion)
	res.BaselineQStashRequestsPerMillion = 1e6
	res.Note = fmt.Sprintf("Wall-clock GB-s assume the drain runs as fast as here (%.0f events/s); on Lambda a 128 MB function gets %.3f vCPU, "+
		"so with this child's %.2f CPU-seconds per %d events the CPU-bound figures are %.1f GB-s (128 MB) and %.1f GB-s (512 MB) per million. "+
		"QStash requests: %.0f per million events with batches of %d (the article's one publish per event: 1,000,000); QStash bills per message either way.",
		res.EventsPerSec, math.Min(1, 128.0/lambdaVCPUMB), res.CPUSeconds, cfg.Events,
		res.LambdaCPUBoundGBsPerMillion[128], res.LambdaCPUBoundGBsPerMillion[512], res.QStashRequestsPerMillion, cfg.Batch)
	if progress != nil {
		progress(fmt.Sprintf("memory peak RSS (VmHWM) %.1f MiB (rusage maxrss %.1f MiB), %.0f events/s, %.2f CPU s, %d publish calls",
			res.PeakRSSMiB, res.RusageMaxRSSMiB, res.EventsPerSec, res.CPUSeconds, res.PublishCalls))
	}
	return res, nil
}

func round1(f float64) float64 { return math.Round(f*10) / 10 }

func lastLine(b []byte) []byte {
	b = bytes.TrimSpace(b)
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		return b[i+1:]
	}
	return b
}
