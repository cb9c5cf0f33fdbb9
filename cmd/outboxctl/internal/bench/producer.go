package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster"
	"github.com/outbox-relay/outbox-relay/v3/migrations"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// The producer scenario's arms: what wakes the relay, and who inserts.
const (
	// ArmNotifyEveryInsert: migration 0001's trigger, a NOTIFY in every producer
	// transaction (what shipped before 0014, and what an operator may restore).
	ArmNotifyEveryInsert = "notify-every-insert"
	// ArmNoWakeUp: the trigger disabled; nothing on the commit path. The relay, never
	// woken, drains once per PollInterval (1 s), in full batches.
	ArmNoWakeUp = "no-wake-up"
	// ArmNoWakeUpPolling: the trigger disabled, and the relay polling every millisecond:
	// nothing on the commit path, and the relay's work as an awake relay does it (claims of
	// what committed since the last, keeping up). Against it, the sleeper arm's ratio is
	// what the commit path costs; against ArmNoWakeUp it also holds the cost of keeping up
	// (a relay on the same two cores claiming a few hundred rows every few milliseconds,
	// not a thousand once a second).
	ArmNoWakeUpPolling = "no-wake-up-polling"
	// ArmSleeper: migration 0014's trigger, a NOTIFY only while a relay sleeps.
	ArmSleeper = "sleeper"
	// ArmGoEnqueue: migration 0014's trigger, events written through outbox.Enqueue, one
	// pgx transaction per event.
	ArmGoEnqueue = "go-enqueue"
)

// producerArms run in this order in odd rounds and in the reverse order in even ones, so
// that no arm always runs right after another: the machine drifts between arms (a
// checkpoint, autovacuum of the last arm's rows, the page cache), and in a fixed order
// that drift falls on the same arm every round.
var producerArms = []string{ArmNotifyEveryInsert, ArmNoWakeUp, ArmSleeper, ArmNoWakeUpPolling, ArmGoEnqueue}

// producerRoundArms returns the arms of round (1-based) in the order they run.
func producerRoundArms(round int) []string {
	if round%2 == 1 {
		return producerArms
	}
	arms := slices.Clone(producerArms)
	slices.Reverse(arms)
	return arms
}

// ProducerConfig sizes the producer scenario.
type ProducerConfig struct {
	// Clients are the concurrency levels, each client one connection committing one event
	// per transaction as fast as it can.
	Clients  []int         `json:"clients"`
	Duration time.Duration `json:"duration_ns"`
	// Rounds: every arm runs once per round, the arms in turns; the median is reported.
	Rounds int `json:"rounds"`
}

// ProducerConfigFor returns the producer scenario's size.
func ProducerConfigFor(s Size) ProducerConfig {
	switch s {
	case Full:
		// Five paired rounds: this machine's rounds of one arm spread by ±10% (6,007 to
		// 7,189 commits/s in one run), as wide as the cost the scenario judges (≥ 0.95);
		// the median of five ratios taken within a round is steadier than a ratio of
		// medians of three.
		return ProducerConfig{Clients: []int{64, 8}, Duration: 10 * time.Second, Rounds: 5}
	case Short:
		return ProducerConfig{Clients: []int{64}, Duration: 3 * time.Second, Rounds: 1}
	default:
		// Two rounds, so the reversed order of the even ones runs too.
		return ProducerConfig{Clients: []int{4}, Duration: time.Second, Rounds: 2}
	}
}

// ProducerArm is one arm at one concurrency: the median of its rounds.
type ProducerArm struct {
	Arm     string `json:"arm"`
	Clients int    `json:"clients"`
	// Driver is pgbench (plain SQL INSERTs) or go (outbox.Enqueue).
	Driver        string    `json:"driver"`
	CommitsPerSec float64   `json:"commits_per_sec"`
	Rounds        []float64 `json:"rounds"`
	// RelayDispatched counts the events the running relay published during the arm's
	// rounds: the wake-up under test was being served, not measured idle.
	RelayDispatched int `json:"relay_dispatched"`
	// VsNoWakeUp is the median of RoundRatios: each round's commits/s over the no-wake-up
	// arm's in the same round. Pairing within a round cancels the drift between rounds
	// that a ratio of the two medians keeps.
	VsNoWakeUp  float64   `json:"vs_no_wake_up"`
	RoundRatios []float64 `json:"round_ratios"`
	// VsPolling is the same against the ArmNoWakeUpPolling arm.
	VsPolling float64 `json:"vs_no_wake_up_polling"`
}

// ProducerResult is the producer scenario's output.
type ProducerResult struct {
	Config  ProducerConfig `json:"config"`
	Pgbench string         `json:"pgbench"`
	Path    string         `json:"path"`
	Arms    []ProducerArm  `json:"arms"`
}

// Find returns the arm at clients, or nil.
func (r *ProducerResult) Find(arm string, clients int) *ProducerArm {
	if r == nil {
		return nil
	}
	return find(r.Arms, func(a *ProducerArm) bool { return a.Arm == arm && a.Clients == clients })
}

