package qstashtest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// maxResponseBody bounds what is kept of a destination's response (for the DLQ entry and
// the failure callback).
const maxResponseBody = 64 << 10

// queue is a FIFO queue: one message at a time (parallelism 1 unless upserted otherwise);
// the next starts only after the current one is delivered or failed and its failure
// callback is done.
type queue struct {
	name        string
	parallelism int
	items       []*message
	active      int
	paused      bool
	createdAt   time.Time
	updatedAt   time.Time
}

// schedule registers m as pending and starts it (or queues it). False if closed.
func (s *Server) schedule(m *message) bool {
	if s.opts.HoldDeliveries {
		// Pending as any message (an enqueued one in its queue, whose lag counts it), but
		// never started: pumpQueue starts nothing either.
		m.ctx, m.cancel = s.ctx, func() {}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			return false
		}
		s.messages[m.id] = m
		if m.queue != "" {
			q := s.queueLocked(m.queue)
			q.items = append(q.items, m)
		}
		return true
	}
	ctx, cancel := context.WithCancel(s.ctx)
	m.ctx, m.cancel = ctx, cancel
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		return false
	}
	s.messages[m.id] = m
	if m.queue != "" {
		q := s.queueLocked(m.queue)
		q.items = append(q.items, m)
		s.mu.Unlock()
		s.pumpQueue(q)
		return true
	}
	s.mu.Unlock()
	if !s.goTracked(func() { s.run(ctx, m); s.finish(m) }) {
		s.finish(m)
		return false
	}
	return true
}

func (s *Server) queueLocked(name string) *queue {
	q, ok := s.queues[name]
	if !ok {
		now := time.Now()
		q = &queue{name: name, parallelism: 1, createdAt: now, updatedAt: now}
		s.queues[name] = q
	}
	return q
}

// pumpQueue starts the queue's next messages while it has free slots.
func (s *Server) pumpQueue(q *queue) {
	for {
		s.mu.Lock()
		if len(q.items) == 0 || q.active >= q.parallelism || q.paused || s.closed || s.opts.HoldDeliveries {
			s.mu.Unlock()
			return
		}
		m := q.items[0]
		q.items = q.items[1:]
		q.active++
		s.mu.Unlock()
		ok := s.goTracked(func() {
			s.run(m.ctx, m)
			s.finish(m)
			s.mu.Lock()
			q.active--
			s.mu.Unlock()
			s.pumpQueue(q)
		})
		if !ok {
			s.finish(m)
			return
		}
	}
}

// finish removes m from the pending set and wakes WaitIdle when nothing is left.
func (s *Server) finish(m *message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.messages[m.id]; !ok {
		return
	}
	delete(s.messages, m.id)
	m.cancel()
	if len(s.messages) == 0 {
		close(s.idle)
		s.idle = make(chan struct{})
	}
}

// sleep waits d or until ctx ends; false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// response is the last answer of the destination.
type response struct {
	status int
	header http.Header
	body   []byte
}

// run delivers m with retries. On final failure it records a DLQ entry and runs the
// failure callback to completion before returning (FIFO queues wait for both), or beside
// what follows (Options.FailureCallbackBeside).
func (s *Server) run(ctx context.Context, m *message) {
	if !sleep(ctx, time.Until(m.notBefore)) {
		return
	}
	var (
		last    response
		retried int
	)
	for ; ; retried++ {
		if m.flowKey != "" {
			if !s.flow.acquire(ctx, m.flowKey, m.flowParallelism, m.flowRate, m.flowPeriod) {
				return
			}
		}
		res, err := s.attempt(ctx, m, retried, false)
		if m.flowKey != "" {
			s.flow.release(m.flowKey)
		}
		if ctx.Err() != nil {
			return
		}
		if err == nil && res.status >= 200 && res.status <= 299 {
			s.maybeDuplicate(ctx, m, retried)
			if m.callback != "" && m.kind == kindMessage {
				s.callback(ctx, m, res, retried, kindCallback)
			}
			return
		}
		last = res
		nonRetryable := res.status == 489 && strings.EqualFold(res.header.Get("Upstash-NonRetryable-Error"), "true")
		if nonRetryable || retried >= m.retries {
			break
		}
		delay := s.retryDelay(m, retried+1, res)
		if !sleep(ctx, delay) {
			return
		}
	}
	if m.kind != kindMessage {
		return
	}
	e := s.addDLQ(m, last, retried)
	switch {
	case m.failureCallback == "":
	case s.opts.FailureCallbackBeside:
		// A message of its own, pending (WaitIdle waits for it) but outside the queue.
		cb := s.failureCallbackMessage(m, e)
		cb.queue = ""
		s.schedule(cb)
	default:
		s.failureCallback(ctx, m, e)
	}
}

