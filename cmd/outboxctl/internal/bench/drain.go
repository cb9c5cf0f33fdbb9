package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// The three ways of draining the outbox that the drain scenario puts side by side.
const (
	// WayRelay is relay.Relay publishing through the QStash Publisher over HTTP.
	WayRelay = "relay"
	// WayFloor runs the relay's claim and mark statements with no publish at all: the
	// database's own limit for this schema on this machine.
	WayFloor = "floor"
	// WayFloorOneRun is the floor with the claim's serial shape: one event per key per batch
	// when there are more keys than rows (keyRun 1, as a relay with PublishConcurrency 1
	// claims), beside WayFloor's runs of up to DefaultPublishConcurrency per key: the
	// pipelined claim's cost, same events, same run.
	WayFloorOneRun = "floor_one_run"
	// WayBaseline is the article's algorithm, literally: claim 50 with its statement, one
	// HTTP publish per row (all at once), one UPDATE per row afterwards, a pool of 10.
	WayBaseline = "baseline"
)

// DrainConfig sizes the drain scenario.
type DrainConfig struct {
	// Events pending at the start of every drain (~300-byte payloads) over Keys keys.
	Events int `json:"events"`
	Keys   int `json:"keys"`
	// Batches are the relay's and the floor's batch sizes; Relays the numbers of
	// concurrent relays (each with its own pool, as separate processes would have).
	Batches []int `json:"batches"`
	Relays  []int `json:"relays"`
	// BaselineBatch and BaselinePool are the article's batch size (50) and pool size (10).
	BaselineBatch int `json:"baseline_batch"`
	BaselinePool  int `json:"baseline_pool"`
	// BaselineEvents is how many events the baseline drains (it is ~10x slower, so a
	// smaller load keeps the run short; its rate is per event, so it stays comparable).
	// Zero means Events.
	BaselineEvents int `json:"baseline_events"`
	// RTTMillis are the modelled round trips to QStash (the local server's Latency): besides every
	// run above at 0, the relay at RTTBatch with 1 relay and the baseline with 1 relay run
	// at each non-zero one, on the same events. The floor publishes nothing, so RTT does not
	// touch it.
	RTTMillis []int `json:"rtt_ms"`
	RTTBatch  int   `json:"rtt_batch"`
	// RTTRounds is how many times the relay drains at RTTBatch with 1 relay at each round
	// trip (0 included), the round trips taking turns; the median round is reported. One
	// relay run at a round trip of 30 ms moved by a third from run to run on the same
	// machine, while the baseline, bound by the round trip, moved by 6 %, so the baseline
	// runs once.
	RTTRounds int `json:"rtt_rounds,omitempty"`
}

// DrainConfigFor returns the drain scenario's size.
func DrainConfigFor(s Size) DrainConfig {
	c := DrainConfig{Keys: 1000, Batches: []int{50, 100, 500, 1000}, Relays: []int{1, 2}, BaselineBatch: 50, BaselinePool: 10,
		RTTMillis: []int{0, 10, 30, 80}, RTTBatch: relay.DefaultBatchSize, RTTRounds: 1}
	switch s {
	case Full:
		c.Events, c.BaselineEvents, c.RTTRounds = 200_000, 100_000, 3
	case Short:
		c.Events, c.BaselineEvents, c.Batches = 20_000, 10_000, []int{50, 500, 1000}
	default:
		c.Events, c.BaselineEvents, c.Batches, c.Keys, c.RTTMillis, c.RTTBatch, c.RTTRounds = 2_000, 1_000, []int{50, 500}, 100, []int{0, 10}, 500, 2
	}
	return c
}

