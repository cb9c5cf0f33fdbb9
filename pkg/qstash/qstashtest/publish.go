package qstashtest

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// maxBody bounds a publish or batch request: QStash's 100 MB request limit, answered 413.
const maxBody = qstash.MaxRequestBytes

// message is a published message, pending until delivered or finally failed.
type message struct {
	id        string
	url       string
	method    string
	header    http.Header // sent to the destination (forwarded headers already stripped)
	body      []byte
	retries   int
	timeout   time.Duration
	notBefore time.Time
	createdAt time.Time
	queue     string
	callerIP  string
	// retryDelay is a constant Upstash-Retry-Delay, or -1 for QStash's default backoff.
	retryDelay time.Duration

	callback, failureCallback string
	fcRetries                 int
	fcMethod                  string
	fcTimeout                 time.Duration
	fcHeader                  http.Header
	cbHeader                  http.Header

	flowKey         string
	flowParallelism int
	flowRate        int
	flowPeriod      time.Duration

	// kind marks a callback message; its outcome creates no DLQ entry or further callback.
	kind attemptKind

	ctx    context.Context
	cancel context.CancelFunc
}

type attemptKind int

const (
	kindMessage attemptKind = iota
	kindFailureCallback
	kindCallback
)

type dedupEntry struct {
	messageID string
	url       string
	at        time.Time
}

// publishResponse is one element of a publish or batch answer.
type publishResponse struct {
	MessageID    string `json:"messageId,omitempty"`
	URL          string `json:"url,omitempty"`
	Deduplicated bool   `json:"deduplicated,omitempty"`
	Error        string `json:"error,omitempty"`
}

// badRequest is a validation failure answered with 400 {"error"}.
type badRequest string

func (e badRequest) Error() string { return string(e) }

// fault draws the publish-side fault for one request: "", "5xx", "429" or "drop".
func (s *Server) fault() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.faults
	if f.Publish5xxRate <= 0 && f.Publish429Rate <= 0 && f.DropResponseRate <= 0 {
		return ""
	}
	x := s.pubRand.Float64()
	switch {
	case x < f.Publish5xxRate:
		return "5xx"
	case x < f.Publish5xxRate+f.Publish429Rate:
		return "429"
	case x < f.Publish5xxRate+f.Publish429Rate+f.DropResponseRate:
		return "drop"
	}
	return ""
}

// preFault answers an injected 5xx or 429 and reports whether it did.
func preFault(w http.ResponseWriter, f string) bool {
	switch f {
	case "5xx":
		writeError(w, http.StatusInternalServerError, "injected fault: internal server error")
		return true
	case "429":
		w.Header().Set("RateLimit-Limit", "1000")
		w.Header().Set("RateLimit-Remaining", "0")
		w.Header().Set("RateLimit-Reset", strconv.FormatInt(time.Now().Add(time.Second).Unix(), 10))
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, "injected fault: daily quota exceeded")
		return true
	}
	return false
}

