package model

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vmarena/vmarena/acl"
)

// CalibrateOptions says what [Calibrate] measures. The zero value measures
// the defaults below.
type CalibrateOptions struct {
	// Name and Description of the new profile; "" gives "calibrated" and a
	// line naming the driver.
	Name, Description string
	// Base supplies what cannot be measured (the stand-in kernel launch,
	// which calls are serialised, and anything the driver refuses), carried
	// over and marked as estimates. nil means the shipped "h200".
	Base *Profile
	// Granules are the sizes, in granules, at which the sized calls are
	// measured. nil means 1, 8, 64 and 512. Sizes that do not fit in half
	// the device's free memory are skipped.
	Granules []int
	// CopySizes are the sizes in bytes of the copies and memsets. nil means
	// 4 KiB, 256 KiB, 4 MiB and 64 MiB.
	CopySizes []uintptr
	// Spans are the numbers of adjacent one-granule mappings one
	// MemSetAccess covers, where the driver allows it. nil means 2 and 8.
	Spans []int
	// Reps is the number of samples per call and size (after one discarded
	// warm-up). 0 means 15.
	Reps int
	// Log, if set, receives a line as each step starts.
	Log func(format string, args ...any)

	// clock, which only tests set, replaces the monotonic clock the calls
	// are timed on (with a model's virtual clock, Driver.now).
	clock func() time.Duration
}

