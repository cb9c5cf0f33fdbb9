package qstashtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// dlqEntry is a finally failed message.
type dlqEntry struct {
	id      string
	msg     *message
	resp    response
	retried int
	at      time.Time
}

// DLQEntry is a dead-lettered message as the DLQ API shows it.
type DLQEntry struct {
	DLQID          string
	MessageID      string
	URL            string
	Queue          string
	ResponseStatus int
	Retried        int
	MaxRetries     int
	Body           []byte
}

// DLQ returns the DLQ entries, oldest first.
func (s *Server) DLQ() []DLQEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]DLQEntry, len(s.dlq))
	for i, e := range s.dlq {
		out[i] = DLQEntry{
			DLQID: e.id, MessageID: e.msg.id, URL: e.msg.url, Queue: e.msg.queue,
			ResponseStatus: e.resp.status, Retried: e.retried, MaxRetries: e.msg.retries, Body: e.msg.body,
		}
	}
	return out
}

func (s *Server) addDLQ(m *message, last response, retried int) *dlqEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	e := &dlqEntry{id: fmt.Sprintf("%d-%d", time.Now().UnixMilli(), s.seq), msg: m, resp: last, retried: retried, at: time.Now()}
	s.dlq = append(s.dlq, e)
	return e
}

// messageJSON is the Message object of the messages and DLQ APIs.
func messageJSON(m *message) map[string]any {
	v := map[string]any{
		"messageId":  m.id,
		"url":        m.url,
		"method":     m.method,
		"header":     map[string][]string(m.header),
		"maxRetries": m.retries,
		"notBefore":  unixMs(m.notBefore, m.createdAt),
		"createdAt":  m.createdAt.UnixMilli(),
	}
	if utf8.Valid(m.body) {
		v["body"] = string(m.body)
	} else {
		v["bodyBase64"] = b64(m.body)
	}
	for k, s := range map[string]string{"callback": m.callback, "failureCallback": m.failureCallback, "queueName": m.queue, "callerIP": m.callerIP, "flowControlKey": m.flowKey} {
		if s != "" {
			v[k] = s
		}
	}
	if m.flowKey != "" {
		v["parallelism"], v["rate"], v["period"] = m.flowParallelism, m.flowRate, int64(m.flowPeriod/time.Second)
	}
	return v
}

func dlqJSON(e *dlqEntry) map[string]any {
	v := messageJSON(e.msg)
	v["dlqId"] = e.id
	v["responseStatus"] = e.resp.status
	v["responseHeader"] = map[string][]string(e.resp.header)
	if utf8.Valid(e.resp.body) {
		v["responseBody"] = string(e.resp.body)
	} else {
		v["responseBodyBase64"] = b64(e.resp.body)
	}
	return v
}

