package qstash

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// Defaults for PublisherConfig.
const (
	DefaultBaseURL        = "https://qstash.upstash.io"
	DefaultRetries        = 3
	DefaultFIFOQueues     = 8
	DefaultRequestTimeout = 10 * time.Second
	DefaultMaxBatchItems  = 1000
	// DefaultMaxRequestBytes is the byte budget of one /v2/batch request: far under
	// QStash's 100 MB, so a request stays quick to send and to retry.
	DefaultMaxRequestBytes = 8 << 20
	// MinRequestBytes is the smallest budget accepted.
	MinRequestBytes = 64 << 10
	// NoRetries, as PublisherConfig.Retries, sends Upstash-Retries: 0 (one attempt).
	NoRetries = -1
	// MaxFlowControlPeriod is QStash's upper bound for the flow-control period.
	MaxFlowControlPeriod = 7 * 24 * time.Hour
)

// PublisherConfig configures NewPublisher. Zero fields take the Default* values.
type PublisherConfig struct {
	// BaseURL is the QStash API (QSTASH_URL). Default DefaultBaseURL. It must be a bare
	// origin: https (http only for a loopback host, the local server), no path other than
	// "/", no query. A base ending in /v2 would make every request /v2/v2/..., answered 404.
	BaseURL string
	// Token is QSTASH_TOKEN, sent as a bearer token. Required unless Tokens is set.
	Token string
	// Tokens, when set, replaces Token: the token, re-read from its source when QStash
	// answers 401 or 403 (see Token). Share one between the deployment's QStash clients
	// (Token.Transport for the others), so one re-read serves them all. Default a fixed
	// Token holding Token.
	Tokens *Token
	// DestinationBaseURL is the webhook's public base URL (PUBLIC_BASE_URL). A message of
	// topic T goes to DestinationBaseURL + "/events/" + T, with any trailing "/" of the base
	// dropped first (Lambda Function URLs end in "/"), so no "//" appears. Required.
	DestinationBaseURL string
	// FailureCallbackURL, when set, is sent as Upstash-Failure-Callback: QStash POSTs a
	// FailureCallback there once a message finally fails.
	FailureCallbackURL string
	// Retries is QStash's delivery retry budget per message (Upstash-Retries). 0 means
	// DefaultRetries (3); NoRetries means a single attempt.
	Retries int
	// RetryDelay, when set, is the wait between QStash's retries of a message (sent as
	// Upstash-Retry-Delay, in whole milliseconds, at least 1 s, at most a day), instead of
	// QStash's backoff (12 s, 2 min 28 s, 30 min 8 s: the last retry about 32.8 minutes
	// after the first attempt). A short ladder (10s with 3 retries, the stack's default: 30
	// seconds) hands a consumer outage to the outbox sooner: the failure callback reschedules the event and
	// the relay holds its topic until a probe is delivered (docs/reliability.md, "Consumer
	// outage"). A receiver's Retry-After still wins.
	RetryDelay time.Duration
	// Ordering is publish.OrderingPublish (default: each message on its own, QStash keeps no
	// per-key order, not even with flow control, not across retries) or
	// publish.OrderingFIFO (each message enqueued into one of FIFOQueues queues chosen by a
	// stable hash of its partition key; a queue delivers one at a time, the next waiting for
	// the current one's retries and failure callback, so each key keeps strict order end to
	// end; a message that exhausts its retries stops blocking its queue).
	Ordering publish.Ordering
	// FIFOQueues is the number of QStash queues in FIFO mode, and so its delivery
	// parallelism. Default DefaultFIFOQueues. Changing it while events are in flight moves
	// keys between queues, and per-key order holds only within one queue.
	FIFOQueues int
	// QueuePrefix names FIFO queues <QueuePrefix>-<n>. Default Name.
	QueuePrefix string
	// Name is the deployment's name (OUTBOX_NAME): 1-MaxNameLen characters of
	// [A-Za-z0-9_-]. It is in every deduplication id (<name>-<id>, <name>-<id>-r<gen>), in
	// the default queue prefix and in every flow-control key, so two deployments sharing a
	// QStash account neither deduplicate each other's events nor share queues or limits.
	// Default DefaultName ("outbox": the ids and queues used before names existed).
	Name string
	// Plan is the QStash plan (QSTASH_PLAN). Default DefaultPlan. It bounds FIFOQueues
	// (the plan's queue count) and MaxMessageBytes.
	Plan Plan
	// MaxMessageBytes is the largest payload sent (QSTASH_MAX_MESSAGE_BYTES). Default the
	// plan's message size limit; it may be lowered, not raised above the plan's. A larger
	// message is not sent: it fails alone with a permanent *MessageTooLargeError.
	MaxMessageBytes int64
	// MaxRequestBytes is the byte budget of one /v2/batch request body
	// (QSTASH_MAX_REQUEST_BYTES). Default DefaultMaxRequestBytes; at most MaxRequestBytes.
	// A Publish call is split into several requests by size as well as by MaxBatchItems. A
	// single message larger than the budget (but within MaxMessageBytes) goes alone.
	MaxRequestBytes int64
	// FlowControlParallelism and FlowControlRate (per FlowControlPeriod, default 1s by
	// QStash) limit deliveries per partition key in publish mode (Upstash-Flow-Control-*).
	// Zero means unset; with both unset no flow control is sent. Not allowed in FIFO mode,
	// where the queue already limits each key to one delivery at a time.
	FlowControlParallelism int
	FlowControlRate        int
	FlowControlPeriod      time.Duration
	// RequestTimeout bounds one /v2/batch request. Default DefaultRequestTimeout.
	RequestTimeout time.Duration
	// HTTPClient sends the requests. Default a client on http.DefaultTransport with no
	// client-level timeout (RequestTimeout and the caller's context bound each request).
	HTTPClient *http.Client
	// MaxBatchItems caps the items in one /v2/batch request; a larger Publish call is split
	// into as few requests as this allows. Default DefaultMaxBatchItems. QStash documents no
	// item limit, only a 100 MB body.
	MaxBatchItems int
}

