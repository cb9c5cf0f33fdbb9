// Package relayconfig reads the relay's whole configuration (database, relay engine, QStash
// publisher, linger, retention, metrics, logging) from environment variables. The relay
// Lambda (functions/relay) and the long-lived relay process (outboxctl relay) share it, so
// both read the same variables the same way.
//
// Variables (Go durations such as 30s or 1h; a whole number of days may be written 7d):
//
//	DATABASE_URL               required; postgres://user:pass@host:5432/db?sslmode=require
//	QSTASH_TOKEN               required
//	QSTASH_URL                 default https://qstash.upstash.io; a bare https origin (http only
//	                           for a loopback host), no path, no query
//	QSTASH_PLAN                free | payg (default) | fixed: bounds FIFO_QUEUES, QSTASH_RETRIES and
//	                           the message size
//	QSTASH_MAX_MESSAGE_BYTES   default the plan's message size (free 1000000, payg 10000000, fixed
//	                           50000000); a larger payload is dead-lettered unsent
//	QSTASH_MAX_REQUEST_BYTES   default 8388608: byte budget of one QStash batch request
//	OUTBOX_NAME                default outbox; [A-Za-z0-9_-], at most 128: the deployment's name in
//	                           dedup ids, FIFO queue names and flow-control keys
//	PUBLIC_BASE_URL            required; the webhook's base URL; events go to <base>/events/<topic>
//	FAILURE_CALLBACK_URL       optional; the failure function's URL (Upstash-Failure-Callback)
//	QSTASH_RETRIES             default 3; 0 means a single delivery attempt; at most the plan's cap
//	                           (free 3, payg 5, fixed 20)
//	ORDERING                   publish (default) | fifo
//	FIFO_QUEUES                default 8 (fifo ordering only); at most the plan's queue count (free
//	                           10, payg 100, fixed 1000)
//	FLOW_CONTROL_PARALLELISM   optional, publish ordering only
//	FLOW_CONTROL_RATE          optional, publish ordering only
//	FLOW_CONTROL_PERIOD        optional, whole seconds, with FLOW_CONTROL_RATE
//	BATCH_SIZE                 default 100 rows per claim
//	PUBLISH_CONCURRENCY        default 4 batches in flight at once (1: strictly serial)
//	LEASE                      default 30s
//	PUBLISH_TIMEOUT            default 10s (also the QStash request timeout)
//	MAX_ATTEMPTS               default 12
//	BACKOFF_BASE               default 30s
//	BACKOFF_MAX                default 1h
//	LINGER                     default 0 (off): keep draining this long per invocation
//	OUTBOX_RETENTION           default 7d
//	DEDUPE_TTL                 default 14d; must exceed the retry horizon
//	METRICS_NAMESPACE          default OutboxRelay
//	LOG_LEVEL                  debug | info (default) | warn | error
package relayconfig

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/pkg/metrics"
	"github.com/outbox-relay/outbox-relay/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/pkg/relay"
	"github.com/outbox-relay/outbox-relay/pkg/retention"
)

// Config is the relay's configuration with defaults applied.
type Config struct {
	DatabaseURL string
	// Relay has no Logger; set one before relay.New.
	Relay     relay.Config
	Publisher qstash.PublisherConfig
	// Linger, when positive, keeps a scheduled invocation draining (LISTEN/NOTIFY plus
	// polling) for this long, capped by the invocation's deadline.
	Linger time.Duration
	// Retention has OutboxRetention and DedupeTTL set; no Logger.
	Retention        retention.Config
	MetricsNamespace string
	LogLevel         slog.Level
}

// Variables lists every environment variable FromEnv reads.
var Variables = []string{
	"DATABASE_URL", "QSTASH_TOKEN", "QSTASH_URL", "QSTASH_PLAN", "QSTASH_MAX_MESSAGE_BYTES",
	"QSTASH_MAX_REQUEST_BYTES", "OUTBOX_NAME", "PUBLIC_BASE_URL", "FAILURE_CALLBACK_URL",
	"QSTASH_RETRIES", "ORDERING", "FIFO_QUEUES", "FLOW_CONTROL_PARALLELISM", "FLOW_CONTROL_RATE",
	"FLOW_CONTROL_PERIOD", "BATCH_SIZE", "PUBLISH_CONCURRENCY", "LEASE", "PUBLISH_TIMEOUT", "MAX_ATTEMPTS", "BACKOFF_BASE",
	"BACKOFF_MAX", "LINGER", "OUTBOX_RETENTION", "DEDUPE_TTL", "METRICS_NAMESPACE", "LOG_LEVEL",
}

