package chunk

import (
	"fmt"

	"github.com/vmarena/vmarena/acl"
)

// Giving memory back to the device.
//
// Put keeps a chunk in the cache, where the next Acquire finds it without a
// driver call; but a cached chunk still holds device memory that no other
// process (and no other pool) can have. Free gives a chunk straight back to
// the driver instead: what an arena going to sleep does with every chunk it
// holds, so that the device's free memory grows by exactly that much.

// Free gives c, a chunk out of this pool and no longer mapped, straight back
// to the driver (FreePhysical), never to the cache. The budget no longer
// counts it, and growths waiting for memory in any pool on the device are
// woken. A shared chunk is handled as Put handles it (it is never cached
// anyway). Free fails with acl.ErrInvalidParam, and changes nothing, for a
// chunk that is not out of this pool, or whose Size is not the size the pool
// lent it out with; if the driver refuses to free it, the chunk stays out,
// with the caller, who still owns it (to map it again, or to try again).
func (p Lender) Free(c Chunk) error {
	p.pool.mu.Lock()
	l, ok := p.pool.out[c.Handle]
	if !ok {
		p.pool.mu.Unlock()
		return fmt.Errorf("chunk: %w: free of chunk %#x, which is not out of this pool", acl.ErrInvalidParam, uintptr(c.Handle))
	}
	if c.Size != l.size {
		p.pool.mu.Unlock()
		return wrongSize("free", 0, c, l)
	}
	if l.shared != nil {
		return p.pool.putSharedLocked(c, l) // freed, never cached
	}
	// Off the books before the call that makes the handle's value free:
	// the driver may hand the value to the next MallocPhysical at once, and
	// that chunk's lease must not be the one deleted.
	p.pool.unlendLocked(c.Handle, l)
	p.pool.freeingLocked(l.size) // on its way back: a growth short of memory waits for it (roomNow)
	p.pool.mu.Unlock()
	err := p.pool.drv.FreePhysical(c.Handle)
	p.pool.mu.Lock()
	p.pool.freedLocked(l.size)
	if err != nil {
		// The driver kept it, so its value is still this chunk's.
		p.pool.lendLocked(c.Handle, l)
		p.pool.mu.Unlock()
		return fmt.Errorf("chunk: free: %w", err)
	}
	p.pool.stats.Frees++
	p.pool.held -= l.size
	p.pool.returns++
	p.pool.mu.Unlock()
	p.pool.freed() // wait.go
	return nil
}

// Shared reports whether c, a chunk out of this pool, is shared with
// another process: exported (Export) or imported (Import).
func (p Lender) Shared(c Chunk) bool { return p.pool.isShared(c) }
