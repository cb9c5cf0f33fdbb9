package qstash

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/relay"
)

// Publisher publishes claimed outbox messages to QStash through /v2/batch, one result per
// message. It implements relay.Publisher.
//
// It talks to the API with its own small HTTP client instead of qstash-go v1.0.0, because
// of three gaps in that SDK (qstash-contract.md §11):
//   - the SDK prefixes every custom header with Upstash-Forward-, so the flow-control and
//     failure-callback headers cannot be sent; batchItem carries them verbatim;
//   - it discards the status code and fails to parse a non-JSON error body; sendBatch
//     returns an *APIError with the status, QStash's text and the rate-limit headers;
//   - it turns a failed batch item into a zero value with an empty id; decodeBatch reports
//     an *ItemError for it and treats an item with no id as a failure, never a success.
//
// It also takes a context and a timeout per request, which the SDK cannot.
type Publisher struct {
	cfg      PublisherConfig
	batchURL string
	destBase string
	flow     string
}

var _ relay.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher, or an error naming every invalid config field.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new qstash publisher: %w", err)
	}
	p := &Publisher{
		cfg:      cfg,
		batchURL: trimBase(cfg.BaseURL) + "/v2/batch",
		destBase: trimBase(cfg.DestinationBaseURL) + "/events/",
	}
	var fc []string
	if cfg.FlowControlParallelism > 0 {
		fc = append(fc, "parallelism="+strconv.Itoa(cfg.FlowControlParallelism))
	}
	if cfg.FlowControlRate > 0 {
		fc = append(fc, "rate="+strconv.Itoa(cfg.FlowControlRate))
		if cfg.FlowControlPeriod > 0 {
			fc = append(fc, fmt.Sprintf("period=%ds", int64(cfg.FlowControlPeriod.Seconds())))
		}
	}
	p.flow = strings.Join(fc, ",")
	return p, nil
}

// Config returns the effective configuration (defaults applied).
func (p *Publisher) Config() PublisherConfig { return p.cfg }

// Destination is the URL a message of topic is delivered to, and so the subject its
// signature carries: DestinationBaseURL (trailing "/" dropped) + "/events/" + topic.
func (p *Publisher) Destination(topic string) string {
	return p.destBase + url.PathEscape(topic)
}

// QueueName is the FIFO queue of partitionKey: <QueuePrefix>-<fnv1a(key) mod FIFOQueues>.
// The hash is stable across processes and releases, so a key always maps to one queue.
func (p *Publisher) QueueName(partitionKey string) string {
	return QueueName(p.cfg.QueuePrefix, p.cfg.FIFOQueues, partitionKey)
}

// QueueName is the FIFO queue of partitionKey among n queues named prefix-0..prefix-(n-1).
func QueueName(prefix string, n int, partitionKey string) string {
	h := fnv.New32a()
	h.Write([]byte(partitionKey))
	return prefix + "-" + strconv.FormatUint(uint64(h.Sum32())%uint64(n), 10)
}

// batchItem is one element of a /v2/batch request body. Headers are sent verbatim (the SDK
// would prefix them), Queue turns the item into an enqueue.
type batchItem struct {
	Destination string            `json:"destination"`
	Headers     map[string]string `json:"headers"`
	Body        string            `json:"body"`
	Queue       string            `json:"queue,omitempty"`
}

// Publish sends msgs in as few /v2/batch requests as MaxBatchItems allows, in order, one
// request after the other, and returns one Result per message in msgs' order. A failed
// request fails only its own messages, plus the later messages of the same partition keys
// (ErrHeldBack), which would otherwise overtake them.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []relay.Result {
	results := make([]relay.Result, len(msgs))
	failedKeys := map[string]bool{}
	for start := 0; start < len(msgs); {
		var (
			items []batchItem
			idx   []int
		)
		i := start
		for ; i < len(msgs) && len(items) < p.cfg.MaxBatchItems; i++ {
			m := msgs[i]
			if failedKeys[m.PartitionKey] {
				results[i].Err = fmt.Errorf("publish outbox message %d: %w", m.ID, ErrHeldBack)
				continue
			}
			item, err := p.item(i, m)
			if err != nil {
				results[i].Err = err
				failedKeys[m.PartitionKey] = true
				continue
			}
			items = append(items, item)
			idx = append(idx, i)
		}
		start = i
		if len(items) == 0 {
			continue
		}
		for j, r := range p.sendBatch(ctx, items, idx) {
			results[idx[j]] = r
			if r.Err != nil {
				failedKeys[msgs[idx[j]].PartitionKey] = true
			}
		}
	}
	return results
}