// retryDelay is the wait before retry n (1-based): a receiver-sent delay if present and
// at most a day, else Upstash-Retry-Delay, else min(86400, e^(2.5n)) s; all times TimeScale.
func (s *Server) retryDelay(m *message, n int, res response) time.Duration {
	var d time.Duration = -1
	if res.header != nil {
		for _, name := range []string{"Retry-After", "X-RateLimit-Reset", "X-RateLimit-Reset-Requests", "X-RateLimit-Reset-Tokens"} {
			if v := res.header.Get(name); v != "" {
				if rd, ok := parseReceiverDelay(v, time.Now()); ok && rd <= maxBackoff {
					d = rd
					break
				}
			}
		}
	}
	if d < 0 && m.retryDelay >= 0 {
		d = m.retryDelay
	}
	if d < 0 {
		d = backoff(n)
	}
	return time.Duration(float64(d) * s.opts.TimeScale)
}

// backoff is QStash's default delay before retry n (n = 1 for the first retry):
// min(86400, e^(2.5n)) seconds, unscaled.
func backoff(n int) time.Duration {
	sec := math.Min(86400, math.Exp(2.5*float64(n)))
	return time.Duration(sec * float64(time.Second))
}

// parseReceiverDelay reads seconds, an HTTP date or a Go duration.
func parseReceiverDelay(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now)), true
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return d, true
	}
	return 0, false
}