// Producer measures what the outbox's wake-up costs producer commits: at each concurrency,
// clients commit one event per transaction for cfg.Duration per arm while the long-lived
// relay (relay.Run) publishes to a local QStash that holds what it accepts. The plain SQL
// arms run pgbench (from the server binaries' directory or PATH).
func Producer(ctx context.Context, schemaURL string, cfg ProducerConfig, progress func(string)) (*ProducerResult, error) {
	pgbench, err := findPgbench()
	if err != nil {
		return nil, err
	}
	res := &ProducerResult{Config: cfg, Pgbench: pgbench,
		Path: "clients commit one order.created event per transaction (pgbench: INSERT; go: outbox.Enqueue in a pgx transaction) while relay.Run publishes to a local QStash (publish mode, holding)"}
	admin, err := openPool(ctx, schemaURL, 4)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	setups, err := triggerSetups()
	if err != nil {
		return nil, err
	}
	script, err := pgbenchScript()
	if err != nil {
		return nil, err
	}
	defer os.Remove(script)

	runs := map[string][]float64{}
	dispatched := map[string]int{}
	key := func(arm string, clients int) string { return arm + "/" + strconv.Itoa(clients) }
	for _, clients := range cfg.Clients {
		for round := 1; round <= cfg.Rounds; round++ {
			for _, arm := range producerRoundArms(round) {
				rate, st, err := producerRun(ctx, admin, schemaURL, pgbench, script, setups[arm], arm, clients, cfg.Duration)
				if err != nil {
					return res, fmt.Errorf("producer %s at %d clients: %w", arm, clients, err)
				}
				runs[key(arm, clients)] = append(runs[key(arm, clients)], rate)
				dispatched[key(arm, clients)] += st.Dispatched
				if progress != nil {
					progress(fmt.Sprintf("producer %-20s clients=%-3d round %d: %8.0f commits/s (relay: %s)", arm, clients, round, rate, st.LogValue()))
				}
			}
		}
		none, polling := runs[key(ArmNoWakeUp, clients)], runs[key(ArmNoWakeUpPolling, clients)]
		for _, arm := range producerArms {
			mid, rs := median(runs[key(arm, clients)], func(v float64) float64 { return v })
			driver := "pgbench"
			if arm == ArmGoEnqueue {
				driver = "go"
			}
			paired, pairedPolling := make([]float64, len(rs)), make([]float64, len(rs))
			for i, v := range rs {
				paired[i], pairedPolling[i] = ratio(v, none[i]), ratio(v, polling[i])
			}
			vs, _ := median(paired, func(v float64) float64 { return v })
			vsPolling, _ := median(pairedPolling, func(v float64) float64 { return v })
			res.Arms = append(res.Arms, ProducerArm{Arm: arm, Clients: clients, Driver: driver, CommitsPerSec: mid, Rounds: rs,
				RelayDispatched: dispatched[key(arm, clients)], VsNoWakeUp: vs, RoundRatios: paired, VsPolling: vsPolling})
		}
		if progress != nil {
			if s := res.Find(ArmSleeper, clients); s != nil {
				progress(fmt.Sprintf("producer clients=%d: sleeper / no wake-up %.3f (median of the rounds' ratios %s), / no wake-up with a polling relay %.3f", clients, s.VsNoWakeUp, ratiosList(s.RoundRatios), s.VsPolling))
			}
		}
	}
	// Leave the outbox as migrated: the even rounds end with 0001's trigger, which 0014's
	// statements drop and replace.
	if _, err := admin.Exec(ctx, setups[ArmSleeper]); err != nil {
		return res, fmt.Errorf("restore migration 0014's trigger: %w", err)
	}
	return res, nil
}

// producerRun runs one arm once on an emptied outbox and returns its commits per second
// and what the relay did meanwhile.
func producerRun(ctx context.Context, admin *pgxpool.Pool, schemaURL, pgbench, script, setup, arm string, clients int, d time.Duration) (float64, relay.Stats, error) {
	var st relay.Stats
	if err := Reset(ctx, admin); err != nil {
		return 0, st, err
	}
	// Every arm starts from 0014's trigger, enabled.
	if _, err := admin.Exec(ctx, qNotifyEveryInsert); err != nil {
		return 0, st, fmt.Errorf("set the trigger up: %w", err)
	}
	if _, err := admin.Exec(ctx, setup); err != nil {
		return 0, st, fmt.Errorf("set the trigger up: %w", err)
	}
	if err := checkpoint(ctx, admin); err != nil {
		return 0, st, err
	}

	q := startSinkQStash(0)
	defer q.Close()
	pool, err := openPool(ctx, schemaURL, int32(relay.DefaultPublishConcurrency+2))
	if err != nil {
		return 0, st, err
	}
	defer pool.Close()
	pub, err := newPublisher(q.URL, q.Token, q.SinkURL, false)
	if err != nil {
		return 0, st, err
	}
	rc := relayConfig(relay.DefaultBatchSize, false)
	if arm == ArmNoWakeUpPolling {
		rc.PollInterval = time.Millisecond
	}
	r, err := relay.New(pool, pub, rc)
	if err != nil {
		return 0, st, err
	}
	stop, cancel := context.WithCancel(ctx)
	defer cancel()
	var relayErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		st, relayErr = r.Run(stop)
	}()

	var rate float64
	if arm == ArmGoEnqueue {
		rate, err = goProducers(ctx, schemaURL, clients, d)
	} else {
		rate, err = runPgbench(ctx, pgbench, script, schemaURL, clients, d)
	}
	cancel()
	<-done
	if err == nil && relayErr != nil {
		err = fmt.Errorf("relay run: %w", relayErr)
	}
	return rate, st, err
}

