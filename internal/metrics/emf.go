package metrics

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"
)

// maxValuesPerMetric is EMF's limit on the values array of one metric in one document.
const maxValuesPerMetric = 100

// EMFConfig configures an EMF writer. Zero fields take defaults.
type EMFConfig struct {
	// Namespace is the CloudWatch namespace. Default DefaultNamespace.
	Namespace string
	// Topics is the bounded set of topics that may become a Topic dimension (the webhook's
	// registered handlers). Nil: no Topic dimension is ever emitted.
	Topics []string
	// Now is the clock for events without a Time. Default time.Now.
	Now func() time.Time
}

// EMF writes Events as CloudWatch Embedded Metric Format documents, one JSON object per
// line, each line written with a single Write call. Safe for concurrent use.
type EMF struct {
	mu     sync.Mutex
	w      io.Writer
	ns     string
	topics topicSet
	now    func() time.Time
}

// NewEMF returns a writer of EMF lines to w (os.Stdout in a Lambda: CloudWatch Logs
// extracts the metrics, no PutMetricData permission needed).
func NewEMF(w io.Writer, cfg EMFConfig) *EMF {
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &EMF{w: w, ns: cfg.Namespace, topics: slices.Clone(cfg.Topics), now: cfg.Now}
}

// Record writes ev as one EMF line (more only when a distribution has over 100 samples:
// the overflow goes in follow-up lines carrying just that metric). Metrics without values
// are left out; an event with no values at all writes nothing.
func (e *EMF) Record(ev Event) error {
	defs, err := ev.validate()
	if err != nil {
		return err
	}
	ts := ev.Time
	if ts.IsZero() {
		ts = e.now()
	}
	var buf bytes.Buffer
	first := true
	for chunk := 0; ; chunk++ {
		var names []int
		for i, v := range ev.Values {
			if len(v.Values) > chunk*maxValuesPerMetric {
				names = append(names, i)
			}
		}
		if len(names) == 0 {
			break
		}
		if err := e.encode(&buf, ev, defs, names, chunk, ts, first); err != nil {
			return err
		}
		first = false
	}
	if buf.Len() == 0 {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("write emf line: %w", err)
	}
	return nil
}

// encode appends one document with the metrics at idx, their chunk-th slice of values.
// Members are written in a fixed order (_aws, dimensions, metrics, properties) so output
// is byte-stable for golden tests.
func (e *EMF) encode(buf *bytes.Buffer, ev Event, defs []Definition, idx []int, chunk int, ts time.Time, withProps bool) error {
	dims := [][]string{{DimFunction}}
	topicDim := e.topics.has(ev.Topic)
	if topicDim {
		dims = append(dims, []string{DimFunction, DimTopic})
	}
	buf.WriteString(`{"_aws":{"Timestamp":`)
	buf.WriteString(strconv.FormatInt(ts.UnixMilli(), 10))
	buf.WriteString(`,"CloudWatchMetrics":[{"Namespace":`)
	writeJSON(buf, e.ns)
	buf.WriteString(`,"Dimensions":`)
	writeJSON(buf, dims)
	buf.WriteString(`,"Metrics":[`)
	for n, i := range idx {
		if n > 0 {
			buf.WriteByte(',')
		}
		buf.WriteString(`{"Name":`)
		writeJSON(buf, defs[i].Name)
		buf.WriteString(`,"Unit":`)
		writeJSON(buf, string(defs[i].Unit))
		buf.WriteByte('}')
	}
	buf.WriteString(`]}]},"Function":`)
	writeJSON(buf, ev.Function)
	if ev.Topic != "" {
		// A topic outside the bounded set is still useful in Logs Insights.
		buf.WriteString(`,"Topic":`)
		writeJSON(buf, ev.Topic)
	}
	for _, i := range idx {
		v, d := ev.Values[i], defs[i]
		buf.WriteByte(',')
		writeJSON(buf, d.Name)
		buf.WriteByte(':')
		lo := chunk * maxValuesPerMetric
		hi := min(len(v.Values), lo+maxValuesPerMetric)
		if d.Kind == Distribution {
			buf.WriteByte('[')
			for j, x := range v.Values[lo:hi] {
				if j > 0 {
					buf.WriteByte(',')
				}
				buf.WriteString(formatFloat(x))
			}
			buf.WriteByte(']')
		} else {
			buf.WriteString(formatFloat(v.Values[0]))
		}
	}
	if withProps {
		for _, k := range slices.Sorted(maps.Keys(ev.Properties)) {
			buf.WriteByte(',')
			writeJSON(buf, k)
			buf.WriteByte(':')
			writeJSON(buf, ev.Properties[k])
		}
	}
	buf.WriteString("}\n")
	return nil
}

func writeJSON(buf *bytes.Buffer, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only strings and string slices reach here; they always marshal.
		panic(err)
	}
	buf.Write(b)
}

// formatFloat renders a finite float as a JSON number, without exponent for usual values.
func formatFloat(x float64) string {
	return strconv.FormatFloat(x, 'f', -1, 64)
}
