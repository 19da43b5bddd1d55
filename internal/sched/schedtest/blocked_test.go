package schedtest

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

func lockIt(mu *sync.Mutex, done chan<- struct{}) {
	mu.Lock()
	mu.Unlock()
	close(done)
}

func TestBlocked(t *testing.T) {
	const frame = "github.com/vmarena/vmarena/internal/sched/schedtest.lockIt"
	var mu sync.Mutex
	assert.False(t, Blocked("sync.Mutex.Lock", frame), "nobody is there yet")
	mu.Lock()
	done := make(chan struct{})
	go lockIt(&mu, done)
	WaitBlocked(t, "sync.Mutex.Lock", frame)
	assert.False(t, Blocked("select", frame), "another state")
	assert.False(t, Blocked("sync.Mutex.Lock", frame+"Not"), "another function")
	mu.Unlock()
	<-done
	assert.False(t, Blocked("sync.Mutex.Lock", frame), "it went on")
}
