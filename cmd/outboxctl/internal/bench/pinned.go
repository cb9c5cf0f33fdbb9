package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// PinnedConfig sizes the pinned-horizon scenario.
type PinnedConfig struct {
	// Rate events per second, each its own INSERT transaction, over Keys partition keys,
	// written by Producers connections in turns.
	Rate      int `json:"rate"`
	Keys      int `json:"keys"`
	Producers int `json:"producers"`
	// Warmup events are produced and delivered first but reported apart: measured, the
	// first two seconds at 800 events/s had a p99 of 430 and 90 ms (the webhook's and the
	// local QStash's connections being dialled, first deliveries of 1,000 keys), the next
	// ones 23-32 ms.
	Warmup time.Duration `json:"warmup_ns"`
	// Clean runs before the pin, Hold is how long the pinning transaction stays open,
	// Recovery runs after it commits; production goes on throughout.
	Clean    time.Duration `json:"clean_ns"`
	Hold     time.Duration `json:"hold_ns"`
	Recovery time.Duration `json:"recovery_ns"`
	// Window is the reporting period (events are placed by their created_at).
	Window time.Duration `json:"window_ns"`
	// Grace bounds everything after production ends: waiting for the last deliveries,
	// then stopping the relay. The scenario ends within Clean + Hold + Recovery + Grace
	// whatever Postgres does.
	Grace time.Duration `json:"grace_ns"`
}

// PinnedLongHold is the opt-in long pin (outboxctl bench --pinned-hold 2h): a forgotten
// session or a long report, held for two hours.
const PinnedLongHold = 2 * time.Hour

// PinnedConfigFor returns the pinned scenario's size.
func PinnedConfigFor(s Size) PinnedConfig {
	c := PinnedConfig{Rate: 800, Keys: 1000, Producers: 4, Warmup: 3 * time.Second, Grace: time.Minute}
	switch s {
	case Full:
		c.Clean, c.Hold, c.Recovery, c.Window = time.Minute, 4*time.Minute, 2*time.Minute, 30*time.Second
	case Short:
		// 63 s of production plus the last deliveries (under a second when the relay keeps
		// up): about 64 s of bench-short; 20 s of grace keeps even a relay that falls
		// behind under the 90 s the issue allows (measured: with the server's horizon held by
		// another session from the start, 27,051 of 50,400 events were still pending).
		c.Clean, c.Hold, c.Recovery, c.Window, c.Grace = 10*time.Second, 30*time.Second, 20*time.Second, 10*time.Second, 20*time.Second
	default:
		c.Rate, c.Producers, c.Warmup, c.Grace = 100, 2, time.Second, 20*time.Second
		c.Clean, c.Hold, c.Recovery, c.Window = 2*time.Second, 2*time.Second, 2*time.Second, time.Second
	}
	return c
}

// PinnedWindow is one reporting window: the events created in it, and the server's dead
// tuples at its end.
type PinnedWindow struct {
	// StartSec is the window's start in seconds from the end of the warm-up.
	StartSec float64 `json:"start_s"`
	// Pinned: the pinning transaction was open for at least half of the window.
	Pinned        bool    `json:"pinned"`
	PinnedSeconds float64 `json:"pinned_seconds"`
	// Produced events were created in the window; Delivered of them reached the handler's
	// commit by the end; CommittedInWindow counts handler commits that happened in it
	// (whenever their event was created): the pipeline's throughput.
	Produced          int `json:"produced"`
	Delivered         int `json:"delivered"`
	CommittedInWindow int `json:"committed_in_window"`
	// Latency covers the window's events, created_at -> handler commit; an event never
	// delivered counts with its age at the end of the scenario (a lower bound), so a window
	// that left events behind shows it.
	Latency Latency `json:"latency"`
	// DeadTuples is the outbox's n_dead_tup (pg_stat_user_tables) read at the window's end,
	// Vacuums its vacuum_count + autovacuum_count then.
	DeadTuples int64 `json:"n_dead_tup"`
	Vacuums    int64 `json:"vacuums"`
	// Claim is how long the relay's claims that leased rows took, by when they started;
	// Publish and Mark the same for the batches' publish calls and marks.
	Claim   Latency `json:"claim"`
	Publish Latency `json:"publish"`
	Mark    Latency `json:"mark"`
	// Dispatch covers the window's dispatched events, created_at -> dispatched_at (the
	// start of the mark after the publish): the relay's share of Latency, the rest being
	// QStash's delivery and the handler.
	Dispatch Latency `json:"dispatch"`
}