// dropResponse closes the connection without answering: the request was accepted.
func dropResponse(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// acceptBody draws the request's injected fault and reads its body, up to QStash's 100 MB;
// ok is false when it has answered the request already: an injected 5xx or 429, a body it
// could not read (what names the body in the error) or one over the limit.
func (s *Server) acceptBody(w http.ResponseWriter, r *http.Request, what string) (fault string, body []byte, ok bool) {
	fault = s.fault()
	if preFault(w, fault) {
		return fault, nil, false
	}
	body, err := readBody(r, maxBody+1)
	if err != nil {
		writeError(w, http.StatusBadRequest, "read "+what+": "+err.Error())
		return fault, nil, false
	}
	if len(body) > maxBody {
		writeError(w, http.StatusRequestEntityTooLarge, "request body is over the 100 MB limit")
		return fault, nil, false
	}
	return fault, body, true
}

func (s *Server) handlePublish(w http.ResponseWriter, r *http.Request, req *Request, queue, rawDest string) {
	f, body, ok := s.acceptBody(w, r, "body")
	if !ok {
		return
	}
	req.Messages = 1
	dest, err := destination(rawDest, r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	h := r.Header.Clone()
	// Configuration can also come as lowercase query parameters (upstash-retries=3).
	for k, vs := range r.URL.Query() {
		if strings.HasPrefix(strings.ToLower(k), "upstash-") && h.Get(k) == "" && len(vs) > 0 {
			h.Set(k, vs[0])
		}
	}
	m, dedupKey, err := s.parse(dest, h, body, queue)
	if err != nil {
		writeRejection(w, err)
		return
	}
	if s.overQuota(w, 1) {
		return
	}
	m.callerIP = callerIP(r)
	resp, status, err := s.commit(m, dedupKey)
	if err != nil {
		writeRejection(w, err)
		return
	}
	if f == "drop" {
		dropResponse(w)
		return
	}
	writeJSON(w, status, resp)
}

// rejection is a validation failure answered with its own status (412, 413).
type rejection struct {
	status int
	msg    string
}

func (e rejection) Error() string { return e.msg }

// writeRejection answers a parse error: a rejection with its status, else 400.
func writeRejection(w http.ResponseWriter, err error) {
	var rj rejection
	if errors.As(err, &rj) {
		writeError(w, rj.status, rj.msg)
		return
	}
	writeError(w, http.StatusBadRequest, err.Error())
}

// overQuota answers 429 with the daily-quota headers if n more messages would exceed
// QuotaMessages, and otherwise counts them.
func (s *Server) overQuota(w http.ResponseWriter, n int) bool {
	if s.opts.QuotaMessages <= 0 {
		return false
	}
	s.mu.Lock()
	now := time.Now()
	for now.Sub(s.quotaStart) >= s.opts.QuotaWindow {
		s.quotaStart = s.quotaStart.Add(s.opts.QuotaWindow)
		s.quotaUsed = 0
	}
	used, reset := s.quotaUsed, s.quotaStart.Add(s.opts.QuotaWindow)
	over := used+n > s.opts.QuotaMessages
	if !over {
		s.quotaUsed += n
	}
	s.mu.Unlock()
	if !over {
		return false
	}
	// docs api-ratelimiting: the daily quota answers 429 with these three headers; Reset
	// is a unix time in seconds. Rounded up, so waiting until it is always enough.
	w.Header().Set("RateLimit-Limit", strconv.Itoa(s.opts.QuotaMessages))
	w.Header().Set("RateLimit-Remaining", strconv.Itoa(max(0, s.opts.QuotaMessages-used)))
	w.Header().Set("RateLimit-Reset", strconv.FormatInt((reset.UnixMilli()+999)/1000, 10))
	writeError(w, http.StatusTooManyRequests, "daily message quota exceeded: "+strconv.Itoa(s.opts.QuotaMessages)+" messages per day")
	return true
}

// ResetQuota starts a new quota period now, as the daily reset does.
func (s *Server) ResetQuota() {
	s.mu.Lock()
	s.quotaUsed, s.quotaStart = 0, time.Now()
	s.mu.Unlock()
}

type batchRequestItem struct {
	Destination string            `json:"destination"`
	Headers     map[string]string `json:"headers"`
	Body        *string           `json:"body"`
	Queue       *string           `json:"queue"`
	// headerPairs and body are what decodeBatchFast read in place of Headers and Body:
	// the headers as name, value, ... (a name sent twice counts once, the last value, as
	// in Headers), and the body when one was sent (non-nil, perhaps empty).
	headerPairs []string
	body        []byte
}

// header returns the item's headers with canonical names. Every value shares one backing
// array: one allocation per item instead of one per header.
func (it *batchRequestItem) header() http.Header {
	n := len(it.Headers) + len(it.headerPairs)/2
	h := make(http.Header, n)
	vals := make([]string, n)
	i := 0
	set := func(k, v string) {
		vals[i] = v
		h[http.CanonicalHeaderKey(k)] = vals[i : i+1 : i+1]
		i++
	}
	for k, v := range it.Headers {
		set(k, v)
	}
	for j := 0; j+1 < len(it.headerPairs); j += 2 {
		set(it.headerPairs[j], it.headerPairs[j+1])
	}
	return h
}

func (s *Server) handleBatch(w http.ResponseWriter, r *http.Request, req *Request) {
	f, data, ok := s.acceptBody(w, r, "batch body")
	if !ok {
		return
	}
	items, err := decodeBatchItems(data)
	if err != nil {
		writeError(w, http.StatusBadRequest, "batch body must be a JSON array of messages: "+err.Error())
		return
	}
	req.Messages = len(items)
	ip := callerIP(r)
	type parsed struct {
		m        *message
		dedupKey string
		err      error
	}
	ps := make([]parsed, len(items))
	valid := 0
	for i, it := range items {
		h := it.header()
		body := it.body
		if it.Body != nil {
			body = []byte(*it.Body)
		}
		queue := ""
		if it.Queue != nil {
			queue = *it.Queue
		}
		dest, err := destination(it.Destination, nil)
		if err == nil {
			ps[i].m, ps[i].dedupKey, err = s.parse(dest, h, body, queue)
		}
		if err != nil {
			ps[i].err = err
			if s.opts.BatchErrors == BatchErrorsWholeRequest {
				writeRejection(w, fmt.Errorf("message %d: %w", i, err))
				return
			}
			continue
		}
		ps[i].m.callerIP = ip
		valid++
	}
	if s.overQuota(w, valid) {
		return
	}
	out := make([]publishResponse, len(items))
	for i, p := range ps {
		if p.err != nil {
			out[i] = publishResponse{Error: p.err.Error()}
			continue
		}
		resp, _, err := s.commit(p.m, p.dedupKey)
		if err != nil {
			out[i] = publishResponse{Error: err.Error()}
			continue
		}
		out[i] = resp
	}
	if f == "drop" {
		dropResponse(w)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// destination turns the raw path tail (or a batch item's destination) into a URL, adding
// the request's query minus the token and upstash-* parameters.
func destination(raw string, q url.Values) (string, error) {
	if !strings.Contains(raw, "://") {
		if u, err := url.PathUnescape(raw); err == nil {
			raw = u
		}
	}
	u, err := url.Parse(raw)
	if err != nil || raw == "" {
		return "", badRequest("invalid destination url: " + strconv.Quote(raw))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", badRequest("invalid destination url: endpoint has invalid scheme, add http:// or https://")
	}
	if u.Host == "" {
		return "", badRequest("invalid destination url: missing host")
	}
	extra := url.Values{}
	for k, vs := range q {
		if k == "qstash_token" || strings.HasPrefix(strings.ToLower(k), "upstash-") {
			continue
		}
		extra[k] = vs
	}
	if len(extra) > 0 {
		sep := "?"
		if strings.Contains(raw, "?") {
			sep = "&"
		}
		raw += sep + extra.Encode()
	}
	return raw, nil
}

func isLoopback(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func callerIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// commit deduplicates a parsed message and schedules it. It returns the answer element and
// status (201 new, 202 duplicate).
func (s *Server) commit(m *message, dedupKey string) (publishResponse, int, error) {
	dest := m.url
	now := time.Now()
	s.mu.Lock()
	if dedupKey != "" {
		if e, ok := s.dedup[dedupKey]; ok && now.Sub(e.at) < s.opts.DedupWindow {
			s.mu.Unlock()
			return publishResponse{MessageID: e.messageID, URL: e.url, Deduplicated: true}, http.StatusAccepted, nil
		}
		s.pruneDedupLocked(now)
		s.dedup[dedupKey] = dedupEntry{messageID: m.id, url: dest, at: now}
		s.dedupOrder = append(s.dedupOrder, dedupKey)
	}
	s.mu.Unlock()
	if !s.schedule(m) {
		return publishResponse{}, 0, badRequest("server is shutting down")
	}
	return publishResponse{MessageID: m.id, URL: dest}, http.StatusCreated, nil
}

// pruneDedupLocked forgets the ids whose window has passed, oldest first. An id is in
// dedupOrder once: commit adds it again only after its window, when this has removed it.
func (s *Server) pruneDedupLocked(now time.Time) {
	for len(s.dedupOrder) > 0 && now.Sub(s.dedup[s.dedupOrder[0]].at) >= s.opts.DedupWindow {
		delete(s.dedup, s.dedupOrder[0])
		s.dedupOrder[0] = ""
		s.dedupOrder = s.dedupOrder[1:]
	}
}

var retryDelayConst = regexp.MustCompile(`^\s*[0-9]+\s*$`)

// parse reads QStash's configuration headers into a message, and returns its
// deduplication key ("" for none).
func (s *Server) parse(dest string, h http.Header, body []byte, queue string) (*message, string, error) {
	if err := s.checkTarget(dest, h, body, queue); err != nil {
		return nil, "", err
	}
	m := newMessage(dest, body, queue)
	for _, step := range []func(*message, http.Header) error{s.parseDelivery, s.parseCallbacks, parseFlowHeaders} {
		if err := step(m, h); err != nil {
			return nil, "", err
		}
	}
	dedupID := h.Get("Upstash-Deduplication-Id")
	contentBased := dedupID == "" && strings.EqualFold(h.Get("Upstash-Content-Based-Deduplication"), "true")
	fwd := forwardHeaders(m, h, contentBased)
	key, err := dedupKey(dest, h, body, dedupID, contentBased, fwd)
	if err != nil {
		return nil, "", err
	}
	return m, key, nil
}

// checkTarget refuses a publish the real QStash would refuse before reading its options:
// a destination this server may not reach, a bad queue name, the plan's limits, a bad label.
func (s *Server) checkTarget(dest string, h http.Header, body []byte, queue string) error {
	if !s.opts.AllowNonLoopback && !isLoopback(dest) {
		return badRequest("invalid destination url: " + dest + " is not a loopback address (the local server only delivers to this machine; set AllowNonLoopback)")
	}
	if queue != "" && !validName(queue) {
		return badRequest("invalid queue name " + strconv.Quote(queue))
	}
	if s.limits != nil {
		if int64(len(body)) > s.limits.MaxMessageBytes {
			// Pricing page: "Max Message Size" per plan; over it, 412.
			return rejection{http.StatusPreconditionFailed, fmt.Sprintf("message size %d bytes exceeds the %d-byte limit of the %s plan", len(body), s.limits.MaxMessageBytes, s.opts.Plan)}
		}
		if queue != "" {
			s.mu.Lock()
			_, exists := s.queues[queue]
			n := len(s.queues)
			s.mu.Unlock()
			if !exists && n >= s.limits.MaxQueues {
				return s.queueCapRejection()
			}
		}
	}
	if v := h.Get("Upstash-Label"); v != "" {
		for _, l := range strings.Split(v, ",") {
			if !qstash.ValidResourceName(strings.TrimSpace(l)) {
				return badRequest("invalid label " + strconv.Quote(l) + ": labels may contain only letters, digits, '-', '_' and '.'")
			}
		}
	}
	return nil
}

// newMessage returns a message with QStash's defaults (POST, 3 retries, the default delay).
func newMessage(dest string, body []byte, queue string) *message {
	return &message{
		id:         "msg_" + randomID(26),
		url:        dest,
		method:     http.MethodPost,
		header:     http.Header{},
		body:       body,
		retries:    3,
		createdAt:  time.Now(),
		queue:      queue,
		retryDelay: -1,
	}
}

// parseDelivery reads how the message is delivered: method, retries, delays and timeout.
func (s *Server) parseDelivery(m *message, h http.Header) error {
	if v := h.Get("Upstash-Method"); v != "" {
		switch v = strings.ToUpper(v); v {
		case "GET", "POST", "PUT", "PATCH", "DELETE":
			m.method = v
		default:
			return badRequest("Upstash-Method must be one of GET, POST, PUT, PATCH, DELETE")
		}
	}
	if v := h.Get("Upstash-Retries"); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 {
			return badRequest("Upstash-Retries must be a non-negative integer")
		}
		if s.limits != nil && n > s.limits.MaxRetries {
			if s.opts.RetriesRefusal != "" {
				return badRequest(s.opts.RetriesRefusal)
			}
			return badRequest(fmt.Sprintf("Upstash-Retries %d exceeds the maximum of %d retries of the %s plan", n, s.limits.MaxRetries, s.opts.Plan))
		}
		m.retries = n
	}
	m.fcRetries = m.retries
	if v := h.Get("Upstash-Retry-Delay"); v != "" {
		if !retryDelayConst.MatchString(v) {
			return badRequest("Upstash-Retry-Delay: the local server supports only a constant number of milliseconds")
		}
		ms, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		m.retryDelay = time.Duration(ms) * time.Millisecond
	}
	if v := h.Get("Upstash-Delay"); v != "" {
		d, err := parseCompoundDuration(v)
		if err != nil {
			return badRequest("Upstash-Delay: " + err.Error())
		}
		m.notBefore = m.createdAt.Add(d)
	}
	if v := h.Get("Upstash-Not-Before"); v != "" {
		sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return badRequest("Upstash-Not-Before must be unix seconds")
		}
		m.notBefore = time.Unix(sec, 0)
	}
	return parseTimeout(h, "Upstash-Timeout", &m.timeout)
}

// parseTimeout sets *dst from the timeout header name when it is present; QStash refuses a
// timeout that is not a positive duration.
func parseTimeout(h http.Header, name string, dst *time.Duration) error {
	v := h.Get(name)
	if v == "" {
		return nil
	}
	d, err := parseCompoundDuration(v)
	if err != nil || d <= 0 {
		return badRequest(name + ": invalid duration")
	}
	*dst = d
	return nil
}

// parseCallbacks reads the callback and failure callback options.
func (s *Server) parseCallbacks(m *message, h http.Header) error {
	for _, cb := range []struct {
		name string
		dst  *string
	}{{"Upstash-Callback", &m.callback}, {"Upstash-Failure-Callback", &m.failureCallback}} {
		if v := h.Get(cb.name); v != "" {
			u, err := url.Parse(v)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return badRequest(cb.name + ": invalid url, add http:// or https://")
			}
			if !s.opts.AllowNonLoopback && !isLoopback(v) {
				return badRequest(cb.name + ": " + v + " is not a loopback address")
			}
			*cb.dst = v
		}
	}
	if v := h.Get("Upstash-Failure-Callback-Retries"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return badRequest("Upstash-Failure-Callback-Retries must be a non-negative integer")
		}
		m.fcRetries = n
	}
	m.fcMethod = http.MethodPost
	if v := h.Get("Upstash-Failure-Callback-Method"); v != "" {
		m.fcMethod = strings.ToUpper(v)
	}
	return parseTimeout(h, "Upstash-Failure-Callback-Timeout", &m.fcTimeout)
}

// parseFlowHeaders reads the flow control key and value.
func parseFlowHeaders(m *message, h http.Header) error {
	key, value := h.Get("Upstash-Flow-Control-Key"), h.Get("Upstash-Flow-Control-Value")
	if key != "" || value != "" {
		if key == "" {
			return badRequest("Upstash-Flow-Control-Key is required with Upstash-Flow-Control-Value")
		}
		if !qstash.ValidResourceName(key) {
			return badRequest("invalid flow control key " + strconv.Quote(key) + ": it may contain only letters, digits, '-', '_' and '.'")
		}
		p, rate, period, err := parseFlowControl(value)
		if err != nil {
			return err
		}
		m.flowKey, m.flowParallelism, m.flowRate, m.flowPeriod = key, p, rate, period
	}
	return nil
}

// forwardHeaders copies the headers the message forwards to its destination and
// callbacks, and returns the forwarded ones as "key:values" for content-based
// deduplication (when contentBased).
func forwardHeaders(m *message, h http.Header, contentBased bool) []string {
	forwardAll := strings.EqualFold(h.Get("Upstash-Header-Forward"), "true")
	var fwd []string // the forwarded headers, for content-based deduplication
	for k, vs := range h {
		ck := http.CanonicalHeaderKey(k)
		switch {
		case strings.HasPrefix(ck, "Upstash-Forward-"):
			name := strings.TrimPrefix(ck, "Upstash-Forward-")
			if name == "" {
				continue
			}
			m.header[http.CanonicalHeaderKey(name)] = append([]string(nil), vs...)
			if contentBased {
				fwd = append(fwd, ck+":"+strings.Join(vs, ","))
			}
		case strings.HasPrefix(ck, "Upstash-Failure-Callback-Forward-"):
			if m.fcHeader == nil {
				m.fcHeader = http.Header{}
			}
			m.fcHeader[strings.TrimPrefix(ck, "Upstash-Failure-Callback-Forward-")] = vs
		case strings.HasPrefix(ck, "Upstash-Callback-Forward-"):
			if m.cbHeader == nil {
				m.cbHeader = http.Header{}
			}
			m.cbHeader[strings.TrimPrefix(ck, "Upstash-Callback-Forward-")] = vs
		case ck == "Content-Type":
			m.header.Set("Content-Type", vs[0])
		case forwardAll && !strings.HasPrefix(ck, "Upstash-") && !hopByHop[ck]:
			m.header[ck] = vs
		}
	}
	return fwd
}

// dedupKey returns the message's deduplication key: its id, a hash of its content, or "".
func dedupKey(dest string, h http.Header, body []byte, dedupID string, contentBased bool, fwd []string) (string, error) {
	if dedupID != "" {
		if strings.Contains(dedupID, ":") {
			return "", badRequest("DeduplicationId cannot contain ':'")
		}
		return "id:" + dedupID, nil
	}
	if !contentBased {
		return "", nil
	}
	// Content-based: destination, body, Content-Type and the forwarded headers.
	sort.Strings(fwd)
	sum := sha256.New()
	fmt.Fprintf(sum, "%s\n%s\n%s\n", dest, h.Get("Content-Type"), strings.Join(fwd, "\n"))
	sum.Write(body)
	return "content:" + hex.EncodeToString(sum.Sum(nil)), nil
}

var hopByHop = map[string]bool{
	"Authorization": true, "Connection": true, "Content-Length": true, "Host": true,
	"Keep-Alive": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Accept-Encoding": true, "User-Agent": true,
}

func validName(s string) bool {
	for _, r := range s {
		if !(r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return s != ""
}

const flowControlValueError = "Upstash-Flow-Control-Value should be either rate=X or parallelism=Y, or both as comma-separated values"

// parseFlowControl reads "parallelism=5, rate=10, period=60s" (spaces optional).
func parseFlowControl(v string) (parallelism, rate int, period time.Duration, err error) {
	period = time.Second
	for _, part := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return 0, 0, 0, badRequest(flowControlValueError)
		}
		k, val = strings.TrimSpace(k), strings.TrimSpace(val)
		switch k {
		case "parallelism", "rate":
			n, perr := strconv.Atoi(val)
			if perr != nil || n <= 0 {
				return 0, 0, 0, badRequest(flowControlValueError)
			}
			if k == "parallelism" {
				parallelism = n
			} else {
				rate = n
			}
		case "period":
			d, perr := parseCompoundDuration(val)
			if perr != nil || d <= 0 || d > 7*24*time.Hour {
				return 0, 0, 0, badRequest("Upstash-Flow-Control-Value: period must be a duration between 1s and 1 week")
			}
			period = d
		default:
			return 0, 0, 0, badRequest(flowControlValueError)
		}
	}
	if parallelism == 0 && rate == 0 {
		return 0, 0, 0, badRequest(flowControlValueError)
	}
	return parallelism, rate, period, nil
}

// parseCompoundDuration reads QStash durations: "10s", "1d10h30m", or a bare number of
// seconds.
func parseCompoundDuration(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
		return time.Duration(n) * time.Second, nil
	}
	var total time.Duration
	sc := bufio.NewScanner(strings.NewReader(v))
	sc.Split(bufio.ScanRunes)
	num := ""
	for sc.Scan() {
		c := sc.Text()
		if c >= "0" && c <= "9" {
			num += c
			continue
		}
		if num == "" {
			return 0, fmt.Errorf("invalid duration %q", v)
		}
		n, _ := strconv.ParseInt(num, 10, 64)
		num = ""
		switch c {
		case "s":
			total += time.Duration(n) * time.Second
		case "m":
			total += time.Duration(n) * time.Minute
		case "h":
			total += time.Duration(n) * time.Hour
		case "d":
			total += time.Duration(n) * 24 * time.Hour
		default:
			return 0, fmt.Errorf("invalid duration unit %q in %q", c, v)
		}
	}
	if num != "" || v == "" {
		return 0, fmt.Errorf("invalid duration %q", v)
	}
	return total, nil
}

// readBody reads up to limit bytes of r's body into a buffer sized by Content-Length when
// the request declares one (io.ReadAll's doubling buffer was the server's largest
// allocation under the drain bench).
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if n := r.ContentLength; n >= 0 && n < limit {
		buf := make([]byte, n+1) // one spare byte sees a body longer than declared
		got, err := io.ReadFull(io.LimitReader(r.Body, limit), buf)
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			err = nil
		}
		return buf[:got], err
	}
	return io.ReadAll(io.LimitReader(r.Body, limit))
}
