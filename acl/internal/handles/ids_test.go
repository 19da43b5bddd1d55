package handles

import "testing"

func TestIDsReuseTheLastFreed(t *testing.T) {
	ids := NewIDs(0x1000)
	a, b, c := ids.New(), ids.New(), ids.New()
	if a != 0x1001 || b != 0x1002 || c != 0x1003 {
		t.Fatalf("fresh values %#x %#x %#x", a, b, c)
	}
	ids.Free(a)
	ids.Free(c)
	if got := ids.New(); got != c {
		t.Fatalf("after freeing %#x then %#x, New gave %#x, want the last freed", a, c, got)
	}
	if got := ids.New(); got != a {
		t.Fatalf("New gave %#x, want %#x", got, a)
	}
	if got := ids.New(); got != 0x1004 {
		t.Fatalf("nothing freed: New gave %#x, want a fresh value", got)
	}
}