// qNotifyEveryInsert restores 0001's trigger, as migration 0014's comment tells operators.
const qNotifyEveryInsert = `DROP TRIGGER outbox_notify_insert ON outbox;
CREATE TRIGGER outbox_notify_insert AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()`

// triggerSetups returns each arm's statements: 0014 itself for the arms of the shipped
// wake-up (so the bench measures the file that ships), the escape hatch for 0001's.
func triggerSetups() (map[string]string, error) {
	names, err := fs.Glob(migrations.FS, "0014_*.sql")
	if err != nil || len(names) != 1 {
		return nil, fmt.Errorf("find migration 0014: %d files (%v)", len(names), err)
	}
	b, err := fs.ReadFile(migrations.FS, names[0])
	if err != nil {
		return nil, fmt.Errorf("read migration %s: %w", names[0], err)
	}
	return map[string]string{
		ArmNotifyEveryInsert: qNotifyEveryInsert,
		ArmNoWakeUp:          `ALTER TABLE outbox DISABLE TRIGGER outbox_notify_insert`,
		ArmNoWakeUpPolling:   `ALTER TABLE outbox DISABLE TRIGGER outbox_notify_insert`,
		ArmSleeper:           string(b),
		ArmGoEnqueue:         string(b),
	}, nil
}

// findPgbench looks beside the server binaries (Debian keeps them off PATH), then on PATH.
func findPgbench() (string, error) {
	if dir, err := pgcluster.FindPostgresBin(); err == nil {
		if p := filepath.Join(dir, "pgbench"); isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, nil
	}
	return "", errors.New("the producer scenario needs pgbench (Debian: apt-get install postgresql-contrib or postgresql; it ships with the server)")
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode()&0o111 != 0
}

// pgbenchScript writes the one-event transaction: the bench's ~300-byte payload over 1,000
// keys.
func pgbenchScript() (string, error) {
	f, err := os.CreateTemp("", "outbox-producer-*.sql")
	if err != nil {
		return "", fmt.Errorf("write pgbench script: %w", err)
	}
	payload := strings.ReplaceAll(string(Payload("pgbench", 1, KeyName(1))), "'", "''")
	_, err = fmt.Fprintf(f, "\\set k random(0, 999)\nINSERT INTO outbox (topic, partition_key, payload) VALUES ('%s', 'key-' || :k, '%s');\n", Topic, payload)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("write pgbench script: %w", err)
	}
	return f.Name(), nil
}

var pgbenchTPS = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)

// runPgbench runs the script on clients connections for d and returns pgbench's tps
// (without connection time). libpq rejects the pgx-only search_path URL parameter, so the
// schema travels in PGOPTIONS.
func runPgbench(ctx context.Context, pgbench, script, schemaURL string, clients int, d time.Duration) (float64, error) {
	u, err := url.Parse(schemaURL)
	if err != nil {
		return 0, fmt.Errorf("parse database url: %w", err)
	}
	query := u.Query()
	schema := query.Get("search_path")
	query.Del("search_path")
	u.RawQuery = query.Encode()
	threads := min(clients, runtime.NumCPU())
	cmd := exec.CommandContext(ctx, pgbench, "-n", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(threads),
		"-T", strconv.Itoa(max(1, int(d.Round(time.Second).Seconds()))), "-f", script, u.String())
	cmd.Env = append(os.Environ(), "PGOPTIONS=-c search_path="+schema)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pgbench: %w: %s", err, lastLine(out))
	}
	m := pgbenchTPS.FindStringSubmatch(string(out))
	if m == nil {
		return 0, fmt.Errorf("pgbench printed no tps: %s", lastLine(out))
	}
	return strconv.ParseFloat(m[1], 64)
}

// goProducers runs clients goroutines, each committing one outbox.Enqueue per pgx
// transaction on a connection of its own, for d; it returns commits per second.
func goProducers(ctx context.Context, schemaURL string, clients int, d time.Duration) (float64, error) {
	pool, err := openPool(ctx, schemaURL, int32(clients))
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	run := runID("p")
	var commits atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	start := time.Now()
	end := start.Add(d)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := c; time.Now().Before(end); n += clients {
				key := KeyName(n % 1000)
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := outbox.Enqueue(ctx, tx, outbox.Event{Topic: Topic, PartitionKey: key, Payload: Payload(run, n, key)})
					return err
				})
				if err != nil {
					errs <- err
					return
				}
				commits.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, fmt.Errorf("enqueue: %w", err)
	}
	return rate(int(commits.Load()), elapsed), nil
}
