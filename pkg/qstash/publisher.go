package qstash

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/bits"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// Publisher publishes claimed outbox messages to QStash through /v2/batch, one result per
// message. It implements relay.Publisher.
//
// It talks to the API with its own small HTTP client instead of qstash-go v1.0.0, because
// of three gaps in that SDK (qstash-contract.md §11):
//   - the SDK prefixes every custom header with Upstash-Forward-, so the flow-control,
//     label and failure-callback headers cannot be sent; the batch items carry them verbatim
//     (appendBatchItem);
//   - it discards the status code and fails to parse a non-JSON error body; a request
//     error is an *APIError with the status, QStash's text and the rate-limit headers;
//   - it turns a failed batch item into a zero value with an empty id; decodeBatch reports
//     an *ItemError for it and treats an item with no id as a failure, never a success.
//
// What an answer means for the messages (docs/qstash-contract.md has the sources):
//   - 429: every message of the request and of the rest of the call is deferred
//     (publish.DeferQuota) until the reset the headers give; nothing is spent or lost.
//   - 401/403, 404/405, or a text saying the endpoint, token or destination is wrong: a
//     deployment fault (publish.DeferDeployment) whose error names the variable to fix.
//   - 400/412/413/422 on a request of several messages: the request is split in halves
//     and resent until the message that fails alone is found; only it fails, permanently.
//     When both halves are refused with the same answer and nothing in the call was
//     published, the refusal is about something every message carries (Upstash-Retries
//     over the plan's cap, the failure-callback URL, the flow-control value): a deployment
//     fault, not one message's. A split sends at most splitBudget requests.
//   - 5xx or 408 for the whole request, a network error, a timeout: an outage
//     (publish.DeferOutage); nothing is spent, the relay tries again after a short pause.
//   - An unknown item error inside a 2xx answer (a 5xx-like text included): retryable.
type Publisher struct {
	cfg      PublisherConfig
	baseURL  string
	batchURL string
	destBase string
	flow     string
	now      func() time.Time
	bufs     buffers
}