// item builds the batch item of msgs[i], or a permanent error if QStash could only refuse it.
func (p *Publisher) item(i int, m outbox.Message) (batchItem, error) {
	h := make(map[string]string, len(m.Headers)+8)
	for k, v := range m.Headers {
		if !validHeaderName(k) || !validHeaderValue(v) {
			return batchItem{}, &InvalidMessageError{Index: i, Reason: fmt.Sprintf("outbox message %d: header %q is not a valid HTTP header", m.ID, k)}
		}
		h["Upstash-Forward-"+k] = v
	}
	h["Content-Type"] = "application/json"
	h["Upstash-Forward-X-Outbox-Id"] = m.ID.String()
	// The failure-callback recorder compares it with the outbox row, so a late callback of
	// an earlier generation cannot dead-letter an event that was redriven since.
	h["Upstash-Forward-X-Outbox-Generation"] = strconv.Itoa(m.Generation)
	h["Upstash-Deduplication-Id"] = m.DeduplicationID()
	retries := p.cfg.Retries
	if retries == NoRetries {
		retries = 0
	}
	h["Upstash-Retries"] = strconv.Itoa(retries)
	if p.cfg.FailureCallbackURL != "" {
		h["Upstash-Failure-Callback"] = p.cfg.FailureCallbackURL
	}
	it := batchItem{Destination: p.Destination(m.Topic), Headers: h, Body: string(m.Payload)}
	switch p.cfg.Ordering {
	case OrderingFIFO:
		it.Queue = p.QueueName(m.PartitionKey)
	default:
		if p.flow != "" && m.PartitionKey != "" {
			if !validHeaderValue(m.PartitionKey) {
				return batchItem{}, &InvalidMessageError{Index: i, Reason: fmt.Sprintf("outbox message %d: partition key is not a valid header value", m.ID)}
			}
			h["Upstash-Flow-Control-Key"] = m.PartitionKey
			h["Upstash-Flow-Control-Value"] = p.flow
		}
	}
	return it, nil
}

// maxResponseBody bounds how much of a batch response is read (about 150 bytes per item).
const maxResponseBody = 32 << 20

// sendBatch POSTs items to /v2/batch and returns one Result per item. idx maps items to
// their positions in the Publish call (for ItemError.Index).
func (p *Publisher) sendBatch(ctx context.Context, items []batchItem, idx []int) []relay.Result {
	all := func(err error) []relay.Result {
		out := make([]relay.Result, len(items))
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	body, err := json.Marshal(items)
	if err != nil {
		return all(fmt.Errorf("encode qstash batch: %w", err))
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.batchURL, bytes.NewReader(body))
	if err != nil {
		return all(fmt.Errorf("publish qstash batch: %w", err))
	}
	req.Header.Set("Authorization", "Bearer "+p.cfg.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.cfg.HTTPClient.Do(req)
	if err != nil {
		// A network error or timeout: the batch may have been accepted. Resending is safe
		// because every item carries its deduplication id.
		return all(fmt.Errorf("publish qstash batch: %w", err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
	if err != nil {
		return all(fmt.Errorf("read qstash batch response: %w", err))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return all(fmt.Errorf("publish qstash batch: %w", newAPIError(resp, data)))
	}
	return decodeBatch(data, idx)
}

// decodeBatch maps a 2xx /v2/batch body to results. The body is a JSON array in request
// order; each element is {messageId,...}, {"error": text}, or (URL groups) an array of the
// former. Anything else fails the affected messages, retryably.
func decodeBatch(data []byte, idx []int) []relay.Result {
	out := make([]relay.Result, len(idx))
	var elems []json.RawMessage
	if err := json.Unmarshal(data, &elems); err != nil {
		// The JS SDK accepts a bare object for a one-item batch; so do we.
		if len(idx) == 1 && bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) {
			elems = []json.RawMessage{data}
		} else {
			for i := range out {
				out[i].Err = fmt.Errorf("decode qstash batch response: %w: %s", ErrBadResponse, snippet(data))
			}
			return out
		}
	}
	if len(elems) != len(idx) {
		for i := range out {
			out[i].Err = fmt.Errorf("decode qstash batch response: %w: %d results for %d messages", ErrBadResponse, len(elems), len(idx))
		}
		return out
	}
	for i, el := range elems {
		out[i] = decodeItem(el, idx[i])
	}
	return out
}

type itemResponse struct {
	MessageID    string `json:"messageId"`
	URL          string `json:"url"`
	Deduplicated bool   `json:"deduplicated"`
	Error        string `json:"error"`
}

func decodeItem(el json.RawMessage, index int) relay.Result {
	el = bytes.TrimSpace(el)
	var rs []itemResponse
	if bytes.HasPrefix(el, []byte("[")) {
		if err := json.Unmarshal(el, &rs); err != nil || len(rs) == 0 {
			return relay.Result{Err: fmt.Errorf("decode qstash batch item %d: %w: %s", index, ErrBadResponse, snippet(el))}
		}
	} else {
		var r itemResponse
		if err := json.Unmarshal(el, &r); err != nil {
			return relay.Result{Err: fmt.Errorf("decode qstash batch item %d: %w: %s", index, ErrBadResponse, snippet(el))}
		}
		rs = []itemResponse{r}
	}
	for _, r := range rs {
		if r.Error != "" {
			return relay.Result{Err: &ItemError{Index: index, Message: r.Error}}
		}
		if r.MessageID == "" {
			return relay.Result{Err: fmt.Errorf("decode qstash batch item %d: %w", index, ErrNoMessageID)}
		}
	}
	return relay.Result{MessageID: rs[0].MessageID}
}

func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
