package main

import (
	"context"
	"errors"
)

// runBench is a placeholder until its issue lands.
func runBench(ctx context.Context, e env, args []string) error {
	return errors.New("not implemented yet")
}
