// Package relayenv reads the relay's configuration from the environment, for the relay
// Lambda and `outboxctl relay`, with envconfig's Reader (every problem at once, each a
// *envconfig.VarError naming its variable).
//
// Every variable read here, its default and meaning, is described in package envdoc
// (`outboxctl env`, docs/configuration.md); its tests fail when the two part.
package relayenv

import (
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/retention"
)

// Config is the relay's configuration, defaults applied.
type Config struct {
	DatabaseURL string
	Relay       relay.Config
	Publisher   qstash.PublisherConfig
	// IdleGap: an invocation keeps draining while events keep arriving and returns once
	// this long has passed with none (relay.DrainIdle); 0 drains once and returns.
	IdleGap          time.Duration
	Retention        retention.Config
	MetricsNamespace string
	LogLevel         slog.Level
}

// Read reads the relay's configuration through getenv and reports every missing or
// invalid variable at once, then every inconsistency between them (a lease not above the
// publish timeout, a DEDUPE_TTL inside the retry horizon, ...), each naming its variable.
func Read(getenv func(string) string) (Config, error) {
	r := envconfig.NewReader(getenv)
	c := Config{DatabaseURL: r.DatabaseURL(), MetricsNamespace: r.Get("METRICS_NAMESPACE")}
	if c.MetricsNamespace == "" {
		c.MetricsNamespace = metrics.DefaultNamespace
	}

	pub := readPublisher(r)
	rc := readRelay(r)
	c.Relay = rc.WithDefaults()
	pub.RequestTimeout = c.Relay.PublishTimeout
	c.Publisher = pub.WithDefaults()
	// ORDERING is one setting of both: the relay hands batches to the publisher as its
	// queue orders them (also when a test injects another publisher).
	c.Relay.Ordering = c.Publisher.Ordering

	c.IdleGap = DefaultIdleGap
	if d, ok := r.Duration("IDLE_GAP"); ok {
		c.IdleGap = d
	}
	if c.IdleGap > maxIdleGap {
		r.Fail("IDLE_GAP", "%v is longer than %v: a relay that waits that long for events holds a database session for nothing; the schedule and the producers' kicks wake it", c.IdleGap, maxIdleGap)
	}
	ret := retention.Config{}
	ret.OutboxRetention, _ = r.Duration("OUTBOX_RETENTION", "OutboxRetention")
	ret.DedupeTTL, _ = r.Duration("DEDUPE_TTL", "DedupeTTL")
	c.Retention = ret.WithDefaults()
	c.LogLevel = r.LogLevel()

	check(r, c)
	return c, r.Err()
}

// readPublisher reads the publisher's variables.
func readPublisher(r *envconfig.Reader) qstash.PublisherConfig {
	pub := qstash.PublisherConfig{
		BaseURL:            r.Str("QSTASH_URL", "BaseURL"),
		Token:              r.Required("QSTASH_TOKEN", "Upstash console, QStash, Request builder", "Token"),
		DestinationBaseURL: r.Required("PUBLIC_BASE_URL", "the webhook's base URL, e.g. its Function URL; events go to <base>/events/<topic>", "DestinationBaseURL"),
		// Read as the failure function reads the same variable, so a URL it would refuse at
		// its cold start stops the relay first.
		FailureCallbackURL: r.AbsoluteURL("FAILURE_CALLBACK_URL", "https://abc.lambda-url.eu-west-1.on.aws/", "FailureCallbackURL"),
		Name:               r.Str("OUTBOX_NAME", "Name", "QueuePrefix"),
		Plan:               qstash.Plan(strings.ToLower(r.Str("QSTASH_PLAN", "Plan"))),
	}
	switch v := r.Str("ORDERING", "Ordering"); publish.Ordering(strings.ToLower(v)) {
	case "":
	case publish.OrderingPublish, publish.OrderingFIFO:
		pub.Ordering = publish.Ordering(strings.ToLower(v))
	default:
		r.Fail("ORDERING", "%q must be publish or fifo", v)
	}
	if n, ok := r.Int("QSTASH_RETRIES", 0, 100, "Retries"); ok {
		pub.Retries = n
		if n == 0 {
			pub.Retries = qstash.NoRetries
		}
	}
	pub.RetryDelay, _ = r.Duration("QSTASH_RETRY_DELAY", "RetryDelay")
	pub.FIFOQueues, _ = r.Int("FIFO_QUEUES", 1, 1000, "FIFOQueues")
	if n, ok := r.Int("QSTASH_MAX_MESSAGE_BYTES", 1, qstash.MaxRequestBytes, "MaxMessageBytes"); ok {
		pub.MaxMessageBytes = int64(n)
	}
	if n, ok := r.Int("QSTASH_MAX_REQUEST_BYTES", qstash.MinRequestBytes, qstash.MaxRequestBytes, "MaxRequestBytes"); ok {
		pub.MaxRequestBytes = int64(n)
	}
	pub.FlowControlParallelism, _ = r.Int("FLOW_CONTROL_PARALLELISM", 1, 1_000_000, "FlowControlParallelism")
	pub.FlowControlRate, _ = r.Int("FLOW_CONTROL_RATE", 1, 1_000_000, "FlowControlRate")
	pub.FlowControlPeriod, _ = r.Duration("FLOW_CONTROL_PERIOD", "FlowControlPeriod")
	return pub
}

