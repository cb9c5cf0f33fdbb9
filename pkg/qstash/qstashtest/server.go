// Package qstashtest is a QStash-compatible server for tests and the local stack, in the
// style of net/http/httptest: NewServer starts it on a loopback port, and its URL, Token and
// signing keys configure a client exactly as the official dev server's would.
//
// It implements the parts of the QStash v2 API that this project and qstash-go v1.0.0 use
// (qstash-contract.md, checklist): publish, batch, enqueue into FIFO queues, deduplication,
// signed deliveries with QStash's retry and backoff rules, flow control, the DLQ with
// failure callbacks, signing keys and pending messages, plus seeded fault injection and an
// attempt log for tests. URL groups, schedules and the success callback's per-attempt
// semantics are not implemented. State lives in memory.
//
// It is as strict as production where the relay depends on it (docs/qstash-contract.md):
// flow-control keys and labels outside the resource-name rule are 400, bodies over 100 MB
// 413, unknown paths 404; with Options.Plan, the plan's message size (412), retry cap (400),
// queue count (412) and delivery parallelism. Options.BatchErrors switches between the
// documented per-item batch errors and the whole-request 400 seen in production;
// Options.QuotaMessages answers 429 like a used-up daily quota; Options.Latency models the
// round trip to a remote QStash.
package qstashtest

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// Defaults for Options.
const (
	DefaultAddr            = "127.0.0.1:8080"
	DefaultDedupWindow     = 10 * time.Minute
	DefaultDeliveryTimeout = 30 * time.Second
	// defaultLogLimit bounds each of the request and attempt logs: a long-running
	// qstash-dev or a two-hour benchmark must not grow without bound (an attempt keeps its
	// headers and body, about 5 kB: 650 MB at the limit, 6 GB after a million deliveries).
	defaultLogLimit = 1 << 17
	// maxBackoff is QStash's cap on the default retry delay (one day).
	maxBackoff = 24 * time.Hour
)