// PinnedResult is the pinned scenario's output.
type PinnedResult struct {
	Config PinnedConfig `json:"config"`
	Path   string       `json:"path"`
	// Planned events (Rate x production time, warm-up included) and Produced ones (the
	// producers stop at the end of production even if behind), WarmupProduced of them in
	// the warm-up.
	Planned        int `json:"planned"`
	Produced       int `json:"produced"`
	WarmupProduced int `json:"warmup_produced"`
	// InsertsStuck counts inserts still running 5 s after the end of production, abandoned
	// (whether they committed is unknown).
	InsertsStuck int `json:"inserts_stuck"`
	// LeftBehind events were not delivered when the scenario ended.
	LeftBehind int `json:"left_behind"`
	// PinStartSec and PinEndSec: when the pin's snapshot was taken and when it committed,
	// in seconds from the end of the warm-up (database clock).
	PinStartSec float64 `json:"pin_start_s"`
	PinEndSec   float64 `json:"pin_end_s"`
	// WarmupLatency covers the warm-up's events, CleanLatency those created after it and
	// before the pin.
	WarmupLatency Latency        `json:"warmup_latency"`
	CleanLatency  Latency        `json:"clean_latency"`
	CleanDispatch Latency        `json:"clean_dispatch"`
	Windows       []PinnedWindow `json:"windows"`
	// WorstPinnedP99 is the highest p99 of a pinned window.
	WorstPinnedP99 float64 `json:"worst_pinned_p99_ms"`
	// CleanClaimP99 and WorstPinnedClaimP99: the highest p99 of the claim's duration in a
	// window before the pin and in a pinned one.
	CleanClaimP99       float64 `json:"clean_claim_p99_ms"`
	WorstPinnedClaimP99 float64 `json:"worst_pinned_claim_p99_ms"`
	// RecoverySeconds: from the pin's release to the start of the first window after it
	// whose p99 is within RecoveryFactor of the clean p99 (window resolution: 0 means the
	// first window after the release already was); null if none was.
	RecoverySeconds *float64 `json:"recovery_seconds"`
	// RelayStopped is false when the relay did not return from Run within the grace, even
	// after its sessions were terminated.
	RelayStopped bool `json:"relay_stopped"`
	// RelayTerminated: Run had not returned a quarter of the grace after its stop, and its
	// sessions were terminated; RelayError is what Run returned then (not the scenario's
	// failure: what was left is reported in LeftBehind).
	RelayTerminated bool   `json:"relay_terminated"`
	RelayError      string `json:"relay_error,omitempty"`
	// RelayRestarts counts runs that failed and were started again (relay.Supervise, as
	// outboxctl relay does); RelayRunError is the last one's error.
	RelayRestarts int     `json:"relay_restarts"`
	RelayRunError string  `json:"relay_run_error,omitempty"`
	Seconds       float64 `json:"seconds"`
}

// RecoveryFactor: a window has recovered when its p99 is within this factor of the clean
// period's (the 1.5x).
const RecoveryFactor = 1.5

// pinnedSample is one produced event.
type pinnedSample struct {
	id      int64
	created time.Time
}

