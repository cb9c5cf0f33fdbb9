package console

// The console's statements, for the benchmark's EXPLAIN checks.
const (
	QChartPending    = qChartPending
	QChartDispatched = qChartDispatched
	QOpenLetterIDs   = qOpenLetterIDs
	QAllLetterIDs    = qAllLetterIDs
	QEvent           = qEvent
	QDedupe          = qDedupe
	QEventLetterIDs  = qEventLetterIDs
)

// ResetChartCache empties s's cache of finished chart buckets, for the benchmark's first
// (cold) page.
func ResetChartCache(s *Server) { s.charts.reset() }

// CachedChartBuckets is the number of chart buckets s has cached.
func CachedChartBuckets(s *Server) int {
	s.charts.mu.Lock()
	defer s.charts.mu.Unlock()
	return len(s.charts.buckets)
}
