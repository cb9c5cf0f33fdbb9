// Package humanize formats the health report's figures the same way for the terminal
// (outboxctl status) and the browser (outboxctl ui).
package humanize

import (
	"fmt"
	"time"
)

// Seconds formats s seconds as a duration: to the millisecond below a second, else to the
// second.
func Seconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// Bytes formats n bytes in binary units (KiB, MiB, ...) with one decimal.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
