// Package handles holds what the device bindings (acl/ascend, acl/cuda)
// share in their books of the runtime's handles.
package handles

import "github.com/vmarena/vmarena/acl"

// GraveyardSize is how many destroyed streams a Graveyard remembers.
const GraveyardSize = 1024

// Graveyard remembers the last GraveyardSize streams a driver destroyed, so
// that using one again is refused instead of reaching the runtime as a
// dangling pointer. The runtime may hand a destroyed stream's pointer out
// again: to the driver (which then calls Revive: it is simply the new
// stream), or to the caller's own code, and then the driver cannot tell the
// caller's new stream from the destroyed one and refuses it while it is
// remembered. A stream destroyed more than GraveyardSize destructions ago is
// forgotten and, if used again, passed on as a foreign one.
//
// The zero value is empty. A Graveyard is not safe for concurrent use; the
// driver holds its own lock.
type Graveyard struct {
	slot map[acl.Stream]int // stream → its slot in ring
	ring []acl.Stream       // the destroyed streams, oldest overwritten first
	next int                // the slot the next burial takes
}

// Bury remembers s as destroyed.
func (g *Graveyard) Bury(s acl.Stream) {
	if g.slot == nil {
		g.slot = make(map[acl.Stream]int)
	}
	if len(g.ring) < GraveyardSize {
		g.ring = append(g.ring, s)
	} else {
		old := g.ring[g.next]
		if i, ok := g.slot[old]; ok && i == g.next {
			delete(g.slot, old)
		}
		g.ring[g.next] = s
	}
	g.slot[s] = g.next
	g.next = (g.next + 1) % GraveyardSize
}

// Revive forgets s: the runtime handed it out again, as a new stream.
func (g *Graveyard) Revive(s acl.Stream) { delete(g.slot, s) }

// Holds reports whether s is a stream the driver destroyed.
func (g *Graveyard) Holds(s acl.Stream) bool {
	_, ok := g.slot[s]
	return ok
}
