package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/lambdasvc"
	"github.com/outbox-relay/outbox-relay/v3/internal/localstack"
	"github.com/outbox-relay/outbox-relay/v3/internal/rie"
	"github.com/outbox-relay/outbox-relay/v3/pkg/kick"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// DeployedProfile is one relay schedule of the deployed scenario.
type DeployedProfile struct {
	Name string `json:"name"`
	// Schedule is the backstop tick's period (the template's RelaySchedule).
	Schedule time.Duration `json:"schedule_ns"`
}

// DeployedConfig sizes the deployed scenario.
type DeployedConfig struct {
	Profiles []DeployedProfile `json:"profiles"`
	// Rates are commits per second, spread over Producers producer processes (a Kicker
	// each, reading the relay's promises), each run for Run, then Idle with the schedule
	// running and the relay's database sessions sampled.
	Rates     []int         `json:"rates"`
	Producers int           `json:"producers"`
	Run       time.Duration `json:"run_ns"`
	Idle      time.Duration `json:"idle_ns"`
	// The producers' commit rate with kicks on and off: CommitClients clients, one event per
	// transaction, CommitRounds rounds of CommitRound in turns.
	CommitClients int           `json:"commit_clients"`
	CommitRound   time.Duration `json:"commit_round_ns"`
	CommitRounds  int           `json:"commit_rounds"`
}

var (
	profileDefaults    = DeployedProfile{Name: "defaults (rate(1 minute))", Schedule: time.Minute}
	profileScaleToZero = DeployedProfile{Name: "scale to zero (rate(15 minutes))", Schedule: 15 * time.Minute}
)

// DeployedConfigFor returns the deployed scenario's size.
func DeployedConfigFor(s Size) DeployedConfig {
	switch s {
	case Full:
		return DeployedConfig{Profiles: []DeployedProfile{profileDefaults, profileScaleToZero}, Rates: []int{1, 20, 200}, Producers: 4,
			Run: 20 * time.Second, Idle: time.Minute, CommitClients: 64, CommitRound: 10 * time.Second, CommitRounds: 4}
	case Short:
		return DeployedConfig{Profiles: []DeployedProfile{profileDefaults}, Rates: []int{1, 20, 200}, Producers: 4,
			Run: 5 * time.Second, Idle: 10 * time.Second, CommitClients: 64, CommitRound: 3 * time.Second, CommitRounds: 2}
	default:
		return DeployedConfig{Profiles: []DeployedProfile{profileDefaults}, Rates: []int{20}, Producers: 2,
			Run: 2 * time.Second, Idle: 2 * time.Second, CommitClients: 8, CommitRound: time.Second, CommitRounds: 2}
	}
}

// DeployedRun is one profile at one rate.
type DeployedRun struct {
	Profile string  `json:"profile"`
	Rate    int     `json:"commits_per_sec"`
	Events  int     `json:"events"`
	Latency Latency `json:"commit_to_dispatched"`
	// Invocations of the relay that started while the producers committed and until the
	// last invocation ended: Drained claimed events, FoundNothing opened sessions and
	// claimed none, Coalesced were kicks answered without a session, Failed returned an
	// error.
	Invocations  int `json:"invocations"`
	Drained      int `json:"drained"`
	FoundNothing int `json:"found_nothing"`
	Coalesced    int `json:"coalesced"`
	Failed       int `json:"failed"`
	// ClaimedNothingShare is (FoundNothing + Coalesced) / Invocations.
	ClaimedNothingShare float64 `json:"claimed_nothing_share"`
	// IdleInvocations started in the idle span (the schedule's ticks, kicks Lambda still
	// retried), IdleClaimedNothing of them claimed nothing.
	IdleInvocations    int `json:"idle_invocations"`
	IdleClaimedNothing int `json:"idle_claimed_nothing"`
	// Kicks the producers' kickers sent, and the reads of a promise that spared one.
	KicksSent     int64 `json:"kicks_sent"`
	KicksPromised int64 `json:"kicks_promised"`
	// Environments is the emulators started (cold starts); ColdStartMs the first event's
	// commit -> dispatched, in a new environment.
	Environments int     `json:"environments"`
	ColdStartMs  float64 `json:"cold_start_ms"`
	// IdleSessionSeconds is the relay's database sessions summed over the idle span
	// (sampled every 20 ms), per minute of it.
	IdleSessionSecondsPerMinute float64 `json:"idle_session_seconds_per_minute"`
}