// Options configures a Server. Zero fields take the defaults.
type Options struct {
	// Addr is the listen address for Start. Default DefaultAddr. NewServer ignores it and
	// listens on a free loopback port.
	Addr string
	// Token is the accepted API token. Default qstash.DevToken.
	Token string
	// CurrentSigningKey and NextSigningKey default to the dev keys.
	CurrentSigningKey string
	NextSigningKey    string
	// SignWithNextKey signs deliveries with the next key instead of the current one (a
	// verifier must accept both during rotation).
	SignWithNextKey bool
	// ClockSkew shifts the iat/exp of every signature (a negative value ages tokens).
	ClockSkew time.Duration
	// TimeScale multiplies every retry delay: QStash's min(86400, e^(2.5n)) s backoff,
	// Retry-After answers and Upstash-Retry-Delay. Default 1 (QStash's real timing); tests
	// use e.g. 0.0001 so a 12 s backoff takes 1.2 ms.
	TimeScale float64
	// DedupWindow is how long a deduplication id is remembered. Default DefaultDedupWindow
	// (10 min, as the current QStash docs state).
	DedupWindow time.Duration
	// DeliveryTimeout cuts off a delivery attempt unless Upstash-Timeout is shorter.
	// Default DefaultDeliveryTimeout.
	DeliveryTimeout time.Duration
	// AllowNonLoopback permits destinations and callbacks on non-loopback hosts. Default
	// false: they are refused with 400, so a test cannot post to the internet.
	AllowNonLoopback bool
	// Seed seeds the fault-injection random sources, so a run with the same Seed and the
	// same sequence of requests injects the same faults.
	Seed uint64
	// Faults is the initial fault configuration (see SetFaults).
	Faults Faults
	// OnAttempt, if set, is called after every delivery attempt (including failure
	// callbacks), from the delivering goroutine; it must be safe for concurrent use.
	OnAttempt func(Attempt)
	// HTTPClient delivers messages. Default a client with its own transport.
	HTTPClient *http.Client
	// Logger receives the server's logs. Default: discard.
	Logger *slog.Logger

	// Plan, when set, enforces that QStash plan's limits as production does: message size
	// (412), Upstash-Retries cap (400), queue count (412) and delivery parallelism
	// (MaxInFlight). Default "" behaves as the official dev server is documented to: no
	// plan limits. The rules that hold on every plan are always enforced: flow-control
	// keys and labels (400), requests over 100 MB (413), unknown paths (404).
	Plan qstash.Plan
	// BatchErrors chooses how a batch with an invalid message is answered. Default
	// BatchErrorsPerItem.
	BatchErrors BatchErrorMode
	// RetriesRefusal, when set, is the text of the 400 for an Upstash-Retries over the
	// Plan's cap, in place of the server's own ("Upstash-Retries 5 exceeds the maximum of
	// 3 retries of the free plan"). Production's wording is undocumented
	// (docs/qstash-contract.md §4), so tests run each plausible one.
	RetriesRefusal string
	// QuotaMessages, when positive, is a daily message quota: a publish, enqueue or batch
	// request that would take the count of accepted messages over it is answered 429 with
	// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset (unix seconds), as
	// production does when the daily quota is used up, and nothing of it is accepted. The
	// count restarts every QuotaWindow, or on ResetQuota.
	QuotaMessages int
	// QuotaWindow is the quota's period. Default DefaultQuotaWindow (a day).
	QuotaWindow time.Duration
	// ManagementBurst, when positive, is the management endpoints' one-second burst limit
	// (queues, DLQ, messages, flow control, keys; docs/qstash-contract.md §5): a request
	// over it within one second of the server's clock is answered 429 with
	// Burst-RateLimit-Limit, Burst-RateLimit-Remaining (0) and Burst-RateLimit-Reset (unix
	// seconds of the next second), and is not served. Publish, enqueue and batch have no
	// per-second limit.
	ManagementBurst int
	// Latency delays the answer to every API request (before it is handled), modelling
	// the network round trip to QStash; LatencyJitter adds a uniform random extra in
	// [0, LatencyJitter). Deliveries are not delayed.
	Latency       time.Duration
	LatencyJitter time.Duration
	// HoldDeliveries keeps every accepted message pending and never attempts it, as if the
	// account's deliveries were paused: for measuring the publish path alone (a delivery
	// happens on QStash's machines, not the relay's). A held message costs memory only, no
	// goroutine; it can still be cancelled, and WaitIdle does not return while any is held.
	HoldDeliveries bool
	// FailureCallbackBeside makes a FIFO queue move on to its next message as soon as a
	// message has failed, its failure callback delivered beside that next message. By
	// default the queue waits until the failure callback is done. QStash documents only
	// that a queue delivers its next message after the current one is delivered or failed
	// (docs/qstash-contract.md 7), not whether its failure callback comes first, so tests of
	// per-key order run both.
	FailureCallbackBeside bool
	// LogLimit bounds the request and attempt logs that Requests and Attempts return:
	// each keeps its newest LogLimit/2 to LogLimit entries. Default 131,072 (1 << 17).
	// Negative: nothing is logged, and Requests and Attempts return nil. A benchmark that
	// reads neither sets it, so the garbage collector of the process it measures does not
	// scan the headers of 131,072 attempts that the real QStash keeps on its own machines
	// (in the bench's pinned scenario, 800 deliveries/s: 14 of the process's 194
	// CPU-seconds spent marking without them, 30 of 222 with). OnAttempt is called either
	// way.
	LogLimit int
	// MaxInFlight caps delivery attempts in flight at once (QStash's per-plan
	// "parallelism"); attempts over it wait for a slot. Default: the Plan's parallelism,
	// or no cap without a Plan. Negative: no cap.
	MaxInFlight int
}

// BatchErrorMode is how the server answers a /v2/batch request with an invalid message.
type BatchErrorMode string

const (
	// BatchErrorsPerItem answers 200 with an {"error"} element for the invalid message and
	// publishes the others, as QStash documents (docs features/batch).
	BatchErrorsPerItem BatchErrorMode = "per-item"
	// BatchErrorsWholeRequest answers 400 {"error"} for the whole request and publishes
	// nothing, as production was observed to do for one bad deduplication id
	// (github.com/superset-sh/superset/pull/3591).
	BatchErrorsWholeRequest BatchErrorMode = "whole-request"
)

// DefaultQuotaWindow is the quota period: QStash's quota is per day.
const DefaultQuotaWindow = 24 * time.Hour

// Request is one API request as the server answered it.
type Request struct {
	Method string
	// Path is the escaped path, without the query.
	Path   string
	Status int
	// Bytes is the request body's length as read (up to the 100 MB limit).
	Bytes int64
	// Messages is the number of messages the request carried (publish, enqueue, batch).
	Messages int
}

