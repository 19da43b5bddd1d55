package model

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/internal/skip"
)

// truthProfile has a distinct, easily measured value for every coefficient
// Calibrate measures.
func truthProfile(t testing.TB) *Profile {
	p := zeroProfile(t)
	p.Name = "truth"
	set := func(name string, base, perMiB float64) {
		p.Calls[name].Base.Value = base
		if perMiB != 0 {
			p.Calls[name].PerMiB.Value = perMiB
		}
	}
	set("granularity", 3, 0)
	set("malloc", 30, 2)
	set("free", 20, 1)
	set("reserve", 15, 0.5)
	set("release", 12, 0.25)
	set("map", 10, 0.5)
	set("unmap", 25, 1.5)
	set("access", 35, 1)
	p.Calls["access"].PerMapping.Value = 4
	set("htod", 12, 0)
	set("dtoh", 10, 0)
	set("dtod", 6, 0)
	set("memset", 5, 0)
	set("meminfo", 6, 0)
	set("create_stream", 8, 0)
	set("destroy_stream", 7, 0)
	set("sync_stream", 3, 0)
	set("sync_device", 4, 0)
	set("create_event", 2.5, 0)
	set("destroy_event", 1.8, 0)
	set("record_event", 2, 0)
	set("query_event", 1.5, 0)
	set("sync_event", 2.2, 0)
	set("memset_async", 5, 0)
	set("launch", 9, 0)
	p.Calls["map"].Serial.Value = true
	p.Device.Latency.Value = 50
	p.Device.LocalGBps.Value = 20
	p.Device.HtoDGBps.Value = 5
	p.Device.DtoHGBps.Value = 4
	p.Capacity.Value = 8 << 30
	return p
}

// Calibration tolerance on the model, which the test runs on its virtual
// clock: every call costs exactly what the profile says, however loaded the
// machine, so what is left is the calibration's own arithmetic (the fits
// and the three significant figures it keeps). Every measured coefficient is
// within calTolerance of the truth, or calFloor of its unit (µs, µs per MiB,
// GB/s), whichever is larger.
const (
	calTolerance = 0.005
	calFloor     = 0.01
)

var calOpts = CalibrateOptions{
	Name:      "again",
	Granules:  []int{1, 4, 16},
	CopySizes: []uintptr{64 << 10, 1 << 20, 4 << 20},
	Spans:     []int{2, 4, 8},
	Reps:      7,
}

// calErrors lists the coefficients of got, calibrated on a model of truth,
// that are off.
func calErrors(t *testing.T, truth, got *Profile) []string {
	want := map[string]float64{}
	truth.coefs(func(name string, c *Coef) { want[name] = c.Value })
	var errs []string
	got.coefs(func(name string, c *Coef) {
		if c.Estimate {
			assert.Contains(t, c.Source, "carried over from profile", name)
			return
		}
		assert.Contains(t, c.Source, "calibrated on model:truth", name)
		w := want[name]
		tol := max(calTolerance*math.Abs(w), calFloor)
		t.Logf("%-32s want %10.4g got %10.4g", name, w, c.Value)
		if math.Abs(c.Value-w) > tol {
			errs = append(errs, fmt.Sprintf("%s: calibrated %v, the model charges %v (tolerance %.3g)", name, c.Value, w, tol))
		}
	})
	return errs
}

// TestCalibrateModel calibrates the model and checks that it recovers the
// model's own coefficients: the strongest test that the model charges what
// its profile says and that the calibration measures what it claims.
func TestCalibrateModel(t *testing.T) {
	truth := truthProfile(t)
	// Without data: the calibration reads back nothing it checks. On the
	// virtual clock: the figures do not depend on the machine's load.
	d := open(t, Config{Profile: truth, NoData: true, virtualTime: true})
	defer func() { require.NoError(t, d.Close()) }()
	opts := calOpts
	opts.clock = func() time.Duration { return time.Duration(d.now()) }
	got, err := Calibrate(context.Background(), blindReads{d}, opts)
	require.NoError(t, err)
	require.True(t, d.Live().Zero(), "calibration released everything: %+v", d.Live())
	require.NoError(t, got.Validate())
	if errs := calErrors(t, truth, got); len(errs) > 0 {
		t.Fatalf("calibration off:\n%s", strings.Join(errs, "\n"))
	}

	m, n := got.Measured()
	assert.Equal(t, n-1, m, "everything but the stand-in launch is measured")
	assert.True(t, got.Calls["launch"].Base.Estimate)
	assert.True(t, got.Calls["map"].Serial.Value, "serial flags are carried over")
	assert.True(t, got.Calls["map"].Serial.Estimate)
	assert.Equal(t, "again", got.Name)
	assert.True(t, got.Caps.AccessSpan.Value)
	assert.Equal(t, "process", got.Caps.Fresh.Value)

	var buf bytes.Buffer
	require.NoError(t, got.WriteJSON(&buf))
	back, err := ParseProfile(buf.Bytes())
	require.NoError(t, err, "the calibrated profile reads back")
	assert.Equal(t, got, back)
}