// DeployedResult is the deployed scenario's outcome.
type DeployedResult struct {
	Config DeployedConfig `json:"config"`
	Path   string         `json:"path"`
	Runs   []DeployedRun  `json:"runs"`
	// Producers' commits/s with kicks on and off, every round and the best of each.
	CommitsOnBest   float64   `json:"commits_kicks_on"`
	CommitsOffBest  float64   `json:"commits_kicks_off"`
	CommitRatio     float64   `json:"commit_ratio"`
	CommitRoundsOn  []float64 `json:"commit_rounds_on"`
	CommitRoundsOff []float64 `json:"commit_rounds_off"`
}

// Run returns the run of profile at rate, or nil.
func (r *DeployedResult) Run(profile string, rate int) *DeployedRun {
	for i := range r.Runs {
		if r.Runs[i].Profile == profile && r.Runs[i].Rate == rate {
			return &r.Runs[i]
		}
	}
	return nil
}

// Deployed measures what `sam deploy` gives: the built relay bootstrap under aws-lambda-rie
// behind the local Lambda Invoke API (reserved concurrency 2 and a 50-s timeout as the
// template's defaults, IDLE_GAP and the rest at their defaults), kicked by producers
// through package kick after each commit and ticked by the profile's schedule, publishing
// to the local QStash, which delivers to the webhook. Needs aws-lambda-rie (make
// rie-install) and the module's source (it builds functions/relay).
func Deployed(ctx context.Context, url string, cfg DeployedConfig, progress func(string)) (*DeployedResult, error) {
	if _, err := rie.Path(); err != nil {
		return nil, fmt.Errorf("deployed scenario: %w (make rie-install)", err)
	}
	dir, err := os.MkdirTemp("", "outbox-bench-relay-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin, err := rie.Build(ctx, "./functions/relay", dir)
	if err != nil {
		return nil, err
	}
	pool, pl, _, err := startCommitPipeline(ctx, url)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	defer pl.Close()
	res := &DeployedResult{Config: cfg, Path: "producers (outbox.BeginFunc, a kick.Kicker each with DB) -> relay bootstrap under aws-lambda-rie behind the local Invoke API (reserved concurrency 2) -> local QStash -> webhook"}
	d := deployedBench{url: url, app: runID("bench-deployed-relay-"), bin: bin, pool: pool, pl: pl, cfg: cfg}
	for _, prof := range cfg.Profiles {
		for _, rate := range cfg.Rates {
			run, err := d.measure(ctx, prof, rate)
			if err != nil {
				return res, fmt.Errorf("%s at %d/s: %w", prof.Name, rate, err)
			}
			res.Runs = append(res.Runs, run)
			if progress != nil {
				progress(fmt.Sprintf("deployed %s at %d/s: commit -> dispatched p50 %.1f p99 %.1f max %.1f ms; %d invocations (%d drained, %d found nothing, %d coalesced); kicks sent %d, spared by a promise %d; idle: %d invocations (%d claimed nothing), %.2f session-s/min",
					prof.Name, rate, run.Latency.P50, run.Latency.P99, run.Latency.Max, run.Invocations, run.Drained, run.FoundNothing, run.Coalesced, run.KicksSent, run.KicksPromised,
					run.IdleInvocations, run.IdleClaimedNothing, run.IdleSessionSecondsPerMinute))
			}
		}
	}
	if err := d.commitRates(ctx, res); err != nil {
		return res, err
	}
	if progress != nil {
		progress(fmt.Sprintf("deployed producer commits/s, %d clients: kicks on %.0f, off %.0f (%.2f)", cfg.CommitClients, res.CommitsOnBest, res.CommitsOffBest, res.CommitRatio))
	}
	return res, nil
}

// deployedBench is one deployed scenario's shared parts.
type deployedBench struct {
	url string
	// app is the relay's application_name, by which its sessions are counted.
	app  string
	bin  string
	pool *pgxpool.Pool
	pl   *localstack.Pipeline
	cfg  DeployedConfig
}

// deployment is the relay function served for one run, with its invocations' outcomes.
type deployment struct {
	svc     *lambdasvc.Service
	mu      sync.Mutex
	results []lambdasvc.Result
}

func (d *deployedBench) deploy() (*deployment, error) {
	dep := &deployment{}
	dbURL, err := withApplicationName(d.url, d.app)
	if err != nil {
		return nil, err
	}
	svc, err := lambdasvc.Start(lambdasvc.FunctionConfig{
		Name: "relay", Bootstrap: d.bin, Timeout: 50 * time.Second, ReservedConcurrency: 2, Log: io.Discard,
		Env: map[string]string{
			"DATABASE_URL": dbURL, "QSTASH_URL": d.pl.QStashURL, "QSTASH_TOKEN": d.pl.Token,
			"PUBLIC_BASE_URL": d.pl.BaseURL, "FAILURE_CALLBACK_URL": d.pl.FailureURL, "LOG_LEVEL": "warn",
		},
		OnResult: func(r lambdasvc.Result) { dep.mu.Lock(); dep.results = append(dep.results, r); dep.mu.Unlock() },
	})
	if err != nil {
		return nil, err
	}
	dep.svc = svc
	return dep, nil
}

// kicker is one producer process's Kicker on the deployment, reading promises on the pool.
func (d *deployedBench) kicker(ctx context.Context, dep *deployment) (*kick.Kicker, error) {
	return kick.New(ctx, kick.Config{Function: "relay", DB: d.pool, Client: lambdasvc.Client(dep.svc.URL), Logger: discardLogger()})
}

func (d *deployedBench) measure(ctx context.Context, prof DeployedProfile, rate int) (DeployedRun, error) {
	run := DeployedRun{Profile: prof.Name, Rate: rate}
	if err := Reset(ctx, d.pool); err != nil {
		return run, err
	}
	dep, err := d.deploy()
	if err != nil {
		return run, err
	}
	defer dep.svc.Close()
	stopTicks, err := dep.svc.Schedule("relay", prof.Schedule, []byte(`{"task":"drain"}`))
	if err != nil {
		return run, err
	}
	defer stopTicks()
	kickers := make([]*kick.Kicker, d.cfg.Producers)
	for i := range kickers {
		if kickers[i], err = d.kicker(ctx, dep); err != nil {
			return run, err
		}
	}
	n, err := d.produce(ctx, kickers, rate)
	if err != nil {
		return run, err
	}
	for _, k := range kickers {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_ = k.Close(cctx)
		cancel()
		st := k.Stats()
		run.KicksSent += st.Sent
		run.KicksPromised += st.Promised
	}
	if err := waitFor(ctx, 2*time.Minute, func() (bool, error) { return d.count(ctx, qDispatchedCount, n) }); err != nil {
		return run, fmt.Errorf("wait for %d events dispatched: %w", n, err)
	}
	lats, err := d.latencies(ctx)
	if err != nil {
		return run, err
	}
	run.Events, run.Latency = len(lats), summarise(lats)
	if len(lats) > 0 {
		run.ColdStartMs = round3(float64(lats[0]) / float64(time.Millisecond))
	}
	// Idle: the last invocation ends, then the relay's sessions are summed over the idle
	// span, in which the schedule ticks on and throttled kicks still queued are retried.
	if err := waitFor(ctx, 30*time.Second, func() (bool, error) { return d.count(ctx, qAppSessions, 0, d.app) }); err != nil {
		return run, fmt.Errorf("wait for the relay's sessions to close: %w", err)
	}
	idleStart := time.Now()
	secs, err := d.sessionSeconds(ctx, d.cfg.Idle)
	if err != nil {
		return run, err
	}
	run.IdleSessionSecondsPerMinute = round3(secs / d.cfg.Idle.Minutes())
	dep.mu.Lock()
	results := slices.Clone(dep.results)
	dep.mu.Unlock()
	run.tally(results, idleStart)
	run.Environments = int(dep.svc.Stats("relay").Environments)
	return run, nil
}

// tally classifies the relay's invocations by their result; those that started from
// idleStart on are the idle span's.
func (run *DeployedRun) tally(results []lambdasvc.Result, idleStart time.Time) {
	for _, r := range results {
		var body struct {
			Claimed   int  `json:"claimed"`
			Coalesced bool `json:"coalesced"`
		}
		if !r.Start.Before(idleStart) {
			run.IdleInvocations++
			if r.Err == nil && json.Unmarshal(r.Body, &body) == nil && body.Claimed == 0 {
				run.IdleClaimedNothing++
			}
			continue
		}
		run.Invocations++
		switch {
		case r.Err != nil || json.Unmarshal(r.Body, &body) != nil:
			run.Failed++
		case body.Coalesced:
			run.Coalesced++
		case body.Claimed == 0:
			run.FoundNothing++
		default:
			run.Drained++
		}
	}
	run.ClaimedNothingShare = ratio(float64(run.FoundNothing+run.Coalesced), float64(run.Invocations))
}

// produce commits rate events a second for the run, spread over the kickers' producers
// (each started a fraction of a period after the one before, as independent processes),
// each event in a transaction of its own followed by its producer's kick.
func (d *deployedBench) produce(ctx context.Context, kickers []*kick.Kicker, rate int) (int, error) {
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(kickers))
	period := time.Duration(len(kickers)) * time.Second / time.Duration(rate)
	end := time.Now().Add(d.cfg.Run)
	for i, k := range kickers {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * period / time.Duration(len(kickers)))
			tick := time.NewTicker(period)
			defer tick.Stop()
			for time.Now().Before(end) {
				if err := commitOne(ctx, d.pool, k); err != nil {
					errs <- err
					return
				}
				n.Add(1)
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return int(n.Load()), <-errs
}

// commitOne commits one event in a transaction of its own, then kicks w (nil: no kick).
func commitOne(ctx context.Context, pool *pgxpool.Pool, w outbox.Waker) error {
	return outbox.BeginFunc(ctx, pool, w, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: "bench.deployed", PartitionKey: "k", Payload: []byte(`{}`)})
		return err
	})
}