// Faults are injected failures. Rates are probabilities in [0,1]. A Server's faults can be
// changed at any time with SetFaults.
type Faults struct {
	// Publish5xxRate: a publish, enqueue or batch request is answered 500 and not accepted.
	Publish5xxRate float64
	// Publish429Rate: such a request is answered 429 with RateLimit-* and Retry-After
	// headers and not accepted.
	Publish429Rate float64
	// DropResponseRate: the request is accepted (messages are created) but the connection
	// is closed without a response: the ambiguous timeout a publisher must survive.
	DropResponseRate float64
	// DuplicateRate: after a successful delivery, the same delivery (same message id and
	// Upstash-Retried) is made once more, as QStash's at-least-once delivery allows.
	DuplicateRate float64
	// DelayRate and MaxDelay: an attempt is held back by a random delay up to MaxDelay
	// before it is sent, which reorders deliveries that are not in a FIFO queue.
	DelayRate float64
	MaxDelay  time.Duration
	// Outage, when set, fails every API request (publish, batch, queues, DLQ, ...) the way
	// an outage of QStash, or of the egress to it, does, until it is set back to
	// OutageNone; nothing of a failed request is accepted. Deliveries are not affected.
	// (A connection refused needs no server: point the client at a closed port.)
	Outage Outage
}

// Outage is how the server fails every API request during an injected outage.
type Outage string

const (
	// OutageNone (the zero value) injects no outage.
	OutageNone Outage = ""
	// Outage503 answers 503 {"error"}, as a failing service or its load balancer does.
	Outage503 Outage = "503"
	// OutageHang never answers: the request hangs until the client gives up (its
	// timeout) or the server closes.
	OutageHang Outage = "hang"
	// OutageReset closes the connection without an answer, before reading the request.
	OutageReset Outage = "reset"
)

// Attempt is one delivery attempt as the destination saw it.
type Attempt struct {
	MessageID string
	// URL is the destination (or the failure-callback URL).
	URL    string
	Method string
	// Queue is the FIFO queue, if the message was enqueued.
	Queue string
	// Retried is the Upstash-Retried header sent: 0 on the first attempt.
	Retried int
	// Status is the response status, 0 if no response arrived (Err says why).
	Status int
	Err    string
	// Duplicate marks an injected duplicate delivery; FailureCallback a failure-callback
	// delivery; Callback a success-callback delivery.
	Duplicate       bool
	FailureCallback bool
	Callback        bool
	// Header and Body are what was sent.
	Header http.Header
	Body   []byte
	Start  time.Time
	End    time.Time
}

// Server is a running QStash-compatible server.
type Server struct {
	// URL is the base URL (QSTASH_URL), e.g. http://127.0.0.1:43121, without a trailing "/".
	URL string
	// Token is the accepted API token (QSTASH_TOKEN) at start; SetToken changes it.
	Token string
	// CurrentSigningKey and NextSigningKey are the signing keys at start. Rotation through
	// the API changes the keys in use; see Keys.
	CurrentSigningKey string
	NextSigningKey    string

	opts   Options
	log    *slog.Logger
	srv    *http.Server
	ln     net.Listener
	client *http.Client
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	closed   bool
	wg       sync.WaitGroup
	keys     [2]string
	faults   Faults
	token    string // the accepted token (SetToken)
	pubRand  *rand.Rand
	delRand  *rand.Rand
	seq      uint64
	dedup    map[string]dedupEntry
	messages map[string]*message // pending (not yet delivered or failed)
	queues   map[string]*queue
	dlq      []*dlqEntry
	attempts []Attempt
	idle     chan struct{} // closed and replaced when pending drops to zero
	flow     *flowControl
	limits   *qstash.PlanLimits // nil without a Plan
	requests []Request
	latRand  *rand.Rand
	// inFlight holds one token per delivery attempt in flight; nil means no cap.
	inFlight   chan struct{}
	quotaUsed  int
	quotaStart time.Time
	// burstSecond and burstUsed count management requests in the current second.
	burstSecond int64
	burstUsed   int
	// dedupOrder lists dedup's keys in insertion order, so expired ids are dropped from
	// its front as new ones arrive, at no cost per remembered id.
	dedupOrder []string
}

// TB is the part of testing.TB that NewTestServer uses.
type TB interface {
	Helper()
	Cleanup(func())
}

// TestTimeScale is the TimeScale NewTestServer sets when the options set none: QStash's
// retry delays shrunk so a test waits milliseconds for what takes minutes in production.
const TestTimeScale = 0.0001

