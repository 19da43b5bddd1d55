package chunk

import "example.com/good/acl"

var _ = acl.Ptr
