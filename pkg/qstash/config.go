package qstash

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Ordering chooses how the Publisher hands messages to QStash.
type Ordering string

const (
	// OrderingPublish publishes every message independently (/v2/publish semantics), with
	// optional flow control keyed by partition key. QStash delivers in parallel and does NOT
	// keep per-key order, not even with flow control, and not across retries.
	OrderingPublish Ordering = "publish"
	// OrderingFIFO enqueues each message into one of FIFOQueues QStash queues chosen by a
	// stable hash of its partition key. A queue delivers one message at a time and the next
	// waits for the current one's retries and failure callback, so each key keeps strict
	// order end to end, at a total parallelism of FIFOQueues. A message that exhausts its
	// retries stops blocking its queue: order then continues past a dead letter.
	OrderingFIFO Ordering = "fifo"
)

// Defaults for PublisherConfig.
const (
	DefaultBaseURL        = "https://qstash.upstash.io"
	DefaultRetries        = 3
	DefaultFIFOQueues     = 8
	DefaultQueuePrefix    = "outbox"
	DefaultRequestTimeout = 10 * time.Second
	DefaultMaxBatchItems  = 1000
	// NoRetries, as PublisherConfig.Retries, sends Upstash-Retries: 0 (one attempt).
	NoRetries = -1
	// MaxFlowControlPeriod is QStash's upper bound for the flow-control period.
	MaxFlowControlPeriod = 7 * 24 * time.Hour
)

// PublisherConfig configures NewPublisher. Zero fields take the Default* values.
type PublisherConfig struct {
	// BaseURL is the QStash API (QSTASH_URL). Default DefaultBaseURL. A trailing "/" is
	// ignored.
	BaseURL string
	// Token is QSTASH_TOKEN, sent as a bearer token. Required.
	Token string
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
	// Ordering is OrderingPublish (default) or OrderingFIFO.
	Ordering Ordering
	// FIFOQueues is the number of QStash queues in FIFO mode, and so its delivery
	// parallelism. Default DefaultFIFOQueues. Changing it while events are in flight moves
	// keys between queues, and per-key order holds only within one queue.
	FIFOQueues int
	// QueuePrefix names FIFO queues <QueuePrefix>-<n>. Default DefaultQueuePrefix.
	QueuePrefix string
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
	if c.BaseURL == "" {
		c.BaseURL = DefaultBaseURL
	}
	if c.Retries == 0 {
		c.Retries = DefaultRetries
	}
	if c.Ordering == "" {
		c.Ordering = OrderingPublish
	}
	if c.FIFOQueues == 0 {
		c.FIFOQueues = DefaultFIFOQueues
	}
	if c.QueuePrefix == "" {
		c.QueuePrefix = DefaultQueuePrefix
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{}
	}
	if c.MaxBatchItems == 0 {
		c.MaxBatchItems = DefaultMaxBatchItems
	}
	return c
}

// Validate reports every invalid field of c (call it after WithDefaults).
func (c PublisherConfig) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("qstash publisher config %s: "+format, append([]any{field}, args...)...))
	}
	if err := checkHTTPURL(c.BaseURL); err != nil {
		bad("BaseURL", "%v", err)
	}
	if c.Token == "" {
		bad("Token", "is empty (set QSTASH_TOKEN)")
	}
	if c.DestinationBaseURL == "" {
		bad("DestinationBaseURL", "is empty (set PUBLIC_BASE_URL)")
	} else if err := checkHTTPURL(c.DestinationBaseURL); err != nil {
		bad("DestinationBaseURL", "%v", err)
	} else if u, _ := url.Parse(c.DestinationBaseURL); u.RawQuery != "" || u.Fragment != "" {
		bad("DestinationBaseURL", "%q must not have a query or fragment", c.DestinationBaseURL)
	}
	if c.FailureCallbackURL != "" {
		if err := checkHTTPURL(c.FailureCallbackURL); err != nil {
			bad("FailureCallbackURL", "%v", err)
		}
	}
	if c.Retries < NoRetries {
		bad("Retries", "%d is negative (use NoRetries for a single attempt)", c.Retries)
	}
	switch c.Ordering {
	case OrderingPublish:
	case OrderingFIFO:
		if c.FlowControlParallelism != 0 || c.FlowControlRate != 0 || c.FlowControlPeriod != 0 {
			bad("FlowControlParallelism", "flow control is for publish ordering; FIFO queues already deliver one message per queue at a time")
		}
	default:
		bad("Ordering", "%q is neither %q nor %q", c.Ordering, OrderingPublish, OrderingFIFO)
	}
	if c.FIFOQueues < 1 {
		bad("FIFOQueues", "%d must be at least 1", c.FIFOQueues)
	}
	if !validQueueName(c.QueuePrefix) {
		bad("QueuePrefix", "%q must be letters, digits, '-' or '_'", c.QueuePrefix)
	}
	if c.FlowControlParallelism < 0 {
		bad("FlowControlParallelism", "%d is negative", c.FlowControlParallelism)
	}
	if c.FlowControlRate < 0 {
		bad("FlowControlRate", "%d is negative", c.FlowControlRate)
	}
	if c.FlowControlPeriod < 0 || c.FlowControlPeriod > MaxFlowControlPeriod {
		bad("FlowControlPeriod", "%v is outside 0..%v", c.FlowControlPeriod, MaxFlowControlPeriod)
	} else if c.FlowControlPeriod%time.Second != 0 {
		bad("FlowControlPeriod", "%v is not a whole number of seconds", c.FlowControlPeriod)
	}
	if c.FlowControlPeriod != 0 && c.FlowControlRate == 0 {
		bad("FlowControlPeriod", "is set without FlowControlRate")
	}
	if c.RequestTimeout <= 0 {
		bad("RequestTimeout", "%v must be positive", c.RequestTimeout)
	}
	if c.MaxBatchItems < 1 {
		bad("MaxBatchItems", "%d must be at least 1", c.MaxBatchItems)
	}
	return errors.Join(errs...)
}

func checkHTTPURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an absolute http(s) URL", s)
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
