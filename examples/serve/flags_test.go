package main

import (
	"bytes"
	"context"
	"testing"
)

// A negative -requests is a bad value: refused, not a silent run of nothing.
func TestBadRequestsIsAnError(t *testing.T) {
	o := defaults()
	o.spec = "host"
	o.requests = -3
	var out bytes.Buffer
	if _, err := run(context.Background(), &out, o); err == nil {
		t.Errorf("-requests -3 accepted:\n%s", out.String())
	}
}
