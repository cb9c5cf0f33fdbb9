// Package kick wakes the relay Lambda right after a producer's commit: an asynchronous
// Invoke (InvocationType Event) of the relay function, sent off the commit path and
// coalesced, so a busy producer sends a few invokes a second, not one per transaction.
//
//	k, err := kick.New(ctx, kick.Config{Function: os.Getenv("RELAY_FUNCTION")})
//	...
//	err = outbox.BeginFunc(ctx, pool, k, func(tx pgx.Tx) error { ... outbox.Enqueue(ctx, tx, ev) ... })
//
// A kicked relay drains, stays while events keep arriving, and returns after its idle gap
// (IDLE_GAP, relay.DrainIdle), counted from its start. So a Kicker skips a kick when its
// last accepted kick was sent less than Interval ago (Interval is at most the relay's gap:
// the relay that kick woke sees the commit), and at most one kick is in flight at a time.
// With Config.DB a Kicker first asks the database whether a relay has promised a claim
// after the commit (outbox_relay_awake, migration 0022: a draining relay keeps such a
// promise about its idle gap ahead) and sends nothing if one has; otherwise it writes the
// promise of the relay it is about to wake, so producers committing in the same instant
// send one invoke between them, not one each.
//
// A kick that fails is logged and counted (Stats), never returned to the caller: the
// event is committed and the relay's schedule delivers it if nothing else does (a lost
// kick costs at most one schedule period of latency, never the event).
package kick

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// Defaults for Config.
const (
	// defaultInterval is the relay's default idle gap. A kick requested at t1 within it of
	// an accepted kick sent at t0 is covered: the relay that kick woke started after t0,
	// stays the gap from its start, and its last claim begins after t0 + gap > t1 (no
	// margin for the invoke's latency is needed: a later start only moves that claim
	// later).
	defaultInterval = time.Second
	// defaultTimeout bounds one Invoke call, its SDK retries included.
	defaultTimeout = 5 * time.Second
)

// Config tunes a Kicker.
type Config struct {
	// Function is the relay function's name or ARN (the stack's RelayFunctionArn output).
	Function string
	// Interval: a kick requested less than Interval after the start of the last accepted
	// kick is skipped, and kicks are sent at most once per Interval. It must not exceed the
	// relay's IDLE_GAP. Default 1s, IDLE_GAP's default.
	Interval time.Duration
	// Timeout bounds one Invoke call, the SDK's retries included. Default 5s.
	Timeout time.Duration
	// Logger receives a warning per failed kick. Default slog.Default().
	Logger *slog.Logger
	// DB is the database the producer commits to (a *pgxpool.Pool). With it a kick is sent
	// only when no relay has promised a claim after the commit (see the package's doc):
	// a steady stream of commits costs an invoke when the relay went away, not one per
	// Interval per process. Nil: every kick due is sent.
	DB outbox.Querier
	// Client sends the invokes. Nil: a client from the default AWS configuration (region,
	// credentials, and the endpoint: AWS_ENDPOINT_URL_LAMBDA or AWS_ENDPOINT_URL when set,
	// which points it at a local Invoke API).
	Client *lambda.Client
}

// payload is the invocation payload of a kick (the relay function's {"task":"kick"}); the
// relay answers one sent before its environment last found the outbox idle without
// opening a database session.
type payload struct {
	Task   string    `json:"task"`
	SentAt time.Time `json:"sent_at"`
}

// Stats counts what a Kicker did.
type Stats struct {
	// Requested counts Kick calls.
	Requested int64
	// Sent counts invokes the Lambda API accepted (202), Failed those it refused or that
	// did not answer in time.
	Sent   int64
	Failed int64
	// Skipped counts Kick calls that caused no invoke of their own: covered by an
	// accepted kick (sent less than Interval before, or in flight then) or by a relay's
	// promise, or folded into the next one.
	Skipped int64
	// Promised counts the checks (Config.DB) that found a relay's or another producer's
	// promise and so sent no invoke.
	Promised int64
}

// Kicker wakes the relay after commits. Its methods are safe for concurrent use.
type Kicker struct {
	client *lambda.Client
	cfg    Config
	log    *slog.Logger

	mu sync.Mutex
	// inFlight: an invoke is being sent; pending: a Kick came that no accepted kick
	// covers yet (sent when the one in flight ends or the spacing allows).
	inFlight, pending bool
	// lastRequest is the last Kick call; lastSent the start of the last invoke; lastOK that
	// of the last accepted one.
	lastRequest, lastSent, lastOK time.Time
	// promisedUntil: a relay claims every event committed before it (a promise read
	// from the database), by this clock.
	promisedUntil time.Time
	timer         *time.Timer
	closed        bool
	wg            sync.WaitGroup

	requested, sent, failed, promised atomic.Int64
	// noTable: the database has no outbox_relay_awake (said once); kicks are sent.
	noTable atomic.Bool
}

