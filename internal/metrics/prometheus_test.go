package metrics

import (
	"bytes"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

func TestPromName(t *testing.T) {
	t.Parallel()
	want := map[string]string{
		Dispatched:                "outbox_dispatched_total",
		DeadLettered:              "outbox_dead_lettered_total",
		LeaseLost:                 "outbox_lease_lost_total",
		PublishLatency:            "outbox_publish_latency_seconds",
		BacklogPending:            "outbox_backlog_pending",
		OldestPendingAgeSeconds:   "outbox_oldest_pending_age_seconds",
		RetentionDeletedProcessed: "outbox_retention_deleted_processed_total",
		DeliveryDeadLetters:       "outbox_delivery_dead_letters_total",
	}
	for name, p := range want {
		d, _ := Lookup(name)
		if got := PromName(d); got != p {
			t.Errorf("PromName(%s) = %s, want %s", name, got, p)
		}
	}
	seen := map[string]bool{}
	for _, d := range Definitions {
		n := PromName(d)
		if !regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`).MatchString(n) || seen[n] {
			t.Errorf("invalid or duplicate Prometheus name %q", n)
		}
		seen[n] = true
	}
}

func TestRegistryGolden(t *testing.T) {
	t.Parallel()
	r := NewRegistry(RegistryConfig{Functions: []string{FunctionRelay}})
	st := relay.Stats{Batches: 2, Claimed: 10, Dispatched: 9, Retried: 1, DeferredQuota: 3,
		PublishLatency: []time.Duration{4 * time.Millisecond, 30 * time.Millisecond, 2 * time.Second, 20 * time.Second}}
	for range 2 {
		if err := r.Record(Event{Function: FunctionRelay, Values: Relay(st.Counts(), st.PublishLatency)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Record(Event{Function: FunctionRelay, Values: Backlog(7, 90*time.Second, 95*time.Second, 0)}); err != nil {
		t.Fatal(err)
	}
	if err := r.Record(Event{Function: FunctionRelay, Values: Backlog(3, 1500*time.Millisecond, 3600*time.Second, 0)}); err != nil {
		t.Fatal(err)
	}
	// A webhook metric is not exposed by a relay-only registry.
	if err := r.Record(Event{Function: FunctionWebhook, Values: []Value{Count(Processed, 1)}}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := r.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	checkPromText(t, buf.String())
	golden(t, "prometheus_relay", buf.Bytes())
	for _, line := range []string{
		"outbox_dispatched_total 18\n",
		"outbox_backlog_pending 3\n",
		"outbox_oldest_pending_age_seconds 1.5\n",
		`outbox_publish_latency_seconds_bucket{le="0.005"} 2` + "\n",
		`outbox_publish_latency_seconds_bucket{le="2.5"} 6` + "\n",
		`outbox_publish_latency_seconds_bucket{le="+Inf"} 8` + "\n",
		"outbox_publish_latency_seconds_count 8\n",
	} {
		if !strings.Contains(buf.String(), line) {
			t.Errorf("exposition lacks %q", line)
		}
	}
	if strings.Contains(buf.String(), "outbox_processed_total") {
		t.Error("relay registry exposes a webhook metric")
	}
}

func TestRegistryTopicLabelsEscaped(t *testing.T) {
	t.Parallel()
	odd := "a\"b\\c\nd"
	r := NewRegistry(RegistryConfig{Functions: []string{FunctionWebhook}, Topics: []string{"order.created", odd}})
	for _, ev := range []Event{
		{Function: FunctionWebhook, Topic: "order.created", Values: []Value{Count(Processed, 2)}},
		{Function: FunctionWebhook, Topic: odd, Values: []Value{Count(Processed, 1)}},
		{Function: FunctionWebhook, Topic: "unbounded", Values: []Value{Count(Processed, 5)}},
	} {
		if err := r.Record(ev); err != nil {
			t.Fatal(err)
		}
	}
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if ct := rec.Header().Get("Content-Type"); ct != ContentType {
		t.Fatalf("content type %q", ct)
	}
	body := rec.Body.String()
	checkPromText(t, body)
	for _, line := range []string{
		"outbox_processed_total 5\n", // the unbounded topic is counted without a label
		`outbox_processed_total{topic="order.created"} 2` + "\n",
		`outbox_processed_total{topic="a\"b\\c\nd"} 1` + "\n",
	} {
		if !strings.Contains(body, line) {
			t.Errorf("exposition lacks %q:\n%s", line, body)
		}
	}
}

func TestEscapeHelp(t *testing.T) {
	t.Parallel()
	if got := escapeHelp("a\\b\n\"c\""); got != `a\\b\n"c"` {
		t.Fatalf("escapeHelp = %q", got)
	}
}

var (
	promComment = regexp.MustCompile(`^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)$`)
	promSample  = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*\})? (\S+)$`)
)

// checkPromText validates the text format: every line is a HELP, TYPE or sample line; a
// family's HELP and TYPE come once, before its samples; samples belong to a declared family
// (histograms through _bucket, _sum, _count); label values are escaped.
func checkPromText(t *testing.T, text string) {
	t.Helper()
	if !strings.HasSuffix(text, "\n") {
		t.Fatal("exposition must end with a newline")
	}
	types := map[string]string{}
	help := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if m := promComment.FindStringSubmatch(line); m != nil {
			switch m[1] {
			case "HELP":
				if help[m[2]] {
					t.Fatalf("second HELP for %s", m[2])
				}
				help[m[2]] = true
			case "TYPE":
				if types[m[2]] != "" || !help[m[2]] {
					t.Fatalf("TYPE for %s repeated or before HELP", m[2])
				}
				if m[3] != "counter" && m[3] != "gauge" && m[3] != "histogram" {
					t.Fatalf("type %q", m[3])
				}
				types[m[2]] = m[3]
			}
			continue
		}
		m := promSample.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("not a valid sample line: %q", line)
		}
		name := m[1]
		fam := name
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base := strings.TrimSuffix(name, suf); base != name && types[base] == "histogram" {
				fam = base
			}
		}
		if types[fam] == "" {
			t.Fatalf("sample %s before its TYPE line", name)
		}
	}
}
