package bench

// find returns the first element of xs that match accepts, in place (so the caller may
// read a result's run without copying it), or nil.
func find[T any](xs []T, match func(*T) bool) *T {
	for i := range xs {
		if match(&xs[i]) {
			return &xs[i]
		}
	}
	return nil
}