// Pinned produces Rate events/s as plain SQL INSERTs while relay.Run publishes to the local
// QStash, which delivers to webhook.Handler; after Clean a separate session holds a
// REPEATABLE READ snapshot for Hold (the xmin horizon pinned, so no dead outbox row can be
// removed), then production goes on for Recovery. It reports latency, throughput and dead
// tuples per window, what was left behind, and how long latency took to recover.
func Pinned(ctx context.Context, schemaURL string, cfg PinnedConfig, progress func(string)) (*PinnedResult, error) {
	if cfg.Rate <= 0 || cfg.Keys <= 0 || cfg.Producers <= 0 || cfg.Window <= 0 || cfg.Grace <= 0 || cfg.Warmup < 0 || cfg.Clean < 0 || cfg.Hold < 0 || cfg.Recovery < 0 {
		return nil, fmt.Errorf("pinned: rate %d, keys %d, producers %d, window %v and grace %v must be positive, the periods not negative", cfg.Rate, cfg.Keys, cfg.Producers, cfg.Window, cfg.Grace)
	}
	began := time.Now()
	// production is what the windows cover; it starts after the warm-up.
	production := cfg.Clean + cfg.Hold + cfg.Recovery
	planned := cfg.Warmup + production
	res := &PinnedResult{Config: cfg, Planned: int(float64(cfg.Rate) * planned.Seconds()),
		Path: "plain INSERT, one event per transaction -> relay.Run (linger, NOTIFY) -> local QStash (publish mode) over HTTP -> webhook.Handler (OrderCreated) -> commit; a REPEATABLE READ transaction on its own session pins the xmin horizon"}
	// Nothing outlives production + Grace: the relay's Run, the waits, every statement.
	ctx, cancel := context.WithTimeout(ctx, planned+cfg.Grace+5*time.Second)
	defer cancel()

	pool, pl, commits, err := startCommitPipeline(ctx, schemaURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	defer pl.Close()

	var t0 time.Time
	if err := pool.QueryRow(ctx, qClockTimestamp).Scan(&t0); err != nil {
		return nil, fmt.Errorf("read database clock: %w", err)
	}
	warm := time.Now()
	// t0 and start: the end of the warm-up, where the windows begin, on the database's
	// clock and on this process's.
	t0, start := t0.Add(cfg.Warmup), warm.Add(cfg.Warmup)
	end := start.Add(production)

	// The relay's sessions carry a name of their own, so a claim stuck past the grace can
	// be terminated.
	relayApp := runID("bench-pinned-relay-")
	relayURL, err := withApplicationName(schemaURL, relayApp)
	if err != nil {
		return nil, err
	}
	relayPool, err := openPool(ctx, relayURL, int32(relay.DefaultPublishConcurrency+2))
	if err != nil {
		return nil, err
	}
	rcfg := relayConfig(relay.DefaultBatchSize, false)
	rcfg.PollInterval = relay.DefaultPollInterval // what outboxctl relay runs with
	var claims claimClock
	rcfg.Tracer = claims.tracer()
	r, err := pl.NewRelay(relayPool, rcfg)
	if err != nil {
		relayPool.Close()
		return nil, err
	}
	stopRelay, stop := context.WithDeadline(ctx, began.Add(planned+cfg.Grace))
	defer stop()
	var (
		relayErr  error
		restartMu sync.Mutex
		restarts  int
		lastErr   string
	)
	relayDone := make(chan struct{})
	go func() {
		defer close(relayDone)
		// As outboxctl relay runs it: a run that fails (a claim out of its time under the
		// pin, say) is followed by another after a backoff instead of ending the relay.
		relayErr = relay.Supervise(stopRelay, func(int) (*relay.Relay, error) { return r, nil }, relay.SuperviseConfig{
			OnRun: func(_ relay.Stats, err error) {
				if err != nil && stopRelay.Err() == nil {
					restartMu.Lock()
					restarts, lastErr = restarts+1, err.Error()
					restartMu.Unlock()
				}
			},
		})
	}()

	var (
		wg      sync.WaitGroup
		prodErr error
		pinErr  error
		samples []pinnedSample
		stats   []tableStats
		statErr error
	)
	wg.Add(3)
	go func() {
		defer wg.Done()
		samples, res.InsertsStuck, prodErr = producePlain(ctx, schemaURL, cfg, warm, end)
	}()
	go func() {
		defer wg.Done()
		var pinAt, releasedAt time.Time
		pinAt, releasedAt, pinErr = holdSnapshot(ctx, schemaURL, start.Add(cfg.Clean), cfg.Hold)
		if pinErr == nil {
			res.PinStartSec, res.PinEndSec = round3(pinAt.Sub(t0).Seconds()), round3(releasedAt.Sub(t0).Seconds())
		}
	}()
	go func() {
		defer wg.Done()
		stats, statErr = watchDeadTuples(ctx, pool, start, cfg.Window, production, progress)
	}()
	wg.Wait()
	res.Produced = len(samples)

	// The last deliveries, then the relay (a quarter of the grace to return, a quarter
	// more once its sessions are terminated): together within the grace.
	awaitDeliveries(ctx, commits, samples, began.Add(planned+cfg.Grace/2))
	stop()
	res.RelayStopped, res.RelayTerminated = awaitRelay(context.WithoutCancel(ctx), pool, relayApp, relayDone, cfg.Grace/4)
	if res.RelayStopped {
		relayPool.Close()
	} else {
		// A session Postgres would not give back; closing would wait for it.
		go relayPool.Close()
	}
	var end0 time.Time
	if err := pool.QueryRow(context.WithoutCancel(ctx), qClockTimestamp).Scan(&end0); err != nil {
		end0 = t0.Add(time.Since(start))
	}

	restartMu.Lock()
	res.RelayRestarts, res.RelayRunError = restarts, lastErr
	restartMu.Unlock()
	// The claims on the database's clock, as the events are: start is t0 on this process's.
	clock := claims.snapshot()
	for i := range clock {
		clock[i].at = t0.Add(clock[i].at.Sub(start))
	}
	dispatched, err := dispatchTimes(context.WithoutCancel(ctx), pool, samples)
	if err != nil {
		return nil, err
	}
	res.summarise(samples, commits, dispatched, stats, clock, t0, end0)
	res.Seconds = round3(time.Since(began).Seconds())
	if progress != nil {
		progress(res.progressLine())
	}
	// relayErr is Run's to write until relayDone closes: a relay that would not stop has
	// no error to read yet.
	var runErr error
	if res.RelayStopped {
		runErr = relayErr
	}
	switch {
	case prodErr != nil:
		return res, fmt.Errorf("pinned produce: %w", prodErr)
	case pinErr != nil:
		return res, fmt.Errorf("pinned hold: %w", pinErr)
	case statErr != nil:
		return res, statErr
	case res.RelayTerminated:
		if runErr != nil {
			res.RelayError = runErr.Error()
		}
	case runErr != nil && !errors.Is(runErr, context.Canceled) && !errors.Is(runErr, context.DeadlineExceeded):
		return res, fmt.Errorf("relay run: %w", runErr)
	}
	// Undelivered events are the scenario's finding, reported as LeftBehind, not an error.
	return res, nil
}

// awaitDeliveries returns once every sample has a handler commit, or at deadline. It
// counts every quarter second rather than at every commit: hundreds of thousands of ids
// counted at every delivery of a late backlog would take a core.
func awaitDeliveries(ctx context.Context, commits *commitLog, samples []pinnedSample, deadline time.Time) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		missing := 0
		for _, s := range samples {
			if commits.get(s.id).IsZero() {
				missing++
			}
		}
		if missing == 0 || !time.Now().Before(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// withApplicationName adds application_name to a database URL.
func withApplicationName(dbURL, name string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("parse database url: %w", err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// awaitRelay waits up to wait for Run to return after its stop; then it terminates the
// relay's sessions (a claim Postgres keeps running ignores the cancel) and waits as long
// again. It reports whether Run returned, and whether its sessions were terminated.
func awaitRelay(ctx context.Context, admin *pgxpool.Pool, app string, done <-chan struct{}, wait time.Duration) (stopped, terminated bool) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
		return true, false
	case <-t.C:
	}
	tctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	_, _ = admin.Exec(tctx, qTerminateApp, app)
	select {
	case <-done:
		return true, true
	case <-tctx.Done():
		return false, true
	}
}

// producePlain inserts Rate events per second, one INSERT per transaction, from
// cfg.Producers connections taking the events in turns, each event at its scheduled time
// (a producer behind schedule catches up without sleeping) until end.
func producePlain(ctx context.Context, schemaURL string, cfg PinnedConfig, start, end time.Time) ([]pinnedSample, int, error) {
	pool, err := openPool(ctx, schemaURL, int32(cfg.Producers))
	if err != nil {
		return nil, 0, err
	}
	var stuck atomic.Int64
	defer pool.Close()
	run := runID("pin")
	interval := time.Second / time.Duration(cfg.Rate)
	per := make([][]pinnedSample, cfg.Producers)
	errs := make([]error, cfg.Producers)
	var wg sync.WaitGroup
	for w := range cfg.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A statement stuck behind the server cannot outlast production by much.
			pctx, cancel := context.WithDeadline(ctx, end.Add(5*time.Second))
			defer cancel()
			for n := w; ; n += cfg.Producers {
				// A producer behind schedule stops at the end too: production is a period.
				at := start.Add(time.Duration(n) * interval)
				if !at.Before(end) || !time.Now().Before(end) {
					return
				}
				if d := time.Until(at); d > 0 {
					select {
					case <-pctx.Done():
						errs[w] = pctx.Err()
						return
					case <-time.After(d):
					}
				}
				key := KeyName(n % cfg.Keys)
				s := pinnedSample{}
				if err := pool.QueryRow(pctx, qPlainInsert, Topic, key, Payload(run, n, key)).Scan(&s.id, &s.created); err != nil {
					if ctx.Err() == nil && errors.Is(pctx.Err(), context.DeadlineExceeded) {
						// Stuck past the end: the server's doing, reported, not a failure.
						stuck.Add(1)
						return
					}
					errs[w] = fmt.Errorf("insert outbox row: %w", err)
					return
				}
				per[w] = append(per[w], s)
			}
		}()
	}
	wg.Wait()
	var out []pinnedSample
	for _, p := range per {
		out = append(out, p...)
	}
	return out, int(stuck.Load()), errors.Join(errs...)
}

