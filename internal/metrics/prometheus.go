package metrics

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
)

// LatencyBuckets are the upper bounds, in seconds, of the PublishLatency histogram.
var LatencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// RegistryConfig configures a Registry.
type RegistryConfig struct {
	// Functions limits the exposed families to the metrics of these functions (a relay
	// process shows only relay metrics). Nil: every function.
	Functions []string
	// Topics is the bounded set of topics that may become a topic label; other topics are
	// counted without it.
	Topics []string
}

// Registry accumulates Events for a Prometheus text-format exposition: counters add,
// gauges keep the last value, distributions feed a histogram in base units (seconds).
// Safe for concurrent use.
type Registry struct {
	mu     sync.Mutex
	defs   []Definition
	topics topicSet
	series map[string]map[string]*series // prometheus name -> label string -> series
}

type series struct {
	labels  string // rendered {…} or ""
	value   float64
	set     bool     // gauges: a value has been recorded
	buckets []uint64 // histograms: cumulative counts are computed at render time
	sum     float64  // histograms
	count   uint64   // histograms
}

// NewRegistry returns an empty registry. Counters of the selected functions start at zero
// so rate() works from the first scrape; gauges appear once recorded.
func NewRegistry(cfg RegistryConfig) *Registry {
	r := &Registry{topics: slices.Clone(cfg.Topics), series: map[string]map[string]*series{}}
	for _, d := range Definitions {
		if cfg.Functions != nil && !slices.Contains(cfg.Functions, d.Function) {
			continue
		}
		r.defs = append(r.defs, d)
		r.series[PromName(d)] = map[string]*series{}
		if d.Kind == Counter {
			r.series[PromName(d)][""] = &series{}
		}
	}
	return r
}

// PromName is the Prometheus name of d: outbox_<snake_case name>, in base units, with
// _total on counters (Dispatched -> outbox_dispatched_total, PublishLatency ->
// outbox_publish_latency_seconds, OldestPendingAgeSeconds -> outbox_oldest_pending_age_seconds).
func PromName(d Definition) string {
	n := "outbox_" + snake(d.Name)
	switch {
	case d.Kind == Counter:
		return n + "_total"
	case d.Unit == UnitMilliseconds || (d.Unit == UnitSeconds && !strings.HasSuffix(n, "_seconds")):
		return n + "_seconds"
	}
	return n
}

func snake(s string) string {
	var b strings.Builder
	rs := []rune(s)
	for i, r := range rs {
		if unicode.IsUpper(r) {
			if i > 0 && (unicode.IsLower(rs[i-1]) || (i+1 < len(rs) && unicode.IsLower(rs[i+1]))) {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Record folds ev into the registry. Metrics of functions the registry does not expose are
// ignored.
func (r *Registry) Record(ev Event) error {
	defs, err := ev.validate()
	if err != nil {
		return err
	}
	labels := ""
	if r.topics.has(ev.Topic) {
		labels = `{topic="` + escapeLabel(ev.Topic) + `"}`
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, v := range ev.Values {
		d := defs[i]
		fam, ok := r.series[PromName(d)]
		if !ok || len(v.Values) == 0 {
			continue
		}
		s := fam[labels]
		if s == nil {
			s = &series{labels: labels}
			fam[labels] = s
		}
		switch d.Kind {
		case Counter:
			s.value += v.Values[0]
		case Gauge:
			s.value, s.set = v.Values[0], true
		case Distribution:
			if s.buckets == nil {
				s.buckets = make([]uint64, len(LatencyBuckets))
			}
			for _, x := range v.Values {
				if d.Unit == UnitMilliseconds {
					x /= 1000
				}
				s.sum += x
				s.count++
				if j, _ := slices.BinarySearch(LatencyBuckets, x); j < len(LatencyBuckets) {
					s.buckets[j]++
				}
			}
		}
	}
	return nil
}

// WriteText writes the exposition (text format 0.0.4): per family a HELP and a TYPE line,
// then its samples, families in Definitions order and series in label order.
func (r *Registry) WriteText(w io.Writer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	bw := bufio.NewWriter(w)
	for _, d := range r.defs {
		name := PromName(d)
		typ := map[Kind]string{Counter: "counter", Gauge: "gauge", Distribution: "histogram"}[d.Kind]
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s %s\n", name, escapeHelp(d.Help), name, typ)
		fam := r.series[name]
		keys := make([]string, 0, len(fam))
		for k := range fam {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			s := fam[k]
			switch d.Kind {
			case Counter:
				fmt.Fprintf(bw, "%s%s %s\n", name, s.labels, formatSample(s.value))
			case Gauge:
				if s.set {
					fmt.Fprintf(bw, "%s%s %s\n", name, s.labels, formatSample(s.value))
				}
			case Distribution:
				var cum uint64
				for j, ub := range LatencyBuckets {
					cum += s.buckets[j]
					fmt.Fprintf(bw, "%s_bucket%s %d\n", name, withLabel(s.labels, "le", formatSample(ub)), cum)
				}
				fmt.Fprintf(bw, "%s_bucket%s %d\n", name, withLabel(s.labels, "le", "+Inf"), s.count)
				fmt.Fprintf(bw, "%s_sum%s %s\n", name, s.labels, formatSample(s.sum))
				fmt.Fprintf(bw, "%s_count%s %d\n", name, s.labels, s.count)
			}
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write prometheus text: %w", err)
	}
	return nil
}

// ContentType is the media type of WriteText's output.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// ServeHTTP serves the exposition (a /metrics endpoint).
func (r *Registry) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", ContentType)
	_ = r.WriteText(w)
}

// withLabel adds name="value" to a rendered label set.
func withLabel(labels, name, value string) string {
	pair := name + `="` + escapeLabel(value) + `"`
	if labels == "" {
		return "{" + pair + "}"
	}
	return labels[:len(labels)-1] + "," + pair + "}"
}

// escapeLabel escapes a label value: backslash, double quote and line feed.
func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// escapeHelp escapes HELP text: backslash and line feed (quotes stay as they are).
func escapeHelp(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(s)
}

func formatSample(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
