// Package sched lets tests stop a goroutine at named points of the pool's
// and the arena's slow paths (each lock taken and each driver call on the
// growth, relief and wait paths), and of the device bindings' host-memory
// frees, so that a test can run another growth (or allocation) there and
// explore the schedules of two or three of them systematically, instead of
// hoping that a stress run hits them.
//
// In production no hook is set and a point costs one atomic load; the
// points lie on slow paths only (never in Alloc's fast path).
//
// Where no point can say what a test needs (that a goroutine is blocked on a
// lock, and so cannot yet do what the test checks it does not do), package
// schedtest reads it from the goroutine dump.
package sched

import "sync/atomic"

// A Point names a place on a slow path.
type Point string

// The points. Each is passed with the object it concerns: the growing
// *arena.Arena for the arena's points, the *chunk.Pool for the pool's.
const (
	GrowFastPath  Point = "grow.fast"       // Grow's lock-free path found the memory mapped, before it raises its promise
	GrowWaiting   Point = "grow.waiting"    // a growth on the caller's path is about to take its arena's lock (a refill under way yields it)
	GrowLocked    Point = "grow.locked"     // a growth holds its arena's lock, before it takes memory
	GrowTaken     Point = "grow.taken"      // it took the chunks it will map, before the first map call
	GrowUnlocked  Point = "grow.unlocked"   // it released its arena's lock to wait (for a relief, or a chunk in its way)
	GrowBlocked   Point = "grow.blocked"    // a growth, holding nothing, is about to wait for a chunk in its way (passed with the pool)
	GrowRelocked  Point = "grow.relocked"   // it took its arena's lock again after the relief
	GrowFailed    Point = "grow.failed"     // it failed and undid its promise, before it wakes the waiters
	ReliefBegin   Point = "relief.begin"    // a relief starts, holding no lock
	ReliefSelect  Point = "relief.selected" // it chose the chunks it takes, before it waits for their events
	ReliefWaited  Point = "relief.waited"   // their events completed, before the unmaps
	ReliefDone    Point = "relief.done"     // it handed the chunks over
	GiveLocked    Point = "give.locked"     // a member holds its lock while it gives chunks to a relief
	DropRecorded  Point = "drop.recorded"   // a drop (Truncate, a shrink of Len) is recorded, before the word that lowers Len is stored
	ViewWaits     Point = "view.waits"      // Arena.Slice found the word frozen and is about to wait for the arena's lock
	CloseLocked   Point = "close.locked"    // a Close holds its arena's lock, before it marks the arena closing
	CloseWaiting  Point = "close.waiting"   // a Close marked its arena closing, released its lock, and is about to wait for the device
	WakeAsked     Point = "wake.asked"      // a Wake asked the worker to refill the headroom, still holding its arena's lock
	SleepCopied   Point = "sleep.copied"    // an Offload Sleep's copy of a step to the host is done, before that step's chunks are unmapped
	WaitJoining   Point = "wait.joining"    // a growth that ran out of memory holds nothing and is about to join the queue of waiters
	WaitEnqueued  Point = "wait.enqueued"   // a growth joined the queue of waiters
	WaitWoken     Point = "wait.woken"      // a waiter woke, before its retry
	WaitServed    Point = "wait.served"     // a waiting growth succeeded, before it leaves the queue
	WaitDeadlock  Point = "wait.deadlock"   // a waiter fails: every holder of the memory waits (chunk.ErrDeadlock)
	ReleaseQueued Point = "release.queued"  // chunks were handed to wait for the device
	ReleaseUnmap  Point = "release.unmap"   // a chunk that waited for the device is about to be unmapped
	WorkerParks   Point = "worker.parks"    // the pool's worker, with nothing asked and nothing to poll for, is about to block until it is poked
	UnmapAwaited  Point = "unmap.awaited"   // a Close (or a settle) found a chunk another goroutine is unmapping, and is about to wait for that unmap to end, holding nothing
	FreesAwaited  Point = "frees.awaited"   // a relief found chunks on their way back to the driver, and waits for their frees before it counts the room, holding nothing
	ShrinkWait    Point = "shrink.wait"     // a Shrink without streams holds nothing and is about to wait for the device
	ShrinkWaited  Point = "shrink.waited"   // it has waited, and is about to take its arena's lock
	BackingUnmap  Point = "backing.unmap"   // the pool is about to tell an arena that chunks it handed over still mapped go (passed with the arena)
	ShareExported Point = "share.exported"  // Share exported the chunks and let go of its arena's lock, before it sends them
	SharedFree    Point = "shared.free"     // a shared chunk put back is out of the pool's books, counted as freeing, before it is freed
	HostFreed     Point = "host.freed"      // a binding's FreeHost: the runtime freed the buffer, before FreeHost returns (passed with the driver; its lock against Close is held for reading)
)

var hook atomic.Pointer[func(Point, any)]

// At calls the hook, if a test set one, with p and who.
func At(p Point, who any) {
	if f := hook.Load(); f != nil {
		(*f)(p, who)
	}
}

// Set installs f as the hook until the returned function is called. Only
// tests call it, and only one at a time.
func Set(f func(p Point, who any)) (restore func()) {
	hook.Store(&f)
	return func() { hook.Store(nil) }
}