// NewTestServer is NewServer for a test: TimeScale defaults to TestTimeScale, and the
// server is closed when the test ends.
func NewTestServer(tb TB, opts Options) *Server {
	tb.Helper()
	if opts.TimeScale == 0 {
		opts.TimeScale = TestTimeScale
	}
	s := NewServer(opts)
	tb.Cleanup(s.Close)
	return s
}

// NewServer starts a Server on a free loopback port. It panics if it cannot listen, as
// httptest.NewServer does. Call Close when done.
func NewServer(opts Options) *Server {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("qstashtest: listen: %v", err))
	}
	return start(ln, opts)
}

// Start starts a Server on opts.Addr (default DefaultAddr), for running it standalone.
func Start(opts Options) (*Server, error) {
	addr := opts.Addr
	if addr == "" {
		addr = DefaultAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("start qstash server: %w", err)
	}
	return start(ln, opts), nil
}

func start(ln net.Listener, opts Options) *Server {
	opts, limits := opts.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		URL:               "http://" + ln.Addr().String(),
		Token:             opts.Token,
		token:             opts.Token,
		CurrentSigningKey: opts.CurrentSigningKey,
		NextSigningKey:    opts.NextSigningKey,
		opts:              opts,
		log:               opts.Logger,
		ln:                ln,
		ctx:               ctx,
		cancel:            cancel,
		keys:              [2]string{opts.CurrentSigningKey, opts.NextSigningKey},
		faults:            opts.Faults,
		pubRand:           rand.New(rand.NewPCG(opts.Seed, 1)),
		delRand:           rand.New(rand.NewPCG(opts.Seed, 2)),
		dedup:             map[string]dedupEntry{},
		messages:          map[string]*message{},
		queues:            map[string]*queue{},
		idle:              make(chan struct{}),
		limits:            limits,
		latRand:           rand.New(rand.NewPCG(opts.Seed, 3)),
		quotaStart:        time.Now(),
	}
	if opts.MaxInFlight > 0 {
		s.inFlight = make(chan struct{}, opts.MaxInFlight)
	}
	s.flow = newFlowControl()
	s.client = deliveryClient(opts.HTTPClient)
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.ErrorContext(ctx, "qstash server stopped", "error", err)
		}
	}()
	return s
}

// withDefaults returns opts with every zero field defaulted, and the limits of opts.Plan
// (nil for no plan). An unknown plan panics: Options come from the test's own code.
func (opts Options) withDefaults() (Options, *qstash.PlanLimits) {
	opts.Token = cmp.Or(opts.Token, qstash.DevToken)
	opts.CurrentSigningKey = cmp.Or(opts.CurrentSigningKey, qstash.DevCurrentSigningKey)
	opts.NextSigningKey = cmp.Or(opts.NextSigningKey, qstash.DevNextSigningKey)
	if opts.TimeScale <= 0 {
		opts.TimeScale = 1
	}
	if opts.DedupWindow <= 0 {
		opts.DedupWindow = DefaultDedupWindow
	}
	if opts.DeliveryTimeout <= 0 {
		opts.DeliveryTimeout = DefaultDeliveryTimeout
	}
	opts.Logger = cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	opts.BatchErrors = cmp.Or(opts.BatchErrors, BatchErrorsPerItem)
	if opts.QuotaWindow <= 0 {
		opts.QuotaWindow = DefaultQuotaWindow
	}
	opts.LogLimit = cmp.Or(opts.LogLimit, defaultLogLimit)
	if opts.Plan == "" {
		return opts, nil
	}
	l, err := opts.Plan.Limits()
	if err != nil {
		panic(fmt.Sprintf("qstashtest: %v", err))
	}
	opts.MaxInFlight = cmp.Or(opts.MaxInFlight, l.MaxParallelism)
	return opts, &l
}

// deliveryClient returns c, or the client deliveries use by default.
func deliveryClient(c *http.Client) *http.Client {
	if c != nil {
		return c
	}
	return &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second},
		// QStash does not follow redirects as far as anyone has documented; a 3xx is a
		// failed attempt.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Close stops accepting requests, cancels pending deliveries and waits for every
// goroutine the server started. Pending messages are lost, as with the dev server.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = s.srv.Shutdown(sctx)
	cancel()
	_ = s.srv.Close()
	s.wg.Wait()
	if t, ok := s.client.Transport.(*http.Transport); ok && s.opts.HTTPClient == nil {
		t.CloseIdleConnections()
	}
}