// FromEnv reads the configuration through getenv and reports every missing or invalid
// variable at once (errors.Join), then every inconsistency between them (a lease not
// above the publish timeout, a DEDUPE_TTL inside the retry horizon, ...).
func FromEnv(getenv func(string) string) (Config, error) {
	p := parser{getenv: getenv}
	c := Config{
		DatabaseURL:      getenv("DATABASE_URL"),
		MetricsNamespace: getenv("METRICS_NAMESPACE"),
	}
	if c.DatabaseURL == "" {
		p.fail("DATABASE_URL is not set (postgres://user:pass@host:5432/db?sslmode=require)")
	} else if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
		// The parse error may quote the URL, password included: say only what is wrong.
		p.fail("DATABASE_URL is not a valid Postgres connection string")
	}
	if c.MetricsNamespace == "" {
		c.MetricsNamespace = metrics.DefaultNamespace
	}

	pub := qstash.PublisherConfig{
		BaseURL:            getenv("QSTASH_URL"),
		Token:              getenv("QSTASH_TOKEN"),
		DestinationBaseURL: getenv("PUBLIC_BASE_URL"),
		FailureCallbackURL: getenv("FAILURE_CALLBACK_URL"),
		Ordering:           qstash.Ordering(strings.ToLower(getenv("ORDERING"))),
		Name:               getenv("OUTBOX_NAME"),
		Plan:               qstash.Plan(strings.ToLower(getenv("QSTASH_PLAN"))),
	}
	if pub.Token == "" {
		p.fail("QSTASH_TOKEN is not set (Upstash console, QStash, Request builder)")
	}
	if pub.DestinationBaseURL == "" {
		p.fail("PUBLIC_BASE_URL is not set (the webhook's base URL, e.g. its Function URL; events go to <base>/events/<topic>)")
	}
	if v := getenv("ORDERING"); v != "" && pub.Ordering != qstash.OrderingPublish && pub.Ordering != qstash.OrderingFIFO {
		p.fail("ORDERING %q must be publish or fifo", v)
		pub.Ordering = ""
	}
	if n, ok := p.int("QSTASH_RETRIES", 0, 100); ok {
		pub.Retries = n
		if n == 0 {
			pub.Retries = qstash.NoRetries
		}
	}
	pub.FIFOQueues, _ = p.int("FIFO_QUEUES", 1, 1000)
	if n, ok := p.int("QSTASH_MAX_MESSAGE_BYTES", 1, qstash.MaxRequestBytes); ok {
		pub.MaxMessageBytes = int64(n)
	}
	if n, ok := p.int("QSTASH_MAX_REQUEST_BYTES", qstash.MinRequestBytes, qstash.MaxRequestBytes); ok {
		pub.MaxRequestBytes = int64(n)
	}
	pub.FlowControlParallelism, _ = p.int("FLOW_CONTROL_PARALLELISM", 1, 1_000_000)
	pub.FlowControlRate, _ = p.int("FLOW_CONTROL_RATE", 1, 1_000_000)
	pub.FlowControlPeriod, _ = p.duration("FLOW_CONTROL_PERIOD")

	rc := relay.Config{}
	rc.BatchSize, _ = p.int("BATCH_SIZE", 1, relay.MaxBatchSize)
	rc.PublishConcurrency, _ = p.int("PUBLISH_CONCURRENCY", 1, relay.MaxPublishConcurrency)
	rc.Lease, _ = p.duration("LEASE")
	rc.PublishTimeout, _ = p.duration("PUBLISH_TIMEOUT")
	rc.MaxAttempts, _ = p.int("MAX_ATTEMPTS", 1, 1000)
	rc.BackoffBase, _ = p.duration("BACKOFF_BASE")
	rc.BackoffMax, _ = p.duration("BACKOFF_MAX")
	c.Relay = rc.WithDefaults()
	c.Relay.Logger = nil
	pub.RequestTimeout = c.Relay.PublishTimeout

	c.Linger, _ = p.duration("LINGER")
	ret := retention.Config{}
	ret.OutboxRetention, _ = p.duration("OUTBOX_RETENTION")
	ret.DedupeTTL, _ = p.duration("DEDUPE_TTL")
	c.Retention = ret.WithDefaults()
	c.Retention.Logger = nil

	if v := getenv("LOG_LEVEL"); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(strings.ToLower(v))); err != nil {
			p.fail("LOG_LEVEL %q must be debug, info, warn or error", v)
		}
	}
	c.Publisher = pub.WithDefaults()
	// The relay hands batches to the publisher as the queue orders them: waves for FIFO
	// queues, one call per batch when QStash keeps no order.
	c.Relay.Ordering = relay.OrderingFIFO
	if c.Publisher.Ordering == qstash.OrderingPublish {
		c.Relay.Ordering = relay.OrderingPublish
	}
	c.Publisher.HTTPClient = nil // let the caller choose; WithDefaults fills it again

	// Consistency checks, reported with the variable names a user sets.
	p.named(c.Relay.Validate(), "relay config ")
	{
		// Missing variables were reported above; stand-ins keep them from being reported twice.
		check := c.Publisher.WithDefaults()
		if check.Token == "" {
			check.Token = "unset"
		}
		if check.DestinationBaseURL == "" {
			check.DestinationBaseURL = "https://unset.invalid"
		}
		p.named(check.Validate(), "qstash publisher config ")
	}
	p.named(c.Retention.Validate(), "retention config ")
	if c.Linger < 0 {
		p.fail("LINGER %v must not be negative (0 turns it off)", c.Linger)
	}
	retries := c.Publisher.Retries
	if retries == qstash.NoRetries {
		retries = 0
	}
	if limits, err := c.Publisher.Plan.Limits(); err == nil && retries > limits.MaxRetries {
		p.fail("QSTASH_RETRIES %d is more than the %d retries QStash's %s plan allows (QSTASH_PLAN); QStash would refuse every message", retries, limits.MaxRetries, c.Publisher.Plan)
	}
	if err := retention.ValidateDedupeTTL(c.Retention.DedupeTTL, c.Relay, retries); err != nil {
		p.errs = append(p.errs, err)
	}
	if err := retention.ValidateOutboxRetention(c.Retention.OutboxRetention, c.Relay, retries); err != nil {
		p.errs = append(p.errs, err)
	}
	return c, errors.Join(p.errs...)
}

