package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

var fixedTime = time.Date(2026, 12, 2, 20, 0, 0, 123_000_000, time.UTC)

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run go test -update to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from golden\n got: %s\nwant: %s", name, got, want)
	}
}

func TestEMFGolden(t *testing.T) {
	t.Parallel()
	latency := make([]time.Duration, 3)
	for i := range latency {
		latency[i] = time.Duration(i+1)*12*time.Millisecond + 500*time.Microsecond
	}
	many := make([]float64, 130)
	for i := range many {
		many[i] = float64(i)
	}
	// The drain's counts come from relay.Stats, as in the relay function.
	st := relay.Stats{Batches: 3, Claimed: 250, Dispatched: 240, Retried: 6, DeadLettered: 1, Released: 3, DeferredQuota: 2, DeferredDeployment: 1, LeaseLost: 0, PublishCalls: 3, PublishLatency: latency}
	cases := []struct {
		name string
		cfg  EMFConfig
		ev   Event
	}{
		{"relay_drain", EMFConfig{}, Event{Function: FunctionRelay, Time: fixedTime,
			Values: append(Relay(st.Counts(), st.PublishLatency), Backlog(42, 3500*time.Millisecond, 7200*time.Second, 1)...)}},
		{"relay_drain_idle", EMFConfig{}, Event{Function: FunctionRelay, Time: fixedTime,
			Values: append(Relay(relay.Stats{Batches: 1}.Counts(), nil), Backlog(0, 0, 0, 0)...)}},
		{"relay_retention", EMFConfig{Namespace: "Shop/Outbox"}, Event{Function: FunctionRelay, Time: fixedTime,
			Values: Retention(1000, 25), Properties: map[string]string{"task": "retention", "request_id": "r-1"}}},
		{"webhook_bounded_topic", EMFConfig{Topics: []string{"order.created"}}, Event{Function: FunctionWebhook, Topic: "order.created", Time: fixedTime,
			Values: []Value{Count(Processed, 1)}}},
		{"webhook_unbounded_topic", EMFConfig{Topics: []string{"order.created"}}, Event{Function: FunctionWebhook, Topic: "made.up", Time: fixedTime,
			Values: []Value{Count(PermanentFailure, 1)}}},
		{"failure_callback", EMFConfig{}, Event{Function: FunctionFailure, Time: fixedTime,
			Values: []Value{Count(DeliveryDeadLetters, 1)}}},
		{"latency_overflow", EMFConfig{}, Event{Function: FunctionRelay, Time: fixedTime,
			Values: []Value{Count(Batches, 130), {Name: PublishLatency, Values: many}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			if err := NewEMF(&buf, c.cfg).Record(c.ev); err != nil {
				t.Fatal(err)
			}
			checkEMFSpec(t, buf.Bytes())
			golden(t, c.name, buf.Bytes())
		})
	}
}

// TestGoldenFilesFollowTheSpec checks every committed golden, so a hand-edited or stale
// golden cannot drift from the specification either.
func TestGoldenFilesFollowTheSpec(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("testdata/*.golden")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, f := range files {
		if strings.HasPrefix(filepath.Base(f), "prometheus") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		checkEMFSpec(t, b)
	}
}

// validUnits are CloudWatch's metric units (EMF spec: Unit is optional, one of these).
var validUnits = map[string]bool{
	"Seconds": true, "Microseconds": true, "Milliseconds": true, "Bytes": true, "Kilobytes": true,
	"Megabytes": true, "Gigabytes": true, "Terabytes": true, "Bits": true, "Kilobits": true,
	"Megabits": true, "Gigabits": true, "Terabits": true, "Percent": true, "Count": true,
	"Bytes/Second": true, "Kilobytes/Second": true, "Megabytes/Second": true, "Gigabytes/Second": true,
	"Terabytes/Second": true, "Bits/Second": true, "Kilobits/Second": true, "Megabits/Second": true,
	"Gigabits/Second": true, "Terabits/Second": true, "Count/Second": true, "None": true,
}

// checkEMFSpec validates output against the EMF specification: one JSON object per line;
// _aws.Timestamp in epoch milliseconds; each directive with Namespace, Dimensions (sets of
// root member names with string values, at most 9 each) and Metrics (at most 100, each
// naming a root member that is a number or an array of at most 100 numbers).
func checkEMFSpec(t *testing.T, out []byte) {
	t.Helper()
	if len(out) == 0 || out[len(out)-1] != '\n' {
		t.Fatalf("output must be newline-terminated lines: %q", out)
	}
	for _, line := range strings.Split(strings.TrimSuffix(string(out), "\n"), "\n") {
		var doc map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &doc); err != nil {
			t.Fatalf("line is not a JSON object: %v\n%s", err, line)
		}
		var aws struct {
			Timestamp         *json.Number `json:"Timestamp"`
			CloudWatchMetrics []struct {
				Namespace  string     `json:"Namespace"`
				Dimensions [][]string `json:"Dimensions"`
				Metrics    []struct {
					Name              string `json:"Name"`
					Unit              string `json:"Unit"`
					StorageResolution *int   `json:"StorageResolution"`
				} `json:"Metrics"`
			} `json:"CloudWatchMetrics"`
		}
		d := json.NewDecoder(bytes.NewReader(doc["_aws"]))
		d.UseNumber()
		if err := d.Decode(&aws); err != nil {
			t.Fatalf("_aws: %v\n%s", err, line)
		}
		if aws.Timestamp == nil {
			t.Fatalf("_aws.Timestamp missing: %s", line)
		}
		ms, err := aws.Timestamp.Int64()
		if err != nil || ms < 1e12 || ms > 1e13 {
			t.Fatalf("_aws.Timestamp %v is not epoch milliseconds", aws.Timestamp)
		}
		if len(aws.CloudWatchMetrics) == 0 {
			t.Fatalf("no CloudWatchMetrics directive: %s", line)
		}
		for _, dir := range aws.CloudWatchMetrics {
			if dir.Namespace == "" || dir.Dimensions == nil || len(dir.Metrics) == 0 || len(dir.Metrics) > 100 {
				t.Fatalf("bad directive: %s", line)
			}
			for _, set := range dir.Dimensions {
				if len(set) > 9 {
					t.Fatalf("dimension set over 9: %v", set)
				}
				for _, dim := range set {
					var s string
					if err := json.Unmarshal(doc[dim], &s); err != nil {
						t.Fatalf("dimension %q is not a root string member: %s", dim, line)
					}
				}
			}
			for _, m := range dir.Metrics {
				if m.Unit != "" && !validUnits[m.Unit] {
					t.Fatalf("metric %s: unit %q is not a CloudWatch unit", m.Name, m.Unit)
				}
				if m.StorageResolution != nil && *m.StorageResolution != 1 && *m.StorageResolution != 60 {
					t.Fatalf("metric %s: StorageResolution %d", m.Name, *m.StorageResolution)
				}
				if _, ok := Lookup(m.Name); !ok {
					t.Fatalf("metric %s is not in Definitions", m.Name)
				}
				raw, ok := doc[m.Name]
				if !ok {
					t.Fatalf("metric %s has no root member: %s", m.Name, line)
				}
				var one float64
				var many []float64
				if json.Unmarshal(raw, &one) != nil {
					if err := json.Unmarshal(raw, &many); err != nil || len(many) == 0 || len(many) > 100 {
						t.Fatalf("metric %s value %s is neither a number nor an array of 1..100 numbers", m.Name, raw)
					}
				}
			}
		}
	}
}