func (s *Server) handleDLQ(w http.ResponseWriter, r *http.Request, rest string) {
	switch {
	case rest == "" && r.Method == http.MethodGet:
		s.listDLQ(w, r)
	case rest == "" && r.Method == http.MethodDelete:
		s.deleteDLQ(w, r)
	case rest == "retry" && r.Method == http.MethodPost:
		ids := s.selectDLQ(r, dlqIDs(r))
		resps := make([]map[string]string, 0, len(ids))
		for _, id := range ids {
			if mid, ok := s.retryDLQ(id, r.Header); ok {
				resps = append(resps, map[string]string{"messageId": mid})
			}
		}
		writeJSON(w, http.StatusCreated, map[string]any{"cursor": "", "responses": resps})
	case strings.HasPrefix(rest, "retry/") && r.Method == http.MethodPost:
		mid, ok := s.retryDLQ(strings.TrimPrefix(rest, "retry/"), r.Header)
		if !ok {
			writeError(w, http.StatusNotFound, "dlq message not found")
			return
		}
		writeJSON(w, http.StatusCreated, map[string]string{"messageId": mid})
	case rest != "" && r.Method == http.MethodGet:
		s.mu.Lock()
		i := s.dlqIndexLocked(rest)
		var v map[string]any
		if i >= 0 {
			v = dlqJSON(s.dlq[i])
		}
		s.mu.Unlock()
		if i < 0 {
			writeError(w, http.StatusNotFound, "dlq message not found")
			return
		}
		writeJSON(w, http.StatusOK, v)
	case rest != "" && r.Method == http.MethodDelete:
		if s.removeDLQ(rest) == nil {
			writeError(w, http.StatusNotFound, "dlq message not found")
			return
		}
		w.WriteHeader(http.StatusOK)
	default:
		writeError(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

func (s *Server) dlqIndexLocked(id string) int {
	return slices.IndexFunc(s.dlq, func(e *dlqEntry) bool { return e.id == id })
}

func (s *Server) removeDLQ(id string) *dlqEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.dlqIndexLocked(id)
	if i < 0 {
		return nil
	}
	e := s.dlq[i]
	s.dlq = slices.Delete(s.dlq, i, i+1)
	return e
}

// dlqIDs reads dlqIds from the query (repeated or comma-separated) or the older JSON body.
func dlqIDs(r *http.Request) []string {
	var ids []string
	for _, v := range r.URL.Query()["dlqIds"] {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 && r.Body != nil {
		var b struct {
			DLQIDs []string `json:"dlqIds"`
		}
		if data, err := io.ReadAll(io.LimitReader(r.Body, 1<<20)); err == nil && len(data) > 0 && json.Unmarshal(data, &b) == nil {
			ids = b.DLQIDs
		}
	}
	return ids
}

// matchDLQ applies the list filters (AND across filters, OR within one).
func matchDLQ(e *dlqEntry, q map[string][]string) bool {
	in := func(name, val string) bool {
		vs := q[name]
		if len(vs) == 0 {
			return true
		}
		for _, v := range vs {
			for _, x := range strings.Split(v, ",") {
				if x == val {
					return true
				}
			}
		}
		return false
	}
	ms := e.at.UnixMilli()
	if v, err := strconv.ParseInt(first(q, "fromDate"), 10, 64); err == nil && ms < v {
		return false
	}
	if v, err := strconv.ParseInt(first(q, "toDate"), 10, 64); err == nil && ms > v {
		return false
	}
	return in("messageId", e.msg.id) && in("url", e.msg.url) && in("queueName", e.msg.queue) &&
		in("responseStatus", strconv.Itoa(e.resp.status)) && in("callerIp", e.msg.callerIP) &&
		in("flowControlKey", e.msg.flowKey)
}

func first(q map[string][]string, k string) string {
	if v := q[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// selectDLQ returns the given ids, or with none, every entry matching the query filters.
func (s *Server) selectDLQ(r *http.Request, ids []string) []string {
	if len(ids) > 0 {
		return ids
	}
	q := r.URL.Query()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, e := range s.dlq {
		if matchDLQ(e, q) {
			out = append(out, e.id)
		}
	}
	return out
}

func (s *Server) listDLQ(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	count := 100
	if v, err := strconv.Atoi(first(q, "count")); err == nil && v > 0 && v < 100 {
		count = v
	}
	offset, _ := strconv.Atoi(first(q, "cursor"))
	s.mu.Lock()
	var matched []map[string]any
	for _, e := range s.dlq {
		if matchDLQ(e, q) {
			matched = append(matched, dlqJSON(e))
		}
	}
	s.mu.Unlock()
	offset = min(max(offset, 0), len(matched))
	end := min(offset+count, len(matched))
	resp := map[string]any{"messages": append([]map[string]any{}, matched[offset:end]...)}
	if end < len(matched) {
		resp["cursor"] = strconv.Itoa(end)
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) deleteDLQ(w http.ResponseWriter, r *http.Request) {
	ids := dlqIDs(r)
	if len(ids) == 0 && len(r.URL.Query()) == 0 {
		writeError(w, http.StatusBadRequest, "dlqIds or a filter is required")
		return
	}
	n := 0
	for _, id := range s.selectDLQ(r, ids) {
		if s.removeDLQ(id) != nil {
			n++
		}
	}
	writeJSON(w, http.StatusOK, map[string]int{"deleted": n})
}

// retryDLQ republishes a DLQ entry as a new message (config headers in h override the
// original's retries) and removes the entry.
func (s *Server) retryDLQ(id string, h http.Header) (string, bool) {
	e := s.removeDLQ(id)
	if e == nil {
		return "", false
	}
	old := e.msg
	m := *old
	m.id = "msg_" + randomID(26)
	m.createdAt = time.Now()
	m.notBefore = time.Time{}
	m.header = old.header.Clone()
	if v, err := strconv.Atoi(h.Get("Upstash-Retries")); err == nil && v >= 0 {
		m.retries = v
	}
	if !s.schedule(&m) {
		return "", false
	}
	return m.id, true
}

func (s *Server) handleMessage(w http.ResponseWriter, r *http.Request, id string) {
	s.mu.Lock()
	m, ok := s.messages[id]
	var v map[string]any
	if ok {
		v = messageJSON(m)
	}
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "message not found")
		return
	}
	switch r.Method {
	case http.MethodGet:
		writeJSON(w, http.StatusOK, v)
	case http.MethodDelete:
		s.mu.Lock()
		if q := s.queues[m.queue]; m.queue != "" && q != nil {
			q.items = slices.DeleteFunc(q.items, func(x *message) bool { return x == m })
		}
		s.mu.Unlock()
		m.cancel()
		s.finish(m)
		w.WriteHeader(http.StatusAccepted)
	default:
		writeError(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

// queueCapRejection is the answer to a queue over the plan's queue count: 412, as for the
// other plan limits (pricing page "Max Queue Count").
func (s *Server) queueCapRejection() rejection {
	return rejection{http.StatusPreconditionFailed, fmt.Sprintf("queue limit reached: the %s plan allows %d queues", s.opts.Plan, s.limits.MaxQueues)}
}

func (s *Server) handleQueues(w http.ResponseWriter, r *http.Request, name string) {
	if base, action, ok := strings.Cut(name, "/"); ok && r.Method == http.MethodPost && (action == "pause" || action == "resume") {
		s.setPaused(w, base, action == "pause")
		return
	}
	switch {
	case name == "" && r.Method == http.MethodPost:
		s.createQueue(w, r)
	case name == "" && r.Method == http.MethodGet:
		s.mu.Lock()
		out := []map[string]any{}
		for _, q := range s.queues {
			out = append(out, q.json())
		}
		s.mu.Unlock()
		slices.SortFunc(out, func(a, b map[string]any) int { return strings.Compare(a["name"].(string), b["name"].(string)) })
		writeJSON(w, http.StatusOK, out)
	case name != "" && r.Method == http.MethodGet:
		s.mu.Lock()
		q, ok := s.queues[name]
		var v map[string]any
		if ok {
			v = q.json()
		}
		s.mu.Unlock()
		if !ok {
			writeError(w, http.StatusNotFound, "queue not found")
			return
		}
		writeJSON(w, http.StatusOK, v)
	case name != "" && r.Method == http.MethodDelete:
		s.mu.Lock()
		q, ok := s.queues[name]
		if ok && len(q.items) == 0 && q.active == 0 {
			delete(s.queues, name)
		}
		s.mu.Unlock()
		if !ok {
			writeError(w, http.StatusNotFound, "queue not found")
			return
		}
		w.WriteHeader(http.StatusOK)
	default:
		writeError(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

// setPaused pauses or resumes a queue; a resumed queue delivers what waited.
func (s *Server) setPaused(w http.ResponseWriter, name string, paused bool) {
	s.mu.Lock()
	q, found := s.queues[name]
	if found {
		q.paused = paused
		q.updatedAt = time.Now()
	}
	s.mu.Unlock()
	if !found {
		writeError(w, http.StatusNotFound, "queue not found")
		return
	}
	if !paused {
		s.pumpQueue(q)
	}
	w.WriteHeader(http.StatusOK)
}

// createQueue creates a queue or updates its parallelism, within the plan's queue limit.
func (s *Server) createQueue(w http.ResponseWriter, r *http.Request) {
	var b struct {
		QueueName   string `json:"queueName"`
		Parallelism int    `json:"parallelism"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&b); err != nil || !validName(b.QueueName) {
		writeError(w, http.StatusBadRequest, "queueName is required")
		return
	}
	s.mu.Lock()
	if _, exists := s.queues[b.QueueName]; !exists && s.limits != nil && len(s.queues) >= s.limits.MaxQueues {
		s.mu.Unlock()
		rj := s.queueCapRejection()
		writeError(w, rj.status, rj.msg)
		return
	}
	q := s.queueLocked(b.QueueName)
	if b.Parallelism > 0 {
		q.parallelism = b.Parallelism
	}
	q.updatedAt = time.Now()
	s.mu.Unlock()
	s.pumpQueue(q)
	w.WriteHeader(http.StatusOK)
}

// json renders q as the queues API does; the caller holds the server's lock.
func (q *queue) json() map[string]any {
	return map[string]any{"name": q.name, "parallelism": q.parallelism, "lag": len(q.items) + q.active,
		"createdAt": q.createdAt.UnixMilli(), "updatedAt": q.updatedAt.UnixMilli(), "paused": q.paused}
}
