// Command relay is the scheduled relay Lambda: each invocation drains the outbox through
// QStash ({"task":"drain"}, also what an EventBridge envelope without Input means), runs
// retention ({"task":"retention"}), or records QStash DLQ entries missing from dead_letters
// ({"task":"dlq-sync"}), writes one EMF metrics line, and returns its counts.
//
// Environment: see package relayenv (DATABASE_URL, QSTASH_TOKEN, PUBLIC_BASE_URL
// required; QSTASH_URL, FAILURE_CALLBACK_URL, QSTASH_RETRIES, ORDERING, FIFO_QUEUES,
// FLOW_CONTROL_PARALLELISM, FLOW_CONTROL_RATE, FLOW_CONTROL_PERIOD, BATCH_SIZE, PUBLISH_CONCURRENCY, LEASE,
// PUBLISH_TIMEOUT, MAX_ATTEMPTS, BACKOFF_BASE, BACKOFF_MAX, LINGER, OUTBOX_RETENTION,
// DEDUPE_TTL, METRICS_NAMESPACE, LOG_LEVEL optional); tracing: the standard OTEL_* variables
// (package telemetry; off unless an OTLP exporter is configured).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/internal/awsenv"
	"github.com/outbox-relay/outbox-relay/internal/envconfig/relayenv"
	"github.com/outbox-relay/outbox-relay/internal/health"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/metrics/relaymetrics"
	"github.com/outbox-relay/outbox-relay/internal/telemetry"
	"github.com/outbox-relay/outbox-relay/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/pkg/relay"
	"github.com/outbox-relay/outbox-relay/pkg/retention"
)

const (
	// baseConns: one environment runs one invocation at a time. The drain claims on one
	// connection and marks each batch in flight (PUBLISH_CONCURRENCY) on its own; the
	// backlog gauge uses one more; linger adds the LISTEN session.
	baseConns = 2
	// deadlineReserve is kept back from the Lambda deadline: the runtime is killed at the
	// deadline itself, so the metrics line and the response must be out before it.
	deadlineReserve = 2 * time.Second
	// gaugeTimeout bounds the backlog query run after the drain, inside the reserve.
	gaugeTimeout = 1500 * time.Millisecond
)

type config struct {
	relayenv.Config
	// creds re-reads the database secret when the server refuses the password (a rotation);
	// nil with a plain DATABASE_URL.
	creds *awsenv.Credentials
	// tracer is telemetry.Setup's (OTEL_* variables); nil when tracing is off.
	tracer trace.Tracer
	// rereadToken reads QSTASH_TOKEN again from QSTASH_TOKEN_PARAM when QStash refuses it
	// (a rotation); nil with a plain QSTASH_TOKEN.
	rereadToken func(context.Context) (string, error)
}

// loadConfig reads the environment through getenv and reports every missing or invalid
// variable at once.
func loadConfig(getenv func(string) string) (config, error) {
	c, err := relayenv.Read(getenv)
	return config{Config: c}, err
}

func main() {
	// The memory limit first, before anything is allocated: the Lambda kills a relay over
	// its memory size before it marks what it published.
	limit, err := memoryLimit(os.Getenv)
	if err != nil {
		slog.New(slog.NewJSONHandler(os.Stdout, nil)).Error("set memory limit", slog.Any("error", err))
		os.Exit(1)
	}
	if limit > 0 {
		debug.SetMemoryLimit(limit)
	}
	// Secrets named by DB_SECRET_ARN and *_PARAM are fetched once per cold start.
	getenv, err := awsenv.Resolve(context.Background(), os.Getenv)
	if err != nil {
		slog.New(slog.NewJSONHandler(os.Stdout, nil)).Error("resolve secrets", slog.Any("error", err))
		os.Exit(1)
	}
	cfg, err := loadConfig(getenv)
	if read := (awsenv.Resolver{}).DatabaseURLReader(os.Getenv); read != nil {
		cfg.creds = awsenv.NewCredentials(read)
	}
	cfg.rereadToken = (awsenv.Resolver{}).ParameterReader(os.Getenv, "QSTASH_TOKEN")
	logger := slog.New(telemetry.LogHandler(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: cfg.LogLevel})))
	if err == nil {
		err = checkTimeout(getenv, cfg.Relay.DeadlineMargin)
	}
	if err != nil {
		logger.Error("load relay config", slog.Any("error", err))
		os.Exit(1)
	}
	// Tracing is on when the OTEL_* variables name an exporter (the ADOT layer's collector).
	tel, err := telemetry.Setup(context.Background(), getenv, "outbox-relay")
	if err != nil {
		logger.Error("set up tracing", slog.Any("error", err))
		os.Exit(1)
	}
	defer tel.Shutdown(context.Background())
	cfg.tracer = tel.Tracer()
	pool, err := newPool(context.Background(), cfg, logger)
	if err != nil {
		logger.Error("start relay", slog.Any("error", err))
		os.Exit(1)
	}
	defer pool.Close()
	h, err := newHandler(cfg, pool, nil, os.Stdout, logger)
	if err != nil {
		logger.Error("start relay", slog.Any("error", err))
		os.Exit(1)
	}
	// The batch spans leave before the invocation returns: the environment may be frozen
	// right after.
	lambda.Start(telemetry.FlushAfter(tel, logger, h.handle))
}

