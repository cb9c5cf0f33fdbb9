package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/health"
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
	// ByGroup: the dead-letter table shows failure groups (?dead=groups), not sources
	// and topics. Groups are the largest of the open dead letters.
	ByGroup         bool
	Groups          []groupRow
	GroupsTruncated bool
	Elapsed         time.Duration
}

// overview shows what outboxctl status shows (the same health.Collect and Check), with the
// chart of the chosen window and the largest failure groups.
func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.queryContext(r)
	defer cancel()
	began := time.Now()
	rg := pickRange(r.URL.Query().Get("range"))
	byGroup := r.URL.Query().Get("dead") == "groups"
	var (
		groups    []groupRow
		more      bool
		groupsErr error
		wg        sync.WaitGroup
	)
	// Grouping reads every open letter (the source and topic counts come with the
	// report), so only on request; on a second connection, beside the snapshot.
	if byGroup {
		wg.Go(func() { groups, more, groupsErr = s.groupsOf(ctx, letterFilter{}, overviewGroupLimit) })
	}
	rep, series, err := s.readOverview(ctx, rg)
	wg.Wait()
	if err := errors.Join(err, groupsErr); err != nil {
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
		ByGroup: byGroup, Groups: groups, GroupsTruncated: more,
	})
}

// readOverview reads the status report and the chart in one read-only, repeatable-read
// transaction: the chart does not count the backlog again but takes the report's pending
// count, so both must see one snapshot. The pending rows are read once per page (by the
// report); the chart reads only the buckets it has not cached.
func (s *Server) readOverview(ctx context.Context, rg chartRange) (health.Report, Series, error) {
	tx, err := s.cfg.DB.Begin(ctx)
	if err != nil {
		return health.Report{}, Series{}, fmt.Errorf("begin overview read: %w", err)
	}
	// Read only: nothing to commit. WithoutCancel: the connection goes back clean even
	// when the request ended.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, qSnapshot); err != nil {
		return health.Report{}, Series{}, fmt.Errorf("begin overview read: %w", err)
	}
	rep, err := health.Collect(ctx, tx)
	if err != nil {
		return health.Report{}, Series{}, err
	}
	series, err := s.charts.series(ctx, tx, rg, s.cfg.Now(), rep.Queue.Pending)
	if err != nil {
		return health.Report{}, Series{}, err
	}
	return rep, series, nil
}
