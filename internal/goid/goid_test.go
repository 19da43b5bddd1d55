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
