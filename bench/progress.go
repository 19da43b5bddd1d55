package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress draws a one-line bar on a terminal; elsewhere it does nothing.
type progress struct {
	w     io.Writer
	on    bool
	units int
	start time.Time
	last  time.Time
	drawn bool
}

func newProgress(w io.Writer, mode string, units int) *progress {
	on := mode == "on" || (mode == "auto" && isTerminal(w))
	return &progress{w: w, on: on && units > 0, units: units, start: time.Now()}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// set shows done whole units plus frac of the next, with a label.
func (p *progress) set(done int, frac float64, label string) {
	if !p.on {
		return
	}
	now := time.Now()
	if p.drawn && frac > 0 && now.Sub(p.last) < 100*time.Millisecond {
		return
	}
	p.last = now
	f := min(1, (float64(done)+min(max(frac, 0), 1))/float64(p.units))
	const width = 30
	n := int(f * width)
	bar := strings.Repeat("=", n) + strings.Repeat(" ", width-n)
	fmt.Fprintf(p.w, "\r\033[K[%s] %3.0f%%  %-36s %5.1fs", bar, 100*f, label, now.Sub(p.start).Seconds())
	p.drawn = true
}

func (p *progress) clear() {
	if p.on && p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}
