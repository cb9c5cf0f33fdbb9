package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"
)

// Defaults for Config.
const (
	DefaultBatchSize      = 100
	DefaultLease          = 30 * time.Second
	DefaultPublishTimeout = 10 * time.Second
	DefaultMarkTimeout    = 5 * time.Second
	DefaultMaxAttempts    = 12
	DefaultBackoffBase    = 30 * time.Second
	DefaultBackoffMax     = time.Hour
	DefaultPollInterval   = time.Second
	// MinBackoff is the floor of every retry delay.
	MinBackoff = time.Second
	// MaxBatchSize bounds one claim statement.
	MaxBatchSize = 10000
)

// Config tunes a Relay. Zero fields take the Default* values.
type Config struct {
	// BatchSize is how many rows one claim takes. Default DefaultBatchSize.
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
	// DeadlineMargin: Drain claims no new batch when less than this is left before its
	// context's deadline. Default PublishTimeout + MarkTimeout: enough to publish what the
	// claim returns and mark it. A batch that needs several publish calls (same-key runs)
	// also stops at the deadline and releases what it did not send.
	DeadlineMargin time.Duration
	// MaxAttempts is the relay's retry budget per event (per redrive generation); a
	// retryable failure on the last attempt dead-letters. Default DefaultMaxAttempts.
	MaxAttempts int
	// BackoffBase and BackoffMax shape the retry delay: full jitter over
	// [MinBackoff, min(BackoffBase*2^attempt, BackoffMax)]. Defaults 30s and 1h.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// Rand returns a float in [0,1) for jitter. Default math/rand/v2.Float64.
	Rand func() float64
	// Now overrides the database clock in every statement (tests). Nil means now().
	Now func() time.Time
	// PollInterval is Linger's safety net when no notification arrives. Default 1s.
	PollInterval time.Duration
	// Channel is the LISTEN channel. Default "outbox" (the migrations' trigger).
	Channel string
	// Logger receives the relay's logs. Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.MarkTimeout == 0 {
		c.MarkTimeout = DefaultMarkTimeout
	}
	if c.DeadlineMargin == 0 {
		c.DeadlineMargin = c.PublishTimeout + c.MarkTimeout
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = DefaultBackoffBase
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = DefaultBackoffMax
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Channel == "" {
		c.Channel = "outbox"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports every invalid field of c (after WithDefaults).
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Config: "relay", Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		bad("BatchSize", "%d is outside 1..%d", c.BatchSize, MaxBatchSize)
	}
	if c.PublishTimeout <= 0 {
		bad("PublishTimeout", "%v must be positive", c.PublishTimeout)
	}
	if c.MarkTimeout <= 0 {
		bad("MarkTimeout", "%v must be positive", c.MarkTimeout)
	}
	if c.Lease <= c.PublishTimeout+c.MarkTimeout {
		bad("Lease", "%v must exceed PublishTimeout+MarkTimeout (%v), or slow publishes are reclaimed and sent twice", c.Lease, c.PublishTimeout+c.MarkTimeout)
	}
	if c.DeadlineMargin < 0 {
		bad("DeadlineMargin", "%v must not be negative", c.DeadlineMargin)
	}
	if c.MaxAttempts < 1 {
		bad("MaxAttempts", "%d must be at least 1", c.MaxAttempts)
	}
	if c.BackoffBase < MinBackoff {
		bad("BackoffBase", "%v is below the %v floor", c.BackoffBase, MinBackoff)
	}
	if c.BackoffMax < c.BackoffBase {
		bad("BackoffMax", "%v is below BackoffBase %v", c.BackoffMax, c.BackoffBase)
	}
	if c.PollInterval <= 0 {
		bad("PollInterval", "%v must be positive", c.PollInterval)
	}
	return errors.Join(errs...)
}

// Backoff returns the delay before retrying after the given attempt (1-based): exponential
// with full jitter (AWS Builders' Library), ceiling min(base*2^attempt, max), floor 1s.
// r is a float in [0,1).
func Backoff(attempt int, base, maxDelay time.Duration, r float64) time.Duration {
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
		total += Backoff(a, c.BackoffBase, c.BackoffMax, 1)
	}
	return total
}
