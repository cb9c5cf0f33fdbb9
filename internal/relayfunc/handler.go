package relayfunc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/awsenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/health"
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics/relaymetrics"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/retention"
)

// handler runs one invocation. pub nil means the QStash publisher from cfg.
type handler struct {
	pool      *pgxpool.Pool
	relay     *relay.Relay
	retention retention.Config
	dlqSync   deadletter.SyncConfig
	// idleGap: a drain waits this long for more events before it returns (relay.DrainIdle).
	idleGap time.Duration
	// seen: every event committed before it was claimed by an invocation of this
	// environment (the last idle claim's start); a kick sent before it needs no drain.
	seen    time.Time
	emf     *metrics.EMF
	log     *slog.Logger
	reserve time.Duration
	// ensureQueues, in FIFO ordering, sets up and checks the QStash queues; it runs before
	// the first drain of a cold start and again until it succeeds.
	ensureQueues func(context.Context) error
	queuesReady  bool
	creds        *awsenv.Credentials
}

func newHandler(cfg Env, pool *pgxpool.Pool, pub relay.Publisher, metricsOut io.Writer, logger *slog.Logger) (*handler, error) {
	var ensure func(context.Context) error
	// The publisher and its DLQ calls share one client and one token (cfg.Publisher.Tokens,
	// re-read when QStash refuses it), so both carry on after a rotation.
	qp, err := qstash.NewPublisher(cfg.Publisher)
	if err != nil {
		return nil, err
	}
	if pub == nil {
		pub, ensure = qp, qp.EnsureQueues
	}
	rc := cfg.Relay
	rc.Logger = logger
	rc.Tracer = cfg.Tracer
	r, err := relay.New(pool, pub, rc)
	if err != nil {
		return nil, err
	}
	ret := cfg.Retention
	ret.Logger = logger
	return &handler{
		pool:      pool,
		relay:     r,
		retention: ret,
		idleGap:   cfg.IdleGap,
		emf:       metrics.NewEMF(metricsOut, metrics.EMFConfig{Namespace: cfg.MetricsNamespace}),
		log:       logger,
		reserve:   DeadlineReserve,
		dlqSync: deadletter.SyncConfig{
			DLQ:                qp.DLQ(),
			DestinationBaseURL: cfg.Publisher.DestinationBaseURL,
			Name:               cfg.Publisher.Name,
			QueuePrefix:        cfg.Publisher.QueuePrefix,
			Logger:             logger,
		},

		ensureQueues: ensure,
		creds:        cfg.Credentials,
	}, nil
}

// Tasks.
const (
	taskDrain = "drain"
	// taskKick is a producer's kick after its commit (package kick): a drain that stays
	// the idle gap from its start.
	taskKick      = "kick"
	taskRetention = "retention"
	taskDLQSync   = "dlq-sync"
)

// request is the invocation payload. Unknown fields (an EventBridge envelope, a Scheduler
// placeholder such as scheduledTime) are ignored; no task means drain.
type request struct {
	Task string `json:"task"`
	// SentAt is when a kick was sent (the producer's clock), after its commit.
	SentAt time.Time `json:"sent_at"`
}

// kickClockSkew is how far a producer's clock may run behind the relay's before a kick
// could be answered from seen wrongly: its SentAt would read earlier than the commit
// really was, and the event would wait for the next kick or tick (never be lost). Lambda
// and EC2 hosts keep time through the Amazon Time Sync Service, well within a millisecond.
const kickClockSkew = 200 * time.Millisecond

// result is the invocation's response: the counts of what it did. The drain's counts are
// members named as in relay.Stats.Counts, right after task, each when it is not zero
// (MarshalJSON).
type result struct {
	Task string `json:"task"`
	// Coalesced: a kick answered without a drain, its commit already claimed by an earlier
	// invocation of this environment.
	Coalesced bool `json:"coalesced,omitempty"`
	// Drain is what the drain task did.
	Drain relay.Stats `json:"-"`
	// RetentionBatches is the retention task's delete statements; a drain's batches are
	// in Drain.
	RetentionBatches  int    `json:"batches,omitempty"`
	StoppedAtDeadline bool   `json:"stopped_at_deadline,omitempty"`
	BacklogPending    *int64 `json:"backlog_pending,omitempty"`
	// OldestPendingAge is the lateness (health.BacklogGauge.Lateness), OldestCreatedAge
	// the oldest pending row's age from its creation.
	OldestPendingAge float64 `json:"oldest_pending_age_seconds,omitempty"`
	OldestCreatedAge float64 `json:"oldest_created_age_seconds,omitempty"`
	OutboxDeleted    int64   `json:"outbox_deleted,omitempty"`
	ProcessedDeleted int64   `json:"processed_deleted,omitempty"`
	Complete         *bool   `json:"complete,omitempty"`
	// DLQSync is the dlq-sync task's counts.
	DLQSync    *deadletter.SyncResult `json:"dlq_sync,omitempty"`
	DurationMS int64                  `json:"duration_ms"`
}