// go runs f on a tracked goroutine, unless the server is closed.
func (s *Server) goTracked(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// SetFaults replaces the fault configuration; it applies to requests and attempts that
// start afterwards.
func (s *Server) SetFaults(f Faults) {
	s.mu.Lock()
	s.faults = f
	s.mu.Unlock()
}

// Faults returns the current fault configuration.
func (s *Server) Faults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

// Attempts returns a copy of the delivery attempts so far (the most recent LogLimit/2 to
// LogLimit of them), in completion order.
func (s *Server) Attempts() []Attempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Attempt(nil), s.attempts...)
}

// Keys returns the signing keys in use (they change on rotation).
func (s *Server) Keys() (current, next string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[0], s.keys[1]
}

// Pending is the number of messages not yet delivered or finally failed (including their
// failure callbacks).
func (s *Server) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.messages)
}

// WaitIdle blocks until no message is pending, or ctx ends.
func (s *Server) WaitIdle(ctx context.Context) error {
	for {
		s.mu.Lock()
		n, ch := len(s.messages), s.idle
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for qstash server idle: %d pending: %w", n, ctx.Err())
		}
	}
}

// ServeHTTP routes on the raw path: http.ServeMux would clean /v2/publish/https://x into
// /v2/publish/https:/x and answer with a redirect.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &recorder{ResponseWriter: w, status: http.StatusOK}
	req := Request{Method: r.Method, Path: r.URL.EscapedPath()}
	s.delay(r.Context())
	if o := s.Faults().Outage; o != OutageNone {
		s.fail(rec, r, o)
	} else if r.ContentLength > maxBody {
		// QStash's limit is on the body; refuse before reading it.
		writeError(rec, http.StatusRequestEntityTooLarge, "request body is over the 100 MB limit")
	} else {
		r.Body = &countingBody{ReadCloser: r.Body, n: &req.Bytes}
		s.route(rec, r, &req)
	}
	req.Status = rec.status
	s.mu.Lock()
	s.requests = appendBounded(s.requests, req, s.opts.LogLimit)
	s.mu.Unlock()
}

// fail answers r as outage o does.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, o Outage) {
	switch o {
	case OutageHang:
		// Read to the end so that the server notices the client hanging up.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-s.ctx.Done():
		}
		dropResponse(w)
	case OutageReset:
		dropResponse(w)
	default:
		writeError(w, http.StatusServiceUnavailable, "injected outage: service unavailable")
	}
}

// appendBounded appends v to a log that keeps only its newest limit/2 entries once it holds
// limit (Options.LogLimit), so it never holds more than limit; a negative limit keeps
// nothing.
func appendBounded[T any](log []T, v T, limit int) []T {
	if limit < 0 {
		return nil
	}
	if len(log) >= limit {
		log = append(log[:0], log[len(log)-limit/2:]...)
	}
	return append(log, v)
}

// Requests returns the API requests so far (the most recent LogLimit/2 to LogLimit of
// them), in the order they were answered.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// delay waits the configured latency (plus jitter), or until ctx ends.
func (s *Server) delay(ctx context.Context) {
	d := s.opts.Latency
	if s.opts.LatencyJitter > 0 {
		s.mu.Lock()
		d += time.Duration(s.latRand.Int64N(int64(s.opts.LatencyJitter)))
		s.mu.Unlock()
	}
	sleep(ctx, d)
}

// recorder keeps the status written.
type recorder struct {
	http.ResponseWriter
	status int
}

func (r *recorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// Hijack lets dropResponse close the connection.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := r.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("hijack not supported")
	}
	r.status = 0
	return h.Hijack()
}

type countingBody struct {
	io.ReadCloser
	n *int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	*c.n += int64(n)
	return n, err
}

