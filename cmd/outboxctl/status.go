package main

import (
	"context"
	"errors"
)

// runStatus is a placeholder until its issue lands.
func runStatus(ctx context.Context, e env, args []string) error {
	return errors.New("not implemented yet")
}
