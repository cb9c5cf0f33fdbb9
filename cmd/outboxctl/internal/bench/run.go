package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
)

// Scenario names, in the order Run runs them.
const (
	ScenarioDrain    = "drain"
	ScenarioClaim    = "claim"
	ScenarioFIFO     = "fifo"
	ScenarioE2E      = "e2e"
	ScenarioProducer = "producer"
	ScenarioConsumer = "consumer"
	ScenarioMemory   = "memory"
	ScenarioBacklog  = "backlog"
	ScenarioPinned   = "pinned"
	ScenarioDeployed = "deployed"
	ScenarioOutage   = "outage"
)

// Scenarios lists every scenario.
var Scenarios = []string{ScenarioDrain, ScenarioClaim, ScenarioFIFO, ScenarioE2E, ScenarioProducer, ScenarioConsumer, ScenarioMemory, ScenarioBacklog, ScenarioPinned, ScenarioDeployed, ScenarioOutage}

// ParseScenarios splits a comma-separated list and checks every name.
func ParseScenarios(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return slices.Clone(Scenarios), nil
	}
	var out []string
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(Scenarios, name) {
			return nil, fmt.Errorf("unknown scenario %q: want some of %s", name, strings.Join(Scenarios, ","))
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out, nil
}

// Options configures Run.
type Options struct {
	Size      Size
	Scenarios []string
	// Spawn starts the relay child of the memory and backlog scenarios (required for them).
	Spawn Spawner
	// Progress receives one line per measurement (nil: silent).
	Progress func(string)
	// Cluster describes the server for the report (empty: DATABASE_URL's).
	Cluster string
	// PinnedHold, when set, replaces the pinned scenario's hold (PinnedLongHold: the
	// opt-in two-hour pin).
	PinnedHold time.Duration
}

// Run runs the chosen scenarios, each in its own bench_<random> schema on baseURL's server
// (created, migrated, dropped), and summarises. A failing scenario is recorded in
// Results.Errors and the others still run; the error returned is the first failure.
func Run(ctx context.Context, baseURL string, opts Options) (*Results, error) {
	res := &Results{Size: opts.Size, Started: time.Now()}
	m, err := DescribeMachine(ctx, baseURL)
	if err != nil {
		return nil, err
	}
	res.Machine = m
	res.Machine.Cluster = opts.Cluster
	var first error
	for _, name := range Scenarios {
		if !slices.Contains(opts.Scenarios, name) {
			continue
		}
		if err := runScenario(ctx, baseURL, name, opts, res); err != nil {
			if res.Errors == nil {
				res.Errors = map[string]string{}
			}
			res.Errors[name] = err.Error()
			if first == nil {
				first = fmt.Errorf("scenario %s: %w", name, err)
			}
			if ctx.Err() != nil {
				break
			}
		}
	}
	res.Machine.LoadEnd = LoadAvg()
	res.Seconds = round3(time.Since(res.Started).Seconds())
	res.Summarise()
	return res, first
}

func runScenario(ctx context.Context, baseURL, name string, opts Options, res *Results) (err error) {
	if opts.Spawn == nil && (name == ScenarioMemory || name == ScenarioBacklog) {
		return fmt.Errorf("%s scenario needs Options.Spawn", name)
	}
	// Each scenario starts on a settled server: what the one before it wrote (a million-row
	// backlog, then its schema dropped) is flushed here, not by a checkpoint in this one's
	// first minute. Measured: the pinned scenario right after the backlog's had p99 54 and
	// 110 ms in its clean minute against 23-57 ms with the snapshot held after it. The
	// scenario's own checkpoints still fall inside it.
	if err := settle(ctx, baseURL); err != nil && opts.Progress != nil {
		opts.Progress("no checkpoint before the scenario (" + err.Error() + "): it may pay for the last one's writes")
	}
	s, err := postgres.CreateSchema(ctx, baseURL, "bench", true, nil)
	if err != nil {
		return err
	}
	defer func() {
		if derr := s.Drop(context.WithoutCancel(ctx)); derr != nil && err == nil {
			err = derr
		}
	}()
	if opts.Progress != nil {
		opts.Progress(fmt.Sprintf("== %s (schema %s)", name, s.Name))
	}
	switch name {
	case ScenarioDrain:
		res.Drain, err = Drain(ctx, s.URL, DrainConfigFor(opts.Size), opts.Progress)
	case ScenarioClaim:
		res.Claim, err = Claim(ctx, s.URL, ClaimConfigFor(opts.Size), opts.Progress)
	case ScenarioFIFO:
		res.FIFO, err = FIFO(ctx, s.URL, FIFOConfigFor(opts.Size), opts.Progress)
	case ScenarioE2E:
		res.E2E, err = E2E(ctx, s.URL, E2EConfigFor(opts.Size), opts.Progress)
	case ScenarioProducer:
		res.Producer, err = Producer(ctx, s.URL, ProducerConfigFor(opts.Size), opts.Progress)
	case ScenarioConsumer:
		res.Consumer, err = Consumer(ctx, s.URL, ConsumerConfigFor(opts.Size), opts.Progress)
	case ScenarioMemory:
		res.Memory, err = Memory(ctx, s.URL, MemoryConfigFor(opts.Size), opts.Spawn, opts.Progress)
	case ScenarioBacklog:
		res.Backlog, err = Backlog(ctx, s.URL, BacklogConfigFor(opts.Size), opts.Spawn, opts.Progress)
	case ScenarioPinned:
		cfg := PinnedConfigFor(opts.Size)
		if opts.PinnedHold > 0 {
			cfg.Hold = opts.PinnedHold
		}
		res.Pinned, err = Pinned(ctx, s.URL, cfg, opts.Progress)
	case ScenarioDeployed:
		res.Deployed, err = Deployed(ctx, s.URL, DeployedConfigFor(opts.Size), opts.Progress)
	case ScenarioOutage:
		res.Outage, err = Outage(ctx, s.URL, OutageConfigFor(opts.Size), opts.Progress)
	}
	return err
}

// settle runs checkpoint on baseURL's server.
func settle(ctx context.Context, baseURL string) error {
	pool, err := openPool(ctx, baseURL, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	return checkpoint(ctx, pool)
}

// RelayDrain runs the drain scenario's relay once, in a schema of its own on baseURL's
// server (created, migrated, dropped): events pending over keys, loaded and analysed, then
// drained by one relay at batch with the default PUBLISH_CONCURRENCY through a local QStash
// rttMillis away. It is the run that other queues are compared with, one drain at a time
// (`make bench-river` alternates it with River).
func RelayDrain(ctx context.Context, baseURL string, events, keys, batch, rttMillis int) (run DrainRun, err error) {
	if events <= 0 || keys <= 0 || batch <= 0 || rttMillis < 0 {
		return run, fmt.Errorf("relay drain: events %d, keys %d and batch %d must be positive and the round trip %d ms not negative", events, keys, batch, rttMillis)
	}
	s, err := postgres.CreateSchema(ctx, baseURL, "bench", true, nil)
	if err != nil {
		return run, err
	}
	defer func() {
		if derr := s.Drop(context.WithoutCancel(ctx)); derr != nil && err == nil {
			err = derr
		}
	}()
	admin, err := openPool(ctx, s.URL, 4)
	if err != nil {
		return run, err
	}
	defer admin.Close()
	return drainOnce(ctx, admin, s.URL, WayRelay, batch, 1, rttMillis, events, keys, relayMaker(batch))
}
