package arena

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// The arena's lifecycle: one typed state, changed only under the arena's
// mu, read without it by the paths that must not take it (a relief asking
// what the arena could give, copies, the lock-free Grow). docs/design.md
// ("Pressure") tells the transitions and who waits for what.
//
//	open ──Close──▶ closing ──the device done──▶ closed
//	closing ──ctx done, or a fault──▶ open (or asleep, or imported: as it was)
//	open ──Sleep──▶ sleeping ──the device done, the memory freed──▶ asleep
//	sleeping ──ctx done, or a fault undone──▶ open
//	asleep ──Wake──▶ waking ──memory mapped, contents back──▶ open
//	waking ──ctx done, or a fault──▶ asleep
//	asleep ──Close──▶ closing;  imported ──Close──▶ closing
//
// closing, sleeping and waking are transitions: the arena's mu is released
// while they wait (for the device, or for memory), and everything else
// refuses the arena meanwhile (ErrClosed, ErrAsleep) or, if it takes a
// context (Close, Sleep, Wake), waits for the transition to end. Every state
// but open keeps the allocator word frozen (thaw reads the state), so
// Alloc's fast path needs no look at it.
type lifecycle uint32

const (
	lifeOpen     lifecycle = iota // in use: allocates, grows, shrinks
	lifeClosing                   // Close waits for the device, its lock released
	lifeClosed                    // released for good
	lifeSleeping                  // Sleep waits for the device, its lock released, then frees the memory
	lifeAsleep                    // its memory freed; Len kept, Cap 0
	lifeWaking                    // Wake maps memory back, its lock released while it waits for memory
	lifeImported                  // an Imported's arena: open, of a fixed size (share.go)
)

var lifeNames = [...]string{"open", "closing", "closed", "sleeping", "asleep", "waking", "imported"}

func (l lifecycle) String() string {
	if int(l) < len(lifeNames) {
		return lifeNames[l]
	}
	return fmt.Sprintf("lifecycle(%d)", uint32(l))
}

// err is why an operation that needs an open arena refuses one in state l.
func (l lifecycle) err() error {
	switch l {
	case lifeOpen:
		return nil
	case lifeClosing, lifeClosed:
		return errClosed
	case lifeImported:
		return errFixed
	}
	return errAsleepAlone // sleeping, asleep, waking
}

// transient reports whether l is a transition that Close, Sleep and Wake
// wait for.
func (l lifecycle) transient() bool {
	return l == lifeClosing || l == lifeSleeping || l == lifeWaking
}

// life is an arena's lifecycle.
type life struct {
	state   atomic.Uint32 // a lifecycle; written under the arena's mu
	changed chan struct{} // under mu: closed at the next change; nil until someone waits
}

// lifeNow returns the arena's state.
func (a *Arena) lifeNow() lifecycle { return lifecycle(a.life.state.Load()) }

// setLife changes the arena's state and wakes whoever waits for a change
// (Close, Sleep and Wake waiting out a transition; growths and reliefs
// waiting for memory for the arena, which stop). Call with mu held.
func (a *Arena) setLife(to lifecycle) {
	a.life.state.Store(uint32(to))
	if a.life.changed != nil {
		close(a.life.changed)
		a.life.changed = nil
	}
}

// lifeChanged returns a channel closed at the arena's next change of state.
// Call with mu held.
func (a *Arena) lifeChanged() chan struct{} {
	if a.life.changed == nil {
		a.life.changed = make(chan struct{})
	}
	return a.life.changed
}

// awaitTransition takes mu, waiting (with mu released, until ctx is done)
// for a transition under way to end, and returns the state it found, with mu
// held; on error mu is not held.
func (a *Arena) awaitTransition(ctx context.Context) (lifecycle, error) {
	if a.ev.owner.Load() != 0 && a.inCallback() {
		return 0, errCallback
	}
	if err := a.lockMu(ctx); err != nil {
		return 0, err
	}
	for {
		l := a.lifeNow()
		if !l.transient() {
			return l, nil
		}
		ch := a.lifeChanged()
		a.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, fmt.Errorf("wait for the arena's %v to end: %w", l, ctx.Err())
		}
		if err := a.lockMu(ctx); err != nil {
			return 0, err
		}
	}
}

// lockMu takes mu, giving up when ctx is done (lockCtx).
func (a *Arena) lockMu(ctx context.Context) error { return lockCtx(ctx, &a.mu) }

// lockCtx takes mu, giving up when ctx is done. The arena's locks are held
// for driver calls, never for a wait for memory or for work on a stream
// (growMu excepted, which a growth holds while it waits, and which only the
// arena's next growth takes); an arena without streams waits for the whole
// device under mu, though (the fallback of Shrink and of undoing faults),
// which is why a caller with a deadline does not block on it. A lock that is
// held is waited for on a goroutine of its own, which hands it over, or
// gives it back if ctx was done first.
func lockCtx(ctx context.Context, mu *sync.Mutex) error {
	if mu.TryLock() {
		return nil
	}
	if ctx.Done() == nil {
		mu.Lock()
		return nil
	}
	got, gone := make(chan struct{}), make(chan struct{})
	go func() {
		mu.Lock()
		select {
		case got <- struct{}{}: // handed over
		case <-gone:
			mu.Unlock()
		}
	}()
	select {
	case <-got:
		return nil
	case <-ctx.Done():
		close(gone)
		return ctx.Err()
	}
}