// MarshalJSON writes r's members with the drain's non-zero counts after task.
func (r result) MarshalJSON() ([]byte, error) {
	type members result // without this method, so Marshal does not come back here
	rest, err := json.Marshal(members(r))
	if err != nil {
		return nil, err
	}
	task, err := json.Marshal(r.Task)
	if err != nil {
		return nil, err
	}
	// rest is {"task":<task>,...}: duration_ms is always there, so a comma follows task.
	split := len(`{"task":`) + len(task)
	b := append(make([]byte, 0, len(rest)+256), rest[:split]...)
	for name, n := range r.Drain.Counts() {
		if n != 0 {
			b = fmt.Appendf(b, `,%q:%d`, name, n) // the names are plain snake_case: %q is JSON
		}
	}
	return append(b, rest[split:]...), nil
}

func parseTask(payload json.RawMessage) (request, error) {
	trimmed := bytes.TrimSpace(payload)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return request{Task: taskDrain}, nil
	}
	if trimmed[0] != '{' {
		return request{}, fmt.Errorf(`decode relay payload: want a JSON object such as {"task":"drain"}, got %.40s`, trimmed)
	}
	var req request
	if err := json.Unmarshal(trimmed, &req); err != nil {
		return request{}, fmt.Errorf(`decode relay payload: %w (want {"task":"drain"}, {"task":"kick"}, {"task":"retention"} or {"task":"dlq-sync"})`, err)
	}
	switch req.Task {
	case "":
		req.Task = taskDrain
		return req, nil
	case taskDrain, taskKick, taskRetention, taskDLQSync:
		return req, nil
	}
	return request{}, fmt.Errorf("unknown relay task %q: want %q, %q, %q or %q", req.Task, taskDrain, taskKick, taskRetention, taskDLQSync)
}

// handle runs the task named by payload under ctx (the Lambda deadline) minus the reserve.
func (h *handler) handle(ctx context.Context, payload json.RawMessage) (result, error) {
	start := time.Now()
	req, err := parseTask(payload)
	if err != nil {
		h.log.ErrorContext(ctx, "reject relay invocation", slog.Any("error", err))
		return result{}, err
	}
	if req.Task == taskKick && h.covers(req.SentAt) {
		// Kicks that Lambda queued while this environment drained (throttled, retried)
		// cost no database session.
		h.log.DebugContext(ctx, "relay kick coalesced", slog.Time("sent_at", req.SentAt), slog.Time("seen", h.seen))
		return result{Task: taskKick, Coalesced: true, DurationMS: time.Since(start).Milliseconds()}, nil
	}
	// No session outlives the invocation: an idle stack holds no connection (Aurora
	// Serverless v2 can pause), and the next invocation reconnects.
	defer h.closeSessions()
	// The pool re-reads a rotated database secret at the first connection the server
	// refuses (awsenv.Credentials), wherever it is opened, and the relay's statements retry
	// once; Ready makes sure the invocation starts with a connection that works. A failure
	// is not fatal here: the task meets it and reports it.
	if err := h.creds.Ready(ctx, h.pool); err != nil {
		h.log.WarnContext(ctx, "database not ready", slog.Any("error", err))
	}
	work := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		work, cancel = context.WithDeadline(ctx, dl.Add(-h.reserve))
		defer cancel()
	}
	switch req.Task {
	case taskRetention:
		return h.runRetention(ctx, work, start)
	case taskDLQSync:
		return h.runDLQSync(work, start)
	default:
		return h.runDrain(ctx, work, start, req.Task)
	}
}

// covers reports whether an earlier invocation of this environment claimed every event
// committed before a kick sent at sentAt.
func (h *handler) covers(sentAt time.Time) bool {
	return !sentAt.IsZero() && !h.seen.IsZero() && sentAt.Add(kickClockSkew).Before(h.seen)
}

// closeSessions closes the pool's sessions, idle ones at once, any still in use when
// released; the pool reconnects on the next acquire.
func (h *handler) closeSessions() {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	for _, c := range h.pool.AcquireAllIdle(ctx) {
		// Hijacked, the session leaves the pool; Close sends Terminate and waits for it.
		_ = c.Hijack().Close(ctx)
	}
	h.pool.Reset()
}

// closeTimeout bounds closing the sessions: a Terminate message and a socket close each.
const closeTimeout = time.Second

