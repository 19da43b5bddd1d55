package model

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

func TestProfiles(t *testing.T) {
	assert.Equal(t, []string{"a100", "h200"}, Profiles())
	for _, name := range Profiles() {
		p, err := LoadProfile(name)
		require.NoError(t, err, name)
		assert.Equal(t, name, p.Name)
		m, n := p.Measured()
		assert.Positive(t, m, "%s measures something", name)
		assert.Less(t, m, n, "%s estimates something", name)
		t.Logf("%s: %d of %d coefficients measured", name, m, n)
		assert.Contains(t, p.Summary(), "modelled")
		for _, c := range callNames {
			assert.NotEmpty(t, p.Calls[c].Op, "%s: %s names its runtime call", name, c)
		}
	}
	_, err := LoadProfile("v100")
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	assert.Contains(t, err.Error(), "a100, h200")
	_, err = LoadProfile("../profiles/h200")
	require.Error(t, err)
}

// us returns the modelled host time of call c over n bytes, in µs.
func us(p *Profile, c call, n uintptr) float64 {
	cs := compile(p)
	return float64(cs.host(c, n)) / 1e3
}

// TestH200Checks checks the h200 profile against the figures it was made
// from: the per-chunk costs measured on the GPU and the bench's scrub cost.
func TestH200Checks(t *testing.T) {
	p, err := LoadProfile("h200")
	require.NoError(t, err)
	const chunk = 2 << 20
	cold := us(p, cMalloc, chunk) + us(p, cMap, chunk) + us(p, cAccess, chunk)
	assert.InDelta(t, 63.9, cold, 63.9*0.03, "cold grow per 2 MiB chunk (measured mean 63.9 µs)")
	reuse := us(p, cMap, chunk) + us(p, cAccess, chunk)
	assert.InDelta(t, 43.0, reuse, 43.0*0.05, "grow from the reuse cache (measured mean 43.0 µs)")
	cs := compile(p)
	scrub := time.Duration(cs.base[cMemset] + cs.device(chunk))
	assert.InDelta(t, 60, float64(scrub)/1e3, 3, "a 2 MiB scrub (≈ 60 µs in the bench's H200 run)")
	assert.Equal(t, 150754820096.0, p.Capacity.Value)
	assert.True(t, p.Caps.AccessSpan.Value)

	a, err := LoadProfile("a100")
	require.NoError(t, err)
	coldA := us(a, cMalloc, chunk) + us(a, cMap, chunk) + us(a, cAccess, chunk)
	assert.InDelta(t, 230, coldA, 2, "kvcached: ≈ 230 µs per cold 2 MB page on the A100")
}

func TestValidate(t *testing.T) {
	good, err := LoadProfile("h200")
	require.NoError(t, err)
	cases := map[string]func(p *Profile){
		"negative":      func(p *Profile) { p.Calls["map"].Base.Value = -1 },
		"no source":     func(p *Profile) { p.Calls["map"].Base.Source = "" },
		"missing call":  func(p *Profile) { delete(p.Calls, "unmap") },
		"unknown call":  func(p *Profile) { p.Calls["mapp"] = p.Calls["map"] },
		"per MiB":       func(p *Profile) { p.Calls["htod"].PerMiB = &Coef{Value: 1, Source: "x"} },
		"no per MiB":    func(p *Profile) { p.Calls["map"].PerMiB = nil },
		"per mapping":   func(p *Profile) { p.Calls["map"].PerMapping = &Coef{Value: 1, Source: "x"} },
		"granularity":   func(p *Profile) { p.Granularity.Value = 3 << 20 },
		"bandwidth":     func(p *Profile) { p.Device.LocalGBps.Value = 0 },
		"fresh":         func(p *Profile) { p.Caps.Fresh.Value = "clean" },
		"name":          func(p *Profile) { p.Name = "a b" },
		"serial source": func(p *Profile) { p.Calls["map"].Serial.Source = "" },
	}
	for name, mutate := range cases {
		p := good.Clone()
		mutate(p)
		err := p.Validate()
		require.ErrorIs(t, err, acl.ErrInvalidParam, name)
		_, err = New(Config{Profile: p})
		require.Error(t, err, name)
	}
	_, err = ParseProfile([]byte(`{"name": "x", "typo": 1}`))
	require.ErrorIs(t, err, acl.ErrInvalidParam)
}

func TestProfileFile(t *testing.T) {
	p, err := LoadProfile("a100")
	require.NoError(t, err)
	p.Name = "mine"
	p.Calls["map"].Base.Value = 123
	path := filepath.Join(t.TempDir(), "mine.json")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, p.WriteJSON(f))
	require.NoError(t, f.Close())

	for _, spec := range []string{path} {
		q, err := Resolve(spec)
		require.NoError(t, err)
		assert.Equal(t, p, q)
	}
	q, err := Resolve("h200")
	require.NoError(t, err)
	assert.Equal(t, "h200", q.Name)
	_, err = Resolve(filepath.Join(t.TempDir(), "none.json"))
	require.Error(t, err)

	d, err := New(Config{Profile: p})
	require.NoError(t, err)
	defer d.Close()
	assert.Equal(t, "model:mine", d.Name())
	p.Calls["map"].Base.Value = 1
	assert.Equal(t, 123.0, d.Profile().Calls["map"].Base.Value, "the driver keeps its own copy")
	assert.True(t, strings.HasPrefix(d.Modelled(), "times are modelled, not measured"))
}
