package schedtest

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

func lockIt(mu *sync.Mutex, n *int, done chan<- struct{}) {
	mu.Lock()
	*n++
	mu.Unlock()
	close(done)
}

func TestBlocked(t *testing.T) {
	const frame = "github.com/vmarena/vmarena/internal/sched/schedtest.lockIt"
	var mu sync.Mutex
	assert.False(t, Blocked("sync.Mutex.Lock", frame), "nobody is there yet")
	mu.Lock()
	done := make(chan struct{})
	var n int
	go lockIt(&mu, &n, done)
	WaitBlocked(t, "sync.Mutex.Lock", frame)
	assert.False(t, Blocked("select", frame), "another state")
	assert.False(t, Blocked("sync.Mutex.Lock", frame+"Not"), "another function")
	assert.Zero(t, n, "it has not got the lock")
	mu.Unlock()
	<-done
	assert.Equal(t, 1, n)
	assert.False(t, Blocked("sync.Mutex.Lock", frame), "it went on")
}