// holdSnapshot opens a REPEATABLE READ transaction on a session of its own at at, takes its
// snapshot with a read, holds it for hold and commits. It returns the database clock when
// the snapshot was held and after the commit.
func holdSnapshot(ctx context.Context, schemaURL string, at time.Time, hold time.Duration) (pinned, released time.Time, err error) {
	select {
	case <-ctx.Done():
		return pinned, released, ctx.Err()
	case <-time.After(time.Until(at)):
	}
	conn, err := pgx.Connect(ctx, schemaURL)
	if err != nil {
		return pinned, released, fmt.Errorf("connect to database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return pinned, released, fmt.Errorf("begin pinning transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, qPinSnapshot); err != nil {
		return pinned, released, fmt.Errorf("take snapshot: %w", err)
	}
	if err := tx.QueryRow(ctx, qClockTimestamp).Scan(&pinned); err != nil {
		return pinned, released, fmt.Errorf("read database clock: %w", err)
	}
	select {
	case <-ctx.Done():
		return pinned, released, ctx.Err()
	case <-time.After(hold):
	}
	if err := tx.Commit(ctx); err != nil {
		return pinned, released, fmt.Errorf("commit pinning transaction: %w", err)
	}
	if err := conn.QueryRow(ctx, qClockTimestamp).Scan(&released); err != nil {
		return pinned, released, fmt.Errorf("read database clock: %w", err)
	}
	return pinned, released, nil
}

// tableStats is the outbox's row in pg_stat_user_tables at a window's end.
type tableStats struct {
	dead, vacuums int64
}

// watchDeadTuples reads the outbox's dead tuples at the end of every window of production.
func watchDeadTuples(ctx context.Context, db *pgxpool.Pool, start time.Time, window, production time.Duration, progress func(string)) ([]tableStats, error) {
	n := windowCount(production, window)
	out := make([]tableStats, 0, n)
	for i := 1; i <= n; i++ {
		at := start.Add(min(time.Duration(i)*window, production))
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-time.After(time.Until(at)):
		}
		var s tableStats
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := db.QueryRow(qctx, qOutboxDeadTuples).Scan(&s.dead, &s.vacuums)
		cancel()
		if err != nil {
			return out, fmt.Errorf("read outbox dead tuples: %w", err)
		}
		out = append(out, s)
		if progress != nil {
			progress(fmt.Sprintf("pinned window %d/%d: n_dead_tup %d, vacuums %d", i, n, s.dead, s.vacuums))
		}
	}
	return out, nil
}