func (h *handler) runDrain(ctx, work context.Context, start time.Time, task string) (result, error) {
	if h.ensureQueues != nil && !h.queuesReady {
		// A FIFO queue that is missing, paused or not at parallelism 1 would break per-key
		// order or hold events: nothing is claimed until the queues are right.
		if err := h.ensureQueues(work); err != nil {
			err = fmt.Errorf("check qstash fifo queues: %w", err)
			h.log.ErrorContext(ctx, "refuse to drain", slog.Any("error", err))
			return result{Task: task, DurationMS: time.Since(start).Milliseconds()}, err
		}
		h.queuesReady = true
	}
	// A kick stays the gap from its start (producers that kicked within it rely on it);
	// a scheduled tick that finds nothing returns at once. Both stop claiming
	// DeadlineMargin before work's deadline.
	from := relay.IdleFromEvents
	if task == taskKick {
		from = relay.IdleFromStart
	}
	// DrainAwake tells producers' kickers that a claim is coming while it drains, so they
	// skip their invokes (migration 0022).
	st, seen, err := h.relay.DrainAwake(work, h.idleGap, from)
	if seen.After(h.seen) {
		h.seen = seen
	}
	res := result{Task: task, Drain: st, StoppedAtDeadline: st.StoppedAtDeadline}
	values := relaymetrics.Values(st)
	// The gauge runs in the reserve, under the real deadline, even when the drain failed:
	// an alarm on the oldest pending age must see the backlog grow while publishing fails.
	timeout := gaugeTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl)-h.reserve/4)
	}
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(timeout, 0))
	g, gerr := health.Backlog(gctx, h.pool)
	cancel()
	if gerr == nil {
		values = append(values, metrics.Backlog(g.Pending, g.Lateness, g.OldestCreatedAge, g.OpenCircuits)...)
		res.BacklogPending, res.OldestPendingAge, res.OldestCreatedAge = &g.Pending, g.Lateness.Seconds(), g.OldestCreatedAge.Seconds()
	} else {
		h.log.WarnContext(ctx, "backlog gauge skipped", slog.Any("error", gerr))
	}
	if merr := h.emf.Record(metrics.Event{Function: metrics.FunctionRelay, Values: values}); merr != nil {
		h.log.ErrorContext(ctx, "write relay metrics", slog.Any("error", merr))
	}
	res.DurationMS = time.Since(start).Milliseconds()
	if err != nil {
		h.log.ErrorContext(ctx, "relay drain", slog.Any("error", err), slog.Any("stats", st))
		return res, fmt.Errorf("drain outbox: %w", err)
	}
	h.log.InfoContext(ctx, "relay drain", slog.String("task", task), slog.Any("stats", st), slog.Int64("backlog_pending", g.Pending),
		slog.Float64("oldest_pending_age_seconds", g.Lateness.Seconds()), slog.Float64("oldest_created_age_seconds", g.OldestCreatedAge.Seconds()))
	return res, nil
}

func (h *handler) runRetention(_, work context.Context, start time.Time) (result, error) {
	r, err := retention.Run(work, h.pool, h.retention)
	if merr := h.emf.Record(metrics.Event{Function: metrics.FunctionRelay, Values: metrics.Retention(r.OutboxDeleted, r.ProcessedDeleted)}); merr != nil {
		h.log.ErrorContext(work, "write retention metrics", slog.Any("error", merr))
	}
	complete := r.Complete
	res := result{Task: taskRetention, OutboxDeleted: r.OutboxDeleted, ProcessedDeleted: r.ProcessedDeleted,
		RetentionBatches: r.Batches, Complete: &complete, DurationMS: time.Since(start).Milliseconds()}
	if err != nil {
		return res, fmt.Errorf("run retention: %w", err)
	}
	return res, nil
}

// runDLQSync records QStash DLQ entries of this outbox that dead_letters lacks (their
// failure callback was not configured or failed), so every dead letter is in one table.
func (h *handler) runDLQSync(work context.Context, start time.Time) (result, error) {
	r, err := deadletter.Sync(work, h.pool, h.dlqSync)
	if merr := h.emf.Record(metrics.Event{Function: metrics.FunctionRelay, Values: []metrics.Value{metrics.Count(metrics.DLQSyncRecorded, int64(r.Recorded))}}); merr != nil {
		h.log.ErrorContext(work, "write dlq sync metrics", slog.Any("error", merr))
	}
	res := result{Task: taskDLQSync, DLQSync: &r, DurationMS: time.Since(start).Milliseconds()}
	if err != nil {
		return res, fmt.Errorf("sync qstash dlq: %w", err)
	}
	return res, nil
}
