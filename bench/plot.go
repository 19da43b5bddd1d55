package main

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/vmarena/vmarena/bench/internal/workload"
)

// One colour per strategy, the same in every plot.
var strategyColors = map[string]color.Color{
	"arena":     color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	"realloc":   color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	"prealloc":  color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	"pertensor": color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},

	"arena-eager": color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	// The competitors servers use.
	"paged":              color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	"caching":            color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff},
	"caching-expandable": color.RGBA{R: 0xbc, G: 0xbd, B: 0x22, A: 0xff},
}

const (
	plotW = 7 * vg.Inch
	plotH = 3.4 * vg.Inch
)

// plot writes, for each workload, the physical memory held over the steps
// (per strategy, with the live bytes) and the distribution of Grow latency;
// and the micro-measure's cold and cached Grows.
func (s *suite) plot(rep *report, dir string) ([]string, error) {
	var files []string
	for _, w := range s.opts.workloads {
		var rows []*row
		for _, x := range rep.Rows {
			if x.Workload == w {
				rows = append(rows, x)
			}
		}
		if len(rows) == 0 {
			continue
		}
		p := filepath.Join(dir, "mem-"+w+".png")
		if err := memPlot(p, w, rows); err != nil {
			return files, err
		}
		files = append(files, p)
		p = filepath.Join(dir, "grow-"+w+".png")
		var curves []cdfCurve
		for _, x := range rows {
			curves = append(curves, cdfCurve{x.Strategy, strategyColors[x.Strategy], nil, x.grows})
		}
		if err := cdfPlot(p, fmt.Sprintf("%s: latency of the Grows that called the driver (%s)", w, s.device), curves); err != nil {
			return files, err
		}
		files = append(files, p)
	}
	if s.micro != nil {
		p := filepath.Join(dir, "grow-micro.png")
		curves := []cdfCurve{
			{"cold (MallocPhysical+map+access)", strategyColors["realloc"], nil, s.micro.Cold},
			{"from the reuse cache (map+access)", strategyColors["arena"], nil, s.micro.Cache},
		}
		title := fmt.Sprintf("arena: Grow by one %s chunk (%s)", workload.HumanBytes(int64(s.micro.ChunkSize)), s.device)
		if err := cdfPlot(p, title, curves); err != nil {
			return files, err
		}
		files = append(files, p)
	}
	return files, nil
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = wrap(title, titleWidth)
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	return p
}

// titleWidth is the most characters of a title line at 11 points that fit
// the plot's width; longer titles are wrapped.
const titleWidth = 80

// wrap breaks s into lines of at most width characters, at spaces.
func wrap(s string, width int) string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len([]rune(line))+1+len([]rune(word)) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	return strings.Join(append(lines, line), "\n")
}

// byteUnit returns the binary unit in which top reads as a number from 1 to
// 1024 (B below 1 KiB), and its size.
func byteUnit(top int64) (string, float64) {
	for _, u := range []struct {
		name string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if top >= u.size {
			return u.name, float64(u.size)
		}
	}
	return "B", 1
}

func memPlot(path, w string, rows []*row) error {
	var peak int64
	for _, x := range rows {
		peak = max(peak, x.PeakPhysical)
	}
	unit, size := byteUnit(peak)
	p := newPlot(w+": physical memory held after each step; an arena's line includes its pool's cache (warm and ahead chunks), which the pool gives back on demand",
		"step", "physical memory held ("+unit+")")
	var top float64
	for _, x := range rows {
		top = max(top, float64(x.PeakPhysical)/size)
		pts := make(plotter.XYs, len(x.med.Samples))
		for i, s := range x.med.Samples {
			pts[i] = plotter.XY{X: float64(s.Step), Y: float64(s.Physical) / size}
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = strategyColors[x.Strategy]
		l.Width = vg.Points(1.2)
		p.Add(l)
		name := x.Strategy
		if x.Pool != nil {
			name += " (incl. its pool's cache)"
		}
		p.Legend.Add(name, l)
	}
	// The live bytes are the workload's own, the same for every strategy.
	s := rows[0].med.Samples
	pts := make(plotter.XYs, len(s))
	for i, v := range s {
		pts[i] = plotter.XY{X: float64(v.Step), Y: float64(v.Live) / size}
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return err
	}
	l.Color = color.Gray{Y: 0x40}
	l.Dashes = []vg.Length{vg.Points(3), vg.Points(2)}
	l.Width = vg.Points(1)
	p.Add(l)
	p.Legend.Add("live tensors", l)
	p.Y.Min = 0
	p.Y.Max = top * 1.45 // room for the legend above the lines
	return save(p, path)
}

type cdfCurve struct {
	name   string
	color  color.Color
	dashes []vg.Length
	ev     []workload.GrowEvent
}

// cdfPlot draws the cumulative distribution of each curve's Grow latency on
// a logarithmic time axis.
func cdfPlot(path, title string, curves []cdfCurve) error {
	p := newPlot(title, "Grow latency (µs, log scale)", "fraction of Grows ≤ x")
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = false
	p.Legend.Left = false
	drawn := false
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range curves {
		if len(c.ev) == 0 {
			continue
		}
		us := make([]float64, len(c.ev))
		for i, e := range c.ev {
			us[i] = max(float64(e.NS)/1e3, 1e-3)
		}
		slices.Sort(us)
		lo, hi = min(lo, us[0]), max(hi, us[len(us)-1])
		pts := make(plotter.XYs, 0, min(len(us), 2000))
		step := max(1, len(us)/2000)
		for i := 0; i < len(us); i += step {
			pts = append(pts, plotter.XY{X: us[i], Y: float64(i+1) / float64(len(us))})
		}
		pts = append(pts, plotter.XY{X: us[len(us)-1], Y: 1})
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = c.color
		l.Dashes = c.dashes
		l.Width = vg.Points(1.4)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (%d)", c.name, len(us)), l)
		drawn = true
	}
	if !drawn {
		p.Add(plotter.NewFunction(func(float64) float64 { return 0 }))
		lo, hi = 1, 10
	}
	p.X.Min, p.X.Max = logRange(lo, hi)
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.XOffs = -vg.Points(4)
	p.Legend.YOffs = vg.Points(4)
	return save(p, path)
}

// logRange returns the whole decades that hold [lo, hi], at least one
// decade wide: a log axis left to the plotting library pads a range of one
// value (a single Grow, or all of one latency) to below zero, and fails.
func logRange(lo, hi float64) (float64, float64) {
	a := math.Pow(10, math.Floor(math.Log10(lo)))
	b := math.Pow(10, math.Ceil(math.Log10(hi)))
	if b <= a {
		b = a * 10
	}
	return a, b
}

// save writes p as a PNG at path. The plotting library panics on some
// inputs; a plot that cannot be drawn is an error of the run, which has
// written its results already, not a crash.
func save(p *plot.Plot, path string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("draw %s: %v", filepath.Base(path), r)
		}
	}()
	return p.Save(plotW, plotH, path)
}