// dispatchTimes reads the dispatched_at of the produced events.
func dispatchTimes(ctx context.Context, db *pgxpool.Pool, samples []pinnedSample) (map[int64]time.Time, error) {
	ids := make([]int64, len(samples))
	for i, s := range samples {
		ids[i] = s.id
	}
	rows, err := db.Query(ctx, qDispatchedAt, ids)
	if err != nil {
		return nil, fmt.Errorf("read dispatch times: %w", err)
	}
	out := make(map[int64]time.Time, len(ids))
	var (
		id int64
		at time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &at}, func() error {
		out[id] = at
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read dispatch times: %w", err)
	}
	return out, nil
}

func windowCount(production, window time.Duration) int {
	return max(1, int(math.Ceil(production.Seconds()/window.Seconds())))
}

// summarise places every event in its window by created_at and fills the result.
func (res *PinnedResult) summarise(samples []pinnedSample, commits *commitLog, dispatched map[int64]time.Time, stats []tableStats, claims []claimTime, t0, end time.Time) {
	cfg := res.Config
	n := windowCount(cfg.Clean+cfg.Hold+cfg.Recovery, cfg.Window)
	lats, relayed := make([][]time.Duration, n), make([][]time.Duration, n)
	res.Windows = make([]PinnedWindow, n)
	var clean, cleanRelayed, warmup []time.Duration
	pinStart := t0.Add(time.Duration(res.PinStartSec * float64(time.Second)))
	pinEnd := t0.Add(time.Duration(res.PinEndSec * float64(time.Second)))
	index := func(at time.Time) int { return min(n-1, max(0, int(at.Sub(t0)/cfg.Window))) }
	res.LeftBehind = 0
	res.WarmupProduced = 0
	for _, s := range samples {
		done := commits.get(s.id)
		lat := done.Sub(s.created)
		if done.IsZero() {
			res.LeftBehind++
			lat = end.Sub(s.created)
		}
		if !done.IsZero() && !done.Before(t0) && done.Before(t0.Add(time.Duration(n)*cfg.Window)) {
			res.Windows[index(done)].CommittedInWindow++
		}
		if s.created.Before(t0) {
			res.WarmupProduced++
			warmup = append(warmup, lat)
			continue
		}
		i := index(s.created)
		w := &res.Windows[i]
		w.Produced++
		if !done.IsZero() {
			w.Delivered++
		}
		lats[i] = append(lats[i], lat)
		d, ok := dispatched[s.id]
		if ok {
			relayed[i] = append(relayed[i], d.Sub(s.created))
		}
		if res.PinStartSec == 0 || s.created.Before(pinStart) {
			clean = append(clean, lat)
			if ok {
				cleanRelayed = append(cleanRelayed, d.Sub(s.created))
			}
		}
	}
	res.CleanLatency, res.WarmupLatency = summarise(clean), summarise(warmup)
	res.CleanDispatch = summarise(cleanRelayed)
	steps := map[string][][]time.Duration{claimStep: make([][]time.Duration, n), publishStep: make([][]time.Duration, n), markStep: make([][]time.Duration, n)}
	for _, c := range claims {
		if !c.at.Before(t0) {
			byWindow := steps[c.step]
			byWindow[index(c.at)] = append(byWindow[index(c.at)], c.took)
		}
	}
	for i := range res.Windows {
		w := &res.Windows[i]
		ws := time.Duration(i) * cfg.Window
		overlap := max(0, min(ws+cfg.Window, pinEnd.Sub(t0))-max(ws, pinStart.Sub(t0)))
		w.StartSec = round3(ws.Seconds())
		w.PinnedSeconds = round3(overlap.Seconds())
		w.Pinned = res.PinEndSec > 0 && overlap*2 >= cfg.Window
		w.Latency = summarise(lats[i])
		w.Claim, w.Publish, w.Mark = summarise(steps[claimStep][i]), summarise(steps[publishStep][i]), summarise(steps[markStep][i])
		w.Dispatch = summarise(relayed[i])
		if i < len(stats) {
			w.DeadTuples, w.Vacuums = stats[i].dead, stats[i].vacuums
		}
		if w.Pinned {
			res.WorstPinnedP99 = max(res.WorstPinnedP99, w.Latency.P99)
			res.WorstPinnedClaimP99 = max(res.WorstPinnedClaimP99, w.Claim.P99)
		} else if w.StartSec < res.PinStartSec {
			res.CleanClaimP99 = max(res.CleanClaimP99, w.Claim.P99)
		}
	}
	res.RecoverySeconds = nil
	if res.PinEndSec == 0 {
		return
	}
	last := -1
	for i, w := range res.Windows {
		if w.Pinned {
			last = i
		}
	}
	for _, w := range res.Windows[last+1:] {
		if w.Latency.Samples > 0 && w.Latency.P99 <= RecoveryFactor*res.CleanLatency.P99 {
			res.RecoverySeconds = ptr(round3(max(0, w.StartSec-res.PinEndSec)))
			return
		}
	}
}

