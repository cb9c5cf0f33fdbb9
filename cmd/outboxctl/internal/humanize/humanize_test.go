package humanize

import "testing"

func TestSecondsAndBytes(t *testing.T) {
	t.Parallel()
	for in, want := range map[float64]string{0: "0s", 0.0123: "12ms", 1.4: "1s", 3725: "1h2m5s"} {
		if got := Seconds(in); got != want {
			t.Errorf("Seconds(%v) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 30: "5.0 GiB"} {
		if got := Bytes(in); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", in, got, want)
		}
	}
}