// NewPublisher returns a Publisher, or an error naming every invalid config field.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new qstash publisher: %w", err)
	}
	// Every request carries the current token, re-read once on a refusal (Token).
	hc := *cfg.HTTPClient
	hc.Transport = cfg.Tokens.Transport(hc.Transport)
	cfg.HTTPClient = &hc
	p := &Publisher{
		cfg:      cfg,
		baseURL:  trimBase(cfg.BaseURL),
		batchURL: trimBase(cfg.BaseURL) + "/v2/batch",
		destBase: trimBase(cfg.DestinationBaseURL) + "/events/",
		now:      time.Now,
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

// DestinationBase is where every message goes (DestinationBaseURL, without a trailing
// slash); the relay names its batch spans after it.
func (p *Publisher) DestinationBase() string { return strings.TrimSuffix(p.destBase, "/events/") }

// Config returns the effective configuration (defaults applied).
func (p *Publisher) Config() PublisherConfig { return p.cfg }

// Ordering returns the configured ordering; a relay whose Config.Ordering is empty takes it,
// so it sends waves to FIFO queues and whole batches otherwise.
func (p *Publisher) Ordering() publish.Ordering { return p.cfg.Ordering }

// destination is the base URL of topic's deliveries: DestinationBaseURL (trailing "/"
// dropped) + "/events/" + topic. appendMessageDestination adds the message's identity.
func (p *Publisher) destination(topic string) string {
	return p.destBase + url.PathEscape(topic)
}

// appendMessageDestination appends the URL m is delivered to, and so the subject its
// signature carries: destination(m.Topic) + "?outbox_id=<id>&generation=<generation>", both
// decimal, always both. The signature covers the URL and not forwarded headers, so a
// receiver that reads the identity from here can trust it (ParseIdentity).
func (p *Publisher) appendMessageDestination(b []byte, m outbox.Message) []byte {
	b = append(b, p.destBase...)
	b = append(b, url.PathEscape(m.Topic)...)
	b = append(b, "?"+IdentityIDParam+"="...)
	b = strconv.AppendInt(b, int64(m.ID), 10)
	b = append(b, "&"+IdentityGenerationParam+"="...)
	return strconv.AppendInt(b, int64(m.Generation), 10)
}

// deduplicationID is m's Upstash-Deduplication-Id in this deployment: <Name>-<id>, plus
// -r<generation> after a redrive.
func (p *Publisher) deduplicationID(m outbox.Message) string { return m.DeduplicationIDFor(p.cfg.Name) }

// HeaderOrdering is forwarded as OrderingFIFO with every message published to a FIFO
// queue (fifo ordering): the queue delivered or failed the key's earlier events before
// it, so a receiver can hold it while its key's previous event, failed, is on its way back
// through the outbox (pkg/webhook). Messages published without it are unordered to a
// receiver. Information only, like X-Outbox-Id: not signed.
const (
	HeaderOrdering = "X-Outbox-Ordering"
	OrderingFIFO   = "fifo"
)

// queueName is the FIFO queue of partitionKey: <QueuePrefix>-<fnv1a(key) mod FIFOQueues>.
// The hash is stable across processes and releases, so a key always maps to one queue.
func (p *Publisher) queueName(partitionKey string) string {
	return fifoQueueName(p.cfg.QueuePrefix, p.cfg.FIFOQueues, partitionKey)
}

// fifoQueueName is the FIFO queue of partitionKey among n queues named prefix-0..prefix-(n-1).
func fifoQueueName(prefix string, n int, partitionKey string) string {
	h := fnv.New32a()
	h.Write([]byte(partitionKey))
	return prefix + "-" + strconv.FormatUint(uint64(h.Sum32())%uint64(n), 10)
}

// encoded is one message ready to send: its position in the Publish call and its batch
// item as JSON (so a request's size is known before it is built).
type encoded struct {
	index int
	key   string
	data  []byte
}

// Publish sends msgs in as few /v2/batch requests as MaxBatchItems and MaxRequestBytes
// allow, in order, one request after the other, and returns one Result per message in
// msgs' order. In publish ordering every message is sent whatever happens to its
// neighbours (QStash keeps no order there anyway). In FIFO ordering a message whose
// earlier same-key message failed in this call is not sent (ErrHeldBack, retryable): it
// would overtake it in the queue.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []publish.Result {
	// Every item is written into one arena, each keeping its own slice.
	a := p.bufs.arena()
	defer a.release()
	s := &publishCall{p: p, arena: a, results: make([]publish.Result, len(msgs)), splitsLeft: splitBudget(len(msgs))}
	if p.cfg.Ordering == publish.OrderingFIFO {
		s.failedKeys = map[string]bool{}
	}
	items := make([]encoded, 0, len(msgs))
	var names encodeNames
	for i, m := range msgs {
		var err error
		a.scratch, err = p.encode(a.scratch[:0], &names, i, m)
		if err != nil {
			s.results[i].Err = err
			if s.failedKeys != nil {
				// Invalid messages are failed in order below, so their key holds back
				// later messages exactly as a failed send would.
				items = append(items, encoded{index: i, key: m.PartitionKey})
			}
			continue
		}
		items = append(items, encoded{index: i, key: m.PartitionKey, data: a.add(a.scratch)})
	}
	var (
		chunk []encoded
		size  int64
	)
	flush := func() {
		if len(chunk) > 0 {
			s.send(ctx, chunk, nil)
		}
		chunk, size = nil, 2
	}
	flush()
	for _, it := range items {
		if it.data == nil { // invalid, failed above
			// Earlier messages of its key in the pending request go first; later ones
			// are held back.
			flush()
			s.failKey(it.key)
			continue
		}
		n := int64(len(it.data)) + 1
		if len(chunk) > 0 && (len(chunk) >= p.cfg.MaxBatchItems || size+n > p.cfg.MaxRequestBytes) {
			flush()
		}
		if s.failedKeys[it.key] && s.deferred == nil {
			// Checked again by send (for failures in the pending request); here it keeps
			// a held-back message from taking a place in a request.
			s.results[it.index].Err = fmt.Errorf("publish outbox message %d: %w", msgs[it.index].ID, ErrHeldBack)
			continue
		}
		chunk = append(chunk, it)
		size += n
	}
	flush()
	return s.results
}

