package strategy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// Several models on one device: each serves from a strategy of its own, as
// servers deploy them today. Split makes them.
//
//	arena    one shared pool (the budget of the whole device) and a tenant per
//	         model: memory moves between models on demand (a growth short of
//	         memory reclaims what other models hold mapped and unused), and
//	         an idle model can sleep (Sleeper)
//	paged    a block pool per model, each a static share of the KV budget,
//	         allocated at start: what a server deploys per model today
//	caching  a caching allocator per model, as one PyTorch process per model
//	         has: each keeps the memory its tensors freed, and gives it back to
//	         the device only when one of its own allocations fails
//
// The other strategies are not made for several models.

// Splits reports whether Split makes the strategy name for several models.
func Splits(name string) bool {
	return name == "arena" || name == "paged" || name == "caching"
}

// Split returns one strategy per model from s, which holds the device's: the
// arena's share the pool; the paged pool's take budgets[i] bytes of blocks
// each (Prepare allocates them); the caching allocators' are fresh ones on
// s's driver. Each part is closed on its own (an arena's part leaves the pool
// to s), before s.
func Split(s Strategy, budgets []int64) ([]Strategy, error) {
	parts := make([]Strategy, len(budgets))
	for i := range parts {
		switch x := s.(type) {
		case *arenaStrategy:
			if x.eager {
				return nil, fmt.Errorf("strategy %s: not made for several models", x.Name())
			}
			v := *x
			v.tenant, v.part = chunk.NewTenant(), true
			parts[i] = &v
		case *pagedStrategy:
			cfg := x.cfg
			cfg.Budget = budgets[i]
			p, err := newPaged(cfg)
			if err != nil {
				return nil, err
			}
			parts[i] = p
		case *cachingStrategy:
			parts[i] = newCaching(x.dev, x.expandable)
		default:
			return nil, fmt.Errorf("strategy %s: not made for several models", s.Name())
		}
	}
	return parts, nil
}

// A Sleeper is a region that can give its memory back to the device while
// it is unused, keeping its addresses, and take it back (the arena's Sleep
// and Wake, in Discard mode: the contents are dropped, and whoever owns them
// copies them in again).
type Sleeper interface {
	Sleep() error
	Wake() error
}

// Sleep gives the region's memory back to the device (Arena.Sleep, Discard).
func (r *arenaRegion) Sleep() error {
	if r.eager {
		return errors.ErrUnsupported
	}
	return r.a.Sleep(context.Background(), arena.Discard)
}

// WakeWait is how long Wake waits for memory when there is too little to
// wake a region at once.
const WakeWait = time.Millisecond

// Wake maps the region's memory back at its addresses (Arena.Wake): what it
// held must be copied in again. Where the memory is not there, it waits at
// most WakeWait for it and fails with an error that matches
// acl.ErrOutOfMemory, the region still asleep: the serving loop that wakes a
// model is the one whose sequences free memory, so a Wake that waited for
// them would wait for itself (Arena.Wake waits until its context is done).
func (r *arenaRegion) Wake() error {
	if r.eager {
		return errors.ErrUnsupported
	}
	ctx, cancel := context.WithTimeout(context.Background(), WakeWait)
	defer cancel()
	err := r.a.Wake(ctx)
	if err != nil && ctx.Err() != nil && !errors.Is(err, acl.ErrOutOfMemory) {
		// The deadline passed before the first try (a loaded machine): no
		// memory was looked for, and the region is as it was.
		err = fmt.Errorf("%w: %w", acl.ErrOutOfMemory, err)
	}
	return err
}

// A Blob is one allocation of raw driver memory that lives as long as a
// model: its weights, where the strategy holds them outside its regions.
type Blob struct {
	d   *dev
	seg segment
}

// NewBlob allocates size bytes on drv in one allocation (reserve, allocate,
// map, set access), as a server loads a model's weights before it serves.
func NewBlob(drv acl.Driver, size int64) (*Blob, error) {
	d, err := newDev(drv)
	if err != nil {
		return nil, err
	}
	seg, err := d.alloc(size)
	if err != nil {
		return nil, err
	}
	return &Blob{d: d, seg: seg}, nil
}

// Ptr returns the blob's device address.
func (b *Blob) Ptr() acl.DevicePtr { return b.seg.base }

// Close frees the blob.
func (b *Blob) Close() error {
	if b == nil || b.seg.size == 0 {
		return nil
	}
	err := b.d.free(b.seg)
	b.seg = segment{}
	return err
}
