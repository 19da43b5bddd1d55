package chunk

import (
	"example.com/bad/acl/host"
	"example.com/bad/arena"
)

var _, _ = host.New, arena.New
