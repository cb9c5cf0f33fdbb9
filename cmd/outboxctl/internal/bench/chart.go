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
	const (
		width, height                = 820, 440
		left, right, top, bottom     = 80, 250, 60, 60
		plotW, plotH                 = width - left - right, height - top - bottom
		titleY, captionY, axisLabelY = 24, 42, height - 18
	)
	batches := d.Config.Batches
	maxY := 0.0
	for _, r := range d.Runs {
		maxY = math.Max(maxY, r.EventsPerSec)
	}
	yMax := niceCeil(maxY * 1.08)
	x := func(i int) float64 {
		if len(batches) == 1 {
			return left + plotW/2
		}
		return left + float64(i)*plotW/float64(len(batches)-1)
	}
	y := func(v float64) float64 { return top + plotH - v/yMax*plotH }

	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="%d" font-size="16" font-weight="bold">Drain throughput by batch size (%d events, %d keys)</text>`+"\n", left, titleY, d.Config.Events, d.Config.Keys)
	p(`<text x="%d" y="%d" fill="#555">%s</text>`+"\n", left, captionY, html.EscapeString(caption))

	// Grid and y axis.
	for i := 0; i <= 5; i++ {
		v := yMax * float64(i) / 5
		p(`<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", left, left+plotW, y(v), y(v))
		p(`<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-8, y(v), humanInt(v))
	}
	p(`<text transform="translate(18 %d) rotate(-90)" text-anchor="middle">events/s</text>`+"\n", top+plotH/2)
	for i, bs := range batches {
		p(`<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", x(i), top+plotH+18, bs)
	}
	p(`<text x="%d" y="%d" text-anchor="middle">batch size (rows per claim)</text>`+"\n", left+plotW/2, axisLabelY)
	p(`<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#333"/>`+"\n", left, left+plotW, top+plotH, top+plotH)
	p(`<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#333"/>`+"\n", left, left, top, top+plotH)

	type series struct {
		label, color string
		dash         string
		points       [][2]float64
	}
	var all []series
	colors := map[string][2]string{WayFloor: {"#2b6cb0", "#63b3ed"}, WayRelay: {"#c05621", "#ed8936"}}
	for ri, n := range d.Config.Relays {
		for _, way := range []string{WayFloor, WayRelay} {
			s := series{label: fmt.Sprintf("%s, %d relay%s", way, n, plural(n)), color: colors[way][min(ri, 1)]}
			for i, bs := range batches {
				if r := d.Find(way, bs, n); r != nil {
					s.points = append(s.points, [2]float64{x(i), y(r.EventsPerSec)})
				}
			}
			all = append(all, s)
		}
		if base := d.Baseline(n); base != nil {
			yy := y(base.EventsPerSec)
			all = append(all, series{
				label: fmt.Sprintf("article baseline (batch %d), %d relay%s", base.Batch, n, plural(n)),
				color: []string{"#2f855a", "#68d391"}[min(ri, 1)], dash: "6 4",
				points: [][2]float64{{left, yy}, {left + plotW, yy}},
			})
		}
	}
	for _, s := range all {
		if len(s.points) == 0 {
			continue
		}
		var pts []string
		for _, pt := range s.points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", pt[0], pt[1]))
		}
		dash := ""
		if s.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, s.dash)
		}
		p(`<polyline fill="none" stroke="%s" stroke-width="2.5"%s points="%s"/>`+"\n", s.color, dash, strings.Join(pts, " "))
		if s.dash == "" {
			for _, pt := range s.points {
				p(`<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`+"\n", pt[0], pt[1], s.color)
			}
		}
	}
	// Legend.
	for i, s := range all {
		ly := top + 10 + i*20
		dash := ""
		if s.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, s.dash)
		}
		p(`<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2.5"%s/>`+"\n", left+plotW+14, left+plotW+38, ly, ly, s.color, dash)
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
