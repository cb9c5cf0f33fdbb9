package relay

import (
	"encoding/json"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestStatsCounts pins the one list of counters: its names and order (the log keys, the
// relay function's result members and, CamelCased, the metric names depend on them), that
// it names every int field of Stats, that add sums each, and that the log line has them.
func TestStatsCounts(t *testing.T) {
	t.Parallel()
	want := []string{"claimed", "dispatched", "retried", "dead_lettered", "released", "lease_lost",
		"deferred_quota", "deferred_deployment", "deferred_outage", "batches", "publish_calls"}
	var st Stats
	v := reflect.ValueOf(&st).Elem()
	var ints []string
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Int {
			f.SetInt(int64(i + 1)) // a distinct value per field
			ints = append(ints, v.Type().Field(i).Name)
		}
	}
	var names []string
	for name, n := range st.Counts() {
		names = append(names, name)
		field := ""
		for w := range strings.SplitSeq(name, "_") {
			field += strings.ToUpper(w[:1]) + w[1:]
		}
		if f := v.FieldByName(field); !f.IsValid() || f.Int() != int64(n) {
			t.Errorf("Counts: %s = %d is not Stats.%s", name, n, field)
		}
	}
	if !slices.Equal(names, want) {
		t.Fatalf("Counts names %v, want %v", names, want)
	}
	if len(names) != len(ints) {
		t.Fatalf("Counts yields %d counts, Stats has %d int fields %v: one is missing from the list", len(names), len(ints), ints)
	}

	sum := st
	sum.add(st)
	for name, n := range sum.Counts() {
		var one int
		for m, k := range st.Counts() {
			if m == name {
				one = k
			}
		}
		if n != 2*one {
			t.Errorf("add: %s = %d, want %d", name, n, 2*one)
		}
	}

	var line strings.Builder
	slog.New(slog.NewJSONHandler(&line, nil)).Info("relay drain", "stats", st)
	var got struct{ Stats map[string]any }
	if err := json.Unmarshal([]byte(line.String()), &got); err != nil {
		t.Fatal(err)
	}
	for name, n := range st.Counts() {
		if got.Stats[name] != float64(n) {
			t.Errorf("log line %s = %v, want %d", name, got.Stats[name], n)
		}
	}
}