func TestEMFRejectsBadEvents(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		ev   Event
		want string
	}{
		{"no function", Event{Values: []Value{Count(Claimed, 1)}}, "Function is empty"},
		{"unknown metric", Event{Function: FunctionRelay, Values: []Value{Count("Delivered", 1)}}, `unknown metric "Delivered"`},
		{"twice", Event{Function: FunctionRelay, Values: []Value{Count(Claimed, 1), Count(Claimed, 2)}}, "appears twice"},
		{"counter array", Event{Function: FunctionRelay, Values: []Value{{Name: Claimed, Values: []float64{1, 2}}}}, "not a distribution"},
		{"nan", Event{Function: FunctionRelay, Values: []Value{{Name: OldestPendingAgeSeconds, Values: []float64{math.NaN()}}}}, "non-finite"},
		{"property collision", Event{Function: FunctionRelay, Values: []Value{Count(Claimed, 1)}, Properties: map[string]string{"Claimed": "x"}}, "collides"},
		{"property _aws", Event{Function: FunctionRelay, Values: []Value{Count(Claimed, 1)}, Properties: map[string]string{"_aws": "x"}}, "collides"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			err := NewEMF(&buf, EMFConfig{}).Record(c.ev)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
			if buf.Len() != 0 {
				t.Fatalf("wrote %q for a rejected event", buf.String())
			}
		})
	}
}

func TestEMFDefaultsAndEmptyEvent(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	e := NewEMF(&buf, EMFConfig{Now: func() time.Time { return fixedTime }})
	if err := e.Record(Event{Function: FunctionRelay, Values: []Value{{Name: PublishLatency}}}); err != nil || buf.Len() != 0 {
		t.Fatalf("an event without values wrote %q (err %v)", buf.String(), err)
	}
	if err := e.Record(Event{Function: FunctionRelay, Values: []Value{Count(Claimed, 2)}}); err != nil {
		t.Fatal(err)
	}
	want := `{"_aws":{"Timestamp":1796241600123,"CloudWatchMetrics":[{"Namespace":"OutboxRelay","Dimensions":[["Function"]],"Metrics":[{"Name":"Claimed","Unit":"Count"}]}]},"Function":"relay","Claimed":2}` + "\n"
	if buf.String() != want {
		t.Fatalf("got  %s\nwant %s", buf.String(), want)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestEMFWriteError(t *testing.T) {
	t.Parallel()
	err := NewEMF(failingWriter{}, EMFConfig{}).Record(Event{Function: FunctionRelay, Values: []Value{Count(Claimed, 1)}})
	if err == nil || !strings.Contains(err.Error(), "write emf line: disk full") {
		t.Fatalf("err = %v", err)
	}
}
