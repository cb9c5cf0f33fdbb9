package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// WriteDrainSVG draws events/s by batch size for the relay, the floor and the article
// baseline (one line per way and relay count; the baseline runs only at its own batch, so it
// is a dashed level across the chart). caption goes under the title (the machine).
func WriteDrainSVG(w io.Writer, d *DrainResult, caption string) error {
	if d == nil || len(d.Runs) == 0 {
		return fmt.Errorf("draw drain chart: no drain results")
	}
	c := lineChart{
		title:   fmt.Sprintf("Drain throughput by batch size (%d events, %d keys)", d.Config.Events, d.Config.Keys),
		caption: caption,
		xTitle:  "batch size (rows per claim)",
	}
	for _, bs := range d.Config.Batches {
		c.xLabels = append(c.xLabels, fmt.Sprint(bs))
	}
	colors := map[string][2]string{WayFloor: {"#2b6cb0", "#63b3ed"}, WayRelay: {"#c05621", "#ed8936"}}
	for ri, n := range d.Config.Relays {
		for _, way := range []string{WayFloor, WayRelay} {
			s := chartSeries{label: fmt.Sprintf("%s, %d relay%s", way, n, plural(n)), color: colors[way][min(ri, 1)]}
			for i, bs := range d.Config.Batches {
				if r := d.Find(way, bs, n); r != nil {
					s.points = append(s.points, chartPoint{i, r.EventsPerSec})
				}
			}
			c.series = append(c.series, s)
		}
		if base := d.Baseline(n); base != nil {
			c.series = append(c.series, chartSeries{
				label: fmt.Sprintf("article baseline (batch %d), %d relay%s", base.Batch, n, plural(n)),
				color: []string{"#2f855a", "#68d391"}[min(ri, 1)], level: true,
				points: []chartPoint{{0, base.EventsPerSec}},
			})
		}
	}
	return c.write(w)
}

// WriteRTTSVG draws events/s by the modelled round trip to QStash for the relay (at the
// drain scenario's RTT batch, 1 relay) and the article baseline, same events, with the
// floor at that batch as a dashed level (it publishes nothing, so no round trip touches it).
func WriteRTTSVG(w io.Writer, d *DrainResult, caption string) error {
	if d == nil || len(d.Config.RTTMillis) == 0 {
		return fmt.Errorf("draw round-trip chart: no drain results")
	}
	c := lineChart{
		title:   fmt.Sprintf("Drain throughput by round trip to QStash (%d events, %d keys)", d.Config.Events, d.Config.Keys),
		caption: caption,
		xTitle:  "modelled round trip to QStash (ms)",
	}
	relayLine := chartSeries{label: fmt.Sprintf("relay (batch %d), 1 relay", d.Config.RTTBatch), color: "#c05621"}
	baseLine := chartSeries{label: fmt.Sprintf("article baseline (batch %d)", d.Config.BaselineBatch), color: "#2f855a"}
	for i, rtt := range d.Config.RTTMillis {
		c.xLabels = append(c.xLabels, fmt.Sprint(rtt))
		if r := d.FindRTT(WayRelay, d.Config.RTTBatch, 1, rtt); r != nil {
			relayLine.points = append(relayLine.points, chartPoint{i, r.EventsPerSec})
		}
		if r := d.BaselineRTT(1, rtt); r != nil {
			baseLine.points = append(baseLine.points, chartPoint{i, r.EventsPerSec})
		}
	}
	c.series = append(c.series, relayLine, baseLine)
	if f := d.Find(WayFloor, d.Config.RTTBatch, 1); f != nil {
		c.series = append(c.series, chartSeries{label: fmt.Sprintf("floor (batch %d, no publish)", f.Batch), color: "#2b6cb0",
			level: true, points: []chartPoint{{0, f.EventsPerSec}}})
	}
	return c.write(w)
}

// lineChart is an SVG line chart with categorical x positions and a linear y axis from 0.
type lineChart struct {
	title, caption, xTitle string
	xLabels                []string
	series                 []chartSeries
}

type chartSeries struct {
	label, color string
	// level draws the series' one value as a dashed line across the whole chart.
	level  bool
	points []chartPoint
}

type chartPoint struct {
	x int // index into xLabels
	y float64
}

func (c lineChart) write(w io.Writer) error {
	const (
		width, height                = 820, 440
		left, right, top, bottom     = 80, 250, 60, 60
		plotW, plotH                 = width - left - right, height - top - bottom
		titleY, captionY, axisLabelY = 24, 42, height - 18
	)
	maxY := 0.0
	for _, s := range c.series {
		for _, pt := range s.points {
			maxY = math.Max(maxY, pt.y)
		}
	}
	yMax := niceCeil(maxY * 1.08)
	x := func(i int) float64 {
		if len(c.xLabels) == 1 {
			return left + plotW/2
		}
		return left + float64(i)*plotW/float64(len(c.xLabels)-1)
	}
	y := func(v float64) float64 { return top + plotH - v/yMax*plotH }

	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="%d" font-size="16" font-weight="bold">%s</text>`+"\n", left, titleY, html.EscapeString(c.title))
	p(`<text x="%d" y="%d" fill="#555">%s</text>`+"\n", left, captionY, html.EscapeString(c.caption))

	// Grid and axes.
	for i := 0; i <= 5; i++ {
		v := yMax * float64(i) / 5
		p(`<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", left, left+plotW, y(v), y(v))
		p(`<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-8, y(v), humanInt(v))
	}
	p(`<text transform="translate(18 %d) rotate(-90)" text-anchor="middle">events/s</text>`+"\n", top+plotH/2)
	for i, l := range c.xLabels {
		p(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(i), top+plotH+18, html.EscapeString(l))
	}
	p(`<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", left+plotW/2, axisLabelY, html.EscapeString(c.xTitle))
	p(`<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#333"/>`+"\n", left, left+plotW, top+plotH, top+plotH)
	p(`<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#333"/>`+"\n", left, left, top, top+plotH)

	const dash = ` stroke-dasharray="6 4"`
	var drawn []chartSeries
	for _, s := range c.series {
		if len(s.points) == 0 {
			continue
		}
		drawn = append(drawn, s)
		if s.level {
			yy := y(s.points[0].y)
			p(`<polyline fill="none" stroke="%s" stroke-width="2.5"%s points="%d,%.1f %d,%.1f"/>`+"\n", s.color, dash, left, yy, left+plotW, yy)
			continue
		}
		var pts []string
		for _, pt := range s.points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(pt.x), y(pt.y)))
		}
		p(`<polyline fill="none" stroke="%s" stroke-width="2.5" points="%s"/>`+"\n", s.color, strings.Join(pts, " "))
		for _, pt := range s.points {
			p(`<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`+"\n", x(pt.x), y(pt.y), s.color)
		}
	}
	// Legend.
	for i, s := range drawn {
		ly := top + 10 + i*20
		d := ""
		if s.level {
			d = dash
		}
		p(`<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2.5"%s/>`+"\n", left+plotW+14, left+plotW+38, ly, ly, s.color, d)
		p(`<text x="%d" y="%d" dominant-baseline="middle" font-size="11">%s</text>`+"\n", left+plotW+44, ly, html.EscapeString(s.label))
	}
	p("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

func humanInt(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%gk", math.Round(v/100)/10)
	}
	return fmt.Sprintf("%.0f", v)
}
