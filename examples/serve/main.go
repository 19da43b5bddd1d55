// Command serve is a small inference server's memory, from start to
// shutdown, as a program using the library manages it: one chunk pool with a
// budget for everything the server holds; two models, each with its weights
// in an arena of its own; a K and a V arena per sequence that grow a row per
// generated token; preemption of the youngest sequence when a growth finds
// the budget spent (its arenas closed, its request requeued and recomputed
// later); an idle model put to sleep, its weights offloaded to host memory,
// and woken, at the same addresses, when a request for it comes; metrics read
// in one Snapshot; and a graceful shutdown on a cancelled context, after
// which the driver holds nothing.
//
// The requests are a fixed trace (a seeded generator), served by one
// scheduler goroutine, so that the output is the same on every run: it
// prints no times. Every finished sequence's K and V rows are read back and
// checked against the values written, so a row lost or overwritten by a
// preemption, a reclaim or a wake fails the run; so does a woken model whose
// weights are not byte for byte what was loaded. docs/serving.md walks
// through this file.
//
// It runs on the driver -device names, $VMARENA_DEVICE by default (the host
// driver when no device answers): go run ./examples/serve -device model:h200
// runs it on the device model.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/device"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/arena/metrics"
	"github.com/vmarena/vmarena/arena/tensor"
	"github.com/vmarena/vmarena/chunk"
)

// options are the server's sizes and its trace; flags set them.
type options struct {
	spec     string // the driver: host, model:h200, …; "" is auto
	budget   int64  // the pool's budget: everything the server may hold on the device
	weights  int    // bytes of weights per model
	layers   int    // transformer layers
	dim      int    // float32s per layer in a token's key (and its value): KV heads × head dimension
	maxBatch int    // sequences decoded together, at most
	maxToks  int    // the longest sequence, prompt and output: what a K or V arena reserves
	requests int    // requests in the trace
	seed     uint64 // the trace's seed
	idle     int    // steps without a request after which a model sleeps
	stop     int    // the step at which the front end stops the server (as SIGTERM would)
}

func defaults() options {
	return options{
		spec:     os.Getenv(acl.DeviceEnv),
		budget:   56 << 20,
		weights:  8 << 20,
		layers:   4,
		dim:      512,
		maxBatch: 8,
		maxToks:  1024,
		requests: 24,
		seed:     1,
		idle:     40,
		stop:     260,
	}
}

func main() {
	o := defaults()
	flag.StringVar(&o.spec, "device", o.spec, "driver spec (host, ascend[:N], cuda[:N], model:NAME; default $"+acl.DeviceEnv+", else auto)")
	flag.Int64Var(&o.budget, "budget", o.budget, "the pool's budget in bytes")
	flag.IntVar(&o.requests, "requests", o.requests, "requests in the trace")
	flag.Uint64Var(&o.seed, "seed", o.seed, "the trace's seed")
	flag.Parse()

	// An interrupt stops the server as the front end does: no new requests,
	// the accepted ones finished, everything closed. (A server under a
	// supervisor adds syscall.SIGTERM.)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := run(ctx, os.Stdout, o); err != nil {
		log.SetFlags(0)
		log.Fatal("serve: ", err)
	}
}

// report is what a run did, for its test to check.
type report struct {
	accepted, finished, refused int
	preempted                   map[int]int // request id → times preempted
	done                        map[int]bool
	sleeps, wakes               int
	wokenBytes                  int // weights bytes compared after the wakes
	snapshot                    metrics.Snapshot
	live                        acl.LiveCounts // what the driver held once the server had closed
}

