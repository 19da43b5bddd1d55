package host

import "example.com/bad/chunk"

func New() {}

var _ = chunk.Pool