func (s *Server) route(w http.ResponseWriter, r *http.Request, req *Request) {
	if !s.authorized(r) {
		writeError(w, http.StatusUnauthorized, "invalid token")
		return
	}
	path := r.URL.EscapedPath()
	switch {
	case strings.HasPrefix(path, "/v2/publish/"):
		s.onlyPost(w, r, func() { s.handlePublish(w, r, req, "", strings.TrimPrefix(path, "/v2/publish/")) })
	case strings.HasPrefix(path, "/v2/enqueue/"):
		rest := strings.TrimPrefix(path, "/v2/enqueue/")
		q, dest, ok := strings.Cut(rest, "/")
		if !ok || q == "" {
			writeError(w, http.StatusBadRequest, "queue name and destination are required")
			return
		}
		s.onlyPost(w, r, func() { s.handlePublish(w, r, req, q, dest) })
	case path == "/v2/batch":
		s.onlyPost(w, r, func() { s.handleBatch(w, r, req) })
	case isManagement(path) && s.overBurst(w):
		// answered 429 by overBurst
	case path == "/v2/keys":
		s.handleKeys(w, r)
	case path == "/v2/keys/rotate" || path == "/v2/rotate":
		s.onlyPost(w, r, func() { s.handleRotate(w) })
	case path == "/v2/dlq" || strings.HasPrefix(path, "/v2/dlq/"):
		s.handleDLQ(w, r, strings.TrimPrefix(strings.TrimPrefix(path, "/v2/dlq"), "/"))
	case strings.HasPrefix(path, "/v2/messages/"):
		s.handleMessage(w, r, strings.TrimPrefix(path, "/v2/messages/"))
	case path == "/v2/queues" || strings.HasPrefix(path, "/v2/queues/"):
		s.handleQueues(w, r, strings.TrimPrefix(strings.TrimPrefix(path, "/v2/queues"), "/"))
	case path == "/v2/flowControl" || strings.HasPrefix(path, "/v2/flowControl/"):
		s.handleFlowControl(w, r, strings.TrimPrefix(strings.TrimPrefix(path, "/v2/flowControl"), "/"))
	default:
		writeError(w, http.StatusNotFound, "not found: "+r.Method+" "+path)
	}
}

func (s *Server) onlyPost(w http.ResponseWriter, r *http.Request, f func()) {
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	f()
}

func (s *Server) authorized(r *http.Request) bool {
	tok := r.URL.Query().Get("qstash_token")
	if h := r.Header.Get("Authorization"); h != "" {
		t, ok := strings.CutPrefix(h, "Bearer ")
		if !ok {
			return false
		}
		tok = t
	}
	s.mu.Lock()
	want := s.token
	s.mu.Unlock()
	return tok != "" && tok == want
}

// SetToken makes token the only accepted API token, as rotating it in the console does:
// the old one is refused with 401 from then on.
func (s *Server) SetToken(token string) {
	s.mu.Lock()
	s.token = token
	s.mu.Unlock()
}

func (s *Server) handleKeys(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		writeError(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	cur, next := s.Keys()
	writeJSON(w, http.StatusOK, map[string]string{"current": cur, "next": next})
}

func (s *Server) handleRotate(w http.ResponseWriter) {
	s.mu.Lock()
	s.keys = [2]string{s.keys[1], "sig_" + randomID(28)}
	cur, next := s.keys[0], s.keys[1]
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{"current": cur, "next": next})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encode response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// isManagement reports whether path is one of the endpoints under the one-second burst
// limit (docs/qstash-contract.md §5): everything but publish, enqueue and batch.
func isManagement(path string) bool {
	for _, p := range []string{"/v2/keys", "/v2/rotate", "/v2/dlq", "/v2/messages/", "/v2/queues", "/v2/flowControl"} {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}

// overBurst counts a management request against Options.ManagementBurst and answers 429
// when it is over the limit in the current second.
func (s *Server) overBurst(w http.ResponseWriter) bool {
	if s.opts.ManagementBurst <= 0 {
		return false
	}
	now := time.Now().Unix()
	s.mu.Lock()
	if now != s.burstSecond {
		s.burstSecond, s.burstUsed = now, 0
	}
	s.burstUsed++
	over := s.burstUsed > s.opts.ManagementBurst
	s.mu.Unlock()
	if !over {
		return false
	}
	h := w.Header()
	h.Set("Burst-RateLimit-Limit", strconv.Itoa(s.opts.ManagementBurst))
	h.Set("Burst-RateLimit-Remaining", "0")
	h.Set("Burst-RateLimit-Reset", strconv.FormatInt(now+1, 10))
	writeError(w, http.StatusTooManyRequests, "burst rate limit exceeded")
	return true
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

const base58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"

// randomID is n base58 characters from a CSPRNG-seeded source (ids, not faults, so it
// does not consume the seeded fault streams).
func randomID(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = base58[rand.IntN(len(base58))]
	}
	return string(b)
}
