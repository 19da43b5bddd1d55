package model

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"sort"
	"strings"

	"github.com/vmarena/vmarena/acl"
)

//go:embed profiles/*.json
var profileFiles embed.FS

// Coef is one coefficient of a profile: its value, where it came from, and
// whether it is an estimate rather than a measurement. Each figure lives in
// exactly one Coef, so refitting a profile means changing one value (and
// its source) per figure.
type Coef struct {
	// Value is the figure, in the unit the field's JSON name ends with
	// (_us, _gbps, _bytes).
	Value float64 `json:"value"`
	// Estimate is true when the figure was reasoned rather than measured.
	Estimate bool `json:"estimate"`
	// Source says where the figure came from: a measurement and its
	// conditions, or the reasoning behind an estimate.
	Source string `json:"source"`
	// Note adds what a reader checking the figure needs: other
	// statistics, checks, what would settle an estimate.
	Note string `json:"note,omitempty"`
}

// Flag is a yes-or-no property of a profile, with its provenance (the
// fields mean what Coef's do).
type Flag struct {
	Value    bool   `json:"value"`
	Estimate bool   `json:"estimate"`
	Source   string `json:"source"`
	Note     string `json:"note,omitempty"`
}

// Word is a property of a profile whose value is one of a fixed set of
// words, with its provenance (the fields mean what Coef's do).
type Word struct {
	Value    string `json:"value"`
	Estimate bool   `json:"estimate"`
	Source   string `json:"source"`
	Note     string `json:"note,omitempty"`
}

// CallCost is the host-side cost of one kind of driver call: the time the
// calling thread spends in it, before any device work or transfer.
//
// For the calls that take a size (malloc, free, reserve, release, map,
// unmap, access) the cost of a call of size bytes is
//
//	Base + PerMiB × (size − granularity) / MiB
//
// so Base is the cost of a one-granule call, the figure measurements give
// directly, and PerMiB says how the call scales. A MemSetAccess over a run of
// k adjacent mappings adds PerMapping × (k − 1). Other calls cost Base.
type CallCost struct {
	// Op names the runtime function(s) the call stands for, e.g.
	// "cuMemCreate".
	Op string `json:"op"`
	// Base is the cost in µs of a call of one granule (or of any call,
	// for the calls that take no size).
	Base Coef `json:"base_us"`
	// PerMiB is the extra cost in µs per MiB beyond the first granule;
	// sized calls only.
	PerMiB *Coef `json:"per_mib_us,omitempty"`
	// PerMapping is the extra cost in µs per mapping beyond the first that
	// one MemSetAccess covers; the access call only.
	PerMapping *Coef `json:"per_mapping_us,omitempty"`
	// Serial says the device's driver serialises the call: the model holds
	// a device-wide lock while it spends the call's host-side time.
	Serial Flag `json:"serial"`
}

// DeviceCost is what device work and transfers cost.
type DeviceCost struct {
	// Latency is the fixed device time in µs of one piece of device work
	// (a memset or a device-to-device copy), from the moment it is queued
	// to its completion, beyond the bytes it moves.
	Latency Coef `json:"latency_us"`
	// LocalGBps is the device-local bandwidth in GB/s (10^9 bytes per
	// second), counting bytes read and bytes written: a memset of n bytes
	// moves n, a device-to-device copy of n bytes moves 2n.
	LocalGBps Coef `json:"local_gbps"`
	// HtoDGBps and DtoHGBps are the bandwidths in GB/s of synchronous
	// copies from and to host memory the Go heap owns (pageable memory).
	HtoDGBps Coef `json:"htod_gbps"`
	DtoHGBps Coef `json:"dtoh_gbps"`
	// PinnedHtoDGBps and PinnedDtoHGBps are the same copies' bandwidths
	// from and to page-locked host memory (the buffers of MallocHost, which
	// the device reaches without staging the bytes). Absent, such copies
	// cost what pageable ones do.
	PinnedHtoDGBps *Coef `json:"pinned_htod_gbps,omitempty"`
	PinnedDtoHGBps *Coef `json:"pinned_dtoh_gbps,omitempty"`
}

