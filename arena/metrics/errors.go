package metrics

import "errors"

// Sentinels callers branch on with errors.Is, all of them here.
var (
	// ErrDuplicate is returned when a name is taken already.
	ErrDuplicate = errors.New("name already registered")
)