// WithDefaults returns c with zero fields set to their defaults.
func (c PublisherConfig) WithDefaults() PublisherConfig {
	c.BaseURL = cmp.Or(c.BaseURL, DefaultBaseURL)
	c.Retries = cmp.Or(c.Retries, DefaultRetries)
	c.Ordering = cmp.Or(c.Ordering, publish.DefaultOrdering)
	c.FIFOQueues = cmp.Or(c.FIFOQueues, DefaultFIFOQueues)
	c.Name = cmp.Or(c.Name, DefaultName)
	c.QueuePrefix = cmp.Or(c.QueuePrefix, c.Name)
	c.Plan = cmp.Or(c.Plan, DefaultPlan)
	if c.MaxMessageBytes == 0 {
		if l, err := c.Plan.Limits(); err == nil {
			c.MaxMessageBytes = l.MaxMessageBytes
		}
	}
	c.MaxRequestBytes = cmp.Or(c.MaxRequestBytes, DefaultMaxRequestBytes)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{}
	}
	if c.Tokens == nil && c.Token != "" {
		c.Tokens = NewToken(c.Token, nil)
	}
	c.MaxBatchItems = cmp.Or(c.MaxBatchItems, DefaultMaxBatchItems)
	return c
}

// Validate reports every invalid field of c (call it after WithDefaults).
func (c PublisherConfig) Validate() error {
	bad := configcheck.For("qstash publisher")
	if err := checkBaseURL(c.BaseURL); err != nil {
		bad.Bad("BaseURL", "%v", err)
	}
	if c.Tokens == nil || c.Tokens.get() == "" {
		bad.Bad("Token", "is empty")
	}
	if c.DestinationBaseURL == "" {
		bad.Bad("DestinationBaseURL", "is empty")
	} else if err := configcheck.BaseURL(c.DestinationBaseURL); err != nil {
		bad.Bad("DestinationBaseURL", "%v", err)
	}
	if c.FailureCallbackURL != "" {
		if err := configcheck.HTTPURL(c.FailureCallbackURL); err != nil {
			bad.Bad("FailureCallbackURL", "%v", err)
		}
	}
	if c.Retries < NoRetries {
		bad.Bad("Retries", "%d is negative (use NoRetries for a single attempt)", c.Retries)
	}
	if c.RetryDelay != 0 && (c.RetryDelay < time.Second || c.RetryDelay > 24*time.Hour) {
		bad.Bad("RetryDelay", "%v must be between 1s and 24h (or 0 for QStash's backoff)", c.RetryDelay)
	}
	switch c.Ordering {
	case publish.OrderingPublish:
	case publish.OrderingFIFO:
		if c.FlowControlParallelism != 0 || c.FlowControlRate != 0 || c.FlowControlPeriod != 0 {
			bad.Bad("FlowControlParallelism", "flow control is for publish ordering; FIFO queues already deliver one message per queue at a time")
		}
	default:
		bad.Bad("Ordering", "%q is neither %q nor %q", c.Ordering, publish.OrderingPublish, publish.OrderingFIFO)
	}
	limits, err := c.Plan.Limits()
	if err != nil {
		bad.Bad("Plan", "%v", err)
	}
	if c.FIFOQueues < 1 {
		bad.Bad("FIFOQueues", "%d must be at least 1", c.FIFOQueues)
	} else if err == nil && c.Ordering == publish.OrderingFIFO && c.FIFOQueues > limits.MaxQueues {
		bad.Bad("FIFOQueues", "%d is more than the %d queues QStash's %s plan allows (set the plan, or fewer queues)", c.FIFOQueues, limits.MaxQueues, c.Plan)
	}
	if !validQueueName(c.QueuePrefix) {
		bad.Bad("QueuePrefix", "%q must be letters, digits, '-' or '_'", c.QueuePrefix)
	}
	if !ValidName(c.Name) {
		bad.Bad("Name", "%q must be 1-%d letters, digits, '-' or '_' (it goes into deduplication ids and queue names)", c.Name, MaxNameLen)
	}
	if c.MaxMessageBytes < 1 && !(err != nil && c.MaxMessageBytes == 0) {
		bad.Bad("MaxMessageBytes", "%d must be positive", c.MaxMessageBytes)
	} else if err == nil && c.MaxMessageBytes > limits.MaxMessageBytes {
		bad.Bad("MaxMessageBytes", "%d is above the %d-byte message limit of QStash's %s plan", c.MaxMessageBytes, limits.MaxMessageBytes, c.Plan)
	}
	if c.MaxRequestBytes < MinRequestBytes || c.MaxRequestBytes > MaxRequestBytes {
		bad.Bad("MaxRequestBytes", "%d is outside %d..%d (QStash refuses requests over 100 MB)", c.MaxRequestBytes, MinRequestBytes, MaxRequestBytes)
	}
	if c.FlowControlParallelism < 0 {
		bad.Bad("FlowControlParallelism", "%d is negative", c.FlowControlParallelism)
	}
	if c.FlowControlRate < 0 {
		bad.Bad("FlowControlRate", "%d is negative", c.FlowControlRate)
	}
	if c.FlowControlPeriod < 0 || c.FlowControlPeriod > MaxFlowControlPeriod {
		bad.Bad("FlowControlPeriod", "%v is outside 0..%v", c.FlowControlPeriod, MaxFlowControlPeriod)
	} else if c.FlowControlPeriod%time.Second != 0 {
		bad.Bad("FlowControlPeriod", "%v is not a whole number of seconds", c.FlowControlPeriod)
	}
	if c.FlowControlPeriod != 0 && c.FlowControlRate == 0 {
		bad.Bad("FlowControlPeriod", "is set without FlowControlRate")
	}
	if c.RequestTimeout <= 0 {
		bad.Bad("RequestTimeout", "%v must be positive", c.RequestTimeout)
	}
	if c.MaxBatchItems < 1 {
		bad.Bad("MaxBatchItems", "%d must be at least 1", c.MaxBatchItems)
	}
	return bad.Err()
}

// checkBaseURL accepts only a bare API origin: https, or http for a loopback host (the
// local server); no path but "/", no query or fragment. Anything else would send every
// request to the wrong place, answered 404 (a base ending in /v2 gives /v2/v2/batch).
func checkBaseURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %w", s, err)
	}
	switch {
	case u.User != nil:
		return fmt.Errorf("must not carry credentials; the token goes in Token")
	case u.Host == "" || (u.Scheme != "https" && u.Scheme != "http"):
		return fmt.Errorf("%q must be an absolute https URL such as %s", s, DefaultBaseURL)
	case u.Scheme == "http" && !isLoopbackHost(u):
		return fmt.Errorf("%q must use https (http is allowed only for a loopback host, the local server)", s)
	case u.Path != "" && u.Path != "/":
		return fmt.Errorf("%q must have no path (got %q): the client adds /v2/...; use e.g. %s", s, u.Path, DefaultBaseURL)
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return fmt.Errorf("%q must have no query or fragment", s)
	}
	return nil
}

func validQueueName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// trimBase drops trailing slashes so base + "/path" never has "//".
func trimBase(s string) string { return strings.TrimRight(s, "/") }
