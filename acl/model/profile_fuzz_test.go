package model

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

// FuzzParseProfile feeds the profile parser what a profile file (model:PATH)
// may hold. A profile it accepts must encode back to itself and drive the
// device model, in both readings, through a round of calls without a panic,
// a wait the virtual clock cannot pass, or a leak; one it refuses must say
// so with acl.ErrInvalidParam.
func FuzzParseProfile(f *testing.F) {
	seeds, err := filepath.Glob("profiles/*.json")
	if err != nil || len(seeds) == 0 {
		f.Fatalf("no shipped profiles to seed from: %v", err)
	}
	for _, s := range seeds {
		b, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		for _, r := range [][2]string{
			{`"value": 2097152`, `"value": 1`},                    // a 1-byte granule
			{`"value": 2097152`, `"value": 18446744073709551615`}, // a granule past any capacity
			{`"value": 150754820096`, `"value": 4096`},            // a device smaller than a granule
			{`"value": 17.9`, `"value": 1e300`},                   // a malloc costing forever
			{`"value": 17.9`, `"value": -1`},
		} {
			if m := bytes.Replace(b, []byte(r[0]), []byte(r[1]), 1); !bytes.Equal(m, b) {
				f.Add(m)
			}
		}
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"name":"x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseProfile(b)
		if err != nil {
			if !errors.Is(err, acl.ErrInvalidParam) {
				t.Fatalf("a refused profile's error does not match acl.ErrInvalidParam: %v", err)
			}
			return
		}
		var buf bytes.Buffer
		if err := p.WriteJSON(&buf); err != nil {
			t.Fatalf("an accepted profile does not encode: %v", err)
		}
		q, err := ParseProfile(buf.Bytes())
		if err != nil {
			t.Fatalf("an accepted profile, encoded, is refused: %v\n%s", err, buf.Bytes())
		}
		var again bytes.Buffer
		if err := q.WriteJSON(&again); err != nil || !bytes.Equal(buf.Bytes(), again.Bytes()) {
			t.Fatalf("the profile changed on a round trip (%v):\n%s\n%s", err, buf.Bytes(), again.Bytes())
		}
		_ = p.Summary()
		for _, pess := range []bool{false, true} {
			d, err := New(Config{Profile: p, NoData: true, Pessimistic: pess, virtualTime: true})
			if err != nil {
				continue // a profile the driver refuses to model (its device too small, say) is not a crash
			}
			_ = roundOfCalls(d) // a refusal is allowed; a panic or a leak is not
			if err := d.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			if l := d.Live(); !l.Zero() {
				t.Fatalf("left live: %+v", l)
			}
		}
	})
}

// roundOfCalls reserves, allocates, maps, grants access, sets, copies and
// gives back one granule on d, and returns the first call's failure (a
// profile may model a device too small for it); the fuzz allows a failure,
// not a panic or a leak.
func roundOfCalls(d *Driver) (err error) {
	prop := acl.DeviceProp(0, 0)
	g, err := d.MemGetAllocationGranularity(&prop, acl.GranularityMinimum)
	if err != nil {
		return err
	}
	va, err := d.ReserveMemAddress(g, 0, 0, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.ReleaseMemAddress(va)) }()
	h, err := d.MallocPhysical(g, &prop, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.FreePhysical(h)) }()
	if err := d.MapMem(va, g, 0, h, 0); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.UnmapMem(va)) }()
	if err := d.MemSetAccess(va, g, acl.ReadWrite(0)); err != nil {
		return err
	}
	return errors.Join(d.Memset(va, 0, g), d.MemcpyHtoD(va, make([]byte, 64)))
}

// The fuzz's round of calls succeeds on every shipped profile: what it
// drives is the model, not its first refusal.
func TestRoundOfCallsOnShippedProfiles(t *testing.T) {
	for _, name := range Profiles() {
		p, err := LoadProfile(name)
		require.NoError(t, err)
		for _, pess := range []bool{false, true} {
			d, err := New(Config{Profile: p, NoData: true, Pessimistic: pess, virtualTime: true})
			require.NoError(t, err)
			require.NoError(t, roundOfCalls(d), "%s, pessimistic %v", name, pess)
			require.NoError(t, d.Close())
			require.True(t, d.Live().Zero(), "%+v", d.Live())
		}
	}
}