// checkTimeout refuses, at cold start, a function timeout that leaves the drain no time:
// Drain claims no batch with less than margin (publish + mark timeout) left before the
// deadline, and the handler keeps deadlineReserve of it back, so such a relay would claim
// nothing on every tick, silently. The timeout is FUNCTION_TIMEOUT (seconds; the template
// sets it from RelayTimeout), else AWS_LAMBDA_FUNCTION_TIMEOUT (set by the emulator and sam
// local); with neither it is unknown and not checked.
func checkTimeout(getenv func(string) string, margin time.Duration) error {
	name, v := "FUNCTION_TIMEOUT", getenv("FUNCTION_TIMEOUT")
	if v == "" {
		name, v = "AWS_LAMBDA_FUNCTION_TIMEOUT", getenv("AWS_LAMBDA_FUNCTION_TIMEOUT")
	}
	if v == "" {
		return nil
	}
	secs, err := strconv.Atoi(v)
	if err != nil || secs <= 0 {
		return fmt.Errorf("%s %q must be the function timeout in whole seconds", name, v)
	}
	timeout := time.Duration(secs) * time.Second
	if left := timeout - deadlineReserve; left < margin {
		return fmt.Errorf("relay function timeout %v (%s) leaves %v after the %v reserve, less than the drain's deadline margin %v "+
			"(PUBLISH_TIMEOUT + mark timeout): no batch would ever be claimed; raise the timeout (RelayTimeout) to at least %v or lower PUBLISH_TIMEOUT",
			timeout, name, left, deadlineReserve, margin, (margin + deadlineReserve).Round(time.Second))
	}
	return nil
}

// newPool opens the pool once per cold start.
func newPool(ctx context.Context, cfg config, logger *slog.Logger) (*pgxpool.Pool, error) {
	conns := int32(baseConns + cfg.Relay.PublishConcurrency)
	if cfg.Linger > 0 {
		conns++
	}
	return awsenv.NewPool(ctx, cfg.DatabaseURL, awsenv.PoolConfig{MaxConns: conns, Logger: logger, Credentials: cfg.creds})
}

// handler runs one invocation. pub nil means the QStash publisher from cfg.
type handler struct {
	pool      *pgxpool.Pool
	relay     *relay.Relay
	retention retention.Config
	dlqSync   deadletter.SyncConfig
	linger    time.Duration
	emf       *metrics.EMF
	log       *slog.Logger
	reserve   time.Duration
	// ensureQueues, in FIFO ordering, sets up and checks the QStash queues; it runs before
	// the first drain of a cold start and again until it succeeds.
	ensureQueues func(context.Context) error
	queuesReady  bool
	creds        *awsenv.Credentials
}