// ProfileCaps is what the device allows beyond the contract (acl.Caps).
type ProfileCaps struct {
	// AccessSpan: one MemSetAccess may cover a run of adjacent mappings.
	AccessSpan Flag `json:"access_span"`
	// Fresh is "unknown", "process" or "zeroed" (acl.Freshness).
	Fresh Word `json:"fresh"`
}

// Profile is the data the model runs on: the costs of one device's driver
// calls and device work, each with its provenance, its capacity and what it
// allows. Profiles are JSON files; the ones shipped with the package are
// listed by [Profiles] and loaded by [LoadProfile].
type Profile struct {
	// Name is the profile's name, e.g. "h200"; the driver is "model:"+Name.
	Name string `json:"name"`
	// Description says in one line what device and driver it describes.
	Description string `json:"description"`
	// Origin says what was measured, on what, and when.
	Origin string `json:"origin"`
	// Sources explains the short references the coefficients' sources use.
	Sources map[string]string `json:"sources,omitempty"`
	// Notes carries reasoning that concerns more than one coefficient.
	Notes []string `json:"notes,omitempty"`

	// Capacity is the device memory in bytes.
	Capacity Coef `json:"capacity_bytes"`
	// Granularity is the allocation granularity in bytes (minimum and
	// recommended); the HUGE1G attributes use 1 GiB pages regardless.
	Granularity Coef        `json:"granularity_bytes"`
	Caps        ProfileCaps `json:"caps"`
	Device      DeviceCost  `json:"device"`
	// Calls holds the host-side cost of every kind of call, by short name
	// ([CallNames]).
	Calls map[string]*CallCost `json:"calls"`
}

// call is a kind of driver call, the index of the model's cost table.
type call int

const (
	cGranularity call = iota
	cMalloc
	cFree
	cReserve
	cRelease
	cMap
	cUnmap
	cAccess
	cHtoD
	cDtoH
	cDtoD
	cMemset
	cMemInfo
	cCreateStream
	cDestroyStream
	cSyncStream
	cSyncDevice
	cCreateEvent
	cRecordEvent
	cQueryEvent
	cSyncEvent
	cDestroyEvent
	cMemsetAsync
	cLaunch
	numCalls
)

var callNames = [numCalls]string{
	"granularity", "malloc", "free", "reserve", "release", "map", "unmap", "access",
	"htod", "dtoh", "dtod", "memset", "meminfo",
	"create_stream", "destroy_stream", "sync_stream", "sync_device",
	"create_event", "record_event", "query_event", "sync_event", "destroy_event",
	"memset_async", "launch",
}

func (c call) String() string { return callNames[c] }

// sized reports whether the call's cost depends on a size.
func (c call) sized() bool { return c >= cMalloc && c <= cAccess }

// CallNames lists the short names of the calls a profile prices, in the
// order of acl.Driver: granularity, malloc, free, reserve, release, map,
// unmap, access, htod, dtoh, dtod, memset, meminfo, create_stream,
// destroy_stream, sync_stream, sync_device, create_event, record_event,
// query_event, sync_event, destroy_event, memset_async, and launch (the
// model's stand-in kernel launch, acl.Launcher).
func CallNames() []string { return append([]string(nil), callNames[:]...) }

// SizedCall reports whether the call named name takes a size, and so has a
// per-MiB coefficient.
func SizedCall(name string) bool {
	for c := range numCalls {
		if callNames[c] == name {
			return c.sized()
		}
	}
	return false
}

// Profiles returns the names of the profiles shipped with the package, sorted.
func Profiles() []string {
	entries, err := profileFiles.ReadDir("profiles")
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// LoadProfile returns a fresh copy of the shipped profile name.
func LoadProfile(name string) (*Profile, error) {
	b, err := profileFiles.ReadFile(path.Join("profiles", name+".json"))
	if err != nil || strings.ContainsAny(name, "/\\") {
		return nil, fmt.Errorf("model: %w: no profile %q (have %s)", acl.ErrInvalidParam, name, strings.Join(Profiles(), ", "))
	}
	p, err := ParseProfile(b)
	if err != nil {
		return nil, fmt.Errorf("model: profile %s: %w", name, err)
	}
	return p, nil
}

// MaxProfileBytes is the largest profile file LoadProfileFile reads: 1 MiB,
// fifty times the shipped profiles.
const MaxProfileBytes = 1 << 20

// LoadProfileFile reads and checks the profile in the JSON file at path, for
// profiles that do not ship with the package (a device's owner calibrates
// one with [Calibrate]). The path may come from the environment
// ($VMARENA_DEVICE), so it reads a regular file only (never a device such as
// /dev/zero, nor a FIFO, which it does not wait on), of at most
// MaxProfileBytes, and fails with an error matching acl.ErrInvalidParam
// otherwise.
func LoadProfileFile(path string) (*Profile, error) {
	b, err := readProfileFile(path)
	if err != nil {
		return nil, fmt.Errorf("model: profile %s: %w", path, err)
	}
	p, err := ParseProfile(b)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", path, err)
	}
	return p, nil
}