// publishCall is the state of one Publish call.
type publishCall struct {
	p       *Publisher
	arena   lease
	results []publish.Result
	// failedKeys (FIFO ordering only) are the partition keys with a failed message.
	failedKeys map[string]bool
	// deferred, once set, is the answer of every message not yet sent: the quota is used
	// up, the deployment is wrong or QStash is out, so sending more would only be refused
	// again.
	deferred error
	// published: some message of the call was accepted, so a refusal cannot be about
	// something every message carries.
	published bool
	// splitsLeft is how many more requests splitting refused requests may send.
	splitsLeft int
}

// splitBudget bounds the requests that splitting a refused call of n messages may send:
// four per halving level plus four. One bad message costs two per level (each half once),
// so this finds two bad messages among any n, and a refusal every message shares costs
// three requests (splitRefused). At 1,000 messages that is 44 requests, 3.5 s at an 80 ms
// round trip, inside the relay's 10 s publish timeout; unbounded, a call with many bad
// messages outlived it (the timeout then charged every message of the call an attempt).
func splitBudget(n int) int {
	return 4*bits.Len(uint(n)) + 4
}

func (s *publishCall) failKey(key string) {
	if s.failedKeys != nil {
		s.failedKeys[key] = true
	}
}

// send publishes one request's messages and fills their results, splitting the request
// when QStash refuses it for one bad message. A send that is part of splitting the request
// refused (not nil) spends one of the call's split requests.
func (s *publishCall) send(ctx context.Context, chunk []encoded, refused *APIError) {
	if s.deferred != nil {
		// Not attempted, whatever else holds them: no attempt is spent.
		for _, it := range chunk {
			s.results[it.index].Err = s.deferred
		}
		return
	}
	if s.failedKeys != nil {
		kept := chunk[:0:0]
		for _, it := range chunk {
			if s.failedKeys[it.key] {
				s.results[it.index].Err = fmt.Errorf("publish qstash batch item %d: %w", it.index, ErrHeldBack)
				continue
			}
			kept = append(kept, it)
		}
		chunk = kept
	}
	if len(chunk) == 0 {
		return
	}
	if refused != nil {
		if s.splitsLeft <= 0 {
			s.splitStopped(chunk, refused)
			return
		}
		s.splitsLeft--
	}
	res, err := s.p.post(ctx, s.arena, chunk)
	s.answer(ctx, chunk, res, err)
}

// answer applies one request's answer to its messages: res when QStash answered 2xx,
// else err (an *APIError, or the transport's error when no answer came).
func (s *publishCall) answer(ctx context.Context, chunk []encoded, res []publish.Result, err error) {
	if err == nil {
		for j, r := range res {
			s.results[chunk[j].index] = r
			if r.Err == nil {
				s.published = true
				continue
			}
			if publish.IsDeferred(r.Err) && s.deferred == nil {
				s.deferred = r.Err
			}
			s.failKey(chunk[j].key)
		}
		return
	}
	switch d := s.p.classify(err, len(chunk)); d.kind {
	case answerDefer:
		s.deferAll(chunk, d.err)
	case answerSplit:
		var refused *APIError
		errors.As(err, &refused)
		s.split(ctx, chunk, refused)
	default:
		for _, it := range chunk {
			s.results[it.index].Err = d.err
			s.failKey(it.key)
		}
	}
}

// deferAll defers chunk's messages and every message of the call not yet sent.
func (s *publishCall) deferAll(chunk []encoded, err error) {
	s.deferred = err
	for _, it := range chunk {
		s.results[it.index].Err = err
	}
}