// readRelay reads the relay engine's variables.
func readRelay(r *envconfig.Reader) relay.Config {
	rc := relay.Config{}
	rc.BatchSize, _ = r.Int("BATCH_SIZE", 1, relay.MaxBatchSize, "BatchSize")
	rc.PublishConcurrency, _ = r.Int("PUBLISH_CONCURRENCY", 1, relay.MaxPublishConcurrency, "PublishConcurrency")
	if n, ok := r.Int("BATCH_BYTES", 1, maxBudgetBytes, "MaxBatchBytes"); ok {
		rc.MaxBatchBytes = int64(n)
	}
	if n, ok := r.Int("IN_FLIGHT_BYTES", 1, maxBudgetBytes, "MaxInFlightBytes"); ok {
		rc.MaxInFlightBytes = int64(n)
	} else if r.Get("IN_FLIGHT_BYTES") == "" {
		rc.MaxInFlightBytes = inFlightForMemory(r)
	}
	rc.Lease, _ = r.Duration("LEASE", "Lease")
	rc.PublishTimeout, _ = r.Duration("PUBLISH_TIMEOUT", "PublishTimeout", "RequestTimeout", "DeadlineMargin")
	rc.MaxAttempts, _ = r.Int("MAX_ATTEMPTS", 1, 1000, "MaxAttempts")
	rc.BackoffBase, _ = r.Duration("BACKOFF_BASE", "BackoffBase")
	rc.BackoffMax, _ = r.Duration("BACKOFF_MAX", "BackoffMax")
	return rc
}

// check reports the inconsistencies between c's parts, after every variable is read.
func check(r *envconfig.Reader, c Config) {
	// Consistency, from the libraries' own rules; a missing variable was reported above
	// and is not reported again.
	r.Check(c.Relay.Validate())
	pub := c.Publisher
	if pub.Tokens == nil {
		// Validate reads the token source, which WithDefaults makes only from a token.
		pub.Tokens = qstash.NewToken("unset", nil)
	}
	if pub.DestinationBaseURL == "" {
		pub.DestinationBaseURL = "https://unset.invalid"
	}
	r.Check(pub.Validate())
	r.Check(c.Retention.Validate())
	retries := max(c.Publisher.Retries, 0)
	if limits, err := c.Publisher.Plan.Limits(); err == nil && retries > limits.MaxRetries {
		r.Fail("QSTASH_RETRIES", "%d is more than the %d retries QStash's %s plan allows (QSTASH_PLAN); QStash would refuse every message", retries, limits.MaxRetries, c.Publisher.Plan)
	}
	r.Check(retention.ValidateDedupeTTL(c.Retention.DedupeTTL, c.Relay, retries))
	r.Check(retention.ValidateOutboxRetention(c.Retention.OutboxRetention, c.Relay, retries))
}

// DefaultIdleGap is IDLE_GAP's default: a kicked relay stays a second for more events;
// producers that kicked within it skip their kick (package kick's Interval is at most it).
const DefaultIdleGap = time.Second

// maxIdleGap bounds IDLE_GAP: beyond a minute the scheduled tick would come first anyway.
const maxIdleGap = time.Minute

// maxBudgetBytes bounds BATCH_BYTES and IN_FLIGHT_BYTES: 10 GB is the largest Lambda.
const maxBudgetBytes = 10 << 30

// inFlightForMemory is IN_FLIGHT_BYTES's default on Lambda: an eighth of the function's
// memory (AWS_LAMBDA_FUNCTION_MEMORY_SIZE, MB), so a larger function drains large payloads
// with more of them in flight; 0 (the library's default) elsewhere. An eighth: at the
// template's 256 MB that is relay.DefaultMaxInFlightBytes, measured to keep the relay
// under its memory (relay.DefaultMaxInFlightBytes).
func inFlightForMemory(r *envconfig.Reader) int64 {
	v := r.Get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
	if v == "" {
		return 0
	}
	mb, err := strconv.Atoi(v)
	if err != nil || mb <= 0 {
		r.Fail("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "%q must be the function's memory in whole MB", v)
		return 0
	}
	return int64(mb) << 20 / 8
}