// readProfileFile reads the regular file at path, of at most
// MaxProfileBytes.
func readProfileFile(path string) ([]byte, error) {
	f, err := sysOpenProfile(path) // does not block on a FIFO
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	switch {
	case err != nil:
		return nil, err
	case !st.Mode().IsRegular():
		return nil, fmt.Errorf("%w: not a regular file (%v)", acl.ErrInvalidParam, st.Mode().Type())
	case st.Size() > MaxProfileBytes:
		return nil, fmt.Errorf("%w: %d bytes, more than a profile's %d", acl.ErrInvalidParam, st.Size(), MaxProfileBytes)
	}
	// A file that says it is small may still go on (a /proc file, one that
	// grows): read one byte past the bound, no more.
	b, err := io.ReadAll(io.LimitReader(f, MaxProfileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxProfileBytes {
		return nil, fmt.Errorf("%w: more than a profile's %d bytes", acl.ErrInvalidParam, MaxProfileBytes)
	}
	return b, nil
}

// Resolve loads a profile by name (a shipped profile) or by path (anything
// containing a path separator or ending in .json).
func Resolve(spec string) (*Profile, error) {
	if strings.ContainsAny(spec, "/\\") || strings.HasSuffix(spec, ".json") {
		return LoadProfileFile(spec)
	}
	return LoadProfile(spec)
}

// ParseProfile decodes and checks a profile. Unknown fields are errors, so
// that a misspelt coefficient is not silently left out.
func ParseProfile(b []byte) (*Profile, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p Profile
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("%w: %v", acl.ErrInvalidParam, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the profile", acl.ErrInvalidParam)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// WriteJSON writes p as indented JSON.
func (p *Profile) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(p)
}

// Clone returns a deep copy of p, to edit without touching the original.
func (p *Profile) Clone() *Profile {
	var buf bytes.Buffer
	if err := p.WriteJSON(&buf); err != nil {
		panic(err) // a Profile always encodes
	}
	var q Profile
	if err := json.Unmarshal(buf.Bytes(), &q); err != nil {
		panic(err)
	}
	return &q
}

// Validate checks that p prices every call with finite, non-negative
// figures, that its bandwidths, capacity and granularity are positive, and
// that per-MiB and per-mapping coefficients appear only where they apply.
func (p *Profile) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format, args...))
	}
	if p.Name == "" || strings.ContainsAny(p.Name, " /\\:") {
		bad("name %q: want a short name without spaces, slashes or colons", p.Name)
	}
	nonneg := func(what string, c Coef) {
		if math.IsNaN(c.Value) || math.IsInf(c.Value, 0) || c.Value < 0 {
			bad("%s: %v is not a finite, non-negative number", what, c.Value)
		}
		if c.Source == "" {
			bad("%s: no source", what)
		}
	}
	positive := func(what string, c Coef) {
		nonneg(what, c)
		if c.Value <= 0 {
			bad("%s: must be positive", what)
		}
	}
	// A time beyond maxCallUS would hold a call for longer than any driver
	// takes (and near 1e16 µs no longer fits int64 nanoseconds), and a
	// bandwidth below minGBps makes a copy take as long.
	duration := func(what string, c Coef) {
		nonneg(what, c)
		if c.Value > maxCallUS {
			bad("%s: %v µs is more than %v", what, c.Value, float64(maxCallUS))
		}
	}
	bandwidth := func(what string, c Coef) {
		positive(what, c)
		if c.Value > 0 && c.Value < minGBps {
			bad("%s: %v GB/s is less than %v", what, c.Value, minGBps)
		}
	}
	positive("capacity_bytes", p.Capacity)
	positive("granularity_bytes", p.Granularity)
	if g := p.Granularity.Value; g > 0 && (g != math.Trunc(g) || g < 4096 || uint64(g)&(uint64(g)-1) != 0 || g > acl.Huge1GPageSize) {
		bad("granularity_bytes: %v is not a power of two from 4 KiB to 1 GiB", g)
	}
	if c := p.Capacity.Value; c > 0 && c != math.Trunc(c) {
		bad("capacity_bytes: %v is not a whole number", c)
	}
	if c := p.Capacity.Value; c >= 1<<62 {
		bad("capacity_bytes: %v is too large", c)
	}
	if p.Caps.AccessSpan.Source == "" {
		bad("caps.access_span: no source")
	}
	if _, ok := freshness(p.Caps.Fresh.Value); !ok {
		bad("caps.fresh: %q: want unknown, process or zeroed", p.Caps.Fresh.Value)
	}
	if p.Caps.Fresh.Source == "" {
		bad("caps.fresh: no source")
	}
	duration("device.latency_us", p.Device.Latency)
	bandwidth("device.local_gbps", p.Device.LocalGBps)
	bandwidth("device.htod_gbps", p.Device.HtoDGBps)
	bandwidth("device.dtoh_gbps", p.Device.DtoHGBps)
	if c := p.Device.PinnedHtoDGBps; c != nil {
		bandwidth("device.pinned_htod_gbps", *c)
	}
	if c := p.Device.PinnedDtoHGBps; c != nil {
		bandwidth("device.pinned_dtoh_gbps", *c)
	}
	for c := range numCalls {
		name := callNames[c]
		cc := p.Calls[name]
		if cc == nil {
			bad("calls.%s: missing", name)
			continue
		}
		duration("calls."+name+".base_us", cc.Base)
		if cc.Serial.Source == "" {
			bad("calls.%s.serial: no source", name)
		}
		switch {
		case cc.PerMiB != nil && !c.sized():
			bad("calls.%s.per_mib_us: the call takes no size", name)
		case cc.PerMiB == nil && c.sized():
			bad("calls.%s.per_mib_us: missing (the call takes a size)", name)
		case cc.PerMiB != nil:
			duration("calls."+name+".per_mib_us", *cc.PerMiB)
		}
		switch {
		case cc.PerMapping != nil && c != cAccess:
			bad("calls.%s.per_mapping_us: only the access call covers several mappings", name)
		case cc.PerMapping == nil && c == cAccess:
			bad("calls.access.per_mapping_us: missing")
		case cc.PerMapping != nil:
			duration("calls.access.per_mapping_us", *cc.PerMapping)
		}
	}
	for name := range p.Calls {
		if !knownCall(name) {
			bad("calls.%s: unknown call (want %s)", name, strings.Join(callNames[:], ", "))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", acl.ErrInvalidParam, errors.Join(errs...))
	}
	return nil
}

