package relayenv

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// The byte budgets: the library's defaults outside Lambda, the in-flight budget from the
// function's memory on Lambda unless IN_FLIGHT_BYTES says otherwise.
func TestReadByteBudgets(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		set             map[string]string
		batch, inFlight int64
	}{
		"outside lambda":        {nil, relay.DefaultMaxBatchBytes, relay.DefaultMaxInFlightBytes},
		"template's 256 MB":     {map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256"}, relay.DefaultMaxBatchBytes, 32 << 20},
		"1 GB function":         {map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1024"}, relay.DefaultMaxBatchBytes, 128 << 20},
		"128 MB function":       {map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128"}, relay.DefaultMaxBatchBytes, 16 << 20},
		"set":                   {map[string]string{"BATCH_BYTES": "1000000", "IN_FLIGHT_BYTES": "5000000", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1024"}, 1_000_000, 5_000_000},
		"in flight only, small": {map[string]string{"IN_FLIGHT_BYTES": "4000000"}, 4_000_000, 4_000_000},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, err := readWith(c.set)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Relay.MaxBatchBytes != c.batch || cfg.Relay.MaxInFlightBytes != c.inFlight {
				t.Errorf("batch %d, in flight %d; want %d, %d", cfg.Relay.MaxBatchBytes, cfg.Relay.MaxInFlightBytes, c.batch, c.inFlight)
			}
		})
	}
}