// commitRates compares the producers' commits/s with kicks on and off, in turns. With
// kicks off the relay is ticked every second, so it drains in both arms (on two cores it
// competes with the producers) and the ratio is the kick's own cost.
func (d *deployedBench) commitRates(ctx context.Context, res *DeployedResult) error {
	if err := Reset(ctx, d.pool); err != nil {
		return err
	}
	dep, err := d.deploy()
	if err != nil {
		return err
	}
	defer dep.svc.Close()
	kickers := make([]*kick.Kicker, d.cfg.Producers)
	for i := range kickers {
		if kickers[i], err = d.kicker(ctx, dep); err != nil {
			return err
		}
	}
	defer func() {
		for _, k := range kickers {
			_ = k.Close(context.WithoutCancel(ctx))
		}
	}()
	for round := range d.cfg.CommitRounds {
		on := round%2 == 0
		stopTicks := func() {}
		if !on {
			if stopTicks, err = dep.svc.Schedule("relay", time.Second, []byte(`{"task":"drain"}`)); err != nil {
				return err
			}
		}
		var n atomic.Int64
		var wg sync.WaitGroup
		var failed atomic.Pointer[error]
		end := time.Now().Add(d.cfg.CommitRound)
		for c := range d.cfg.CommitClients {
			wg.Go(func() {
				var w outbox.Waker
				if on {
					w = kickers[c%len(kickers)]
				}
				for time.Now().Before(end) && ctx.Err() == nil {
					if err := commitOne(ctx, d.pool, w); err != nil {
						failed.CompareAndSwap(nil, &err)
						return
					}
					n.Add(1)
				}
			})
		}
		wg.Wait()
		stopTicks()
		if err := failed.Load(); err != nil {
			return *err
		}
		rate := round3(float64(n.Load()) / d.cfg.CommitRound.Seconds())
		if on {
			res.CommitRoundsOn = append(res.CommitRoundsOn, rate)
		} else {
			res.CommitRoundsOff = append(res.CommitRoundsOff, rate)
		}
		// What a round left is drained before the next: a kick, until every event is out.
		k := kickers[0]
		if err := waitFor(ctx, 5*time.Minute, func() (bool, error) {
			k.Kick()
			return d.count(ctx, qPendingCount, 0)
		}); err != nil {
			return fmt.Errorf("drain the round's events: %w", err)
		}
	}
	if len(res.CommitRoundsOn) > 0 && len(res.CommitRoundsOff) > 0 {
		res.CommitsOnBest, res.CommitsOffBest = slices.Max(res.CommitRoundsOn), slices.Max(res.CommitRoundsOff)
		res.CommitRatio = ratio(res.CommitsOnBest, res.CommitsOffBest)
	}
	return nil
}