// run serves the trace on the driver o.spec names until every request it
// accepted is done, then shuts down.
func run(ctx context.Context, w io.Writer, o options) (rep report, err error) {
	if o.requests < 0 {
		return rep, fmt.Errorf("-requests %d: want 0 or more", o.requests)
	}
	choice, err := device.Open(o.spec)
	if err != nil {
		return rep, err
	}
	drv := choice.Driver
	defer func() { err = errors.Join(err, drv.Close()) }()
	fmt.Fprintf(w, "driver %s\n", drv.Name())

	s, err := newServer(drv, o, w)
	if err != nil {
		return rep, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	err = s.serve(ctx, newTrace(o, s.models), func(step int) {
		if step == o.stop {
			fmt.Fprintf(w, "step %d: the front end stops the server: no new requests\n", step)
			cancel()
			s.printMetrics()
		}
	})
	s.printMetrics()
	rep = s.rep
	rep.snapshot = s.reg.Snapshot()
	if err := errors.Join(err, s.shutdown()); err != nil {
		return rep, err
	}
	// Everything is closed: the driver holds nothing for us.
	if c, ok := drv.(acl.Counter); ok {
		rep.live = c.Live()
		if !rep.live.Zero() {
			return rep, fmt.Errorf("the driver still holds %+v after shutdown", rep.live)
		}
		fmt.Fprintln(w, "shutdown: every arena and the pool closed; the driver holds no reservation, mapping or physical memory")
	}
	return rep, nil
}

// newPool makes the one pool every arena of the server draws on. Its budget
// is all the device memory the server may hold: weights, K and V caches,
// and what the pool keeps cached for reuse. A growth past it fails with
// arena.ErrOutOfMemory (and chunk.ErrBudget) instead of taking memory the
// rest of the device needs.
func newPool(drv acl.Driver, o options) (*chunk.Pool, error) {
	return chunk.New(drv, chunk.Config{
		Size:   2 << 20, // the granularity of ACL and CUDA: the finest a growth can be
		Budget: o.budget,
	})
}

// A model is one model's weights, in an arena of their own, tagged with the
// model's name so that SleepTag and WakeTag find it, and the tenant its
// sequences share: chunks move between the arenas of one model uncleared,
// and are cleared when they move to another model's.
type model struct {
	name       string
	tag        arena.Tag
	tenant     chunk.Tenant
	weights    *arena.Arena
	w          arena.Buffer
	checkpoint []byte // what was loaded, to check a woken model against
	asleep     bool
	lastUsed   int // the last step with a request for it
}

// loadModel makes the model's weights arena, exactly the size of its
// weights, and copies them in.
func loadModel(pool *chunk.Pool, name string, size int, seed uint64) (*model, error) {
	m := &model{name: name, tag: arena.Tag(name + "/weights"), tenant: chunk.NewTenant(), checkpoint: make([]byte, size)}
	fill(m.checkpoint, seed)
	var err error
	m.weights, err = arena.New(arena.Config{Pool: pool, Reserve: size, Tenant: m.tenant, Tag: m.tag})
	if err != nil {
		return nil, err
	}
	if m.w, err = m.weights.Alloc(size, tensor.Align); err != nil {
		return nil, errors.Join(err, m.weights.Close())
	}
	if err := arena.CopyIn(m.w, m.checkpoint); err != nil {
		return nil, errors.Join(err, m.weights.Close())
	}
	return m, nil
}

// A request is what a client asked for: a prompt and a number of tokens to
// generate, from one model. generated survives a preemption: a request
// readmitted recomputes its cache for the prompt and those tokens.
type request struct {
	id, arrive     int
	model          *model
	prompt, output int
	generated      int
	timesPreempted int
}

// A sequence is a request being decoded: a K and a V arena, each holding a
// row per token for every layer.
//
// One K and one V arena per sequence, rather than one per layer: a layer's
// keys for a token are dim float32s, so a token's keys for all layers are
// one row of layers × dim, and each arena grows by whole rows. A sequence
// then costs two reservations and at most two partly used chunks, where
// per-layer arenas would cost 2 × layers of each; and preempting it is two
// Close calls. An attention kernel reads layer l's keys at offset
// l × dim × 4 of every row, a fixed stride. Per-layer arenas suit kernels that
// want each layer's keys contiguous; the memory handling below is the same.
type sequence struct {
	req  *request
	k, v *arena.Arena
}

// newSequence makes the request's K and V arenas. Each reserves address
// space for the longest sequence the server accepts, which costs no memory:
// chunks are mapped only as the sequence grows.
func (s *server) newSequence(r *request) (*sequence, error) {
	cfg := arena.Config{Pool: s.pool, Reserve: s.o.maxToks * s.row, Tenant: r.model.tenant}
	k, err := arena.New(cfg)
	if err != nil {
		return nil, err
	}
	v, err := arena.New(cfg)
	if err != nil {
		return nil, errors.Join(err, k.Close())
	}
	return &sequence{req: r, k: k, v: v}, nil
}

// grow makes room in both arenas for n more tokens. Grow maps chunks now,
// so that the Allocs of the step find their memory mapped (an Alloc within
// the mapped memory is a compare-and-swap, with no driver call). A Grow that
// fails leaves its arena as it was.
func (q *sequence) grow(n, row int) error {
	if err := q.k.Grow(n * row); err != nil {
		return err
	}
	return q.v.Grow(n * row)
}

// appendTokens writes the K and V rows of tokens [from, to) of the request:
// the prompt's at once, as a prefill does, then a token's per decode step.
func (q *sequence) appendTokens(from, to, row int) error {
	for kind, a := range []*arena.Arena{q.k, q.v} {
		b, err := a.Alloc((to-from)*row, 64)
		if err != nil {
			return err
		}
		if err := arena.CopyIn(b, kvRows(q.req.id, from, to, kind, row/4)); err != nil {
			return err
		}
	}
	return nil
}

// close gives the sequence's memory back to the pool: its chunks go to the
// pool's cache, for the next growth of any arena (cleared first if that
// arena is another model's).
func (q *sequence) close() error { return errors.Join(q.k.Close(), q.v.Close()) }

// server is the scheduler's state: one goroutine runs it.
type server struct {
	o       options
	w       io.Writer
	pool    *chunk.Pool
	reg     *metrics.Registry
	models  []*model
	row     int         // bytes per token in a K or V arena: layers × dim float32s
	waiting []*request  // accepted, in order of arrival; preempted requests go back to the front
	running []*sequence // oldest first: the youngest is last
	step    int
	stalled bool // the first waiting request did not fit, and no memory has come back since
	rep     report
}

// newServer makes the pool, loads the models into it, and registers what
// the metrics watch.
func newServer(drv acl.Driver, o options, w io.Writer) (*server, error) {
	s := &server{o: o, w: w, row: o.layers * o.dim * 4, reg: metrics.NewRegistry(),
		rep: report{preempted: map[int]int{}, done: map[int]bool{}}}
	var err error
	if s.pool, err = newPool(drv, o); err != nil {
		return nil, err
	}
	if err := s.reg.AddPool("serve", s.pool); err != nil {
		return nil, errors.Join(err, s.shutdown())
	}
	for i, name := range []string{"chat", "embed"} {
		m, err := loadModel(s.pool, name, o.weights, uint64(i+1))
		if err != nil {
			return nil, errors.Join(err, s.shutdown())
		}
		s.models = append(s.models, m)
		// The weights live as long as the server: worth series of their own.
		// Per-sequence arenas are not: the pool's series count them.
		if err := s.reg.AddArena(string(m.tag), m.weights); err != nil {
			return nil, errors.Join(err, s.shutdown())
		}
	}
	fmt.Fprintf(w, "pool: %s in %d MiB chunks; weights: %d MiB for each of %s and %s; a token takes %d KiB of K and as much of V\n",
		budgetText(o.budget, "%d MiB budget"), s.pool.ChunkSize()>>20, o.weights>>20, s.models[0].name, s.models[1].name, s.row>>10)
	return s, nil
}

// serve runs decode steps until every accepted request is done. Requests
// arrive from the trace at their step while ctx is live; once it is done,
// the server accepts no more, and finishes those it has. onStep runs before
// each step (the front end).
func (s *server) serve(ctx context.Context, trace []*request, onStep func(step int)) error {
	for s.step = 0; ; s.step++ {
		onStep(s.step)
		for len(trace) > 0 && trace[0].arrive <= s.step {
			r := trace[0]
			trace = trace[1:]
			if ctx.Err() != nil {
				s.rep.refused++
				continue
			}
			s.rep.accepted++
			s.waiting = append(s.waiting, r)
		}
		if ctx.Err() != nil && len(s.waiting) == 0 && len(s.running) == 0 {
			fmt.Fprintf(s.w, "step %d: drained: %d requests finished, %d refused after the stop\n", s.step, s.rep.finished, s.rep.refused)
			return nil
		}
		// Sleep, wake and the rest of the work go on after ctx ends: the
		// drain needs them.
		work := context.WithoutCancel(ctx)
		if err := s.sleepIdle(work); err != nil {
			return err
		}
		if err := s.decode(); err != nil {
			return err
		}
		if err := s.admit(work); err != nil {
			return err
		}
	}
}

// admit starts the waiting requests, oldest first, while the batch has
// room and the memory allows. A request whose model sleeps wakes it first.
// Admission never preempts: a request that does not fit waits, and is
// tried again once a sequence has given memory back.
func (s *server) admit(ctx context.Context) error {
	for !s.stalled && len(s.waiting) > 0 && len(s.running) < s.o.maxBatch {
		r := s.waiting[0]
		if r.model.asleep {
			if room(s.pool) < int64(r.model.weights.Reserved()) && len(s.running) > 0 {
				s.stalled = true
				return nil // it waits for memory
			}
			if err := s.wake(ctx, r.model); err != nil {
				return err
			}
		}
		q, err := s.newSequence(r)
		if err != nil {
			return err
		}
		// The prompt, the tokens generated before a preemption, and the
		// next token.
		n := r.prompt + r.generated
		if err := q.grow(n+1, s.row); err != nil {
			err = errors.Join(err, q.close())
			if errors.Is(err, arena.ErrOutOfMemory) && len(s.running) > 0 {
				s.stalled = true
				return nil // it waits: the running sequences will finish
			}
			return fmt.Errorf("request %d does not fit the budget alone: %w", r.id, err)
		}
		if err := q.appendTokens(0, n, s.row); err != nil {
			return errors.Join(err, q.close())
		}
		s.waiting = s.waiting[1:]
		s.running = append(s.running, q)
		if r.timesPreempted > 0 {
			fmt.Fprintf(s.w, "step %d: request %d readmitted: %d tokens recomputed\n", s.step, r.id, n)
		}
	}
	return nil
}

// decode runs one step: every running sequence gets room for its next
// token, writes it, and finishes when it has generated all its output.
func (s *server) decode() error {
	for i := 0; i < len(s.running); i++ {
		q := s.running[i]
		if err := s.reserve(q); errors.Is(err, errPreempted) {
			break // q was the youngest: it and those after it are gone
		} else if err != nil {
			return err
		}
		r := q.req
		t := r.prompt + r.generated
		if err := q.appendTokens(t, t+1, s.row); err != nil {
			return err
		}
		r.generated++
		r.model.lastUsed = s.step
		if r.generated == r.output {
			if err := s.finish(q); err != nil {
				return err
			}
			s.running = append(s.running[:i], s.running[i+1:]...)
			i--
		}
	}
	return nil
}

// errPreempted is reserve's word that the sequence itself was preempted.
var errPreempted = errors.New("preempted")

// reserve makes room for q's next token. When the budget is spent, the
// growth fails with arena.ErrOutOfMemory, having changed nothing, and the
// youngest sequence gives its memory back: its arenas are closed and its
// request goes back to the front of the queue, to be recomputed when memory
// allows. The oldest sequences keep running, so every request finishes.
//
// A server with a goroutine per sequence could wait instead, with
// GrowContext: it returns when other sequences give memory back, and fails
// at once with arena.ErrDeadlock when every sequence holding memory waits
// too, which says which one to preempt.
func (s *server) reserve(q *sequence) error {
	for {
		err := q.grow(1, s.row)
		if !errors.Is(err, arena.ErrOutOfMemory) {
			return err
		}
		youngest := s.running[len(s.running)-1]
		if err := s.preempt(youngest); err != nil {
			return err
		}
		if youngest == q {
			return errPreempted
		}
	}
}

// preempt stops the youngest sequence, q, gives its memory back and requeues
// its request at the front.
func (s *server) preempt(q *sequence) error {
	s.running = s.running[:len(s.running)-1]
	r := q.req
	r.timesPreempted++
	s.rep.preempted[r.id]++
	s.waiting = append([]*request{r}, s.waiting...)
	s.stalled = false
	held := q.k.Cap() + q.v.Cap()
	fmt.Fprintf(s.w, "step %d: out of memory: request %d preempted at %d tokens, %d MiB back to the pool\n",
		s.step, r.id, r.prompt+r.generated, held>>20)
	return q.close()
}

// finish checks a finished sequence's cache against what was written, then
// closes its arenas.
func (s *server) finish(q *sequence) error {
	r := q.req
	n := r.prompt + r.generated
	got := make([]float32, n*s.row/4)
	for kind, a := range []*arena.Arena{q.k, q.v} {
		b, err := a.Slice(0, n*s.row)
		if err != nil {
			return err
		}
		if err := arena.CopyOut(got, b); err != nil {
			return err
		}
		want, d := kvRows(r.id, 0, n, kind, s.row/4), s.row/4
		for t := range n {
			if !equal(got[t*d:(t+1)*d], want[t*d:(t+1)*d]) {
				return fmt.Errorf("request %d: %c row of token %d is not what was written", r.id, "KV"[kind], t)
			}
		}
	}
	s.rep.finished++
	s.stalled = false
	s.rep.done[r.id] = true
	note := ""
	if r.timesPreempted > 0 {
		note = fmt.Sprintf(" (preempted %d×)", r.timesPreempted)
	}
	fmt.Fprintf(s.w, "step %d: request %d (%s) finished: %d tokens, cache checked%s\n", s.step, r.id, r.model.name, n, note)
	return q.close()
}

// sleepIdle puts to sleep every model that has had no request for o.idle
// steps. Offload copies its weights to pinned host memory and frees every
// chunk to the device: the pool's budget gains their size for the others'
// sequences, and the weights' addresses stay reserved.
func (s *server) sleepIdle(ctx context.Context) error {
	for _, m := range s.models {
		if m.asleep || s.step-m.lastUsed < s.o.idle || s.wanted(m) {
			continue
		}
		if err := arena.SleepTag(ctx, s.pool, m.tag, arena.Offload); err != nil {
			return err
		}
		m.asleep = true
		s.stalled = false
		s.rep.sleeps++
		fmt.Fprintf(s.w, "step %d: %s idle for %d steps: asleep, %d MiB offloaded; the pool holds %d MiB\n",
			s.step, m.name, s.step-m.lastUsed, m.weights.HostCopy()>>20, s.pool.Stats().HeldBytes>>20)
	}
	return nil
}

// wanted says whether a request for m is running or waiting.
func (s *server) wanted(m *model) bool {
	for _, q := range s.running {
		if q.req.model == m {
			return true
		}
	}
	for _, r := range s.waiting {
		if r.model == m {
			return true
		}
	}
	return false
}

// room is what a growth, or a wake, can take from the pool at once: the
// budget it has left, and the chunks in its cache. (A growth may take more
// from other arenas' memory mapped and unused; this is what it need not.)
func room(p *chunk.Pool) int64 {
	st := p.Stats()
	return st.Budget - st.HeldBytes + st.CachedBytes
}

// wake brings a sleeping model back before its request is admitted. Wake
// maps chunks at the addresses the weights had and copies them back, so
// every pointer into them (a captured graph's, say) is still good; the
// check below proves the bytes are too. When memory is short Wake waits,
// as GrowContext does, until its context ends. Nothing else frees memory
// while this server's one goroutine waits, so admit wakes a model only
// when the pool has room for it, and the deadline is a guard.
func (s *server) wake(ctx context.Context, m *model) error {
	ptr := m.w.Ptr()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := arena.WakeTag(wctx, s.pool, m.tag); err != nil {
		return err
	}
	got := make([]byte, m.w.Len())
	if err := arena.CopyOut(got, m.w); err != nil {
		return err
	}
	if m.w.Ptr() != ptr || !bytes.Equal(got, m.checkpoint) {
		return fmt.Errorf("%s: woken weights moved or changed", m.name)
	}
	m.asleep = false
	m.lastUsed = s.step
	s.rep.wakes++
	s.rep.wokenBytes += len(got)
	fmt.Fprintf(s.w, "step %d: %s woken for request %d: %d MiB of weights back at the same address, byte for byte\n",
		s.step, m.name, s.waiting[0].id, len(got)>>20)
	return nil
}

// budgetText formats a budget in MiB with format, or says there is none (a
// pool given no budget is bounded by the device alone).
func budgetText(budget int64, format string) string {
	if budget <= 0 {
		return "(no budget)"
	}
	return fmt.Sprintf(format, budget>>20)
}

// printMetrics prints what a dashboard reads, from one Snapshot: the pool's
// figures, which count every arena drawing on it (the bytes they use, how
// many there are), and the weights arenas added by name.
func (s *server) printMetrics() {
	snap := s.reg.Snapshot()
	for _, p := range snap.Pools {
		st := p.Stats
		fmt.Fprintf(s.w, "metrics: pool %s: %d arenas use %d MiB; %d MiB held %s; %d chunks allocated, %d reused from the cache, %d growths refused for the budget\n",
			p.Name, st.Members, st.UsedBytes>>20, st.HeldBytes>>20, budgetText(st.Budget, "of %d MiB"), st.Allocs, st.Hits, st.Failures)
	}
	for _, a := range snap.Arenas {
		fmt.Fprintf(s.w, "metrics: arena %s: %d MiB in use, %d MiB mapped, %d MiB reserved\n",
			a.Name, a.Stats.Used>>20, a.Stats.Mapped>>20, a.Stats.Reserved>>20)
	}
	preempted := 0
	for _, n := range s.rep.preempted {
		preempted += n
	}
	fmt.Fprintf(s.w, "metrics: %d requests finished; %d preemptions of %d requests; sleeps %d, wakes %d\n",
		s.rep.finished, preempted, len(s.rep.preempted), s.rep.sleeps, s.rep.wakes)
}

// shutdown closes what is left: the sequences (none, after a drain), the
// weights, and the pool last, once no arena draws on it.
func (s *server) shutdown() error {
	var errs []error
	for _, q := range s.running {
		errs = append(errs, q.close())
	}
	for _, m := range s.models {
		s.reg.RemoveArena(string(m.tag))
		errs = append(errs, m.weights.Close()) // a sleeping arena closes too, and frees its host copy
	}
	s.reg.RemovePool("serve")
	return errors.Join(append(errs, s.pool.Close())...)
}

// newTrace makes the requests: mostly for the chat model, arriving a few
// steps apart, and for the embed model a first pair early and a second pair
// late, after it has been idle long enough to sleep. The last request
// arrives after the front end stops the server, and is refused.
func newTrace(o options, models []*model) []*request {
	rng := rand.New(rand.NewPCG(o.seed, o.seed^0x5e77e))
	var trace []*request
	at := 0
	for id := range o.requests {
		m := models[0]
		if id == 1 || id == 2 || id == o.requests-4 || id == o.requests-3 {
			m = models[1]
		}
		trace = append(trace, &request{id: id, arrive: at, model: m, prompt: 64 + rng.IntN(384), output: 32 + rng.IntN(224)})
		at += rng.IntN(16)
		if id == o.requests-2 {
			at = o.stop + 1
		}
	}
	return trace
}

// kvRows are the K (kind 0) or V (kind 1) rows of tokens [from, to) of
// request id, d float32s each: what a model would compute, made up, but the
// same every time they are computed.
func kvRows(id, from, to, kind, d int) []float32 {
	x := make([]float32, (to-from)*d)
	for t := from; t < to; t++ {
		h := uint64(id)<<40 ^ uint64(t)<<8 ^ uint64(kind)
		for i := range d {
			h = h*6364136223846793005 + 1442695040888963407
			x[(t-from)*d+i] = float32(int32(h>>33)) / (1 << 31)
		}
	}
	return x
}

// fill writes a model's made-up weights.
func fill(b []byte, seed uint64) {
	h := seed
	for i := range b {
		h = h*6364136223846793005 + 1442695040888963407
		b[i] = byte(h >> 56)
	}
}

func equal(a, b []float32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}
