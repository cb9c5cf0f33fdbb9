package relay

import (
	"cmp"
	"log/slog"
	"math/rand/v2"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// Defaults for Config.
const (
	// DefaultBatchSize and DefaultPublishConcurrency are the fastest setting of the backlog
	// scenario's sweep with a QStash 30 ms away (README, Performance; median of three
	// rounds): 1000 x 8 drained 1.08-1.18x as fast as 500 x 4 in eight full runs (tied with
	// 1000 x 4 in the last seven). Every batch in flight is held in memory, BatchSize x
	// PublishConcurrency payloads (8,000): with ~300-byte payloads the relay peaked at
	// 43-49 MiB RSS over 100,000 events and 55.9-60.7 MiB over the 1M backlog in the last
	// two full runs, under the README's 64 MiB target. Lower BatchSize when payloads are
	// large.
	DefaultBatchSize      = 1000
	DefaultLease          = 30 * time.Second
	DefaultPublishTimeout = 10 * time.Second
	DefaultMarkTimeout    = 5 * time.Second
	DefaultMaxAttempts    = 12
	DefaultBackoffBase    = 30 * time.Second
	DefaultBackoffMax     = time.Hour
	DefaultPollInterval   = time.Second
	// DefaultPublishConcurrency: batches in flight at once, each marked on a connection of
	// its own. 4 hid a 30 ms round trip but not an 80 ms one (0.76 of the rate on
	// loopback); see DefaultBatchSize for the measurement.
	DefaultPublishConcurrency = 8
	// MaxPublishConcurrency bounds PublishConcurrency (each batch in flight may hold a
	// database connection while it is marked).
	MaxPublishConcurrency = 64
	// DefaultDeferPause is the first pause after a deferred publish that names no time.
	DefaultDeferPause = 5 * time.Second
	// maxDeferPause caps every pause after a deferred publish, however far the queue's
	// reset lies (a misread reset must not silence a warm relay for days).
	maxDeferPause = 24 * time.Hour
	// MaxOutagePause caps the pause after an outage (DeferOutage: QStash failing or out of
	// reach for whole requests), which doubles from DeferPause like any other. An outage
	// ends by itself and nobody has to act, so the relay keeps probing: one Publish call
	// per minute at most, the period of the scheduled drain, so publishing resumes within
	// a tick of the end while an outage of hours costs a few hundred refused requests, no
	// attempts. A deployment fault waits for an operator and may pause far longer.
	MaxOutagePause = time.Minute
	// MinBackoff is the floor of every retry delay.
	MinBackoff = time.Second
	// MaxBatchSize bounds one claim statement.
	MaxBatchSize = 10000
	// DefaultMaxBatchBytes and DefaultMaxInFlightBytes bound the payloads one claim takes
	// and the drain holds at once, sized for the relay Lambda's 256 MB (template.yaml).
	// A payload in flight exists several times: the row as pgx reads it,
	// outbox.Message.Payload, its JSON-escaped batch item in the publisher's arena, and
	// what the collector lets pile up between cycles. Measured under aws-lambda-rie on the
	// dev machine (TestRIERelayDrainsLargePayloadsWithinItsMemory, GOMEMLIMIT 80% of 256
	// MB), the bootstrap peaked at 171.8 MiB draining 16,000 x 30 kB and 149.3 MiB draining
	// 1,200 x 400 kB with these budgets (218.8 and 196.6 MiB with the test under -race,
	// its slower local QStash holding batches in flight longer: the heap then grows to the
	// memory limit, 205 MiB, which bounds it), against 203.1 and 1021.8 MiB without them
	// (batch 1,000 x 8 in flight, no memory limit). The claim keeps the budget on the
	// payloads' text, whatever Postgres's compression: 1,200 x 400 kB stored about a
	// hundredfold smaller, then 300 x 1 MB incompressible, peaked at 101-146 MiB (with 75 x
	// 1 MB, 112-165 MiB, against 858.1 MiB when the claim counted stored bytes). With ~300-byte payloads neither bound is reached
	// (1,000 x 8 of them are 2.4 MB).
	DefaultMaxBatchBytes    = 8 << 20
	DefaultMaxInFlightBytes = 32 << 20
	// DefaultMaxDeaths: the relay died holding a row this many times in a row (the first
	// in a batch, then with the row claimed alone) before it dead-letters the row.
	DefaultMaxDeaths = outboxstore.DefaultMaxDeaths
)

// Config tunes a Relay. Zero fields take the Default* values.
type Config struct {
	// BatchSize is how many rows one claim takes. Default DefaultBatchSize. Lower it for
	// large payloads: up to BatchSize x PublishConcurrency of them are in memory at once.
	BatchSize int
	// Lease is how long a claimed row stays invisible to other relays. Default DefaultLease
	// (30s); it must exceed PublishTimeout plus MarkTimeout, or a slow publish is reclaimed
	// and sent twice (harmless but wasteful: deduplication absorbs it).
	Lease time.Duration
	// PublishTimeout bounds one Publisher.Publish call. Default DefaultPublishTimeout.
	PublishTimeout time.Duration
	// MarkTimeout bounds the statements that record a batch's outcome. They run even if the
	// drain's context is cancelled, so a published batch is marked. Default DefaultMarkTimeout.
	MarkTimeout time.Duration
	// ClaimTimeout bounds one claim statement (on the client, and on the server through a
	// transaction-local statement_timeout). Default, and maximum, Lease - PublishTimeout -
	// MarkTimeout (15s with the defaults): the lease runs from the claim's start, so a
	// claim that took longer would leave its batch less than one publish and its mark
	// before the lease ends. A claim that gives up returns an error wrapping
	// outboxstore.ErrTimeout that says why a claim gets that slow; nothing was leased (a
	// claim that committed as it was cut off leaves its rows leased until the lease ends,
	// never published).
	ClaimTimeout time.Duration
	// DeadlineMargin: Drain claims no new batch when less than this is left before its
	// context's deadline. Default PublishTimeout + MarkTimeout: enough to publish what the
	// claim returns and mark it. Batches in flight publish and mark in parallel, each
	// bounded by the same margin, so the rule covers every batch in flight. A batch that
	// needs several publish calls (same-key runs in fifo mode) also stops at the deadline
	// and releases what it did not send.
	DeadlineMargin time.Duration
	// MaxAttempts is the relay's retry budget per event (per redrive generation); a
	// retryable failure on the last attempt dead-letters. Default DefaultMaxAttempts.
	MaxAttempts int
	// BackoffBase and BackoffMax shape the retry delay: full jitter over
	// [MinBackoff, min(BackoffBase*2^attempt, BackoffMax)]. Defaults 30s and 1h.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// Rand returns a float in [0,1) for jitter. Default math/rand/v2.Float64. The relay
	// calls it from one goroutine at a time, so a seeded *rand.Rand's Float64 will do.
	Rand func() float64
	// Now overrides the database clock in every statement (tests). Nil means now().
	Now func() time.Time
	// Ordering decides how a batch is handed to the Publisher: publish.OrderingFIFO sends
	// waves (at most one event per key per call), publish.OrderingPublish one call per
	// batch. Empty means the Publisher's own, so the two cannot disagree: New asks its
	// Ordering() publish.Ordering method (*qstash.Publisher has one), and a Publisher
	// without one gets waves, which keep per-key order whatever its queue does.
	Ordering publish.Ordering
	// PublishConcurrency is how many batches may be in flight (published or being marked)
	// at once; the next claim overlaps the publishes of earlier ones. Default
	// DefaultPublishConcurrency; 1 is the strictly serial relay. Per-key FIFO holds for any
	// value: a key whose head is in flight is not claimed again. Each batch in flight uses
	// a connection while it is marked, and the claim another, so the drain runs at most
	// (pool MaxConns - 1) batches at once.
	PublishConcurrency int
	// DeferPause is the pause after a deferred publish whose DeferError names no Until;
	// it doubles with each consecutive deferral, up to 24 hours. Default
	// DefaultDeferPause.
	DeferPause time.Duration
	// PollInterval is Linger's safety net when no notification arrives. Default 1s.
	PollInterval time.Duration
	// Channel is the LISTEN channel. Default "outbox" (the migrations' trigger).
	Channel string
	// Logger receives the relay's logs. Default slog.Default().
	Logger *slog.Logger
	// MaxBatchBytes bounds the payload bytes (their JSON text) one claim takes: a claim
	// stops adding rows once the budget is reached, but always takes at least one, so an
	// event larger than the budget still moves alone. It holds on the text as read,
	// whatever Postgres's compression of the stored payloads. Default
	// DefaultMaxBatchBytes.
	MaxBatchBytes int64
	// MaxInFlightBytes bounds the payload bytes of every batch in flight together: the
	// drain claims only up to what is left of it, and while less than a quarter of
	// MaxBatchBytes is left it waits for a batch to finish instead. Each batch in flight
	// can exceed its share by one event (the one a claim always takes). An event larger
	// than MaxInFlightBytes is dead-lettered at its claim, its payload never copied: the
	// relay could not hold it. Default DefaultMaxInFlightBytes; at least MaxBatchBytes.
	MaxInFlightBytes int64
	// MaxDeaths: a row whose claims ended without an outcome this many times in a row (the
	// relay died holding it: killed for memory, a panic, the Lambda deadline) is
	// dead-lettered at its next claim, never published again into the same death. From its
	// first such death on, the row is claimed alone, so a batch that kills its process
	// costs the next processes one row, not the backlog. Default DefaultMaxDeaths.
	MaxDeaths int
	// ProbeHorizon is how long after it was sent a consumer circuit's probe with no
	// failure reported counts as delivered, when the consumer's commit is not visible in
	// this database (circuit.go). Default DefaultProbeHorizon; tests on a compressed clock
	// shorten it.
	ProbeHorizon time.Duration
	// CircuitRefresh is how often the relay reads the consumer circuits (one small
	// statement): events published in the refresh after a circuit opened still go to
	// QStash. Default 1 s; a test on a compressed clock shortens it.
	CircuitRefresh time.Duration
	// Tracer, when set, records one span per batch ("send <destination>", linked to the
	// producer span of every event in it, package tracing) with claim, publish and mark as
	// its children and the outcome counts as attributes. Nil turns tracing off: the drain
	// then does no tracing work and allocates nothing for it.
	Tracer trace.Tracer
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	c.MarkTimeout = cmp.Or(c.MarkTimeout, DefaultMarkTimeout)
	c.DeadlineMargin = cmp.Or(c.DeadlineMargin, c.PublishTimeout+c.MarkTimeout)
	c.ClaimTimeout = cmp.Or(c.ClaimTimeout, c.Lease-c.PublishTimeout-c.MarkTimeout)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.BackoffBase = cmp.Or(c.BackoffBase, DefaultBackoffBase)
	c.BackoffMax = cmp.Or(c.BackoffMax, DefaultBackoffMax)
	c.PublishConcurrency = cmp.Or(c.PublishConcurrency, DefaultPublishConcurrency)
	c.DeferPause = cmp.Or(c.DeferPause, DefaultDeferPause)
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
		if c.MaxInFlightBytes > 0 {
			c.MaxBatchBytes = min(c.MaxBatchBytes, c.MaxInFlightBytes)
		}
	}
	c.MaxInFlightBytes = cmp.Or(c.MaxInFlightBytes, max(DefaultMaxInFlightBytes, c.MaxBatchBytes))
	c.MaxDeaths = cmp.Or(c.MaxDeaths, DefaultMaxDeaths)
	c.ProbeHorizon = cmp.Or(c.ProbeHorizon, DefaultProbeHorizon)
	c.CircuitRefresh = cmp.Or(c.CircuitRefresh, defaultCircuitRefresh)
	c.Channel = cmp.Or(c.Channel, "outbox")
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// Validate reports every invalid field of c (after WithDefaults).
func (c Config) Validate() error {
	bad := configcheck.For("relay")
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		bad.Bad("BatchSize", "%d is outside 1..%d", c.BatchSize, MaxBatchSize)
	}
	if c.PublishTimeout <= 0 {
		bad.Bad("PublishTimeout", "%v must be positive", c.PublishTimeout)
	}
	if c.MarkTimeout <= 0 {
		bad.Bad("MarkTimeout", "%v must be positive", c.MarkTimeout)
	}
	if c.Lease <= c.PublishTimeout+c.MarkTimeout {
		bad.Bad("Lease", "%v must exceed PublishTimeout+MarkTimeout (%v), or slow publishes are reclaimed and sent twice", c.Lease, c.PublishTimeout+c.MarkTimeout)
	}
	if limit := c.Lease - c.PublishTimeout - c.MarkTimeout; c.Lease > c.PublishTimeout+c.MarkTimeout && (c.ClaimTimeout <= 0 || c.ClaimTimeout > limit) {
		bad.Bad("ClaimTimeout", "%v is outside (0, Lease-PublishTimeout-MarkTimeout = %v]: a longer claim leaves its batch no time to publish and mark within the lease", c.ClaimTimeout, limit)
	}
	if c.DeadlineMargin < 0 {
		bad.Bad("DeadlineMargin", "%v must not be negative", c.DeadlineMargin)
	}
	if c.MaxAttempts < 1 {
		bad.Bad("MaxAttempts", "%d must be at least 1", c.MaxAttempts)
	}
	if c.BackoffBase < MinBackoff {
		bad.Bad("BackoffBase", "%v is below the %v floor", c.BackoffBase, MinBackoff)
	}
	if c.BackoffMax < c.BackoffBase {
		bad.Bad("BackoffMax", "%v is below BackoffBase %v", c.BackoffMax, c.BackoffBase)
	}
	if c.Ordering != "" && c.Ordering != publish.OrderingFIFO && c.Ordering != publish.OrderingPublish {
		bad.Bad("Ordering", "%q must be %q or %q", c.Ordering, publish.OrderingFIFO, publish.OrderingPublish)
	}
	if c.PublishConcurrency < 1 || c.PublishConcurrency > MaxPublishConcurrency {
		bad.Bad("PublishConcurrency", "%d is outside 1..%d", c.PublishConcurrency, MaxPublishConcurrency)
	}
	if c.DeferPause <= 0 || c.DeferPause > maxDeferPause {
		bad.Bad("DeferPause", "%v is outside (0, %v]", c.DeferPause, maxDeferPause)
	}
	if c.PollInterval <= 0 {
		bad.Bad("PollInterval", "%v must be positive", c.PollInterval)
	}
	if c.MaxDeaths < 1 {
		bad.Bad("MaxDeaths", "%d must be at least 1", c.MaxDeaths)
	}
	if c.MaxBatchBytes < 1 {
		bad.Bad("MaxBatchBytes", "%d must be positive", c.MaxBatchBytes)
	}
	if c.MaxInFlightBytes < c.MaxBatchBytes {
		bad.Bad("MaxInFlightBytes", "%d is below MaxBatchBytes %d: no claim could take a full batch", c.MaxInFlightBytes, c.MaxBatchBytes)
	}
	return bad.Err()
}

// backoff returns the delay before retrying after the given attempt (1-based): exponential
// with full jitter (AWS Builders' Library), ceiling min(base*2^attempt, max), floor 1s.
// r is a float in [0,1).
func backoff(attempt int, base, maxDelay time.Duration, r float64) time.Duration {
	ceiling := maxDelay
	if attempt < 62 {
		if c := base << attempt; c > 0 && c < maxDelay && c>>attempt == base {
			ceiling = c
		}
	}
	d := time.Duration(r * float64(ceiling))
	return max(d, MinBackoff)
}

// RetryHorizon is the longest time the relay can keep retrying one event: the sum of every
// backoff ceiling up to MaxAttempts. Dedupe TTLs must exceed it (plus QStash's own).
func (c Config) RetryHorizon() time.Duration {
	c = c.WithDefaults()
	var total time.Duration
	for a := 1; a < c.MaxAttempts; a++ {
		total += backoff(a, c.BackoffBase, c.BackoffMax, 1)
	}
	return total
}