func knownCall(name string) bool {
	for _, n := range callNames {
		if n == name {
			return true
		}
	}
	return false
}

func freshness(s string) (acl.Freshness, bool) {
	for _, f := range []acl.Freshness{acl.FreshUnknown, acl.FreshProcess, acl.FreshZeroed} {
		if f.String() == s {
			return f, true
		}
	}
	return 0, false
}

// coefs calls fn for every coefficient of p, with its name.
func (p *Profile) coefs(fn func(name string, c *Coef)) {
	fn("capacity_bytes", &p.Capacity)
	fn("granularity_bytes", &p.Granularity)
	fn("device.latency_us", &p.Device.Latency)
	fn("device.local_gbps", &p.Device.LocalGBps)
	fn("device.htod_gbps", &p.Device.HtoDGBps)
	fn("device.dtoh_gbps", &p.Device.DtoHGBps)
	if c := p.Device.PinnedHtoDGBps; c != nil {
		fn("device.pinned_htod_gbps", c)
	}
	if c := p.Device.PinnedDtoHGBps; c != nil {
		fn("device.pinned_dtoh_gbps", c)
	}
	for _, name := range callNames {
		cc := p.Calls[name]
		if cc == nil {
			continue
		}
		fn("calls."+name+".base_us", &cc.Base)
		if cc.PerMiB != nil {
			fn("calls."+name+".per_mib_us", cc.PerMiB)
		}
		if cc.PerMapping != nil {
			fn("calls."+name+".per_mapping_us", cc.PerMapping)
		}
	}
}