func newHandler(cfg config, pool *pgxpool.Pool, pub relay.Publisher, metricsOut io.Writer, logger *slog.Logger) (*handler, error) {
	var ensure func(context.Context) error
	// The token is re-read once when QStash refuses it (QSTASH_TOKEN_PARAM); the publisher
	// and its DLQ calls share one client, so both carry on with the new one.
	cfg.Publisher.Tokens = qstash.NewToken(cfg.Publisher.Token, cfg.rereadToken)
	qp, err := qstash.NewPublisher(cfg.Publisher)
	if err != nil {
		return nil, err
	}
	if pub == nil {
		pub, ensure = qp, qp.EnsureQueues
	}
	rc := cfg.Relay
	rc.Logger = logger
	rc.Tracer = cfg.tracer
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
		linger:    cfg.Linger,
		emf:       metrics.NewEMF(metricsOut, metrics.EMFConfig{Namespace: cfg.MetricsNamespace}),
		log:       logger,
		reserve:   deadlineReserve,
		dlqSync: deadletter.SyncConfig{
			DLQ:                qp.DLQ(),
			DestinationBaseURL: cfg.Publisher.DestinationBaseURL,
			Name:               cfg.Publisher.Name,
			QueuePrefix:        cfg.Publisher.QueuePrefix,
			Logger:             logger,
		},

		ensureQueues: ensure,
		creds:        cfg.creds,
	}, nil
}

// Tasks.
const (
	taskDrain     = "drain"
	taskRetention = "retention"
	taskDLQSync   = "dlq-sync"
)

// request is the invocation payload. Unknown fields (an EventBridge envelope, a Scheduler
// placeholder such as scheduledTime) are ignored; no task means drain.
type request struct {
	Task string `json:"task"`
}

// result is the invocation's response: the counts of what it did. The drain's counts are
// members named as in relay.Stats.Counts, right after task, each when it is not zero
// (MarshalJSON).
type result struct {
	Task string `json:"task"`
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

func parseTask(payload json.RawMessage) (string, error) {
	trimmed := bytes.TrimSpace(payload)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return taskDrain, nil
	}
	if trimmed[0] != '{' {
		return "", fmt.Errorf(`decode relay payload: want a JSON object such as {"task":"drain"}, got %.40s`, trimmed)
	}
	var req request
	if err := json.Unmarshal(trimmed, &req); err != nil {
		return "", fmt.Errorf(`decode relay payload: %w (want {"task":"drain"}, {"task":"retention"} or {"task":"dlq-sync"})`, err)
	}
	switch req.Task {
	case "", taskDrain:
		return taskDrain, nil
	case taskRetention, taskDLQSync:
		return req.Task, nil
	}
	return "", fmt.Errorf("unknown relay task %q: want %q, %q or %q", req.Task, taskDrain, taskRetention, taskDLQSync)
}

// handle runs the task named by payload under ctx (the Lambda deadline) minus the reserve.
func (h *handler) handle(ctx context.Context, payload json.RawMessage) (result, error) {
	start := time.Now()
	task, err := parseTask(payload)
	if err != nil {
		h.log.ErrorContext(ctx, "reject relay invocation", slog.Any("error", err))
		return result{}, err
	}
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
	switch task {
	case taskRetention:
		return h.runRetention(ctx, work, start)
	case taskDLQSync:
		return h.runDLQSync(work, start)
	default:
		return h.runDrain(ctx, work, start)
	}
}

func (h *handler) runDrain(ctx, work context.Context, start time.Time) (result, error) {
	if h.ensureQueues != nil && !h.queuesReady {
		// A FIFO queue that is missing, paused or not at parallelism 1 would break per-key
		// order or hold events: nothing is claimed until the queues are right.
		if err := h.ensureQueues(work); err != nil {
			err = fmt.Errorf("check qstash fifo queues: %w", err)
			h.log.ErrorContext(ctx, "refuse to drain", slog.Any("error", err))
			return result{Task: taskDrain, DurationMS: time.Since(start).Milliseconds()}, err
		}
		h.queuesReady = true
	}
	var st relay.Stats
	var err error
	if h.linger > 0 {
		// Linger itself stops claiming DeadlineMargin before work's deadline.
		st, err = h.relay.Linger(work, start.Add(h.linger))
	} else {
		st, err = h.relay.Drain(work)
	}
	res := result{Task: taskDrain, Drain: st, StoppedAtDeadline: st.StoppedAtDeadline}
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
		values = append(values, metrics.Backlog(g.Pending, g.Lateness, g.OldestCreatedAge)...)
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
	h.log.InfoContext(ctx, "relay drain", slog.Any("stats", st), slog.Int64("backlog_pending", g.Pending),
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
