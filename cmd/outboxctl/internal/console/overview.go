package console

import (
	"errors"
	"html/template"
	"net/http"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/pkg/health"
)

type overviewData struct {
	Report  health.Report
	Status  health.Status
	Reasons []string
	// HorizonWarning: the xmin horizon or the oldest transaction crossed its threshold,
	// so VACUUM cannot clean the outbox's dead rows.
	HorizonWarning bool
	Thresholds     health.Thresholds
	Chart          template.HTML
	Series         Series
	Range          chartRange
	Ranges         []chartRange
	// Groups are the largest failure groups of the open dead letters.
	Groups          []groupRow
	GroupsTruncated bool
	Elapsed         time.Duration
}

// overview shows what outboxctl status shows (the same health.Collect and Check), with the
// chart of the chosen window.
func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.queryContext(r)
	defer cancel()
	began := time.Now()
	rg := pickRange(r.URL.Query().Get("range"))
	// The report and the chart are independent reads, each a pending-index scan: on two
	// connections at once the page costs the slower of them, not their sum.
	var (
		rep       health.Report
		series    Series
		repErr    error
		seriesErr error
		groups    []groupRow
		more      bool
		groupsErr error
		wg        sync.WaitGroup
	)
	wg.Go(func() { rep, repErr = health.Collect(ctx, s.cfg.DB) })
	wg.Go(func() { series, seriesErr = loadSeries(ctx, s.cfg.DB, rg, s.cfg.Now()) })
	wg.Go(func() { groups, more, groupsErr = s.groupsOf(ctx, letterFilter{}, overviewGroupLimit) })
	wg.Wait()
	if err := errors.Join(repErr, seriesErr, groupsErr); err != nil {
		s.fail(w, r, err)
		return
	}
	th := s.cfg.Thresholds.WithDefaults()
	st, reasons := rep.Check(th)
	h := rep.Horizon
	warn := (th.MaxXminAge > 0 && h.XminHorizonAge > th.MaxXminAge) ||
		(th.MaxTransactionAge > 0 && time.Duration(h.OldestTransactionAgeSeconds*float64(time.Second)) > th.MaxTransactionAge)
	s.render(w, r, http.StatusOK, "overview", "Overview", overviewData{
		Report: rep, Status: st, Reasons: reasons, HorizonWarning: warn, Thresholds: th,
		Chart: renderChart(series), Series: series, Range: rg, Ranges: chartRanges, Elapsed: time.Since(began),
		Groups: groups, GroupsTruncated: more,
	})
}
