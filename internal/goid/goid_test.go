package goid

import (
	"sync"
	"testing"
)

func TestIDDiffersBetweenGoroutines(t *testing.T) {
	me := ID()
	if me <= 0 {
		t.Fatalf("ID() = %d", me)
	}
	if again := ID(); again != me {
		t.Fatalf("ID() = %d, then %d on the same goroutine", me, again)
	}
	seen := make(chan int64, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); seen <- ID() }()
	}
	wg.Wait()
	close(seen)
	ids := map[int64]bool{me: true}
	for id := range seen {
		if id <= 0 || ids[id] {
			t.Fatalf("ID() = %d on another goroutine (seen: %v)", id, ids)
		}
		ids[id] = true
	}
}

// BenchmarkID is what a call into an arena costs while one of its
// callbacks runs on another goroutine (otherwise the arena reads one
// atomic word and does not call ID).
func BenchmarkID(b *testing.B) {
	for b.Loop() {
		if ID() == 0 {
			b.Fatal("no goroutine number")
		}
	}
}