// split resends the halves of a request QStash refused for its content, to find the
// messages at fault. When both halves are refused with the same answer while nothing in
// the call has been published, the refusal is about what every message carries (a
// header the relay sets on all of them), and every message is deferred instead: halving
// further would end in dead-lettering each message alone.
//
// In FIFO ordering a message must not overtake an earlier one of its key, so the second
// half is probed before the first is resolved only with its messages whose key is not in
// the first half; the others follow once the first half's failures are known.
func (s *publishCall) split(ctx context.Context, chunk []encoded, refused *APIError) {
	if s.splitsLeft <= 0 {
		s.splitStopped(chunk, refused)
		return
	}
	half := len(chunk) / 2
	first, second := chunk[:half], chunk[half:]
	s.splitsLeft--
	res1, err1 := s.p.post(ctx, s.arena, first)
	probe, rest := second, []encoded(nil)
	if s.failedKeys != nil {
		firstKeys := make(map[string]bool, len(first))
		for _, it := range first {
			firstKeys[it.key] = true
		}
		probe = make([]encoded, 0, len(second))
		for _, it := range second {
			if firstKeys[it.key] {
				rest = append(rest, it)
			} else {
				probe = append(probe, it)
			}
		}
	}
	if s.published || !sameRefusal(err1, refused) || len(probe) == 0 || s.splitsLeft <= 0 {
		s.answer(ctx, first, res1, err1)
		s.send(ctx, second, refused)
		return
	}
	var e1 *APIError
	errors.As(err1, &e1)
	s.splitsLeft--
	res2, err2 := s.p.post(ctx, s.arena, probe)
	if !s.published && sameRefusal(err2, e1) {
		s.deferAll(chunk, s.p.sharedRefusal(e1, len(chunk)))
		return
	}
	// The probe first: what it published tells the first half's split that the refusal
	// is not shared. Its keys are not in the first half, so the order changes no hold.
	s.answer(ctx, probe, res2, err2)
	s.answer(ctx, first, res1, err1)
	s.send(ctx, rest, refused)
}

// splitStopped fails chunk, retryably, once splitting has used the call's budget.
func (s *publishCall) splitStopped(chunk []encoded, refused *APIError) {
	// The refusal is quoted, not wrapped: it is not known to be these messages' own.
	err := fmt.Errorf("publish qstash batch: %w (%d messages not sent: the call's %d split requests are used up; the next attempt carries on): %v",
		errSplitBudget, len(chunk), splitBudget(len(s.results)), refused)
	for _, it := range chunk {
		s.results[it.index].Err = err
		s.failKey(it.key)
	}
}

// errSplitBudget marks messages left unsent because splitting their call used its
// budget of requests (splitBudget). Retryable: the next attempt splits what is left.
var errSplitBudget = errors.New("split of a refused request stopped")

// sameRefusal reports whether err is a refusal of the request's content (a status that
// splits) with the same status and text as ref.
func sameRefusal(err error, ref *APIError) bool {
	var e *APIError
	return ref != nil && errors.As(err, &e) && messageStatus(e.StatusCode) &&
		e.StatusCode == ref.StatusCode && strings.TrimSpace(e.Message) == strings.TrimSpace(ref.Message)
}

// encodeNames keeps what one Publish call derives per key and topic. A claimed batch
// holds several events of each key and mostly one topic, and the flow-control key is a
// SHA-256 of the partition key: profiled, deriving these names again for every message
// took a fifth of what the relay allocated.
type encodeNames struct {
	flowKeys     map[string]string // partition key -> flow-control key
	topic, label string
	dest         []byte // the destination URL, rebuilt in place for each message
}

func (n *encodeNames) flowControlKey(name, key string) string {
	if fk, ok := n.flowKeys[key]; ok {
		return fk
	}
	if n.flowKeys == nil {
		n.flowKeys = make(map[string]string)
	}
	fk := flowControlKey(name, key)
	n.flowKeys[key] = fk
	return fk
}

func (n *encodeNames) labelOf(topic string) string {
	if n.label == "" || n.topic != topic {
		n.topic, n.label = topic, label(topic)
	}
	return n.label
}

