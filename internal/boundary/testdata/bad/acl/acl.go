package acl

import "example.com/bad/internal/units"

var _ = units.Bytes
