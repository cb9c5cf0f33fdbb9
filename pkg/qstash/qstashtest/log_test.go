package qstashtest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestLogsKeepTheirNewerHalf: the request and attempt logs stop growing at their limit
// and keep the newest entries in order, so a server that runs for hours (qstash-dev, the
// two-hour pinned benchmark) holds a bounded history; a negative limit keeps none.
func TestLogsKeepTheirNewerHalf(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{defaultLogLimit, 6, 7, 1} {
		var log []int
		for i := range 3*limit + 7 {
			log = appendBounded(log, i, limit)
			if len(log) > limit {
				t.Fatalf("limit %d: after %d appends the log holds %d entries", limit, i+1, len(log))
			}
		}
		last := 3*limit + 6
		if len(log) < max(limit/2, 1) || log[len(log)-1] != last {
			t.Fatalf("limit %d: log holds %d entries ending at %d, want at least %d ending at %d", limit, len(log), log[len(log)-1], limit/2, last)
		}
		for i := 1; i < len(log); i++ {
			if log[i] != log[i-1]+1 {
				t.Fatalf("limit %d: entries %d and %d are %d and %d: not the newest in order", limit, i-1, i, log[i-1], log[i])
			}
		}
	}
	if log := appendBounded([]int{1, 2}, 3, -1); log != nil {
		t.Fatalf("limit -1: log %v, want none", log)
	}
}

// TestServerLogLimit: a server whose LogLimit is negative delivers as any other (OnAttempt
// sees every attempt) and keeps no request or attempt; the default keeps them all.
func TestServerLogLimit(t *testing.T) {
	t.Parallel()
	dst := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer dst.Close()
	for _, tc := range []struct {
		limit    int
		wantLogs int
	}{{0, 5}, {-1, 0}} {
		var seen atomic.Int64
		srv := NewServer(Options{LogLimit: tc.limit, OnAttempt: func(Attempt) { seen.Add(1) }})
		for range 5 {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v2/publish/"+dst.URL+"/x", strings.NewReader(`{}`))
			req.Header.Set("Authorization", "Bearer "+srv.Token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("LogLimit %d: publish answered %d", tc.limit, resp.StatusCode)
			}
		}
		// A request is logged once its answer is written: wait for the logs too.
		for deadline := time.Now().Add(5 * time.Second); (seen.Load() < 5 || len(srv.Requests()) < tc.wantLogs) && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if seen.Load() != 5 {
			t.Fatalf("LogLimit %d: OnAttempt saw %d attempts, want 5", tc.limit, seen.Load())
		}
		if a, r := len(srv.Attempts()), len(srv.Requests()); a != tc.wantLogs || r != tc.wantLogs {
			t.Fatalf("LogLimit %d: %d attempts and %d requests logged, want %d of each", tc.limit, a, r, tc.wantLogs)
		}
		srv.Close()
	}
}