// encode builds the batch item of msgs[i], or a permanent error if QStash could only
// refuse it.
func (p *Publisher) encode(dst []byte, names *encodeNames, i int, m outbox.Message) ([]byte, error) {
	if n := int64(len(m.Payload)); n > p.cfg.MaxMessageBytes {
		return dst, &MessageTooLargeError{Index: i, OutboxID: m.ID, Size: n, Limit: p.cfg.MaxMessageBytes, Plan: p.cfg.Plan}
	}
	for k, v := range m.Headers {
		if !validHeaderName(k) || !validHeaderValue(v) {
			return dst, &InvalidMessageError{Index: i, Reason: fmt.Sprintf("outbox message %d: header %q is not a valid HTTP header", m.ID, k)}
		}
	}
	retries := p.cfg.Retries
	if retries == NoRetries || m.Probe {
		// A circuit's probe (outbox.Message.Probe) gets one attempt: the relay, not
		// QStash's ladder, decides when the next one goes.
		retries = 0
	}
	own := make([]header, 0, 10)
	own = append(own,
		header{"Content-Type", "application/json"},
		// Information only: receivers take the identity from the signed URL.
		header{forwardPrefix + "X-Outbox-Id", m.ID.String()},
		header{forwardPrefix + "X-Outbox-Generation", strconv.Itoa(m.Generation)},
		header{"Upstash-Deduplication-Id", p.deduplicationID(m)},
		header{"Upstash-Label", names.labelOf(m.Topic)},
		header{"Upstash-Retries", strconv.Itoa(retries)})
	if p.cfg.RetryDelay > 0 && retries > 0 {
		own = append(own, header{"Upstash-Retry-Delay", strconv.FormatInt(p.cfg.RetryDelay.Milliseconds(), 10)})
	}
	if p.cfg.FailureCallbackURL != "" {
		own = append(own, header{"Upstash-Failure-Callback", p.cfg.FailureCallbackURL})
		if m.Probe {
			// A failure callback's retries default to its message's (0 for a probe), and a
			// probe's callback often comes before the relay marked it (one attempt, a fast
			// 5xx): the callback handler answers 500 to that, and must be asked again.
			own = append(own, header{"Upstash-Failure-Callback-Retries", strconv.Itoa(DefaultRetries)})
		}
	}
	queue := ""
	switch p.cfg.Ordering {
	case publish.OrderingFIFO:
		queue = p.queueName(m.PartitionKey)
		// The webhook holds a delivery whose key's previous event failed and is not back
		// in the outbox yet (pkg/webhook, keyorder.go); it must know the queue kept order.
		own = append(own, header{forwardPrefix + HeaderOrdering, OrderingFIFO})
	default:
		if p.flow != "" && m.PartitionKey != "" {
			own = append(own, header{"Upstash-Flow-Control-Key", names.flowControlKey(p.cfg.Name, m.PartitionKey)},
				header{"Upstash-Flow-Control-Value", p.flow})
		}
	}
	names.dest = p.appendMessageDestination(names.dest[:0], m)
	return appendBatchItem(dst, names.dest, m.Headers, own, m.Payload, queue), nil
}

// maxResponseBody bounds how much of a batch response is read (about 150 bytes per item).
const maxResponseBody = 32 << 20