// DrainRun is one timed drain.
type DrainRun struct {
	Way    string `json:"way"`
	Batch  int    `json:"batch"`
	Relays int    `json:"relays"`
	// RTTMillis is the modelled round trip to QStash (0: loopback).
	RTTMillis int `json:"rtt_ms"`
	Events    int `json:"events"`
	// Dispatched is how many rows the drain marked; it must equal Events.
	Dispatched   int     `json:"dispatched"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	// PublishRequests is the number of HTTP requests to QStash (0 for the floor).
	PublishRequests int `json:"publish_requests"`
	// PublishMillisMean is the relay's mean Publisher.Publish latency (one /v2/batch round
	// trip: encode, HTTP, the local QStash's accept, decode), from relay.Stats samples; times
	// PublishRequests it is the time the relay spends not in the database.
	PublishMillisMean float64 `json:"publish_ms_mean,omitempty"`
	// ClaimMillisMean and MarkMillisMean are the floor's mean Store.Claim and
	// Store.MarkDispatched latencies: where the database's own limit goes.
	ClaimMillisMean float64 `json:"claim_ms_mean,omitempty"`
	MarkMillisMean  float64 `json:"mark_ms_mean,omitempty"`
	// WALBytesPerEvent is the write-ahead log the drain wrote per event (claim, mark and
	// the full-page images after the checkpoint that follows the load).
	WALBytesPerEvent float64 `json:"wal_bytes_per_event"`
	// Rounds are every round's events/s when the run is the median of several (see
	// DrainConfig.RTTRounds); Seconds and EventsPerSec are the median round's.
	Rounds []float64 `json:"rounds_events_per_sec,omitempty"`
	// LoadSeconds is the untimed COPY + VACUUM ANALYZE + CHECKPOINT before the drain.
	LoadSeconds float64 `json:"load_seconds"`
	// ClaimShape marks the floor run of the claim-shape comparison ("runs"), which the
	// batch table does not show.
	ClaimShape string `json:"claim_shape,omitempty"`
}

// ClaimShapes is the serial floor with the two shapes of the claim, back to back on the
// same events: one event per key per batch (a relay with PublishConcurrency 1) and runs of
// up to DefaultPublishConcurrency per key (the pipelined relay's).
type ClaimShapes struct {
	OneRun DrainRun `json:"one_run"`
	Runs   DrainRun `json:"runs"`
}

// DrainResult is the drain scenario's output.
type DrainResult struct {
	Config DrainConfig `json:"config"`
	// Delivery says what the local QStash did with accepted messages during the drain.
	Delivery string     `json:"delivery"`
	Runs     []DrainRun `json:"runs"`
	// ClaimShapes compares the claim's two shapes (nil when RTTBatch is 0).
	ClaimShapes *ClaimShapes `json:"claim_shapes,omitempty"`
}

// Find returns the run of way at batch and relays on loopback (RTT 0), or nil.
func (r *DrainResult) Find(way string, batch, relays int) *DrainRun {
	return r.FindRTT(way, batch, relays, 0)
}

// FindRTT returns the run of way at batch, relays and a round trip of rttMillis, or nil.
func (r *DrainResult) FindRTT(way string, batch, relays, rttMillis int) *DrainRun {
	if r == nil {
		return nil
	}
	return find(r.Runs, func(x *DrainRun) bool {
		return x.Way == way && x.Batch == batch && x.Relays == relays && x.RTTMillis == rttMillis && x.ClaimShape == ""
	})
}

// claimShapes returns the claim-shape comparison, or nil.
func (r *DrainResult) claimShapes() *ClaimShapes {
	if r == nil {
		return nil
	}
	return r.ClaimShapes
}

// Baseline returns the baseline run with relays relays on loopback, or nil.
func (r *DrainResult) Baseline(relays int) *DrainRun { return r.BaselineRTT(relays, 0) }

// BaselineRTT returns the baseline run with relays relays at rttMillis, or nil.
func (r *DrainResult) BaselineRTT(relays, rttMillis int) *DrainRun {
	if r == nil {
		return nil
	}
	return r.FindRTT(WayBaseline, r.Config.BaselineBatch, relays, rttMillis)
}

// Drain runs the drain scenario on the migrated schema at url. First the relay at RTTBatch
// with 1 relay drains at every round trip, the round trips taking turns (rttRounds); its
// median at RTT 0 is also the batch table's relay run at RTTBatch with 1 relay. Then, for
// every relay count and batch size, the floor and the relay drain the same freshly loaded,
// analysed table, and the baseline drains it once per relay count; then the claim's two
// shapes; then the baseline once at every non-zero round trip. A failed drain ends the
// scenario with the runs finished so far.
func Drain(ctx context.Context, url string, cfg DrainConfig, progress func(string)) (*DrainResult, error) {
	if cfg.BaselineEvents == 0 {
		cfg.BaselineEvents = cfg.Events
	}
	admin, err := openPool(ctx, url, 4)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	res := &DrainResult{Config: cfg, Delivery: "held: qstashtest (in process, a fresh server per drain) accepts every publish as QStash would and holds the messages (HoldDeliveries), " +
		"so the drain measures the publish path; delivery runs on QStash's machines, not the relay's"}

	rttRuns, err := rttRounds(ctx, admin, url, cfg, progress)
	if err != nil {
		res.Runs = append(res.Runs, rttRuns...)
		return res, err
	}
	rtts := make(map[int]DrainRun, len(rttRuns))
	for _, run := range rttRuns {
		rtts[run.RTTMillis] = run
	}
	baseline := func(relays, rtt int) error {
		run, err := drainOnce(ctx, admin, url, WayBaseline, cfg.BaselineBatch, relays, rtt, cfg.BaselineEvents, cfg.Keys, articleMaker(cfg.BaselineBatch))
		if err != nil {
			return err
		}
		res.Runs = append(res.Runs, run)
		report(progress, run)
		return nil
	}
	// The round-trip runs not yet in res.Runs (RTT 0 goes into the batch table when it can).
	rest := func() []DrainRun {
		var out []DrainRun
		for _, run := range rttRuns {
			if _, ok := rtts[run.RTTMillis]; ok {
				out = append(out, run)
			}
		}
		return out
	}
	for _, relays := range cfg.Relays {
		for _, batch := range cfg.Batches {
			for _, way := range []string{WayFloor, WayRelay} {
				if run, ok := rtts[0]; ok && way == WayRelay && relays == 1 && batch == cfg.RTTBatch {
					res.Runs = append(res.Runs, run)
					delete(rtts, 0)
					continue
				}
				var mk maker
				if way == WayFloor {
					mk = floorMaker(batch, relay.DefaultPublishConcurrency)
				} else {
					mk = relayMaker(batch)
				}
				run, err := drainOnce(ctx, admin, url, way, batch, relays, 0, cfg.Events, cfg.Keys, mk)
				if err != nil {
					res.Runs = append(res.Runs, rest()...)
					return res, err
				}
				res.Runs = append(res.Runs, run)
				report(progress, run)
			}
		}
		if err := baseline(relays, 0); err != nil {
			res.Runs = append(res.Runs, rest()...)
			return res, err
		}
	}
	// The claim's two shapes side by side, back to back on the same events.
	if cfg.RTTBatch > 0 {
		one, err := drainOnce(ctx, admin, url, WayFloorOneRun, cfg.RTTBatch, 1, 0, cfg.Events, cfg.Keys, floorMaker(cfg.RTTBatch, 1))
		if err != nil {
			res.Runs = append(res.Runs, rest()...)
			return res, err
		}
		res.Runs = append(res.Runs, one)
		report(progress, one)
		runs, err := drainOnce(ctx, admin, url, WayFloor, cfg.RTTBatch, 1, 0, cfg.Events, cfg.Keys, floorMaker(cfg.RTTBatch, relay.DefaultPublishConcurrency))
		if err != nil {
			res.Runs = append(res.Runs, rest()...)
			return res, err
		}
		runs.ClaimShape = "runs"
		res.Runs = append(res.Runs, runs)
		res.ClaimShapes = &ClaimShapes{OneRun: one, Runs: runs}
		report(progress, runs)
	}
	// The relay's round-trip runs (RTT 0 too when the batch table did not take it: RTTBatch
	// not among Batches, or no 1 among Relays), then the baseline at each non-zero round
	// trip, drained once: it is bound by the round trip.
	res.Runs = append(res.Runs, rest()...)
	for _, run := range rttRuns {
		if run.RTTMillis == 0 {
			continue
		}
		if err := baseline(1, run.RTTMillis); err != nil {
			return res, err
		}
	}
	return res, nil
}

// rttRounds drains with the relay at cfg.RTTBatch (1 relay) a round trip of each of
// cfg.RTTMillis away (0 always included, each once), cfg.RTTRounds times, and returns the
// median round of each with every round's rate, in that order. The round trips take turns
// (0, 10, 30, 80, 0, 10, ...): run back to back per round trip, the 30 ms rounds landed
// minutes after the 0 ms ones, and the machine's drift in between went straight into their
// ratio (0.93 and 0.74 in two runs an hour apart with nearly the same relay). On an error it
// returns the medians of the rounds that finished.
func rttRounds(ctx context.Context, admin *pgxpool.Pool, url string, cfg DrainConfig, progress func(string)) ([]DrainRun, error) {
	if cfg.RTTBatch <= 0 {
		return nil, nil
	}
	order := []int{0}
	for _, rtt := range cfg.RTTMillis {
		if !slices.Contains(order, rtt) {
			order = append(order, rtt)
		}
	}
	rounds := max(cfg.RTTRounds, 1)
	all := make(map[int][]DrainRun, len(order))
	medians := func() []DrainRun {
		var out []DrainRun
		for _, rtt := range order {
			if len(all[rtt]) == 0 {
				continue
			}
			m := all[rtt][0]
			if rounds > 1 {
				var rates []float64
				m, rates = median(all[rtt], func(r DrainRun) float64 { return r.EventsPerSec })
				m.Rounds = rates
			}
			out = append(out, m)
		}
		return out
	}
	for round := range rounds {
		for _, rtt := range order {
			run, err := drainOnce(ctx, admin, url, WayRelay, cfg.RTTBatch, 1, rtt, cfg.Events, cfg.Keys, relayMaker(cfg.RTTBatch))
			if err != nil {
				return medians(), err
			}
			if progress != nil && rounds > 1 {
				progress(fmt.Sprintf("  round %d of %d, rtt=%dms: %.0f events/s", round+1, rounds, rtt, run.EventsPerSec))
			}
			all[rtt] = append(all[rtt], run)
		}
	}
	out := medians()
	for _, m := range out {
		report(progress, m)
	}
	return out, nil
}

// A maker builds one relay's drainer over its pool, publishing through q.
type maker func(pool *pgxpool.Pool, q *sinkQStash) drainer

// relayMaker builds a relay (publish ordering, default concurrency).
func relayMaker(batch int) maker {
	return func(pool *pgxpool.Pool, q *sinkQStash) drainer {
		pub, err := newPublisher(q.URL, q.Token, q.SinkURL, false)
		if err != nil {
			panic(err) // constant, valid configuration
		}
		r, err := relay.New(pool, pub, relayConfig(batch, false))
		if err != nil {
			panic(err) // constant, valid configuration
		}
		return &relayDrainer{r: r}
	}
}

// articleMaker builds the article's relay.
func articleMaker(batch int) maker {
	return func(pool *pgxpool.Pool, q *sinkQStash) drainer {
		return newArticleRelay(pool, q.URL, q.Token, q.SinkURL, batch)
	}
}

// floorMaker builds the floor: the relay's claim with runs of up to keyRun per key, and
// its mark; it publishes nothing.
func floorMaker(batch, keyRun int) maker {
	return func(pool *pgxpool.Pool, _ *sinkQStash) drainer {
		return &floorDrainer{store: outboxstore.NewStore(pool), batch: batch, keyRun: keyRun}
	}
}

func report(progress func(string), r DrainRun) {
	if progress != nil {
		progress(fmt.Sprintf("drain %-8s batch=%-4d relays=%d rtt=%-3dms  %8.0f events/s  (%d events in %.2fs)",
			r.Way, r.Batch, r.Relays, r.RTTMillis, r.EventsPerSec, r.Events, r.Seconds))
	}
}

// drainer drains until its claim comes back short.
type drainer interface {
	drain(ctx context.Context) (drained, error)
}

type drained struct {
	dispatched, requests int
	// publish are sampled Publish latencies (relay only); claim and mark the floor's
	// statement latencies.
	publish, claim, mark []time.Duration
}

// drainOnce loads events, analyses, and times relays drainers (one pool each) until no row
// is pending.
func drainOnce(ctx context.Context, admin *pgxpool.Pool, url, way string, batch, relays, rttMillis, events, keys int, mk maker) (DrainRun, error) {
	run := DrainRun{Way: way, Batch: batch, Relays: relays, RTTMillis: rttMillis, Events: events}
	t0 := time.Now()
	if err := Reset(ctx, admin); err != nil {
		return run, err
	}
	if err := LoadRows(ctx, admin, Load{Run: runID("d"), Pending: events, Keys: keys}); err != nil {
		return run, err
	}
	if err := Analyze(ctx, admin); err != nil {
		return run, err
	}
	// Every drain starts right after a checkpoint. A 200,000-event drain writes about 400 MB
	// of WAL, so otherwise the checkpoint that the previous drains' WAL requests lands at a
	// different point of each drain, and its full-page images with it.
	if err := checkpoint(ctx, admin); err != nil {
		return run, err
	}
	run.LoadSeconds = round3(time.Since(t0).Seconds())

	// The relay's pool is the Lambda's: a claim, a mark per batch in flight, the gauge.
	poolSize := int32(4)
	switch way {
	case WayBaseline:
		poolSize = 10
	case WayRelay:
		poolSize = int32(2 + relay.DefaultPublishConcurrency)
	}
	// A local QStash of its own per drain, rttMillis away. Every load restarts the ids, and
	// the relay's deduplication id is derived from the id, so a server that had taken an
	// earlier drain (within its 10-minute window) answered most publishes as duplicates
	// without storing them: a cheaper path than a real QStash takes for new messages. It
	// would also keep holding every message it stored (HoldDeliveries) for the process's
	// garbage collector to mark.
	var q *sinkQStash
	if way == WayRelay || way == WayBaseline {
		q = startSinkQStash(time.Duration(rttMillis) * time.Millisecond)
		defer q.Close()
	}
	ds := make([]drainer, relays)
	for i := range ds {
		pool, err := openPool(ctx, url, poolSize)
		if err != nil {
			return run, err
		}
		defer pool.Close()
		ds[i] = mk(pool, q)
	}

	// The previous drain's garbage (its server's held messages among it) is collected
	// here, not during this drain's timing.
	runtime.GC()
	var publish, claim, mark []time.Duration
	wal0, err := walPosition(ctx, admin)
	if err != nil {
		return run, err
	}
	start := time.Now()
	for {
		var mu sync.Mutex
		err := concurrently(ds, func(d drainer) error {
			dd, err := d.drain(ctx)
			mu.Lock()
			defer mu.Unlock()
			run.Dispatched += dd.dispatched
			run.PublishRequests += dd.requests
			publish = append(publish, dd.publish...)
			claim = append(claim, dd.claim...)
			mark = append(mark, dd.mark...)
			return err
		})
		if err != nil {
			return run, fmt.Errorf("drain %s batch %d relays %d: %w", way, batch, relays, err)
		}
		// Concurrent relays each stop at their first short batch; a row another relay
		// released (or a race at the tail) is picked up by another round.
		left, err := pendingCount(ctx, admin)
		if err != nil {
			return run, err
		}
		if left == 0 {
			break
		}
		if ctx.Err() != nil {
			return run, ctx.Err()
		}
	}
	elapsed := time.Since(start)
	wal1, err := walPosition(ctx, admin)
	if err != nil {
		return run, err
	}
	run.WALBytesPerEvent = round3(float64(wal1-wal0) / float64(max(events, 1)))
	run.Seconds = round3(elapsed.Seconds())
	run.EventsPerSec = rate(run.Dispatched, elapsed)
	if len(publish) > 0 {
		run.PublishMillisMean = summarise(publish).Mean
	}
	if len(claim) > 0 {
		run.ClaimMillisMean, run.MarkMillisMean = summarise(claim).Mean, summarise(mark).Mean
	}
	if run.Dispatched != events {
		return run, fmt.Errorf("drain %s batch %d relays %d: dispatched %d of %d events", way, batch, relays, run.Dispatched, events)
	}
	// Every event must have cost the local QStash a new message, as it would a real one.
	if q != nil && q.Pending() != events {
		return run, fmt.Errorf("drain %s batch %d relays %d: the local QStash holds %d messages for %d events", way, batch, relays, q.Pending(), events)
	}
	return run, nil
}

type relayDrainer struct{ r *relay.Relay }

func (d *relayDrainer) drain(ctx context.Context) (drained, error) {
	st, err := d.r.Drain(ctx)
	if err == nil && (st.Retried > 0 || st.DeadLettered > 0) {
		err = fmt.Errorf("relay retried %d and dead-lettered %d events: the local QStash refused them", st.Retried, st.DeadLettered)
	}
	return drained{dispatched: st.Dispatched, requests: st.PublishCalls, publish: st.PublishLatency}, err
}

// floorDrainer is the relay's statements without the relay: claim, mark every id, repeat.
type floorDrainer struct {
	store  *outboxstore.Store
	batch  int
	keyRun int
}

func (d *floorDrainer) drain(ctx context.Context) (drained, error) {
	var out drained
	ids := make([]outbox.ID, 0, d.batch)
	for {
		lease, err := outboxstore.NewLease()
		if err != nil {
			return out, err
		}
		t0 := time.Now()
		claimed, err := d.store.Claim(ctx, outboxstore.ClaimRequest{Lease: lease, Rows: d.batch, KeyRun: d.keyRun, For: relay.DefaultLease})
		msgs, more := claimed.Messages, claimed.More
		out.claim = append(out.claim, time.Since(t0))
		if err != nil {
			return out, err
		}
		ids = ids[:0]
		for _, m := range msgs {
			ids = append(ids, m.ID)
		}
		t1 := time.Now()
		n, err := d.store.MarkDispatched(ctx, lease, ids, nil)
		out.mark = append(out.mark, time.Since(t1))
		if err != nil {
			return out, err
		}
		out.dispatched += int(n)
		if !more {
			return out, nil
		}
	}
}

// articleRelay is the article's relayBatch loop in Go: claim_outbox(50, '30 seconds'), then
// for every row at once (Promise.allSettled): publishJSON with retries 5, deduplicationId
// outbox-<id>, flow control key = partition key with parallelism 1 and the x-outbox-id
// header; then one UPDATE per row on a pool of 10. Repeat until a batch comes back short.
type articleRelay struct {
	pool          *pgxpool.Pool
	qstashURL     string
	token, dest   string
	batch         int
	client        *http.Client
	maxAttempts   int
	leaseInterval string
}

func newArticleRelay(pool *pgxpool.Pool, qstashURL, token, baseURL string, batch int) *articleRelay {
	return &articleRelay{
		pool: pool, qstashURL: qstashURL, token: token, dest: baseURL, batch: batch,
		// Node's fetch keeps sockets alive without a per-host idle cap; Go's default of two
		// idle connections per host would open a new socket for most of the 50 requests.
		client:      &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}, Timeout: 10 * time.Second},
		maxAttempts: 12, leaseInterval: "30 seconds",
	}
}

type articleRow struct {
	id       int64
	topic    string
	key      string
	payload  string
	headers  map[string]string
	attempts int
}

func (a *articleRelay) drain(ctx context.Context) (drained, error) {
	var d drained
	for {
		claimed, dispatched, err := a.relayBatch(ctx)
		d.dispatched += dispatched
		d.requests += claimed
		if err != nil || claimed < a.batch {
			return d, err
		}
	}
}

// relayBatch returns the rows it claimed (one publish request each) and marked dispatched.
func (a *articleRelay) relayBatch(ctx context.Context) (claimedRows, dispatched int, err error) {
	rows, err := a.pool.Query(ctx, qArticleClaim, a.batch, a.leaseInterval)
	if err != nil {
		return 0, 0, fmt.Errorf("article claim: %w", err)
	}
	var claimed []articleRow
	for rows.Next() {
		var r articleRow
		var headers []byte
		if err := rows.Scan(&r.id, &r.topic, &r.key, &r.payload, &headers, &r.attempts); err != nil {
			rows.Close()
			return 0, 0, fmt.Errorf("article claim: %w", err)
		}
		_ = json.Unmarshal(headers, &r.headers)
		claimed = append(claimed, r)
	}
	if err := rows.Err(); err != nil {
		return 0, 0, fmt.Errorf("article claim: %w", err)
	}
	var mu sync.Mutex
	err = concurrently(claimed, func(r articleRow) error {
		ok, err := a.handle(ctx, r)
		if ok {
			mu.Lock()
			dispatched++
			mu.Unlock()
		}
		return err
	})
	return len(claimed), dispatched, err
}

// concurrently calls fn for every item, each in a goroutine of its own, and returns their
// errors joined once all have returned.
func concurrently[T any](items []T, fn func(T) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(items))
	for i, item := range items {
		wg.Go(func() { errs[i] = fn(item) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// handle publishes one row and records its outcome, as the article's per-row closure does.
// ok reports a dispatched row; err only a database failure (the article logs and moves on
// for publish failures, retrying them by backoff).
func (a *articleRelay) handle(ctx context.Context, r articleRow) (ok bool, err error) {
	perr := a.publish(ctx, r)
	if perr == nil {
		if _, err := a.pool.Exec(ctx, qArticleMark, r.id); err != nil {
			return false, fmt.Errorf("article mark: %w", err)
		}
		return true, nil
	}
	if r.attempts >= a.maxAttempts {
		_, err = a.pool.Exec(ctx, qArticleDeadLetter, r.id, perr.Error())
	} else {
		backoff := max(1, int(rand.Float64()*float64(min(30<<min(r.attempts, 20), 3600))))
		_, err = a.pool.Exec(ctx, qArticleRetry, r.id, strconv.Itoa(backoff), perr.Error())
	}
	if err != nil {
		return false, fmt.Errorf("article record failure: %w", err)
	}
	return false, fmt.Errorf("article publish of row %d: %w", r.id, perr)
}

func (a *articleRelay) publish(ctx context.Context, r articleRow) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		a.qstashURL+"/v2/publish/"+a.dest+"/events/"+r.topic, strings.NewReader(r.payload))
	if err != nil {
		return err
	}
	h := req.Header
	h.Set("Authorization", "Bearer "+a.token)
	h.Set("Content-Type", "application/json")
	h.Set("Upstash-Method", "POST")
	h.Set("Upstash-Retries", "5")
	h.Set("Upstash-Deduplication-Id", "outbox-"+strconv.FormatInt(r.id, 10))
	h.Set("Upstash-Flow-Control-Key", r.key)
	h.Set("Upstash-Flow-Control-Value", "parallelism=1")
	for k, v := range r.headers {
		h.Set("Upstash-Forward-"+k, v)
	}
	h.Set("Upstash-Forward-X-Outbox-Id", strconv.FormatInt(r.id, 10))
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("qstash answered %d: %s", resp.StatusCode, body)
	}
	var out struct {
		MessageID string `json:"messageId"`
	}
	if err := json.Unmarshal(body, &out); err != nil || out.MessageID == "" {
		return fmt.Errorf("qstash answered %d without a message id: %s", resp.StatusCode, body)
	}
	return nil
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
