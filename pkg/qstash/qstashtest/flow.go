package qstashtest

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// flowControl limits deliveries per Upstash-Flow-Control-Key: parallelism counts calls in
// flight, rate counts calls started per period window. Over the limit, a message waits (the
// waitlist) instead of being rejected. Waiters are woken together and race for the slot,
// so, as in QStash, a later message may overtake an earlier one.
type flowControl struct {
	mu   sync.Mutex
	keys map[string]*flowKey
}

type flowKey struct {
	parallelismMax, rateMax int
	period                  time.Duration
	inFlight                int
	windowStart             time.Time
	started                 int
	waiting                 int
	wake                    chan struct{}
}

func newFlowControl() *flowControl { return &flowControl{keys: map[string]*flowKey{}} }

// acquire waits for a slot of key. Each message carries its own limits; while messages
// with different limits coexist, the highest apply, as QStash documented.
func (f *flowControl) acquire(ctx context.Context, key string, parallelism, rate int, period time.Duration) bool {
	f.mu.Lock()
	k, ok := f.keys[key]
	if !ok {
		k = &flowKey{wake: make(chan struct{})}
		f.keys[key] = k
	}
	k.parallelismMax = max(k.parallelismMax, parallelism)
	k.rateMax = max(k.rateMax, rate)
	if period > 0 {
		k.period = period
	}
	k.waiting++
	defer func() { k.waiting--; f.mu.Unlock() }()
	for {
		now := time.Now()
		if k.rateMax > 0 && now.Sub(k.windowStart) >= k.period {
			k.windowStart, k.started = now, 0
		}
		parOK := k.parallelismMax == 0 || k.inFlight < k.parallelismMax
		rateOK := k.rateMax == 0 || k.started < k.rateMax
		if parOK && rateOK {
			k.inFlight++
			k.started++
			return true
		}
		wake := k.wake
		var t *time.Timer
		var timer <-chan time.Time
		if !rateOK {
			t = time.NewTimer(time.Until(k.windowStart.Add(k.period)))
			timer = t.C
		}
		f.mu.Unlock()
		select {
		case <-wake:
		case <-timer:
		case <-ctx.Done():
		}
		if t != nil {
			t.Stop()
		}
		f.mu.Lock()
		if ctx.Err() != nil {
			return false
		}
	}
}

func (f *flowControl) release(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.keys[key]
	k.inFlight--
	close(k.wake)
	k.wake = make(chan struct{})
}

// flowInfo is GET /v2/flowControl/{key}.
type flowInfo struct {
	FlowControlKey      string `json:"flowControlKey"`
	WaitListSize        int    `json:"waitListSize"`
	ParallelismMax      int    `json:"parallelismMax"`
	ParallelismCount    int    `json:"parallelismCount"`
	RateMax             int    `json:"rateMax"`
	RateCount           int    `json:"rateCount"`
	RatePeriod          int64  `json:"ratePeriod"`
	RatePeriodStart     int64  `json:"ratePeriodStart"`
	IsPaused            bool   `json:"isPaused"`
	IsPinnedParallelism bool   `json:"isPinnedParallelism"`
	IsPinnedRate        bool   `json:"isPinnedRate"`
}

func (f *flowControl) info(key string) (flowInfo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k, ok := f.keys[key]
	if !ok {
		return flowInfo{}, false
	}
	return flowInfo{
		FlowControlKey: key, WaitListSize: k.waiting, ParallelismMax: k.parallelismMax,
		ParallelismCount: k.inFlight, RateMax: k.rateMax, RateCount: k.started,
		RatePeriod: int64(k.period / time.Second), RatePeriodStart: k.windowStart.UnixMilli(),
	}, true
}

func (s *Server) handleFlowControl(w http.ResponseWriter, r *http.Request, key string) {
	if r.Method != http.MethodGet {
		writeError(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	if key != "" {
		info, ok := s.flow.info(key)
		if !ok {
			writeError(w, http.StatusNotFound, "flow control key not found")
			return
		}
		writeJSON(w, http.StatusOK, info)
		return
	}
	s.flow.mu.Lock()
	names := make([]string, 0, len(s.flow.keys))
	for k := range s.flow.keys {
		if q := r.URL.Query().Get("search"); q == "" || strings.Contains(k, q) {
			names = append(names, k)
		}
	}
	s.flow.mu.Unlock()
	sort.Strings(names)
	out := make([]flowInfo, 0, len(names))
	for _, k := range names {
		if info, ok := s.flow.info(k); ok {
			out = append(out, info)
		}
	}
	writeJSON(w, http.StatusOK, out)
}