// fieldVars maps config struct fields to the variables that set them.
var fieldVars = map[string]string{
	"BatchSize": "BATCH_SIZE", "PublishConcurrency": "PUBLISH_CONCURRENCY", "Lease": "LEASE", "PublishTimeout": "PUBLISH_TIMEOUT", "MaxAttempts": "MAX_ATTEMPTS",
	"BackoffBase": "BACKOFF_BASE", "BackoffMax": "BACKOFF_MAX",
	"BaseURL": "QSTASH_URL", "Token": "QSTASH_TOKEN", "DestinationBaseURL": "PUBLIC_BASE_URL",
	"FailureCallbackURL": "FAILURE_CALLBACK_URL", "Retries": "QSTASH_RETRIES", "Ordering": "ORDERING",
	"FIFOQueues": "FIFO_QUEUES", "FlowControlParallelism": "FLOW_CONTROL_PARALLELISM",
	"FlowControlRate": "FLOW_CONTROL_RATE", "FlowControlPeriod": "FLOW_CONTROL_PERIOD",
	"RequestTimeout": "PUBLISH_TIMEOUT", "OutboxRetention": "OUTBOX_RETENTION", "DedupeTTL": "DEDUPE_TTL",
	"Name": "OUTBOX_NAME", "Plan": "QSTASH_PLAN", "MaxMessageBytes": "QSTASH_MAX_MESSAGE_BYTES",
	"MaxRequestBytes": "QSTASH_MAX_REQUEST_BYTES", "QueuePrefix": "OUTBOX_NAME",
}

// named adds each error joined in err, prefixed with the variable that sets the field it
// names ("relay config Lease: ..." becomes "LEASE: relay config Lease: ...").
func (p *parser) named(err error, prefix string) {
	if err == nil {
		return
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		msg := e.Error()
		if i := strings.Index(msg, prefix); i >= 0 {
			field, _, _ := strings.Cut(msg[i+len(prefix):], ":")
			if v, ok := fieldVars[field]; ok {
				p.errs = append(p.errs, fmt.Errorf("%s: %w", v, e))
				continue
			}
		}
		p.errs = append(p.errs, e)
	}
}

type parser struct {
	getenv func(string) string
	errs   []error
}

func (p *parser) fail(format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf(format, args...))
}

// int parses name as an integer in [lo, hi]; unset gives 0 (the default) and ok false.
func (p *parser) int(name string, lo, hi int) (int, bool) {
	v := p.getenv(name)
	if v == "" {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < lo || n > hi {
		p.fail("%s %q must be a whole number from %d to %d", name, v, lo, hi)
		return 0, false
	}
	return n, true
}

// duration parses name as a Go duration or a whole number of days ("7d"); unset gives 0.
func (p *parser) duration(name string) (time.Duration, bool) {
	v := strings.TrimSpace(p.getenv(name))
	if v == "" {
		return 0, false
	}
	d, err := ParseDuration(v)
	if err != nil {
		p.fail("%s %q is not a duration (e.g. 30s, 15m, 1h, 7d)", name, v)
		return 0, false
	}
	if d < 0 {
		p.fail("%s %q must not be negative", name, v)
		return 0, false
	}
	return d, true
}

// ParseDuration accepts time.ParseDuration's syntax and, in addition, "<n>d" for n days.
func ParseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 || n > 36500 {
			return 0, fmt.Errorf("parse duration %q: days must be a whole number", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("parse duration %q: %w", s, err)
	}
	return d, nil
}