// post sends chunk as one /v2/batch request. A 2xx answer gives one Result per item; any
// other answer gives the *APIError, and a request that got no (whole) answer the
// transport's error (classify reads both).
func (p *Publisher) post(ctx context.Context, a lease, chunk []encoded) ([]publish.Result, error) {
	// The body is the items' own slices between brackets and commas, written out by
	// the transport without being copied into one buffer first.
	size := int64(1)
	for _, it := range chunk {
		size += int64(len(it.data)) + 1
	}
	body := func() (io.ReadCloser, error) {
		bufs := make(net.Buffers, 0, 2*len(chunk)+1)
		for j, it := range chunk {
			sep := []byte(",")
			if j == 0 {
				sep = []byte("[")
			}
			bufs = append(bufs, sep, it.data)
		}
		bufs = append(bufs, []byte("]"))
		return a.body(bufs)
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	first, err := body()
	if err != nil {
		return nil, fmt.Errorf("publish qstash batch: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.batchURL, first)
	if err != nil {
		first.Close()
		return nil, fmt.Errorf("publish qstash batch: %w", err)
	}
	// As for a bytes.Reader body: a known length, and a fresh copy of the body when the
	// transport resends the request on a kept-alive connection the server had closed.
	req.ContentLength = size
	req.GetBody = body
	// The bearer token is set by the client's transport (Token.Transport).
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.cfg.HTTPClient.Do(req)
	if err != nil {
		// A network error or timeout: the batch may have been accepted. Resending is safe
		// because every item carries its deduplication id.
		return nil, &unreachableError{err: fmt.Errorf("publish qstash batch: %w", err)}
	}
	defer resp.Body.Close()
	buf, err := p.bufs.readResponse(resp, maxResponseBody)
	defer p.bufs.putResponse(buf) // whatever is kept of it is copied
	if err != nil {
		return nil, &unreachableError{err: fmt.Errorf("read qstash batch response: %w", err)}
	}
	data := buf.Bytes()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, newAPIError(resp, data, p.now(), req.Method, p.batchURL)
	}
	idx := make([]int, len(chunk))
	for j, it := range chunk {
		idx[j] = it.index
	}
	return p.decodeBatch(data, idx), nil
}

// decodeBatch maps a 2xx /v2/batch body to results. The body is a JSON array in request
// order; each element is {messageId,...}, {"error": text}, or (URL groups) an array of the
// former. Anything else fails the affected messages, retryably.
func (p *Publisher) decodeBatch(data []byte, idx []int) []publish.Result {
	out := make([]publish.Result, len(idx))
	// One pass when every element is an object (the usual answer); the general path below
	// re-reads each element and also takes URL-group arrays.
	var items []itemResponse
	if err := json.Unmarshal(data, &items); err == nil && len(items) == len(idx) {
		for i := range items {
			out[i] = p.itemResult(items[i:i+1], idx[i])
		}
		return out
	}
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
		out[i] = p.decodeItem(el, idx[i])
	}
	return out
}

// itemResponse is what the relay reads of a batch item's answer; the item's url, which
// QStash may send too (docs/qstash-contract.md §11), is left undecoded.
type itemResponse struct {
	MessageID    string `json:"messageId"`
	Deduplicated bool   `json:"deduplicated"`
	Error        string `json:"error"`
}

func (p *Publisher) decodeItem(el json.RawMessage, index int) publish.Result {
	el = bytes.TrimSpace(el)
	var rs []itemResponse
	if bytes.HasPrefix(el, []byte("[")) {
		if err := json.Unmarshal(el, &rs); err != nil || len(rs) == 0 {
			return publish.Result{Err: fmt.Errorf("decode qstash batch item %d: %w: %s", index, ErrBadResponse, snippet(el))}
		}
	} else {
		var r itemResponse
		if err := json.Unmarshal(el, &r); err != nil {
			return publish.Result{Err: fmt.Errorf("decode qstash batch item %d: %w: %s", index, ErrBadResponse, snippet(el))}
		}
		rs = []itemResponse{r}
	}
	return p.itemResult(rs, index)
}

// itemResult is the result of one message from its decoded answer (several for a URL
// group, all of which must have succeeded).
func (p *Publisher) itemResult(rs []itemResponse, index int) publish.Result {
	for _, r := range rs {
		if r.Error != "" {
			ie := &ItemError{Index: index, Message: r.Error}
			if v, hint, ok := deploymentText(r.Error); ok {
				return publish.Result{Err: p.deployment(v, hint, ie)}
			}
			return publish.Result{Err: ie}
		}
		if r.MessageID == "" {
			return publish.Result{Err: fmt.Errorf("decode qstash batch item %d: %w", index, ErrNoMessageID)}
		}
	}
	return publish.Result{MessageID: rs[0].MessageID}
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
