package relayfunc

import (
	"strings"
	"testing"
)

func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		env  map[string]string
		want int64
		err  string
	}{
		{"template's 256 MB", map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256"}, 256 << 20 * 80 / 100, ""},
		{"1 GB", map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1024"}, 1024 << 20 * 80 / 100, ""},
		{"GOMEMLIMIT wins", map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256", "GOMEMLIMIT": "100MiB"}, 0, ""},
		{"GOMEMLIMIT off wins", map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256", "GOMEMLIMIT": "off"}, 0, ""},
		{"outside Lambda", nil, 0, ""},
		{"not a number", map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256MB"}, 0, "AWS_LAMBDA_FUNCTION_MEMORY_SIZE \"256MB\""},
		{"zero", map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "0"}, 0, "whole MB"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, err := memoryLimit(func(k string) string { return c.env[k] })
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("memoryLimit = %d, %v; want %d", got, err, c.want)
			}
		})
	}
}
