package host

// StopMallocAt makes MallocPhysical call f at its points (PointCommit,
// PointCommitted) until the returned function is called.
func StopMallocAt(f func(point int)) (restore func()) {
	stopAt = f
	return func() { stopAt = nil }
}

// The points of StopMallocAt.
const (
	PointCommit    = pointCommit
	PointCommitted = pointCommitted
)

// Closed reports whether Close has begun on d.
func Closed(d *Driver) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.closed
}