// count reports whether the single count query returns want.
func (d *deployedBench) count(ctx context.Context, query string, want int, args ...any) (bool, error) {
	var n int
	if err := d.pool.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		return false, err
	}
	return n == want, nil
}

// latencies returns every event's created_at -> dispatched_at, in id order.
func (d *deployedBench) latencies(ctx context.Context) ([]time.Duration, error) {
	rows, err := d.pool.Query(ctx, `SELECT extract(epoch FROM dispatched_at - created_at) FROM outbox ORDER BY id`)
	if err != nil {
		return nil, err
	}
	secs, err := pgx.CollectRows(rows, pgx.RowTo[float64])
	if err != nil {
		return nil, err
	}
	out := make([]time.Duration, len(secs))
	for i, s := range secs {
		out[i] = time.Duration(s * float64(time.Second))
	}
	return out, nil
}

// sessionSeconds samples the relay's sessions every 20 ms for span and sums them.
func (d *deployedBench) sessionSeconds(ctx context.Context, span time.Duration) (float64, error) {
	const every = 20 * time.Millisecond
	var total int
	tick := time.NewTicker(every)
	defer tick.Stop()
	for end := time.Now().Add(span); time.Now().Before(end); {
		var n int
		if err := d.pool.QueryRow(ctx, qAppSessions, d.app).Scan(&n); err != nil {
			return 0, err
		}
		total += n
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
	return float64(total) * every.Seconds(), nil
}

// waitFor polls done every 50 ms until it reports true, fails, or within passes.
func waitFor(ctx context.Context, within time.Duration, done func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %v: %w", within, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