func (o *CalibrateOptions) defaults() error {
	if o.Base == nil {
		b, err := LoadProfile("h200")
		if err != nil {
			return err
		}
		o.Base = b
	} else if err := o.Base.Validate(); err != nil {
		return fmt.Errorf("base profile: %w", err)
	}
	if o.Granules == nil {
		o.Granules = []int{1, 8, 64, 512}
	}
	if o.CopySizes == nil {
		o.CopySizes = []uintptr{4 << 10, 256 << 10, 4 << 20, 64 << 20}
	}
	if o.Spans == nil {
		o.Spans = []int{2, 8}
	}
	if o.Reps == 0 {
		o.Reps = 15
	}
	if o.Name == "" {
		o.Name = "calibrated"
	}
	o.Granules = sortedPositive(o.Granules)
	o.Spans = sortedPositive(o.Spans)
	o.CopySizes = slices.Compact(slices.Sorted(slices.Values(o.CopySizes)))
	switch {
	case len(o.Granules) == 0:
		return fmt.Errorf("%w: no granule counts", acl.ErrInvalidParam)
	case len(o.CopySizes) == 0 || o.CopySizes[0] == 0:
		return fmt.Errorf("%w: copy sizes must be positive", acl.ErrInvalidParam)
	case o.Reps < 1:
		return fmt.Errorf("%w: reps %d", acl.ErrInvalidParam, o.Reps)
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if o.clock == nil {
		epoch := time.Now()
		o.clock = func() time.Duration { return time.Since(epoch) }
	}
	return nil
}

func sortedPositive(xs []int) []int {
	var out []int
	for _, x := range xs {
		if x > 0 {
			out = append(out, x)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Calibrate measures every call of the contract on drv and returns a
// profile of it: each sized call at several sizes (CalibrateOptions), the
// copies and memsets at several sizes, the stream and event calls, the
// capacity, granularity and capabilities. Costs are fitted by least squares
// over the per-size medians (fixed cost plus cost per MiB; for copies and
// device work, fixed cost plus bandwidth). Every coefficient records where
// it came from; what could not be measured is carried over from
// CalibrateOptions.Base and marked as an estimate.
//
// It releases everything it allocated before returning, also when a call
// fails or ctx is cancelled (it then returns the error, wrapping ctx.Err()
// for a cancellation). It uses one physical allocation of the largest size
// at a time, plus a work area of twice the largest copy.
func Calibrate(ctx context.Context, drv acl.Driver, opts CalibrateOptions) (prof *Profile, err error) {
	if err := opts.defaults(); err != nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	c := &cal{
		ctx:     ctx,
		d:       drv,
		opts:    opts,
		prop:    acl.DeviceProp(drv.Device(), 0),
		samples: make(map[string]map[uintptr][]float64),
		resv:    make(map[acl.DevicePtr]bool),
		maps:    make(map[acl.DevicePtr]bool),
		hs:      make(map[acl.PhysicalHandle]bool),
		streams: make(map[acl.Stream]bool),
		events:  make(map[acl.Event]bool),
	}
	defer func() {
		if cerr := c.cleanup(); cerr != nil {
			prof, err = nil, errors.Join(err, fmt.Errorf("calibrate: cleaning up: %w", cerr))
		}
	}()
	if err := c.measure(); err != nil {
		return nil, fmt.Errorf("calibrate %s: %w", drv.Name(), err)
	}
	return c.profile(), nil
}

// cal is one calibration: the samples, and the objects to release.
type cal struct {
	ctx  context.Context
	d    acl.Driver
	opts CalibrateOptions
	prop acl.PhysicalMemProp
	g    uintptr // granularity
	caps acl.Caps

	capacity  uintptr
	sizes     []uintptr // the sized calls' sizes actually measured
	noAccess  bool      // the runtime lacks MemSetAccess
	noStreams string    // why streams could not be measured, if they could not
	copyMax   uintptr

	// samples[call][size] are µs per call; size 0 for calls without one.
	// "access_span" is keyed by the number of mappings, "memset_device" is
	// the device time of MemsetAsync by size.
	samples map[string]map[uintptr][]float64

	resv    map[acl.DevicePtr]bool
	maps    map[acl.DevicePtr]bool
	hs      map[acl.PhysicalHandle]bool
	streams map[acl.Stream]bool
	events  map[acl.Event]bool
	pinned  []byte // MallocHost's buffer while the pinned copies are measured
}

func (c *cal) add(name string, size uintptr, d time.Duration) {
	m := c.samples[name]
	if m == nil {
		m = make(map[uintptr][]float64)
		c.samples[name] = m
	}
	m[size] = append(m[size], float64(d)/1e3)
}

// timed runs fn, after checking ctx, and records its time under name and
// size when rec is set.
func (c *cal) timed(name string, size uintptr, rec bool, fn func() error) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	t0 := c.opts.clock()
	err := fn()
	el := c.opts.clock() - t0
	if err != nil {
		return err
	}
	if rec {
		c.add(name, size, el)
	}
	return nil
}

func (c *cal) reserve(n uintptr, rec bool) (p acl.DevicePtr, err error) {
	err = c.timed("reserve", n, rec, func() error {
		p, err = c.d.ReserveMemAddress(n, 0, 0, 0)
		return err
	})
	if err == nil {
		c.resv[p] = true
	}
	return p, err
}

func (c *cal) release(p acl.DevicePtr, n uintptr, rec bool) error {
	err := c.timed("release", n, rec, func() error { return c.d.ReleaseMemAddress(p) })
	if err == nil {
		delete(c.resv, p)
	}
	return err
}

func (c *cal) malloc(n uintptr, rec bool) (h acl.PhysicalHandle, err error) {
	err = c.timed("malloc", n, rec, func() error {
		h, err = c.d.MallocPhysical(n, &c.prop, 0)
		return err
	})
	if err == nil {
		c.hs[h] = true
	}
	return h, err
}

func (c *cal) free(h acl.PhysicalHandle, n uintptr, rec bool) error {
	err := c.timed("free", n, rec, func() error { return c.d.FreePhysical(h) })
	if err == nil {
		delete(c.hs, h)
	}
	return err
}

func (c *cal) mapMem(p acl.DevicePtr, n uintptr, h acl.PhysicalHandle, rec bool) error {
	err := c.timed("map", n, rec, func() error { return c.d.MapMem(p, n, 0, h, 0) })
	if err == nil {
		c.maps[p] = true
	}
	return err
}

func (c *cal) unmap(p acl.DevicePtr, n uintptr, rec bool) error {
	err := c.timed("unmap", n, rec, func() error { return c.d.UnmapMem(p) })
	if err == nil {
		delete(c.maps, p)
	}
	return err
}

// access grants access to [p, p+n), recording under name and key.
func (c *cal) access(name string, key uintptr, p acl.DevicePtr, n uintptr, rec bool) error {
	if c.noAccess {
		return nil
	}
	err := c.timed(name, key, rec, func() error { return c.d.MemSetAccess(p, n, acl.ReadWrite(c.d.Device())) })
	if errors.Is(err, acl.ErrNotSupported) {
		c.noAccess = true
		return nil
	}
	return err
}

// cleanup releases everything the calibration still holds: work in flight
// first, then events, mappings, handles, reservations and streams. A call
// that fails is tried once more, since a failed driver call leaves its
// object as it was.
func (c *cal) cleanup() error {
	var errs []error
	retry := func(fn func() error) bool {
		err := fn()
		if err != nil {
			err = fn()
		}
		errs = append(errs, err)
		return err == nil
	}
	if len(c.streams) > 0 {
		retry(c.d.SynchronizeDevice)
	}
	for ev := range c.events {
		if retry(func() error { return c.d.DestroyEvent(ev) }) {
			delete(c.events, ev)
		}
	}
	for p := range c.maps {
		if retry(func() error { return c.d.UnmapMem(p) }) {
			delete(c.maps, p)
		}
	}
	for h := range c.hs {
		if retry(func() error { return c.d.FreePhysical(h) }) {
			delete(c.hs, h)
		}
	}
	for p := range c.resv {
		if retry(func() error { return c.d.ReleaseMemAddress(p) }) {
			delete(c.resv, p)
		}
	}
	for s := range c.streams {
		retry(func() error { return c.d.SynchronizeStream(s) })
		if retry(func() error { return c.d.DestroyStream(s) }) {
			delete(c.streams, s)
		}
	}
	if c.pinned != nil && retry(func() error { return c.d.FreeHost(c.pinned) }) {
		c.pinned = nil
	}
	return errors.Join(errs...)
}

func (c *cal) measure() error {
	c.caps = c.d.Caps()
	o := &c.opts
	o.Log("calibrate %s: granularity, memory info", c.d.Name())
	for rep := -1; rep < 2*o.Reps; rep++ {
		if err := c.timed("granularity", 0, rep >= 0, func() (err error) {
			c.g, err = c.d.MemGetAllocationGranularity(&c.prop, acl.GranularityMinimum)
			return err
		}); err != nil {
			return fmt.Errorf("granularity: %w", err)
		}
	}
	if c.g == 0 {
		return fmt.Errorf("granularity is 0")
	}
	var free uintptr
	for rep := -1; rep < 2*o.Reps; rep++ {
		if err := c.timed("meminfo", 0, rep >= 0, func() (err error) {
			free, c.capacity, err = c.d.GetMemInfo(acl.HBMMem)
			return err
		}); err != nil {
			return fmt.Errorf("memory info: %w", err)
		}
	}
	c.copyMax = o.CopySizes[len(o.CopySizes)-1]
	work := 2 * roundUp(c.copyMax, c.g)
	for _, k := range o.Granules {
		n := uintptr(k) * c.g
		if n > (free-min(free, work))/2 {
			o.Log("calibrate: skipping %d granules (%d MiB): over half the free memory", k, n>>20)
			continue
		}
		c.sizes = append(c.sizes, n)
	}
	if len(c.sizes) == 0 {
		return fmt.Errorf("%w: no size fits in the device's free memory (%d bytes)", acl.ErrOutOfMemory, free)
	}
	o.Log("calibrate: reserve, malloc, map, access, unmap, free, release at %d sizes up to %d MiB", len(c.sizes), c.sizes[len(c.sizes)-1]>>20)
	for rep := -1; rep < o.Reps; rep++ {
		for _, n := range c.sizes {
			if err := c.sized(n, rep >= 0); err != nil {
				return err
			}
		}
	}
	if c.caps.AccessSpan && !c.noAccess {
		for _, k := range o.Spans {
			o.Log("calibrate: one access over %d mappings", k)
			if err := c.span(k); err != nil {
				return err
			}
		}
	}
	o.Log("calibrate: copies and memsets up to %d KiB", c.copyMax>>10)
	if err := c.copies(work); err != nil {
		return err
	}
	o.Log("calibrate: streams and events")
	return c.eventCalls()
}

func roundUp(n, g uintptr) uintptr { return (n + g - 1) / g * g }

// sized measures the life of one allocation of n bytes. The sizes take
// turns within each repetition, so that a disturbance (another process, a
// change of clock speed) falls on all of them alike rather than on one
// size's samples.
func (c *cal) sized(n uintptr, rec bool) error {
	p, err := c.reserve(n, rec)
	if err != nil {
		return fmt.Errorf("reserve %d bytes: %w", n, err)
	}
	h, err := c.malloc(n, rec)
	if err != nil {
		return fmt.Errorf("malloc %d bytes: %w", n, err)
	}
	if err := c.mapMem(p, n, h, rec); err != nil {
		return fmt.Errorf("map %d bytes: %w", n, err)
	}
	if err := c.access("access", n, p, n, rec); err != nil {
		return fmt.Errorf("access %d bytes: %w", n, err)
	}
	if err := c.unmap(p, n, rec); err != nil {
		return fmt.Errorf("unmap %d bytes: %w", n, err)
	}
	if err := c.free(h, n, rec); err != nil {
		return fmt.Errorf("free %d bytes: %w", n, err)
	}
	if err := c.release(p, n, rec); err != nil {
		return fmt.Errorf("release %d bytes: %w", n, err)
	}
	return nil
}

// span measures one MemSetAccess over k adjacent one-granule mappings.
func (c *cal) span(k int) error {
	n := uintptr(k) * c.g
	p, err := c.reserve(n, false)
	if err != nil {
		return fmt.Errorf("span of %d: %w", k, err)
	}
	hs := make([]acl.PhysicalHandle, k)
	for i := range hs {
		if hs[i], err = c.malloc(c.g, false); err != nil {
			return fmt.Errorf("span of %d: %w", k, err)
		}
	}
	for rep := -1; rep < c.opts.Reps; rep++ {
		for i, h := range hs {
			if err := c.mapMem(p+acl.DevicePtr(uintptr(i)*c.g), c.g, h, false); err != nil {
				return fmt.Errorf("span of %d: %w", k, err)
			}
		}
		if err := c.access("access_span", uintptr(k), p, n, rep >= 0); err != nil {
			return fmt.Errorf("span of %d: %w", k, err)
		}
		for i := range hs {
			if err := c.unmap(p+acl.DevicePtr(uintptr(i)*c.g), c.g, false); err != nil {
				return fmt.Errorf("span of %d: %w", k, err)
			}
		}
	}
	for _, h := range hs {
		if err := c.free(h, c.g, false); err != nil {
			return err
		}
	}
	return c.release(p, n, false)
}

// pinnedCopies measures the copies to and from p through a MallocHost
// buffer (page-locked memory, what an Offload sleep and wake copy through),
// where the driver has MallocHost; without it the pinned bandwidths are
// carried over.
func (c *cal) pinnedCopies(p acl.DevicePtr) error {
	buf, err := c.d.MallocHost(c.copyMax)
	if errors.Is(err, acl.ErrNotSupported) {
		c.opts.Log("no MallocHost (%v): the pinned bandwidths are carried over", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("MallocHost of %d bytes: %w", c.copyMax, err)
	}
	c.pinned = buf
	for rep := -1; rep < c.opts.Reps; rep++ {
		for _, n := range c.opts.CopySizes {
			if err := c.timed("htod_pinned", n, rep >= 0, func() error { return c.d.MemcpyHtoD(p, buf[:n]) }); err != nil {
				return fmt.Errorf("htod of %d bytes from pinned memory: %w", n, err)
			}
			if err := c.timed("dtoh_pinned", n, rep >= 0, func() error { return c.d.MemcpyDtoH(buf[:n], p) }); err != nil {
				return fmt.Errorf("dtoh of %d bytes to pinned memory: %w", n, err)
			}
		}
	}
	if err := c.d.FreeHost(buf); err != nil {
		return fmt.Errorf("FreeHost: %w", err) // cleanup tries again
	}
	c.pinned = nil
	return nil
}

// copies measures the copies, Memset and MemsetAsync in a work area of
// work bytes.
func (c *cal) copies(work uintptr) error {
	p, err := c.reserve(work, false)
	if err != nil {
		return fmt.Errorf("work area: %w", err)
	}
	h, err := c.malloc(work, false)
	if err != nil {
		return fmt.Errorf("work area: %w", err)
	}
	if err := c.mapMem(p, work, h, false); err != nil {
		return fmt.Errorf("work area: %w", err)
	}
	if err := c.access("", 0, p, work, false); err != nil {
		return fmt.Errorf("work area: %w", err)
	}
	buf := make([]byte, c.copyMax)
	far := p + acl.DevicePtr(work/2)
	for rep := -1; rep < c.opts.Reps; rep++ {
		rec := rep >= 0
		for _, n := range c.opts.CopySizes {
			steps := []struct {
				name string
				fn   func() error
			}{
				{"htod", func() error { return c.d.MemcpyHtoD(p, buf[:n]) }},
				{"dtoh", func() error { return c.d.MemcpyDtoH(buf[:n], p) }},
				{"dtod", func() error { return c.d.MemcpyDtoD(far, p, n) }},
				{"memset", func() error { return c.d.Memset(p, 0, n) }},
			}
			for _, st := range steps {
				if err := c.timed(st.name, n, rec, st.fn); err != nil {
					return fmt.Errorf("%s of %d bytes: %w", st.name, n, err)
				}
			}
		}
	}
	if err := c.pinnedCopies(p); err != nil {
		return err
	}
	if err := c.probeStreams(); err != nil {
		return err
	}
	if c.noStreams != "" {
		return c.dropWork(p, h, work)
	}
	s, err := c.d.CreateStream()
	if err != nil {
		return fmt.Errorf("create stream: %w", err)
	}
	c.streams[s] = true
	for rep := -1; rep < c.opts.Reps; rep++ {
		for _, n := range c.opts.CopySizes {
			if err := c.ctx.Err(); err != nil {
				return err
			}
			t0 := c.opts.clock()
			if err := c.d.MemsetAsync(p, 0, n, s); err != nil {
				return fmt.Errorf("memset_async of %d bytes: %w", n, err)
			}
			t1 := c.opts.clock()
			if err := c.d.SynchronizeStream(s); err != nil {
				return fmt.Errorf("sync_stream after memset_async: %w", err)
			}
			if rep >= 0 {
				c.add("memset_async", n, t1-t0)
				c.add("memset_async_total", n, c.opts.clock()-t0)
			}
		}
	}
	if err := c.d.DestroyStream(s); err != nil {
		return fmt.Errorf("destroy stream: %w", err)
	}
	delete(c.streams, s)
	return c.dropWork(p, h, work)
}

// dropWork releases the work area.
func (c *cal) dropWork(p acl.DevicePtr, h acl.PhysicalHandle, work uintptr) error {
	if err := c.unmap(p, work, false); err != nil {
		return fmt.Errorf("work area: %w", err)
	}
	if err := c.free(h, work, false); err != nil {
		return fmt.Errorf("work area: %w", err)
	}
	if err := c.release(p, work, false); err != nil {
		return fmt.Errorf("work area: %w", err)
	}
	return nil
}

// probeStreams checks that the driver has streams at all: a runtime without
// them is calibrated without their calls.
func (c *cal) probeStreams() error {
	s, err := c.d.CreateStream()
	if errors.Is(err, acl.ErrNotSupported) {
		c.noStreams = err.Error()
		return nil
	}
	if err != nil {
		return fmt.Errorf("create stream: %w", err)
	}
	c.streams[s] = true
	if err := c.d.DestroyStream(s); err != nil {
		return fmt.Errorf("destroy stream: %w", err)
	}
	delete(c.streams, s)
	return nil
}

// eventCalls measures the stream and event calls that take no size, on an
// idle device.
func (c *cal) eventCalls() error {
	if c.noStreams != "" {
		return nil
	}
	reps := 2 * c.opts.Reps
	for rep := -1; rep < reps; rep++ {
		rec := rep >= 0
		var s acl.Stream
		if err := c.timed("create_stream", 0, rec, func() (err error) { s, err = c.d.CreateStream(); return err }); err != nil {
			return fmt.Errorf("create stream: %w", err)
		}
		c.streams[s] = true
		if err := c.timed("destroy_stream", 0, rec, func() error { return c.d.DestroyStream(s) }); err != nil {
			return fmt.Errorf("destroy stream: %w", err)
		}
		delete(c.streams, s)
		var ev acl.Event
		if err := c.timed("create_event", 0, rec, func() (err error) { ev, err = c.d.CreateEvent(); return err }); err != nil {
			return fmt.Errorf("create event: %w", err)
		}
		c.events[ev] = true
		if err := c.timed("destroy_event", 0, rec, func() error { return c.d.DestroyEvent(ev) }); err != nil {
			return fmt.Errorf("destroy event: %w", err)
		}
		delete(c.events, ev)
	}
	s, err := c.d.CreateStream()
	if err != nil {
		return fmt.Errorf("create stream: %w", err)
	}
	c.streams[s] = true
	ev, err := c.d.CreateEvent()
	if err != nil {
		return fmt.Errorf("create event: %w", err)
	}
	c.events[ev] = true
	for rep := -1; rep < reps; rep++ {
		rec := rep >= 0
		steps := []struct {
			name string
			fn   func() error
		}{
			{"record_event", func() error { return c.d.RecordEvent(ev, s) }},
			{"query_event", func() error { _, err := c.d.QueryEvent(ev); return err }},
			{"sync_event", func() error { return c.d.SynchronizeEvent(ev) }},
			{"sync_stream", func() error { return c.d.SynchronizeStream(s) }},
			{"sync_device", func() error { return c.d.SynchronizeDevice() }},
		}
		for _, st := range steps {
			if err := c.timed(st.name, 0, rec, st.fn); err != nil {
				return fmt.Errorf("%s: %w", st.name, err)
			}
		}
	}
	if err := c.d.DestroyEvent(ev); err != nil {
		return fmt.Errorf("destroy event: %w", err)
	}
	delete(c.events, ev)
	if err := c.d.DestroyStream(s); err != nil {
		return fmt.Errorf("destroy stream: %w", err)
	}
	delete(c.streams, s)
	return nil
}

// medians returns the sizes of name's samples, ascending, and the median at
// each.
func (c *cal) medians(name string) (sizes []uintptr, meds []float64) {
	m := c.samples[name]
	for n := range m {
		sizes = append(sizes, n)
	}
	slices.Sort(sizes)
	for _, n := range sizes {
		meds = append(meds, medianOf(m[n]))
	}
	return sizes, meds
}

func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s) == 0 {
		return math.NaN()
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// lsq fits y = a + b·x by least squares; ok is false with fewer than two
// distinct x.
func lsq(xs, ys []float64) (a, b float64, ok bool) {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	den := n*sxx - sx*sx
	if len(xs) < 2 || den <= 1e-12*n*sxx {
		return 0, 0, false
	}
	b = (n*sxy - sx*sy) / den
	a = (sy - b*sx) / n
	return a, b, true
}

func mib(n uintptr) float64 { return float64(n) / (1 << 20) }

func r3(x float64) float64 { return math.Round(x*1000) / 1000 }

// describe lists medians by size, for a coefficient's note.
func describe(sizes []uintptr, meds []float64, unit func(uintptr) string) string {
	var parts []string
	for i, n := range sizes {
		parts = append(parts, fmt.Sprintf("%s %.3g", unit(n), meds[i]))
	}
	return "medians (µs): " + strings.Join(parts, ", ")
}

func sizeName(n uintptr) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// profile builds the calibrated profile from the samples.
func (c *cal) profile() *Profile {
	o := &c.opts
	base := o.Base
	p := base.Clone()
	date := time.Now().UTC().Format("2006-01-02")
	who := fmt.Sprintf("calibrated on %s, %s", c.d.Name(), date)
	p.Name = o.Name
	p.Description = o.Description
	if p.Description == "" {
		p.Description = fmt.Sprintf("%s, calibrated with model.Calibrate", c.d.Name())
	}
	p.Origin = fmt.Sprintf("Measured by model.Calibrate on %s on %s (%s, %s/%s, GOMAXPROCS=%d): each call timed alone, %d samples per call and size after a discarded warm-up, costs fitted by least squares over the per-size medians. What it could not measure is carried over from profile %s and marked as an estimate.",
		c.d.Name(), date, runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), o.Reps, base.Name)
	p.Sources = map[string]string{
		"calibration": p.Origin,
		"base":        fmt.Sprintf("profile %s: %s", base.Name, base.Origin),
	}
	p.Notes = []string{base.Notes[0]}
	if c.noAccess {
		p.Notes = append(p.Notes, "The runtime lacks MemSetAccess (it answered ErrNotSupported): the access coefficients are carried over.")
	}
	if c.noStreams != "" {
		p.Notes = append(p.Notes, "The runtime has no streams ("+c.noStreams+"): the stream, event and device-work coefficients are carried over.")
	}

	measured := make(map[*Coef]bool)
	set := func(cf *Coef, v float64, src, note string) {
		cf.Value, cf.Estimate, cf.Source, cf.Note = v, false, who+": "+src, note
		measured[cf] = true
	}
	sizesText := func(sizes []uintptr) string {
		var s []string
		for _, n := range sizes {
			s = append(s, sizeName(n))
		}
		return strings.Join(s, ", ")
	}

	set(&p.Capacity, float64(c.capacity), "GetMemInfo's total", "")
	set(&p.Granularity, float64(c.g), "MemGetAllocationGranularity (minimum)", "")
	p.Caps.AccessSpan = Flag{Value: c.caps.AccessSpan, Source: who + ": reported by the driver's Caps()"}
	p.Caps.Fresh = Word{Value: c.caps.Fresh.String(), Source: who + ": reported by the driver's Caps()"}

	// Calls without a size: the median of every sample.
	for _, name := range []string{"granularity", "meminfo", "create_stream", "destroy_stream", "create_event",
		"destroy_event", "record_event", "query_event", "sync_event", "sync_stream", "sync_device", "memset_async"} {
		var all []float64
		for _, xs := range c.samples[name] {
			all = append(all, xs...)
		}
		if len(all) == 0 {
			continue
		}
		set(&p.Calls[name].Base, r3(medianOf(all)), fmt.Sprintf("median of %d calls", len(all)), "")
	}

	// Sized calls: base + per MiB beyond one granule.
	g := mib(c.g)
	for _, name := range []string{"malloc", "free", "reserve", "release", "map", "unmap", "access"} {
		sizes, meds := c.medians(name)
		if len(sizes) == 0 {
			continue
		}
		cc := p.Calls[name]
		note := describe(sizes, meds, sizeName)
		a, b, ok := lsq(sizesF(sizes), meds)
		src := fmt.Sprintf("least squares over the medians at %s, %d samples each", sizesText(sizes), o.Reps)
		if !ok {
			set(&cc.Base, r3(meds[0]), fmt.Sprintf("median of %d calls at %s (one size: no per-MiB fit)", o.Reps, sizeName(sizes[0])), note)
			continue
		}
		if b < 0 {
			note += fmt.Sprintf("; the fit's slope was %.3g µs/MiB, taken as 0", b)
			b, a = 0, medianOf(meds)
		}
		set(&cc.Base, r3(max(0, a+b*g)), src+" (the fit at one granule)", note)
		set(cc.PerMiB, r3(b), src+" (the slope)", note)
	}

	// One access over k mappings: what it costs beyond a single mapping of
	// the same bytes, per extra mapping (least squares through the origin).
	if ks, meds := c.medians("access_span"); len(ks) > 0 && measured[&p.Calls["access"].Base] {
		acc := p.Calls["access"]
		var sxy, sxx float64
		for i, k := range ks {
			single := acc.Base.Value + acc.PerMiB.Value*(mib(k*c.g)-g)
			sxy += float64(k-1) * (meds[i] - single)
			sxx += float64(k-1) * float64(k-1)
		}
		if sxx > 0 {
			note := describe(ks, meds, func(k uintptr) string { return fmt.Sprintf("%d mappings", k) })
			var counts []string
			for _, k := range ks {
				counts = append(counts, fmt.Sprint(k))
			}
			set(acc.PerMapping, r3(max(0, sxy/sxx)), fmt.Sprintf("one MemSetAccess over %s adjacent one-granule mappings, less the fitted single-mapping cost of the same bytes, %d samples each; least squares through the origin",
				strings.Join(counts, ", "), o.Reps), note)
		}
	}

	// Copies to and from the host: base + n ÷ bandwidth.
	for _, k := range []struct {
		name string
		bw   *Coef
	}{{"htod", &p.Device.HtoDGBps}, {"dtoh", &p.Device.DtoHGBps}} {
		sizes, meds := c.medians(k.name)
		a, b, ok := lsq(sizesF(sizes), meds)
		if !ok || b <= 0 {
			continue
		}
		note := describe(sizes, meds, sizeName)
		src := fmt.Sprintf("least squares over the medians at %s, %d samples each", sizesText(sizes), o.Reps)
		set(&p.Calls[k.name].Base, r3(max(0, a)), src+" (the intercept)", note)
		set(k.bw, r3(1048.576/b), src+" (1 ÷ the slope)", note)
	}
	// The same copies through page-locked memory: the call's base is the
	// pageable copy's, the bandwidth their own.
	for _, k := range []struct {
		name string
		bw   **Coef
	}{{"htod_pinned", &p.Device.PinnedHtoDGBps}, {"dtoh_pinned", &p.Device.PinnedDtoHGBps}} {
		sizes, meds := c.medians(k.name)
		_, b, ok := lsq(sizesF(sizes), meds)
		if !ok || b <= 0 {
			continue
		}
		if *k.bw == nil {
			*k.bw = &Coef{}
		}
		src := fmt.Sprintf("copies through a MallocHost buffer, least squares over the medians at %s, %d samples each (1 ÷ the slope)", sizesText(sizes), o.Reps)
		set(*k.bw, r3(1048.576/b), src, describe(sizes, meds, sizeName))
	}

	// Device work: MemsetAsync followed by SynchronizeStream, less the
	// launch and the synchronisation, is the memset's device time.
	lat, local := p.Device.Latency.Value, 1048.576/p.Device.LocalGBps.Value // µs, µs per MiB moved
	if sizes, totals := c.medians("memset_async_total"); len(sizes) > 0 {
		launch := p.Calls["memset_async"].Base.Value
		sync := p.Calls["sync_stream"].Base.Value
		ys := make([]float64, len(sizes))
		for i := range sizes {
			ys[i] = totals[i] - launch - sync
		}
		if a, b, ok := lsq(sizesF(sizes), ys); ok && b > 0 {
			note := describe(sizes, ys, sizeName) + " of device time (MemsetAsync + SynchronizeStream less their bases)"
			src := fmt.Sprintf("MemsetAsync then SynchronizeStream at %s, %d samples each, less the two calls' bases; least squares", sizesText(sizes), o.Reps)
			lat, local = max(0, a), b
			set(&p.Device.Latency, r3(lat), src+" (the intercept)", note)
			set(&p.Device.LocalGBps, r3(1048.576/b), src+" (1 ÷ the slope)", note)
		}
	}
	// The synchronous device-side calls: what is left of their time after
	// the device work, which moves 2n bytes for a copy and n for a memset.
	for _, k := range []struct {
		name  string
		moved float64
	}{{"dtod", 2}, {"memset", 1}} {
		sizes, meds := c.medians(k.name)
		if len(sizes) == 0 {
			continue
		}
		rest := make([]float64, len(sizes))
		for i, n := range sizes {
			rest[i] = meds[i] - lat - k.moved*mib(n)*local
		}
		note := describe(sizes, meds, sizeName)
		if _, b, ok := lsq(sizesF(sizes), meds); ok && b > 0 {
			note += fmt.Sprintf("; fitted alone, their slope gives %.4g GB/s of bytes moved", k.moved*1048.576/b)
		}
		set(&p.Calls[k.name].Base, r3(max(0, medianOf(rest))),
			fmt.Sprintf("median over %s of the call's median less the device time (latency + bytes moved ÷ local bandwidth)", sizesText(sizes)), note)
	}

	// Everything else is the base profile's, as an estimate.
	carried := "carried over from profile " + base.Name + ": "
	p.coefs(func(_ string, cf *Coef) {
		if !measured[cf] {
			cf.Estimate = true
			if !strings.HasPrefix(cf.Source, carried) {
				cf.Source = carried + cf.Source
			}
		}
	})
	for _, cc := range p.Calls {
		cc.Serial.Estimate = true
		if !strings.HasPrefix(cc.Serial.Source, carried) {
			cc.Serial.Source = carried + cc.Serial.Source
		}
	}
	return p
}

func sizesF(sizes []uintptr) []float64 {
	xs := make([]float64, len(sizes))
	for i, n := range sizes {
		xs[i] = mib(n)
	}
	return xs
}