// Measured counts p's numeric coefficients, and how many of them are
// measurements rather than estimates.
func (p *Profile) Measured() (measured, total int) {
	p.coefs(func(_ string, c *Coef) {
		total++
		if !c.Estimate {
			measured++
		}
	})
	return measured, total
}

// Summary says in one line that times from p are modelled, and from what.
func (p *Profile) Summary() string {
	m, n := p.Measured()
	return fmt.Sprintf("times are modelled, not measured: device model, profile %s (%s; %d of %d coefficients measured, the rest estimates)",
		p.Name, p.Description, m, n)
}

// costs is a profile compiled for the model: nanoseconds, per call kind.
type costs struct {
	gran       uintptr
	base       [numCalls]int64   // ns
	perByte    [numCalls]float64 // ns per byte beyond one granule
	perMapping int64             // ns per extra mapping of a spanning access
	serial     [numCalls]bool
	latency    int64   // ns of device work beyond its bytes
	local      float64 // ns per byte moved on the device
	htod, dtoh float64 // ns per byte copied
	// ns per byte copied from and to MallocHost's buffers
	pinnedHtoD, pinnedDtoH float64
}

func compile(p *Profile) costs {
	c := costs{gran: uintptr(p.Granularity.Value)}
	for k := range numCalls {
		cc := p.Calls[callNames[k]]
		c.base[k] = usToNS(cc.Base.Value)
		if cc.PerMiB != nil {
			c.perByte[k] = cc.PerMiB.Value * 1e3 / (1 << 20)
		}
		c.serial[k] = cc.Serial.Value
	}
	c.perMapping = usToNS(p.Calls[callNames[cAccess]].PerMapping.Value)
	c.latency = usToNS(p.Device.Latency.Value)
	c.local = 1 / p.Device.LocalGBps.Value // GB/s = bytes per ns
	c.htod = 1 / p.Device.HtoDGBps.Value
	c.dtoh = 1 / p.Device.DtoHGBps.Value
	c.pinnedHtoD, c.pinnedDtoH = c.htod, c.dtoh
	if cf := p.Device.PinnedHtoDGBps; cf != nil {
		c.pinnedHtoD = 1 / cf.Value
	}
	if cf := p.Device.PinnedDtoHGBps; cf != nil {
		c.pinnedDtoH = 1 / cf.Value
	}
	return c
}

// pessimistic puts the readings Config.Pessimistic names in c: each extra
// mapping of an access span costs a one-granule access call, and launches
// hold the device lock that serial calls hold.
func (c *costs) pessimistic() {
	// The span's per-MiB part already counts every mapping's bytes beyond
	// the first granule: each further mapping adds a call's base less the
	// granule a one-mapping call does not pay for.
	c.perMapping = max(0, c.base[cAccess]-nanos(c.perByte[cAccess]*float64(c.gran)))
	c.serial[cLaunch] = true
}

// The bounds Validate puts on a profile's times and bandwidths, and the
// longest time a cost may come to (about 104 days: past it, a sum of costs
// could wrap int64 nanoseconds).
const (
	maxCallUS = 1e7  // 10 s
	minGBps   = 1e-3 // 1 MB/s
	maxNS     = 1 << 53
)

func usToNS(us float64) int64 { return nanos(us * 1e3) }

// nanos converts x ns to int64, at least 0 and at most maxNS (a float
// beyond int64 would convert to anything).
func nanos(x float64) int64 {
	switch {
	case !(x > 0):
		return 0
	case x >= maxNS:
		return maxNS
	}
	return int64(math.Round(x))
}

// host returns the host-side time of a call of kind k over n bytes.
func (c *costs) host(k call, n uintptr) int64 {
	t := c.base[k]
	if n > c.gran && c.perByte[k] != 0 {
		t = min(t+nanos(c.perByte[k]*float64(n-c.gran)), maxNS)
	}
	return t
}

// device returns the device time of work that moves n bytes.
func (c *costs) device(moved uintptr) int64 {
	return min(c.latency+nanos(c.local*float64(moved)), maxNS)
}
