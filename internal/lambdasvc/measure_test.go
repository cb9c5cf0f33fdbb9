package lambdasvc_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/kick"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// measureEnv turns TestMeasureDeployedShape on: it runs for minutes, so not by default.
const measureEnv = "MEASURE_DEPLOYED_SHAPE"

// TestMeasureDeployedShape measures the relay as deployed (built bootstrap under
// aws-lambda-rie behind the local Invoke API, reserved concurrency 2, IDLE_GAP 1 s, the
// local QStash) with producers that kick: commit -> dispatched at 1, 20 and 200
// commits/s from four producer processes (a Kicker each), the relay's invocations and
// the share that claimed nothing, then a minute idle with the schedule of the profile
// running, sampling the relay's database sessions every 20 ms. It prints a Markdown table
// (docs/performance.md). MEASURE_DEPLOYED_SHAPE=1 runs it.
func TestMeasureDeployedShape(t *testing.T) {
	if os.Getenv(measureEnv) == "" {
		t.Skip(measureEnv + "=1 runs the deployed shape's measurement (about 8 minutes)")
	}
	var rows []string
	for _, profile := range []struct {
		name     string
		schedule time.Duration
	}{{"defaults (rate(1 minute))", time.Minute}, {"scale to zero (rate(15 minutes))", 15 * time.Minute}} {
		for _, rate := range []int{1, 20, 200} {
			rows = append(rows, measure(t, profile.name, profile.schedule, rate))
		}
	}
	commits := measureCommitRate(t)
	t.Logf("machine: %d CPUs (GOMAXPROCS %d), %s/%s\n| profile | commits/s | commit -> dispatched p50 / p99 / max (ms) | relay invocations in the 20 s run and the minute after | relay session-seconds in the idle minute |\n| --- | --- | --- | --- | --- |\n%s\n%s",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, strings.Join(rows, "\n"), commits)
}

const producers = 4

