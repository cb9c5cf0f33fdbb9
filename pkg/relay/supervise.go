package relay

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
)

// Defaults for SuperviseConfig.
const (
	DefaultRestartMin = time.Second
	DefaultRestartMax = 30 * time.Second
)

// ErrRunDied is what Supervise reports for a run whose goroutine ended without returning
// (runtime.Goexit: a crash the process survived).
var ErrRunDied = errors.New("relay run ended without returning")

// SuperviseConfig tunes Supervise. Zero fields take the defaults.
type SuperviseConfig struct {
	// Chunk bounds one Run, so OnRun sees figures while a long-lived relay runs. Zero: a
	// run lasts until stop or an error.
	Chunk time.Duration
	// RestartMin and RestartMax bound the pause before the run that follows a failed one:
	// it doubles from RestartMin to RestartMax and resets after a clean run. Defaults
	// DefaultRestartMin and DefaultRestartMax.
	RestartMin, RestartMax time.Duration
	// OnRun, when set, is called after every run with its stats and error (nil for a clean
	// run, ErrRunDied for a run that died).
	OnRun func(Stats, error)
}

// Supervise keeps a relay running until stop is cancelled, the way a scheduler keeps one
// alive: each run uses the relay next returns (next may return the same relay every time,
// or a fresh one per run), and a run that fails (database down, a killed connection) or
// dies is followed by another after a backoff, so the process outlives an outage. A run in
// flight when stop is cancelled finishes its batches (see Run). Supervise returns nil on
// stop, or next's error.
func Supervise(stop context.Context, next func(run int) (*Relay, error), cfg SuperviseConfig) error {
	cfg.RestartMin = configcheck.Positive(cfg.RestartMin, DefaultRestartMin)
	if cfg.RestartMax < cfg.RestartMin {
		cfg.RestartMax = max(DefaultRestartMax, cfg.RestartMin)
	}
	pause := cfg.RestartMin
	for run := 0; stop.Err() == nil; run++ {
		r, err := next(run)
		if err != nil {
			return err
		}
		st, err := runOnce(stop, r, cfg.Chunk)
		if cfg.OnRun != nil {
			cfg.OnRun(st, err)
		}
		if err == nil || stop.Err() != nil {
			if r.log.Enabled(stop, slog.LevelDebug) {
				r.log.DebugContext(stop, "relay run ended", "run", run, "stats", st)
			}
			pause = cfg.RestartMin
			continue
		}
		r.log.WarnContext(stop, "relay run failed; starting another", "run", run, "error", err.Error(), "pause_ms", pause.Milliseconds())
		t := time.NewTimer(pause)
		select {
		case <-stop.Done():
		case <-t.C:
		}
		t.Stop()
		pause = min(2*pause, cfg.RestartMax)
	}
	return nil
}

// runOnce runs r in its own goroutine, so a run that calls runtime.Goexit (a fault
// injected in tests) is reported as ErrRunDied instead of taking the supervisor with it.
func runOnce(stop context.Context, r *Relay, chunk time.Duration) (Stats, error) {
	var (
		st       Stats
		err      error
		returned bool
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := stop
		if chunk > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(stop, chunk)
			defer cancel()
		}
		st, err = r.Run(ctx)
		returned = true
	}()
	<-done
	if !returned {
		return st, ErrRunDied
	}
	return st, err
}
