package samtemplate_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/lambdatest"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/pkg/qstash/qstashtest"
)

// TestRIERelayDrainsLargePayloadsWithinItsMemory drains a backlog of large events through
// the relay bootstrap as built, under aws-lambda-rie with the template's memory size in
// AWS_LAMBDA_FUNCTION_MEMORY_SIZE (and no GOMEMLIMIT: the relay derives it), and checks
// the bootstrap's peak resident set (VmHWM) against that memory: on Lambda a relay over
// it is killed before it marks, its batch is claimed again after the lease and killed
// again, and the backlog never moves. Every event must arrive once.
//
// Without the byte budgets (batch 1,000 x 8 in flight, whatever the payload size) the
// bootstrap peaked far over the 256 MB; see relay.DefaultMaxInFlightBytes for the figures.
func TestRIERelayDrainsLargePayloadsWithinItsMemory(t *testing.T) {
	t.Parallel()
	relayBin := binary(t, "./functions/relay")
	memMB := toInt(loadTemplate(t).Parameters["RelayMemorySize"]["Default"])
	if memMB <= 0 {
		t.Fatal("template.yaml: RelayMemorySize has no numeric default")
	}
	for _, tc := range []struct {
		name          string
		events, bytes int
	}{
		// About 480 MB of payloads each, both well over the function's memory.
		{"30kB", 16_000, 30_000},
		{"400kB", 1_200, 400_000},
	} {
		// One after the other: each holds ~500 MB of messages in this process's QStash.
		t.Run(tc.name, func(t *testing.T) {
			hwm := drainUnderRIE(t, relayBin, memMB, tc.events, tc.bytes)
			t.Logf("%d events of %d bytes: relay peak RSS (VmHWM) %.1f MiB, function memory %d MB", tc.events, tc.bytes, float64(hwm)/1024, memMB)
			if hwm >= int64(memMB)<<10 {
				t.Errorf("relay peak RSS %.1f MiB, over the function's %d MB: Lambda would kill it before it marks", float64(hwm)/1024, memMB)
			}
		})
	}
}

// drainUnderRIE loads events payloads of about size bytes each, drains them through a
// fresh relay bootstrap under the emulator into the local QStash (payg plan: a 10 MB
// message limit), checks every event was delivered exactly once, and returns the
// bootstrap's VmHWM in KiB.
func drainUnderRIE(t *testing.T, relayBin string, memMB, events, size int) int64 {
	db := pgtest.New(t)
	ctx := ctxT(t, 10*time.Minute)
	// JSON order lines with a random SKU each: Postgres compresses them (by about a third),
	// so the claim meets compressed as well as plain values. Sixteen distinct payloads are
	// enough; each row stores and sends its own copy.
	if _, err := db.Pool.Exec(ctx, `
WITH p AS MATERIALIZED (
    SELECT v, jsonb_build_object('order', v, 'lines',
        (SELECT jsonb_agg(jsonb_build_object('sku', md5(v || '-' || i), 'qty', i % 7, 'note', 'gift wrap'))
         FROM generate_series(1, $2::int / 76) i)) AS payload
    FROM generate_series(0, 15) v
)
INSERT INTO outbox (topic, partition_key, payload)
SELECT 'order.created', 'cust-' || (g % 100), p.payload
FROM generate_series(1, $1::int) g JOIN p ON p.v = g % 16`, events, size); err != nil {
		t.Fatal(err)
	}
	var avg float64
	if err := db.Pool.QueryRow(ctx, `SELECT avg(octet_length(payload::text)) FROM outbox`).Scan(&avg); err != nil {
		t.Fatal(err)
	}
	if avg < 0.9*float64(size) || avg > 1.1*float64(size) {
		t.Fatalf("payloads average %.0f bytes, want about %d", avg, size)
	}

	var mu sync.Mutex
	delivered := map[string]int{}
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		delivered[r.URL.Query().Get("outbox_id")]++
		mu.Unlock()
	}))
	defer sink.Close()
	qs := qstashtest.NewServer(qstashtest.Options{Plan: qstash.PlanPayg, HTTPClient: &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: 128}, Timeout: time.Minute}})
	defer qs.Close()

	// A copy of its own, so the bootstrap's process is found by its executable.
	bin := filepath.Join(t.TempDir(), "bootstrap")
	copyFile(t, relayBin, bin)
	relay := lambdatest.Start(t, lambdatest.Options{Bootstrap: bin, Name: "RelayFunction", Timeout: 120 * time.Second, Env: map[string]string{
		"DATABASE_URL": db.URL, "QSTASH_URL": qs.URL, "QSTASH_TOKEN": qs.Token, "QSTASH_PLAN": string(qstash.PlanPayg),
		"PUBLIC_BASE_URL": sink.URL + "/", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": strconv.Itoa(memMB),
		// A publish that timed out on a slow machine is retried within seconds, not minutes.
		"BACKOFF_BASE": "1s", "BACKOFF_MAX": "2s",
	}})
	dispatched := 0
	// Invoked as the schedule would, until the backlog is empty: rows whose publish timed
	// out become ready again after their backoff (or lease).
	deadline := time.Now().Add(5 * time.Minute)
	for i := 0; ; i++ {
		var res relayResult
		if err := invoke(t, relay, readFile(t, "events/schedule.json")).Decode(&res); err != nil {
			t.Fatalf("drain %d: %v\n%s", i, err, tail(relay.Log(), 4000))
		}
		dispatched += res.Dispatched
		if res.BacklogPending != nil && *res.BacklogPending == 0 {
			break
		}
		if res.Claimed == 0 {
			time.Sleep(time.Second) // the next tick
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d drains %d of %d dispatched (relay peak RSS %.1f MiB), last %+v\n%s", i+1, dispatched, events,
				float64(vmHWMKiB(t, bin))/1024, res, tail(relay.Log(), 3000))
		}
	}
	hwm := vmHWMKiB(t, bin)
	if err := qs.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if dispatched != events || len(delivered) != events {
		t.Errorf("%d dispatched and %d distinct events delivered, want %d", dispatched, len(delivered), events)
	}
	for id, n := range delivered {
		if n != 1 {
			t.Errorf("event %s delivered %d times", id, n)
		}
	}
	return hwm
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// vmHWMKiB returns the peak resident set of the one running process whose executable is
// exe (the emulator starts the bootstrap as its child and keeps it between invokes).
func vmHWMKiB(t *testing.T, exe string) int64 {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	var found []int64
	for _, d := range dirs {
		if p, err := os.Readlink(filepath.Join(d, "exe")); err != nil || p != exe {
			continue
		}
		f, err := os.Open(filepath.Join(d, "status"))
		if err != nil {
			continue
		}
		s := bufio.NewScanner(f)
		for s.Scan() {
			if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
				var kib int64
				if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kib); err == nil {
					found = append(found, kib)
				}
			}
		}
		f.Close()
	}
	if len(found) != 1 {
		t.Fatalf("want one running %s with a VmHWM, found %d (is /proc mounted?)", exe, len(found))
	}
	return found[0]
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