// TestCalibrateHost is a sanity check on the host driver: every figure
// comes out finite and non-negative and nothing is left behind.
func TestCalibrateHost(t *testing.T) {
	d, err := host.New(host.Config{Capacity: 256 << 20, AccessSpan: true})
	if errors.Is(err, acl.ErrNotSupported) {
		skip.Unsupported(t, "the host driver: %v", err)
	}
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	var log []string
	p, err := Calibrate(context.Background(), d, CalibrateOptions{
		Granules:  []int{1, 2, 4},
		CopySizes: []uintptr{4 << 10, 256 << 10, 1 << 20},
		Spans:     []int{2},
		Reps:      3,
		Log:       func(f string, a ...any) { log = append(log, fmt.Sprintf(f, a...)) },
	})
	require.NoError(t, err)
	assert.True(t, d.Live().Zero(), "%+v", d.Live())
	require.NoError(t, p.Validate())
	assert.Equal(t, float64(256<<20), p.Capacity.Value)
	assert.Equal(t, float64(2<<20), p.Granularity.Value)
	assert.Equal(t, "zeroed", p.Caps.Fresh.Value)
	assert.Contains(t, p.Origin, "host")
	assert.NotEmpty(t, log)
	m, n := p.Measured()
	t.Logf("host: %d of %d coefficients measured; malloc %.1f µs + %.1f µs/MiB, htod %.2f GB/s, local %.2f GB/s",
		m, n, p.Calls["malloc"].Base.Value, p.Calls["malloc"].PerMiB.Value, p.Device.HtoDGBps.Value, p.Device.LocalGBps.Value)
	assert.Greater(t, m, n/2)
}

// TestCalibrateCleansUp fails each driver call of a calibration in turn and
// checks that nothing is left allocated.
func TestCalibrateCleansUp(t *testing.T) {
	opts := CalibrateOptions{Granules: []int{1, 2}, CopySizes: []uintptr{4096, 8192}, Spans: []int{2}, Reps: 1}
	inner := open(t, Config{Untimed: true})
	defer func() { require.NoError(t, inner.Close()) }()
	fd := faultdriver.New(inner)
	_, err := Calibrate(context.Background(), fd, opts)
	require.NoError(t, err)
	var calls int64
	for _, op := range faultdriver.Ops {
		calls += fd.Calls(op)
	}
	require.Greater(t, calls, int64(50))
	for k := 1; k <= int(calls); k++ {
		fd.Clear()
		fd.FailNth(faultdriver.Any, k, acl.ErrCodeRTMemoryAllocation)
		_, err := Calibrate(context.Background(), fd, opts)
		require.Error(t, err, "call %d failing", k)
		require.True(t, inner.Live().Zero(), "call %d failing left %+v", k, inner.Live())
	}
}

// TestCalibrateCancel cancels a calibration at each of its steps.
func TestCalibrateCancel(t *testing.T) {
	inner := open(t, Config{Untimed: true})
	defer func() { require.NoError(t, inner.Close()) }()
	for step := 0; ; step++ {
		ctx, cancel := context.WithCancel(context.Background())
		seen := 0
		_, err := Calibrate(ctx, inner, CalibrateOptions{Granules: []int{1, 2}, CopySizes: []uintptr{4096}, Reps: 2,
			Log: func(string, ...any) {
				if seen == step {
					cancel()
				}
				seen++
			}})
		cancel()
		require.True(t, inner.Live().Zero(), "cancelled at step %d: %+v", step, inner.Live())
		if step >= seen {
			require.NoError(t, err)
			break
		}
		require.ErrorIs(t, err, context.Canceled, "cancelled at step %d", step)
	}
}

func TestCalibrateOptions(t *testing.T) {
	d := open(t, Config{Untimed: true, Capacity: 64 << 20})
	defer d.Close()
	_, err := Calibrate(context.Background(), d, CalibrateOptions{Granules: []int{0, -1}})
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	_, err = Calibrate(context.Background(), d, CalibrateOptions{Granules: []int{1024}, CopySizes: []uintptr{4096}})
	require.ErrorIs(t, err, acl.ErrOutOfMemory, "no size fits")
	p, err := Calibrate(context.Background(), d, CalibrateOptions{Granules: []int{1, 1024}, CopySizes: []uintptr{4096}, Reps: 1})
	require.NoError(t, err, "sizes that do not fit are skipped")
	assert.Contains(t, p.Calls["malloc"].Base.Source, "one size")
	assert.True(t, p.Calls["malloc"].PerMiB.Estimate, "no per-MiB fit from one size")
}

// blindReads is a model without data whose reads succeed, leaving dst as it was: the
// calibration times reads and needs none of their bytes.
type blindReads struct{ *Driver }

func (b blindReads) MemcpyDtoH(dst []byte, src acl.DevicePtr) error {
	err := b.Driver.MemcpyDtoH(dst, src)
	if errors.Is(err, acl.ErrNotSupported) {
		return nil // the calibration checks no byte it reads; clearing dst would add host time to the copy's
	}
	return err
}
