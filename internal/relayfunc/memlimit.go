package relayfunc

import (
	"fmt"
	"strconv"
)

// memoryLimitPercent is the share of the function's memory given to the Go runtime as its
// soft limit. The rest is what the runtime does not count: the executable's mapped pages
// and the kernel's buffers, about 20 MiB of the relay's resident set when idle (VmRSS at
// cold start on the dev machine), and the overshoot while a collection runs.
const memoryLimitPercent = 80

// memoryLimit returns the soft memory limit to set at cold start (0: leave the runtime's):
// memoryLimitPercent of AWS_LAMBDA_FUNCTION_MEMORY_SIZE (MB, set by Lambda and the
// emulator), unless GOMEMLIMIT is set, which the runtime has applied already. Without a
// limit the collector lets the heap grow to twice what is live, so a drain holding 140 MB
// of batches would ask for 280 MB of a 256 MB function and be killed.
func memoryLimit(getenv func(string) string) (int64, error) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, nil
	}
	v := getenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
	if v == "" {
		return 0, nil
	}
	mb, err := strconv.Atoi(v)
	if err != nil || mb <= 0 {
		return 0, fmt.Errorf("AWS_LAMBDA_FUNCTION_MEMORY_SIZE %q must be the function's memory in whole MB", v)
	}
	return int64(mb) << 20 * memoryLimitPercent / 100, nil
}