// measure runs one profile at one rate and returns its table row.
func measure(t *testing.T, profile string, schedule time.Duration, rate int) string {
	d := deploy(t)
	stopTicks, err := d.svc.Schedule("relay", schedule, []byte(`{"task":"drain"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer stopTicks()
	kickers := make([]*kick.Kicker, producers)
	for i := range kickers {
		kickers[i] = newKicker(t, d)
	}
	const run = 20 * time.Second
	ids := produce(t, d, kickers, rate, run)
	waitDispatched(t, d, len(ids))
	lat := latencies(t, d)
	// Idle: let the last invocation end, then count the relay's sessions for a minute, in
	// which the throttled kicks still queued are retried (their maximum age is a minute).
	testwait.Eventually(t, 30*time.Second, func() bool { return d.sessions(t) == 0 }, "the relay's sessions closed")
	idle := sessionSeconds(t, d, time.Minute)
	inv := d.results.get()
	n := count(inv)
	st := d.svc.Stats("relay")
	t.Logf("%s at %d/s: %d events, service %+v", profile, rate, len(ids), st)
	return fmt.Sprintf("| %s | %d | %.0f / %.0f / %.0f | %d: %d drained, %d found nothing (%.0f %%), %d coalesced; %d kicks dropped | %.2f |", profile, rate,
		ms(pct(lat, 50)), ms(pct(lat, 99)), ms(lat[len(lat)-1]), len(inv), n.drained, n.empty,
		100*float64(n.empty)/float64(max(len(inv), 1)), n.coalesced, st.Dropped, idle)
}

// newKicker is a producer process's Kicker, reading the relay's promises on the outbox's
// database.
func newKicker(t *testing.T, d *deployed) *kick.Kicker {
	t.Helper()
	return newKickerOn(t, d, d.db.Pool)
}

// newKickerOn is newKicker reading promises on db; nil: a kicker that reads none (an older
// library, Config.DB unset), whose kicks only Interval spaces.
func newKickerOn(t *testing.T, d *deployed, db kick.Querier) *kick.Kicker {
	t.Helper()
	k, err := kick.New(t.Context(), kick.Config{Function: "relay", DB: db, Client: client(d.svc.URL, 0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close(context.Background()) })
	return k
}

// produce commits rate events a second for run, spread over the kickers' producers, each
// in a transaction of its own followed by its producer's kick.
func produce(t *testing.T, d *deployed, kickers []*kick.Kicker, rate int, run time.Duration) []outbox.ID {
	var mu sync.Mutex
	var ids []outbox.ID
	var wg sync.WaitGroup
	period := time.Duration(len(kickers)) * time.Second / time.Duration(rate)
	end := time.Now().Add(run)
	for i, k := range kickers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Producers start spread over one period, as independent processes would.
			time.Sleep(time.Duration(i) * period / time.Duration(len(kickers)))
			tick := time.NewTicker(period)
			defer tick.Stop()
			for time.Now().Before(end) {
				id := d.commit(t, k)
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
				<-tick.C
			}
		}()
	}
	wg.Wait()
	return ids
}

func waitDispatched(t *testing.T, d *deployed, n int) {
	testwait.Eventually(t, 2*time.Minute, func() bool {
		return d.db.Count(t, `SELECT count(*) FROM outbox WHERE dispatched_at IS NOT NULL`) == n
	}, "%d events dispatched", n)
}

func latencies(t *testing.T, d *deployed) []time.Duration {
	rows, err := d.db.Pool.Query(t.Context(), `SELECT extract(epoch FROM dispatched_at - created_at) FROM outbox ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []time.Duration
	for rows.Next() {
		var s float64
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, time.Duration(s*float64(time.Second)))
	}
	return out
}

// sessionSeconds samples the relay's sessions every 20 ms for d and sums them.
func sessionSeconds(t *testing.T, d *deployed, span time.Duration) float64 {
	const every = 20 * time.Millisecond
	var total int
	tick := time.NewTicker(every)
	defer tick.Stop()
	for end := time.Now().Add(span); time.Now().Before(end); <-tick.C {
		total += d.sessions(t)
	}
	return float64(total) * every.Seconds()
}

func pct(sorted []time.Duration, p int) time.Duration {
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// measureCommitRate compares producers' commits/s with kicks on and off: 64 clients, one
// event per transaction, 10 s each, in turns, twice. With kicks off the relay is invoked
// every second by the schedule, so that it drains in both arms (on two cores it competes
// with the producers) and the ratio is the kick's own cost.
func measureCommitRate(t *testing.T) string {
	d := deploy(t)
	kickers := make([]*kick.Kicker, producers)
	for i := range kickers {
		kickers[i] = newKicker(t, d)
	}
	rates := map[bool][]float64{}
	for round := range 4 {
		on := round%2 == 0
		stopTicks := func() {}
		if !on {
			var err error
			if stopTicks, err = d.svc.Schedule("relay", time.Second, []byte(`{"task":"drain"}`)); err != nil {
				t.Fatal(err)
			}
		}
		var n atomic.Int64
		var wg sync.WaitGroup
		end := time.Now().Add(10 * time.Second)
		for c := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var w outbox.Waker
				if on {
					w = kickers[c%len(kickers)]
				}
				for time.Now().Before(end) {
					d.commit(t, w)
					n.Add(1)
				}
			}()
		}
		wg.Wait()
		stopTicks()
		rates[on] = append(rates[on], float64(n.Load())/10)
		waitDispatchedOrTick(t, d)
	}
	on, off := slices.Max(rates[true]), slices.Max(rates[false])
	return fmt.Sprintf("producer commits/s, 64 clients, one event per transaction, best of two 10-s rounds: kicks on %.0f, kicks off %.0f (%.2f); rounds on %v, off %v",
		on, off, on/off, rates[true], rates[false])
}

// waitDispatchedOrTick drains what a round left behind before the next round: a kick
// (the kicked rounds' relay may still run) then everything dispatched.
func waitDispatchedOrTick(t *testing.T, d *deployed) {
	k := newKicker(t, d)
	k.Kick()
	n := d.db.Count(t, `SELECT count(*) FROM outbox`)
	testwait.Eventually(t, 5*time.Minute, func() bool {
		if d.db.Count(t, `SELECT count(*) FROM outbox WHERE dispatched_at IS NOT NULL`) == n {
			return true
		}
		k.Kick()
		return false
	}, "round's events dispatched")
}