// New returns a Kicker that invokes cfg.Function.
func New(ctx context.Context, cfg Config) (*Kicker, error) {
	if cfg.Function == "" {
		return nil, errors.New("new kicker: Function is empty: set it to the relay function's name or ARN (the stack's RelayFunctionArn output)")
	}
	if cfg.Interval < 0 || cfg.Timeout < 0 {
		return nil, fmt.Errorf("new kicker: Interval %v and Timeout %v must not be negative", cfg.Interval, cfg.Timeout)
	}
	cfg.Interval = cmp.Or(cfg.Interval, defaultInterval)
	cfg.Timeout = cmp.Or(cfg.Timeout, defaultTimeout)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.Client == nil {
		awsCfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, fmt.Errorf("new kicker: load AWS config: %w", err)
		}
		cfg.Client = lambda.NewFromConfig(awsCfg)
	}
	return &Kicker{client: cfg.Client, cfg: cfg, log: cfg.Logger}, nil
}

// Kick asks for the relay to be woken: call it after a commit that enqueued events. It
// never blocks on the network and never fails; the invoke, if one is due, is sent on a
// goroutine of its own.
func (k *Kicker) Kick() {
	k.requested.Add(1)
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return
	}
	k.lastRequest = now
	switch {
	case k.inFlight:
		// Covered by the kick in flight if it is accepted; resent after it otherwise.
		k.pending = true
	case !k.lastOK.IsZero() && now.Sub(k.lastOK) < k.cfg.Interval:
		// The relay the last accepted kick woke sees this commit.
	case now.Before(k.promisedUntil):
		// A relay promised a claim after this commit.
	default:
		k.pending = true
		k.sendLocked(now)
	}
}

// sendLocked starts an invoke now, or arms the timer for when the spacing allows one.
func (k *Kicker) sendLocked(now time.Time) {
	if wait := k.lastSent.Add(k.cfg.Interval).Sub(now); !k.lastSent.IsZero() && wait > 0 {
		if k.timer == nil {
			k.timer = time.AfterFunc(wait, k.fire)
		}
		return
	}
	k.inFlight, k.pending, k.lastSent = true, false, now
	k.wg.Add(1)
	go k.send(now)
}

func (k *Kicker) fire() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.timer = nil
	if k.pending && !k.inFlight && !k.closed {
		k.sendLocked(time.Now())
	}
}