// attempt makes one delivery and records it.
func (s *Server) attempt(ctx context.Context, m *message, retried int, duplicate bool) (response, error) {
	key, err := s.delayFault(ctx)
	if err != nil {
		return response{}, err
	}
	if s.inFlight != nil {
		// The account's delivery parallelism: wait for a slot.
		select {
		case s.inFlight <- struct{}{}:
			defer func() { <-s.inFlight }()
		case <-ctx.Done():
			return response{}, ctx.Err()
		}
	}
	start := time.Now()
	sig, err := qstash.Sign(key, m.url, m.body, start.Add(s.opts.ClockSkew))
	if err != nil {
		return response{}, err
	}
	timeout := s.opts.DeliveryTimeout
	if m.timeout > 0 && m.timeout < timeout {
		timeout = m.timeout
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := deliveryRequest(actx, m, retried, sig)
	if err != nil {
		return response{}, err
	}
	a := Attempt{
		MessageID: m.id, URL: m.url, Method: m.method, Queue: m.queue, Retried: retried,
		Duplicate: duplicate, FailureCallback: m.kind == kindFailureCallback, Callback: m.kind == kindCallback,
		Header: req.Header.Clone(), Body: m.body, Start: start,
	}
	var res response
	resp, err := s.client.Do(req)
	if err == nil {
		data, rerr := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
		_ = resp.Body.Close()
		res = response{status: resp.StatusCode, header: resp.Header, body: data}
		a.Status = resp.StatusCode
		if rerr != nil {
			a.Err = rerr.Error()
		}
	} else {
		a.Err = err.Error()
	}
	a.End = time.Now()
	if ctx.Err() != nil {
		// Cancelled by Close or a message cancel: not an attempt the destination judged.
		return res, ctx.Err()
	}
	s.mu.Lock()
	s.attempts = appendBounded(s.attempts, a, s.opts.LogLimit)
	s.mu.Unlock()
	if s.opts.OnAttempt != nil {
		s.opts.OnAttempt(a)
	}
	return res, err
}

// delayFault holds a delivery for the configured delay fault, if it strikes, and returns
// the key to sign it with; the error is ctx's if it ends meanwhile.
func (s *Server) delayFault(ctx context.Context) (string, error) {
	s.mu.Lock()
	f := s.faults
	var hold time.Duration
	if f.DelayRate > 0 && f.MaxDelay > 0 && s.delRand.Float64() < f.DelayRate {
		hold = time.Duration(s.delRand.Int64N(int64(f.MaxDelay)) + 1)
	}
	cur, next := s.keys[0], s.keys[1]
	s.mu.Unlock()
	if !sleep(ctx, hold) {
		return "", ctx.Err()
	}
	if s.opts.SignWithNextKey {
		return next, nil
	}
	return cur, nil
}

// deliveryRequest builds the request QStash sends to m's destination: its forwarded
// headers and the Upstash ones, signed with sig.
func deliveryRequest(ctx context.Context, m *message, retried int, sig string) (*http.Request, error) {
	var body io.Reader
	if len(m.body) > 0 {
		body = bytes.NewReader(m.body)
	}
	req, err := http.NewRequestWithContext(ctx, m.method, m.url, body)
	if err != nil {
		return nil, err
	}
	for k, vs := range m.header {
		req.Header[k] = append([]string(nil), vs...)
	}
	req.Header.Set("User-Agent", "Upstash-QStash")
	req.Header.Set("Upstash-Message-Id", m.id)
	req.Header.Set("Upstash-Retried", strconv.Itoa(retried))
	req.Header.Set("Upstash-Signature", sig)
	if m.callerIP != "" {
		req.Header.Set("Upstash-Caller-Ip", m.callerIP)
	}
	return req, nil
}

// maybeDuplicate re-sends a delivered message once, if the duplicate fault fires.
func (s *Server) maybeDuplicate(ctx context.Context, m *message, retried int) {
	s.mu.Lock()
	dup := s.faults.DuplicateRate > 0 && s.delRand.Float64() < s.faults.DuplicateRate
	s.mu.Unlock()
	if dup {
		_, _ = s.attempt(ctx, m, retried, true)
	}
}

// callbackBody is the failure (or success) callback JSON, per qstash-contract.md §8:
// numbers for status, counts and unix-ms times; header maps of lists; bodies in std base64.
func callbackBody(m *message, res response, retried int, dlqID string) []byte {
	header := map[string][]string{}
	for k, vs := range res.header {
		header[k] = vs
	}
	src := map[string][]string{}
	for k, vs := range m.header {
		src[k] = vs
	}
	v := map[string]any{
		"status":          res.status,
		"header":          header,
		"body":            base64.StdEncoding.EncodeToString(res.body),
		"retried":         retried,
		"maxRetries":      m.retries,
		"sourceMessageId": m.id,
		"url":             m.url,
		"method":          m.method,
		"sourceHeader":    src,
		"sourceBody":      base64.StdEncoding.EncodeToString(m.body),
		"notBefore":       unixMs(m.notBefore, m.createdAt),
		"createdAt":       m.createdAt.UnixMilli(),
		"callerIP":        m.callerIP,
	}
	if dlqID != "" {
		v["dlqId"] = dlqID
	}
	if m.queue != "" {
		v["queueName"] = m.queue
	}
	b, _ := json.Marshal(v)
	return b
}

func unixMs(t, fallback time.Time) int64 {
	if t.IsZero() {
		return fallback.UnixMilli()
	}
	return t.UnixMilli()
}

// failureCallback delivers the failure callback of m as its own signed message, with its
// own retries, and waits for it.
func (s *Server) failureCallback(ctx context.Context, m *message, e *dlqEntry) {
	s.run(ctx, s.failureCallbackMessage(m, e))
}

// failureCallbackMessage is the failure callback of m, whose DLQ entry is e.
func (s *Server) failureCallbackMessage(m *message, e *dlqEntry) *message {
	return callbackMessage(m, m.failureCallback, m.fcMethod, callbackBody(m, e.resp, e.retried, e.id),
		m.fcRetries, m.fcTimeout, m.fcHeader, kindFailureCallback)
}

// callback sends the success callback once (best effort, with the message's retries).
func (s *Server) callback(ctx context.Context, m *message, res response, retried int, kind attemptKind) {
	s.run(ctx, callbackMessage(m, m.callback, http.MethodPost, callbackBody(m, res, retried, ""),
		m.retries, 0, m.cbHeader, kind))
}

// callbackMessage is a callback about m: a message of its own to url, JSON with the
// callback's own headers added, with m's caller and retry delay, and in m's queue when it
// is the failure callback.
func callbackMessage(m *message, url, method string, body []byte, retries int, timeout time.Duration, h http.Header, kind attemptKind) *message {
	cb := &message{
		id:         "msg_" + randomID(26),
		url:        url,
		method:     method,
		header:     http.Header{"Content-Type": {"application/json"}},
		body:       body,
		retries:    retries,
		timeout:    timeout,
		createdAt:  time.Now(),
		callerIP:   m.callerIP,
		retryDelay: m.retryDelay,
		kind:       kind,
	}
	if kind == kindFailureCallback {
		cb.queue = m.queue
	}
	for k, vs := range h {
		cb.header[k] = vs
	}
	return cb
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