func (res *PinnedResult) progressLine() string {
	rec := "never"
	if res.RecoverySeconds != nil {
		rec = fmt.Sprintf("%.0f s", *res.RecoverySeconds)
	}
	return fmt.Sprintf("pinned: clean p50 %.1f ms p99 %.1f ms, worst pinned window p99 %.1f ms, recovery %s, %d of %d events left behind (%.0f s)",
		res.CleanLatency.P50, res.CleanLatency.P99, res.WorstPinnedP99, rec, res.LeftBehind, res.Produced, res.Seconds)
}

const (
	// qPlainInsert is what an application's own SQL writes (no producer API).
	qPlainInsert = `INSERT INTO outbox (topic, partition_key, payload) VALUES ($1, $2, $3) RETURNING id, created_at`

	// qPinSnapshot takes the REPEATABLE READ transaction's snapshot: its xmin holds back
	// every vacuum of the server until it ends.
	qPinSnapshot = `SELECT 1 FROM outbox LIMIT 1`

	qDispatchedAt = `SELECT id, dispatched_at FROM outbox WHERE id = ANY($1::bigint[]) AND dispatched_at IS NOT NULL`

	qOutboxDeadTuples = `SELECT n_dead_tup, vacuum_count + autovacuum_count FROM pg_stat_user_tables WHERE relid = 'outbox'::regclass`

	qTerminateApp = `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`
)