// send invokes the relay once, unless a promise covers the kicks, and settles what came
// in meanwhile.
func (k *Kicker) send(start time.Time) {
	defer k.wg.Done()
	until, release := k.promise(start)
	var err error
	if until.IsZero() {
		if err = k.invoke(start); err != nil && release != nil {
			release()
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.inFlight = false
	switch {
	case !until.IsZero():
		k.promised.Add(1)
		if until.After(k.promisedUntil) {
			k.promisedUntil = until
		}
		if k.pending && k.lastRequest.Before(k.promisedUntil) {
			k.pending = false
		}
	case err == nil:
		k.sent.Add(1)
		k.lastOK = start
	default:
		k.failed.Add(1)
		k.log.Warn("relay kick failed; the relay's schedule delivers the events", "function", k.cfg.Function, "error", err.Error())
	}
	if !k.pending {
		return
	}
	if until.IsZero() && err == nil && k.lastRequest.Sub(start) < k.cfg.Interval {
		// The relay this kick woke stays the idle gap from its start: it sees them.
		k.pending = false
		return
	}
	if !k.closed {
		k.sendLocked(time.Now())
	}
}

// kickToken keys the promise a kicker writes before its invoke: one row that every
// producer of the outbox contends for, so two committing at once send one invoke.
const kickToken = "00000000-0000-4000-8000-006b69636b00"

// minPromise: a promise that ends sooner than this covers nothing worth a skip.
const minPromise = 20 * time.Millisecond

const (
	// qPromise reads the latest promise ending after the minimum, and, if there is none,
	// writes the kick's own (the relay it wakes stays Interval from its start, which is
	// after this statement). The upsert serializes kickers: one that meets a live kick
	// row written after its snapshot takes nothing and reads again.
	qPromise = `
WITH promised AS (
    SELECT max(until) AS until FROM outbox_relay_awake
    WHERE until > clock_timestamp() + $3 * interval '1 microsecond'
), taken AS (
    INSERT INTO outbox_relay_awake AS a (token, until)
    SELECT $1::uuid, clock_timestamp() + $2 * interval '1 microsecond'
    WHERE (SELECT until FROM promised) IS NULL
    ON CONFLICT (token) DO UPDATE SET until = excluded.until WHERE a.until <= clock_timestamp()
    RETURNING until
)
SELECT (extract(epoch FROM (SELECT until FROM promised) - clock_timestamp()) * 1e6)::bigint,
       (SELECT until FROM taken)`
	// qRelease withdraws a kick's promise whose invoke failed.
	qRelease = `DELETE FROM outbox_relay_awake WHERE token = $1::uuid AND until = $2`
)

// promise asks the database whether a relay will claim every event committed before now
// (until, by this clock: non-zero means no invoke is needed). Otherwise it has written the
// kick's own promise, and release withdraws it if the invoke fails. Without Config.DB, or
// when the database cannot answer, the kick is sent.
func (k *Kicker) promise(start time.Time) (until time.Time, release func()) {
	if k.cfg.DB == nil || k.noTable.Load() {
		return time.Time{}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), k.cfg.Timeout)
	defer cancel()
	// A kicker that lost the race for the kick row reads again: that row is then visible.
	for range 3 {
		var left *int64
		var taken *time.Time
		err := k.cfg.DB.QueryRow(ctx, qPromise, kickToken, k.cfg.Interval.Microseconds(), minPromise.Microseconds()).Scan(&left, &taken)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table: before 0022
			if !k.noTable.Swap(true) {
				k.log.Warn("kicker sends every kick: the database has no outbox_relay_awake table (run migrate up: 0022)")
			}
			return time.Time{}, nil
		case err != nil:
			k.log.Debug("kicker could not read the relay's promise; kicking", "error", err.Error())
			return time.Time{}, nil
		case left != nil:
			// The database read its clock after start: the promise ends at least left
			// after start.
			return start.Add(time.Duration(*left) * time.Microsecond), nil
		case taken != nil:
			return time.Time{}, func() {
				rctx, rcancel := context.WithTimeout(context.Background(), k.cfg.Timeout)
				defer rcancel()
				if _, err := k.cfg.DB.Exec(rctx, qRelease, kickToken, *taken); err != nil {
					k.log.Debug("kicker could not withdraw its promise", "error", err.Error())
				}
			}
		}
	}
	return time.Time{}, nil
}

func (k *Kicker) invoke(start time.Time) error {
	body, err := json.Marshal(payload{Task: "kick", SentAt: start.UTC()})
	if err != nil {
		return fmt.Errorf("encode kick payload: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), k.cfg.Timeout)
	defer cancel()
	out, err := k.client.Invoke(ctx, &lambda.InvokeInput{
		FunctionName:   &k.cfg.Function,
		InvocationType: types.InvocationTypeEvent,
		Payload:        body,
	})
	if err != nil {
		return fmt.Errorf("invoke %s: %w", k.cfg.Function, err)
	}
	if out.StatusCode != 202 {
		return fmt.Errorf("invoke %s: status %d, want 202 (accepted for asynchronous invocation)", k.cfg.Function, out.StatusCode)
	}
	return nil
}

// Stats returns the counts so far.
func (k *Kicker) Stats() Stats {
	sent, failed, req := k.sent.Load(), k.failed.Load(), k.requested.Load()
	return Stats{Requested: req, Sent: sent, Failed: failed, Skipped: max(req-sent-failed-k.pendingCount(), 0), Promised: k.promised.Load()}
}

func (k *Kicker) pendingCount() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pending {
		return 1
	}
	return 0
}

// Close stops the Kicker: it waits for the invoke in flight, until ctx is done, and sends
// the kick still owed (a Kick no accepted kick or promise covers). Kick does nothing after
// Close.
func (k *Kicker) Close(ctx context.Context) error {
	k.mu.Lock()
	k.closed = true
	if k.timer != nil {
		k.timer.Stop()
		k.timer = nil
	}
	k.mu.Unlock()
	done := make(chan struct{})
	go func() { k.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("close kicker: %w", ctx.Err())
	}
	k.mu.Lock()
	owed := k.pending
	k.pending = false
	k.mu.Unlock()
	if !owed {
		return nil
	}
	start := time.Now()
	until, release := k.promise(start)
	if !until.IsZero() {
		// A relay claims after the last commit: nothing is owed.
		k.promised.Add(1)
		return nil
	}
	err := k.invoke(start)
	if err != nil {
		if release != nil {
			release()
		}
		k.failed.Add(1)
		return fmt.Errorf("close kicker: %w", err)
	}
	k.sent.Add(1)
	return nil
}
