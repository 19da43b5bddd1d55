package model_test

import (
	"context"
	"fmt"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/model"
)

// The model charges each call the time the profile's device takes for it,
// while it holds no device memory.
func Example() {
	d, err := model.New(model.Config{}) // the h200 profile
	if err != nil {
		panic(err)
	}
	defer d.Close()
	fmt.Println(d.Name())
	fmt.Println(d.Modelled()[:40])

	prop := acl.DeviceProp(d.Device(), 0)
	t0 := time.Now()
	h, err := d.MallocPhysical(2<<20, &prop, 0) // cuMemCreate of 2 MiB: 17.9 µs on the H200
	if err != nil {
		panic(err)
	}
	fmt.Println(time.Since(t0) >= 17900*time.Nanosecond)
	_ = d.FreePhysical(h)
	// Output:
	// model:h200
	// times are modelled, not measured: device
	// true
}

// A kernel that runs for a while on one stream holds back an event
// recorded behind it, and not one recorded on another stream.
func ExampleDriver_LaunchFor() {
	d, _ := model.New(model.Config{})
	defer d.Close()
	busy, _ := d.CreateStream()
	idle, _ := d.CreateStream()
	e1, _ := d.CreateEvent()
	e2, _ := d.CreateEvent()

	_ = d.LaunchFor(busy, 0, 0, 5*time.Millisecond) // touches no memory
	_ = d.RecordEvent(e1, busy)
	_ = d.RecordEvent(e2, idle)
	done1, _ := d.QueryEvent(e1)
	done2, _ := d.QueryEvent(e2)
	fmt.Println(done1, done2)
	_ = d.SynchronizeEvent(e1)
	done1, _ = d.QueryEvent(e1)
	fmt.Println(done1)

	_ = d.DestroyEvent(e1)
	_ = d.DestroyEvent(e2)
	_ = d.DestroyStream(busy)
	_ = d.DestroyStream(idle)
	// Output:
	// false true
	// true
}

// Calibrate measures a driver and writes what it found as a profile; here
// the driver is the model itself, which the calibration recovers.
func ExampleCalibrate() {
	truth, _ := model.LoadProfile("a100")
	d, _ := model.New(model.Config{Profile: truth})
	defer d.Close()
	p, err := model.Calibrate(context.Background(), d, model.CalibrateOptions{
		Name: "a100-again", Granules: []int{1, 8}, CopySizes: []uintptr{1 << 20, 8 << 20}, Reps: 5,
	})
	if err != nil {
		panic(err)
	}
	// A profile is JSON: p.WriteJSON(file) writes it, and
	// model.LoadProfileFile reads it back.
	c := p.Calls["malloc"].Base
	fmt.Printf("%s: cuMemCreate of one granule within 10%% of 193 µs: %v (measured: %v)\n",
		p.Name, c.Value > 174 && c.Value < 212, !c.Estimate)

	// Output:
	// a100-again: cuMemCreate of one granule within 10% of 193 µs: true (measured: true)
}
