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
